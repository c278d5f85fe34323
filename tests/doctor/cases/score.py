"""Scores the doctor on the corpus of tests/doctor/cases/: what it finds, what it misses,
what it reports that is not there.

    python tests/doctor/cases/score.py                       # every case
    python tests/doctor/cases/score.py train_nan_guard.py eval_clean_no_grad.py
    python tests/doctor/cases/score.py --min-recall 0.8 --min-precision 0.9    # exit 1 below these
    python tests/doctor/cases/score.py --json summary.json --reports reports/  # machine-readable results

Each case is a small script that starts with an annotation block:

    # doctor-case: <one line description>
    # loop: training                         (optional: the kind of loop, for the per-loop recall)
    # expect: hidden_sync @ 23               (the line a good tool names for this trap)
    # expect: host_to_device_copy @ 17|16    (either of these lines is right)
    # expect: clean                          (or: nothing may be reported)
    # target: ascend310p3                    (optional: the chip to run as; default the doctor's own)
    # raises: TypeError                      (optional: the script stops with this error there, by design)

The doctor runs on each case (``python -m torch_npu.doctor --json <tmp> --no-profile
[--target T] <case>``, in a fresh process, two at a time at most); a finding hits an expectation when
its kind is the expected kind, its file is the case and its line one of the allowed
lines. Recall is the expected traps found over the expected traps; precision the
findings that hit an expectation over the findings about the case's own lines (findings
about other files, or without a line, are listed but not counted). A crash is a doctor
that wrote no report, timed out, or exited non-zero when the script itself did not fail
(a script that raises under the doctor is run again without it to tell who failed).

The exit status is 0 unless --min-recall or --min-precision is given and not met.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("cpu_fallback", "host_to_device_copy", "hidden_sync", "launch_bound", "strided_copy", "float64",
         "memory_growth", "wrong_result", "compile", "float16_overflow", "unsupported_dtype")
MAX_JOBS = 2   # the cases are scored on small machines: two doctors at a time at most

_EXPECT = re.compile(r"^#\s*expect:\s*(?P<kind>[a-z0-9_]+)\s*@\s*(?P<lines>\d+(?:\s*\|\s*\d+)*)\s*$")


# ---- the cases -------------------------------------------------------------------

class CaseError(ValueError):
    """A case whose annotation block cannot be read."""


def parse_case(path):
    """{"name", "path", "description", "loop", "target", "raises", "clean", "expect": [(kind, (lines...)), ...]}."""
    description, loop, target, raises, clean, expect = None, None, None, None, False, []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.startswith("#"):
                break
            body = line[1:].strip()
            if body.startswith("doctor-case:"):
                description = body[len("doctor-case:"):].strip()
            elif body.startswith("loop:"):
                loop = body[len("loop:"):].strip()
            elif body.startswith("target:"):
                target = body[len("target:"):].strip()
            elif body.startswith("raises:"):
                raises = body[len("raises:"):].strip()
            elif body.startswith("expect:"):
                if body[len("expect:"):].strip() == "clean":
                    clean = True
                    continue
                m = _EXPECT.match("# " + body)
                if not m:
                    raise CaseError(f"{path}:{number}: cannot read the expectation {line!r} "
                                    f"(write '# expect: <kind> @ <line>[|<line>...]' or '# expect: clean')")
                if m.group("kind") not in KINDS:
                    raise CaseError(f"{path}:{number}: unknown kind {m.group('kind')!r} (one of {', '.join(KINDS)})")
                lines = tuple(int(n) for n in m.group("lines").split("|"))
                expect.append((m.group("kind"), lines))
    if description is None:
        raise CaseError(f"{path}: no '# doctor-case: <description>' line in the annotation block")
    if clean == bool(expect):
        raise CaseError(f"{path}: a case has either '# expect: clean' or '# expect: <kind> @ <line>' lines, "
                        f"{'not both' if clean else 'none found'}")
    return {"name": os.path.basename(path), "path": os.path.abspath(path), "description": description,
            "loop": loop or "other", "target": target, "raises": raises, "clean": clean, "expect": expect}


def find_cases(names):
    """The case files named (a path, or a file name in this folder), or all of them."""
    if not names:
        return sorted(os.path.join(HERE, f) for f in os.listdir(HERE)
                      if f.endswith(".py") and f != os.path.basename(__file__) and not f.startswith("_"))
    paths = []
    for name in names:
        for candidate in (name, os.path.join(HERE, name), os.path.join(HERE, name + ".py")):
            if os.path.isfile(candidate):
                paths.append(os.path.abspath(candidate))
                break
        else:
            raise SystemExit(f"score.py: no such case: {name}")
    return paths


# ---- running the doctor ----------------------------------------------------------

def _env(cache_dir):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=cache_dir)
    env.pop("PYTHONSTARTUP", None)
    return env


_WITHOUT_DOCTOR = ("import runpy, sys; import torch_npu; import torch_npu.contrib.transfer_to_npu; "
                   "sys.argv = [sys.argv[1]]; sys.path.insert(0, __import__('os').path.dirname(sys.argv[0])); "
                   "runpy.run_path(sys.argv[0], run_name='__main__')")


def _chip_env(case, env):
    """The script alone runs as the chip the doctor ran it as (a refusal of the chip is the
    script's own error there)."""
    target = case.get("target") or "ascend910b2"
    return dict(env, NPU_EMU_PROFILE=target) if target not in ("none", "generic") else env


def run_doctor(case, python, timeout, workdir, cache_dir, reports=None):
    """Runs the doctor on one case: {"rc", "wall_s", "report" (the JSON or None), "crash", "script_error", ...}."""
    out = os.path.join(workdir, case["name"] + ".json")
    target = ["--target", case["target"]] if case.get("target") else []
    cmd = [python, "-m", "torch_npu.doctor", "--no-progress", "--json", out, "--no-profile", *target, case["path"]]
    start = time.perf_counter()
    result = {"rc": None, "report": None, "crash": None, "script_error": None, "stderr_tail": ""}
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=_env(cache_dir), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        result["wall_s"] = time.perf_counter() - start
        result["crash"] = f"timed out after {timeout} s"
        result["stderr_tail"] = _tail(e.stderr)
        return result
    result["wall_s"] = time.perf_counter() - start
    result["rc"] = proc.returncode
    result["stderr_tail"] = _tail(proc.stderr)
    try:
        with open(out, encoding="utf-8") as f:
            result["report"] = json.load(f)
    except (OSError, ValueError) as e:
        result["crash"] = f"no JSON report (exit status {proc.returncode}): {type(e).__name__}: {e}"
        return result
    if reports:
        shutil.copy(out, os.path.join(reports, case["name"] + ".json"))
    error = result["report"].get("error")
    if proc.returncode == 0:
        return result
    if case.get("raises") and proc.returncode == 1 and (error or "").startswith(case["raises"] + ":"):
        return result   # the error the case is about
    if proc.returncode != 1 or not error:
        result["crash"] = f"exit status {proc.returncode}" + (f" (report error: {error})" if error else "")
        return result
    # The script raised under the doctor: its own error, or one the doctor caused?
    try:
        alone = subprocess.run([python, "-c", _WITHOUT_DOCTOR, case["path"]], cwd=workdir,
                               env=_chip_env(case, _env(cache_dir)), capture_output=True, text=True, timeout=timeout)
        own = alone.returncode != 0
    except subprocess.TimeoutExpired:
        own = False
    if own:
        result["script_error"] = error
    else:
        result["crash"] = f"the script raised under the doctor but runs without it: {error}"
    return result


def _tail(text, n=1500):
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "")[-n:]


# ---- scoring ---------------------------------------------------------------------

def _same_file(a, b):
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (TypeError, ValueError):
        return False


def score_case(case, result):
    """Matches the report's findings to the case's expectations."""
    findings = (result["report"] or {}).get("findings", []) if not result["crash"] else []
    own, elsewhere = [], []
    for f in findings:
        (own if f.get("file") and f.get("line") is not None and _same_file(f["file"], case["path"])
         else elsewhere).append(f)
    hits, misses = [], []
    matched = set()
    for kind, lines in case["expect"]:
        found = [i for i, f in enumerate(own) if f["kind"] == kind and f["line"] in lines]
        matched.update(found)
        (hits if found else misses).append((kind, lines))
    false_alarms = [f for i, f in enumerate(own) if i not in matched]
    return {"hits": hits, "misses": misses, "matched": len(matched), "own": len(own),
            "false_alarms": false_alarms, "elsewhere": elsewhere}


def _lines(lines):
    return "|".join(str(n) for n in lines)


def _finding_text(f):
    where = f"{f['line']}" if f.get("file") else "(no line)"
    return f"{f['kind']} @ {where}: {f.get('title', '')}"


def summarize(cases, results, scores, wall, jobs):
    # Every case counts: a crashed doctor found nothing, and a script that raises still gets its
    # report (of what ran until then).
    scored = list(zip(cases, results, scores))
    hits = sum(len(s["hits"]) for _, _, s in scored)
    expected = sum(len(c["expect"]) for c in cases)
    own = sum(s["own"] for _, _, s in scored)
    matched = sum(s["matched"] for _, _, s in scored)
    by_kind_expected, by_kind_hit = collections.Counter(), collections.Counter()
    by_loop_expected, by_loop_hit = collections.Counter(), collections.Counter()
    misses_by_kind, false_by_kind = collections.Counter(), collections.Counter()
    for c, _, s in scored:
        for kind, _ in s["hits"]:
            by_kind_hit[kind] += 1
            by_loop_hit[c["loop"]] += 1
        for kind, _ in s["hits"] + s["misses"]:
            by_kind_expected[kind] += 1
            by_loop_expected[c["loop"]] += 1
        for kind, _ in s["misses"]:
            misses_by_kind[kind] += 1
        for f in s["false_alarms"]:
            false_by_kind[f["kind"]] += 1
    clean = [(c, r, s) for c, r, s in scored if c["clean"]]
    return {
        "cases": len(cases), "trap_cases": sum(not c["clean"] for c in cases), "clean_cases": len(clean),
        "expected": expected, "hits": hits,
        "recall": hits / expected if expected else 1.0,
        "own_findings": own, "matched_findings": matched,
        "precision": matched / own if own else 1.0,
        "clean_kept_clean": sum(1 for _, r, s in clean if not r["crash"] and not s["own"] and not s["elsewhere"]),
        "crashes": {c["name"]: r["crash"] for c, r in zip(cases, results) if r["crash"]},
        "script_errors": {c["name"]: r["script_error"] for c, r in zip(cases, results) if r["script_error"]},
        "misses_by_kind": dict(misses_by_kind), "false_alarms_by_kind": dict(false_by_kind),
        "recall_by_kind": {k: [by_kind_hit[k], by_kind_expected[k]] for k in sorted(by_kind_expected)},
        "recall_by_loop": {k: [by_loop_hit[k], by_loop_expected[k]] for k in sorted(by_loop_expected)},
        "wall_s": wall, "jobs": jobs,
        "per_case": {c["name"]: {
            "loop": c["loop"], "clean": c["clean"], "wall_s": round(r["wall_s"], 2), "rc": r["rc"],
            "crash": r["crash"], "script_error": r["script_error"],
            "hits": [[k, list(lines)] for k, lines in s["hits"]],
            "misses": [[k, list(lines)] for k, lines in s["misses"]],
            "false_alarms": [[f["kind"], f["line"], f.get("title", "")] for f in s["false_alarms"]],
            "elsewhere": [[f["kind"], f.get("file"), f.get("line")] for f in s["elsewhere"]],
        } for c, r, s in zip(cases, results, scores)},
    }


def print_report(cases, results, scores, summary, out=sys.stdout):
    w = out.write
    for c, r, s in zip(cases, results, scores):
        if r["crash"]:
            status = "CRASH"
        elif r["script_error"]:
            status = "SCRIPT ERROR"
        elif c["clean"]:
            status = "clean" if not s["own"] and not s["elsewhere"] else "NOT CLEAN"
        else:
            status = f"{len(s['hits'])}/{len(c['expect'])} found" + (
                f", {len(s['false_alarms'])} false alarm{'s' if len(s['false_alarms']) != 1 else ''}"
                if s["false_alarms"] else "")
        w(f"{c['name']}  [{c['loop']}]  {r['wall_s']:.1f} s  {status}\n")
        for kind, lines in s["hits"]:
            w(f"    hit    {kind} @ {_lines(lines)}\n")
        for kind, lines in s["misses"]:
            w(f"    miss   {kind} @ {_lines(lines)}\n")
        for f in s["false_alarms"]:
            w(f"    false  {_finding_text(f)}\n")
        for f in s["elsewhere"]:
            w(f"    other  {f['kind']} @ {f.get('file')}:{f.get('line')} (not counted)\n")
        if r["crash"]:
            w(f"    crash  {r['crash']}\n")
            for line in r["stderr_tail"].strip().splitlines()[-6:]:
                w(f"           {line}\n")
        if r["script_error"]:
            w(f"    script error (the case fails without the doctor too; scored on what ran): {r['script_error']}\n")
    t = summary
    w("\n")
    w(f"cases: {t['cases']} ({t['trap_cases']} with traps, {t['clean_cases']} clean)\n")
    w(f"recall:    {t['hits']}/{t['expected']} = {t['recall']:.2f}  (expected traps found)\n")
    w(f"precision: {t['matched_findings']}/{t['own_findings']} = {t['precision']:.2f}  "
      f"(findings on the cases' lines that match an expectation)\n")
    w(f"clean cases kept clean: {t['clean_kept_clean']}/{t['clean_cases']}\n")
    w(f"crashes: {len(t['crashes'])}" + "".join(f"\n    {n}: {m}" for n, m in t["crashes"].items()) + "\n")
    if t["script_errors"]:
        w(f"script errors (cases that fail without the doctor too: fix the case): {len(t['script_errors'])}"
          + "".join(f"\n    {n}: {m}" for n, m in t["script_errors"].items()) + "\n")
    w("recall by kind:  " + ", ".join(f"{k} {h}/{n}" for k, (h, n) in t["recall_by_kind"].items()) + "\n")
    w("recall by loop:  " + ", ".join(f"{k} {h}/{n}" for k, (h, n) in t["recall_by_loop"].items()) + "\n")
    w("misses by kind:  " + (", ".join(f"{k} {n}" for k, n in sorted(t["misses_by_kind"].items())) or "none") + "\n")
    w("false alarms by kind: " + (", ".join(f"{k} {n}" for k, n in sorted(t["false_alarms_by_kind"].items()))
                                  or "none") + "\n")
    times = sorted(r["wall_s"] for r in results)
    if times:
        w(f"wall time: {t['wall_s']:.1f} s for {len(times)} cases, {t['jobs']} at a time (per case: "
          f"median {times[len(times) // 2]:.1f} s, slowest {times[-1]:.1f} s)\n")


def main(argv=None):
    p = argparse.ArgumentParser(description="Score the torch_npu doctor on the cases of tests/doctor/cases/.")
    p.add_argument("cases", nargs="*", help="case files (a path, or a name in tests/doctor/cases/); default: all")
    p.add_argument("--jobs", type=int, default=MAX_JOBS, help=f"doctors run at a time (1 or {MAX_JOBS})")
    p.add_argument("--timeout", type=float, default=180, help="seconds one case may run (default 180)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs the doctor")
    p.add_argument("--json", metavar="FILE", help="also write the scores as JSON")
    p.add_argument("--reports", metavar="DIR", help="keep each case's doctor report (JSON) in DIR")
    p.add_argument("--min-recall", type=float, help="exit 1 if the recall is below this")
    p.add_argument("--min-precision", type=float, help="exit 1 if the precision is below this")
    args = p.parse_args(argv)

    cases = [parse_case(path) for path in find_cases(args.cases)]
    if args.reports:
        os.makedirs(args.reports, exist_ok=True)
    jobs = max(1, min(MAX_JOBS, args.jobs))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="doctor-cases-") as workdir:
        cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(workdir, "inductor-cache")
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_doctor, c, args.python, args.timeout, workdir, cache_dir, args.reports)
                       for c in cases]
            for c, fut in zip(cases, futures):
                r = fut.result()
                print(f"[score] {c['name']}: {r['wall_s']:.1f} s", file=sys.stderr, flush=True)
            results = [f.result() for f in futures]
    wall = time.perf_counter() - start
    scores = [score_case(c, r) for c, r in zip(cases, results)]
    summary = summarize(cases, results, scores, wall, jobs)
    print_report(cases, results, scores, summary)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    failed = []
    if args.min_recall is not None and summary["recall"] < args.min_recall:
        failed.append(f"recall {summary['recall']:.2f} < {args.min_recall}")
    if args.min_precision is not None and summary["precision"] < args.min_precision:
        failed.append(f"precision {summary['precision']:.2f} < {args.min_precision}")
    if failed:
        print("score.py: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

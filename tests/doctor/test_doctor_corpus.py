"""The doctor on a fast subset of its corpus (tests/doctor/cases/, scored by score.py):
no crash, the clean cases stay clean, and the traps it finds today are still found.

The whole corpus (108 cases, about 5 minutes on 2 cores) is scored by hand:
``python tests/doctor/cases/score.py --min-recall 0.95 --min-precision 0.95``. Its recall
and precision are the doctor's measure (docs/guide/doctor.md).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

ROOT = REPO_ROOT
CASES = os.path.join(ROOT, "tests", "doctor", "cases")
SCORE = os.path.join(CASES, "score.py")

# Traps of each kind of loop (training, evaluation without optimizer, validation inside
# training, generation), and clean scripts that must stay clean (GradScaler's own syncs
# and float64 work inside scaler.step() are not the user's).
FOUND_TRAPS = ["train_item_running_loss.py", "train_same_batch_every_step.py", "pipeline_nextafter_fallback.py",
               "eval_accuracy_item.py", "train_randn_npu_add.py", "train_history_append_loss.py",
               "trainval_item_per_val_batch.py", "gen_eos_item_break.py",
               # what only the target chip does: a fallback in the backward pass, float16 saturation, a refusal
               "train_survival_logcumsumexp.py", "infer_fp16_attention_exp_310p.py", "train_bf16_inputs_310p.py"]
CLEAN = ["train_clean_mlp.py", "eval_clean_no_grad.py", "gen_clean_greedy.py", "diffusion_clean_sampler.py",
         "amp_clean_training.py", "graph_replay_clean.py", "infer_fp16_in_range_310p.py"]
SUBSET = FOUND_TRAPS + CLEAN


def _score_module():
    spec = importlib.util.spec_from_file_location("doctor_cases_score", SCORE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """One score.py run over the subset: its JSON summary, and its printed report."""
    out = tmp_path_factory.mktemp("corpus") / "summary.json"
    result = subprocess.run([sys.executable, SCORE, "--json", str(out), "--timeout", "240", *SUBSET], cwd=ROOT,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out) as f:
        return json.load(f), result.stdout


def test_the_doctor_does_not_crash_on_the_subset(scored):
    summary, stdout = scored
    assert summary["cases"] == len(SUBSET)
    assert summary["crashes"] == {}, stdout
    assert summary["script_errors"] == {}, stdout
    for name in SUBSET:   # exit 1: the script stopped on the error the case is about (a chip's refusal)
        assert summary["per_case"][name]["rc"] == (1 if name == "train_bf16_inputs_310p.py" else 0), (name, stdout)
    assert "recall:" in stdout and "precision:" in stdout and "wall time:" in stdout


@pytest.mark.parametrize("name", CLEAN)
def test_clean_cases_stay_clean(scored, name):
    summary, _ = scored
    case = summary["per_case"][name]
    assert case["clean"]
    assert case["false_alarms"] == [] and case["elsewhere"] == [], case


@pytest.mark.parametrize("name", FOUND_TRAPS)
def test_traps_found_today_are_still_found(scored, name):
    case = scored[0]["per_case"][name]
    assert case["misses"] == [] and case["false_alarms"] == [], case



# ---- the corpus itself: well-formed cases, and the scorer's matching ------------------------

def test_every_case_parses_and_points_at_code():
    score = _score_module()
    paths = score.find_cases([])
    cases = [score.parse_case(p) for p in paths]
    assert len(cases) >= 40
    assert sum(c["clean"] for c in cases) >= 10
    kinds = {kind for c in cases for kind, _ in c["expect"]}
    assert kinds >= {"cpu_fallback", "host_to_device_copy", "hidden_sync", "launch_bound", "strided_copy",
                     "float64", "memory_growth", "float16_overflow", "unsupported_dtype"}
    assert sum(c["target"] is not None for c in cases) >= 4   # cases for chips other than the default
    assert {c["loop"] for c in cases} >= {"training", "eval", "generation", "diffusion", "pipeline", "validation",
                                          "amp", "compile"}
    for case in cases:
        with open(case["path"]) as f:
            lines = f.read().split("\n")
        for kind, allowed in case["expect"]:
            for n in allowed:
                assert 1 <= n <= len(lines), (case["name"], kind, n)
                code = lines[n - 1].strip()
                assert code and not code.startswith("#"), f"{case['name']}:{n} ({kind}) is not a line of code"


def test_annotations_are_checked(tmp_path):
    score = _score_module()
    good = tmp_path / "good.py"
    good.write_text("# doctor-case: two traps\n# loop: eval\n# expect: hidden_sync @ 5\n"
                    "# expect: host_to_device_copy @ 7|6\nimport torch\n")
    case = score.parse_case(str(good))
    assert case["expect"] == [("hidden_sync", (5,)), ("host_to_device_copy", (7, 6))] and case["loop"] == "eval"
    assert case["target"] is None and case["raises"] is None
    chip = tmp_path / "chip.py"
    chip.write_text("# doctor-case: a refusal\n# target: ascend310p3\n# raises: TypeError\n"
                    "# expect: unsupported_dtype @ 6\nimport torch\nx = 1\n")
    case = score.parse_case(str(chip))
    assert (case["target"], case["raises"]) == ("ascend310p3", "TypeError")
    for bad in ("# doctor-case: x\n# expect: hidden_sync @ five\n", "# doctor-case: x\n# expect: slow @ 3\n",
                "# doctor-case: x\n", "# expect: clean\n",
                "# doctor-case: x\n# expect: clean\n# expect: float64 @ 2\n"):
        path = tmp_path / "bad.py"
        path.write_text(bad + "import torch\n")
        with pytest.raises(score.CaseError):
            score.parse_case(str(path))


def test_findings_are_matched_by_kind_line_and_file(tmp_path):
    score = _score_module()
    script = tmp_path / "case.py"
    script.write_text("# doctor-case: x\n# expect: hidden_sync @ 5\n# expect: float64 @ 9|8\nimport torch\n")
    case = score.parse_case(str(script))

    def finding(kind, line, file=str(script)):
        return {"kind": kind, "line": line, "file": file, "title": ""}

    report = {"findings": [finding("hidden_sync", 5), finding("float64", 8), finding("hidden_sync", 6),
                           finding("cpu_fallback", 5, file="/elsewhere/lib.py"), finding("memory_growth", None)]}
    s = score.score_case(case, {"report": report, "crash": None})
    assert [k for k, _ in s["hits"]] == ["hidden_sync", "float64"] and s["misses"] == []
    assert s["own"] == 3 and s["matched"] == 2
    assert [(f["kind"], f["line"]) for f in s["false_alarms"]] == [("hidden_sync", 6)]
    assert len(s["elsewhere"]) == 2
    crashed = score.score_case(case, {"report": report, "crash": "timed out"})
    assert crashed["hits"] == [] and len(crashed["misses"]) == 2

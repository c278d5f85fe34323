"""python -m torch_npu.doctor [options] SCRIPT.py [args...]  (also: torch_npu-doctor, torch_npu doctor)

Runs SCRIPT on the npu as the target chip (--target, default ascend910b2) and prints
a report of what to fix there."""
import argparse
import os
import runpy
import sys
import traceback


def _parser(prog):
    p = argparse.ArgumentParser(
        prog=prog, description="Run a PyTorch script on the npu and report what to fix: CPU fallbacks, "
        "host/device copies and syncs in loops, launch-bound lines, strided copies, float64, memory growth.")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    p.add_argument("--json", metavar="FILE", help="also write the findings as JSON (schema torch_npu.doctor/1)")
    p.add_argument("--compare", action="store_true",
                   help="run every npu op on the cpu too and report results that differ (slow)")
    p.add_argument("--no-transfer", dest="transfer", action="store_false",
                   help="do not import torch_npu.contrib.transfer_to_npu (which makes 'cuda' mean the npu)")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="do not profile three iterations with torch_npu.profiler")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line on stderr")
    p.add_argument("--steps-at", metavar="FILE:LINE",
                   help="each run of this line of the script is one iteration (by default the doctor finds the "
                        "script's loop itself, or counts optimizer steps)")
    p.add_argument("--target", default=None, metavar="PROFILE",
                   help="run the script as this chip (its support set, dtypes and numerics) and end the report with "
                        "the step's time projected there: a chip profile of torch_npu.npu.list_profiles(); default "
                        "NPU_EMU_PROFILE when it names a chip, else ascend910b2. 'generic': the ideal npu, no chip "
                        "verdict; 'none': the profile NPU_EMU_PROFILE sets (generic without it), no verdict")
    p.add_argument("--also-target", metavar="A,B", default="",
                   help="also answer for these chip profiles, from the same run (exact where the chips run the "
                        "script's ops alike; the report says where not)")
    p.add_argument("-m", dest="module", action="store_true", help="SCRIPT is a module name, as python -m")
    p.add_argument("script", metavar="SCRIPT", help="the Python script (or module with -m) to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def _run_script(options):
    """Runs the script as __main__; returns the exception that ended it, if any."""
    # As python does: an absolute __file__, the script's folder first on sys.path.
    path = options.script if options.module else os.path.abspath(options.script)
    sys.argv = [path] + options.args
    if not options.module:
        sys.path.insert(0, os.path.dirname(path))
    try:
        if options.module:
            runpy.run_module(path, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            return e
    except KeyboardInterrupt as e:   # stopped by hand: a report of what ran so far
        print("\n[torch_npu doctor] interrupted: the report covers what ran until now", file=sys.stderr)
        return e
    except Exception as e:  # noqa: BLE001  the report still comes, with the error in it
        traceback.print_exc()
        return e
    return None


def _targets(options):
    """The chip the script runs as (None: no verdict) and the other chips to answer for; the
    npu is set to emulate the target before its first use. ValueError names a bad profile."""
    import torch
    from .._emu import profiles as _profiles
    from . import _check_target
    named = options.target
    if named is None:
        env = os.environ.get("NPU_EMU_PROFILE", "").strip()
        named = env if env and env != _profiles.GENERIC else "ascend910b2"
    also = [t.strip() for t in options.also_target.split(",") if t.strip()]
    for name in also:
        try:
            _check_target(name)
        except ValueError as e:
            raise ValueError(f"--also-target {name}: {e}") from None
    if named.lower() == "none":
        return None, also
    if named == _profiles.GENERIC:
        torch.npu.set_profile(_profiles.GENERIC)
        return None, also
    try:
        _check_target(named)
    except ValueError as e:
        raise ValueError(f"--target: {e}") from None
    torch.npu.set_profile(named)   # before the npu's first use: the whole run is the chip's
    return named, [t for t in also if t != named]


def main(argv=None, prog="python -m torch_npu.doctor"):
    options = _parser(prog).parse_args(argv)
    if not options.module and not os.path.isfile(options.script):
        print(f"{prog}: no such script: {options.script}", file=sys.stderr)
        return 2
    # Outputs are named from where the doctor started, whatever the script does with its cwd.
    options.json = os.path.abspath(options.json) if options.json else None
    options.html = os.path.abspath(options.html) if options.html else None
    import torch_npu  # noqa: F401  (the npu device)
    try:
        target, also = _targets(options)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if options.transfer:
        import torch_npu.contrib.transfer_to_npu  # noqa: F401
    from . import Doctor

    try:
        doctor = Doctor(compare=options.compare, profile=options.profile, progress=options.progress,
                        script=options.script, steps_at=options.steps_at, target=target, also_targets=also)
    except ValueError as e:
        print(f"{prog}: --steps-at: {e}", file=sys.stderr)
        return 2
    with doctor:
        error = _run_script(options)
        doctor.script_failed(error)
    if error is not None and doctor.run.error is None:
        doctor.run.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    report = doctor.report()
    print(report, flush=True)
    if options.json:
        report.to_json(options.json)
        print(f"\nJSON report: {options.json}")
    if options.html:
        report.to_html(options.html)
        print(f"\nHTML report: {os.path.abspath(options.html)}")
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 1 if error is not None else 0


def console_main():
    """The ``torch_npu-doctor`` console script."""
    sys.exit(main(prog="torch_npu-doctor"))


def cli_main():
    """The ``torch_npu`` console script: ``torch_npu doctor SCRIPT ...``."""
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help") or argv[0] != "doctor":
        print("usage: torch_npu doctor [options] SCRIPT.py [args...]\n\n"
              "commands:\n  doctor    run a script on the npu and report what to fix "
              "(torch_npu doctor --help)", file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    sys.exit(main(argv[1:], prog="torch_npu doctor"))


if __name__ == "__main__":
    sys.exit(main())

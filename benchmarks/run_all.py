"""Runs every benchmark of benchmarks/ and prints their tables (make bench)."""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ["bench_foundation.py", "bench_ops.py", "bench_fused.py", "bench_profiler.py", "bench_doctor.py", "bench_amp.py",
           "bench_models.py", "bench_profiles.py"]


def main():
    for script in SCRIPTS:
        print(f"\n===== {script} =====", flush=True)
        sys.argv = [script] + sys.argv[1:]
        runpy.run_path(os.path.join(HERE, script), run_name="__main__")


if __name__ == "__main__":
    main()

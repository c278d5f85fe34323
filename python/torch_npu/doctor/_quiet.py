"""What other code prints because the doctor runs, kept out of the user's terminal:
Kineto's log lines when the profiler starts and stops (``USDT: ... profiler_start``,
written by its C++ to the process's stderr, which no setting of its silences), and
the warnings PyTorch raises about the doctor's own dispatch mode. Anything else
written meanwhile is passed on."""
import contextlib
import os
import re
import sys
import tempfile
import warnings

_NATIVE_NOISE = re.compile(r"^(USDT:|\[W\d{4} .*(collection|kineto|ActivityProfiler)[^ ]*\.cpp)")
# PyTorch's profiler warns about an active Python dispatch mode (the doctor's monitor):
# "PythonDispatchMode (Triggered internally at .../profiler/collection.cpp...)".
_WARNINGS = (r"PythonDispatchMode",)


@contextlib.contextmanager
def native_stderr():
    """Runs the block with the process's stderr (file descriptor 2) captured, then writes
    back what was not Kineto's noise."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):   # no usable stderr: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines(True) if not _NATIVE_NOISE.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def filter_warnings():
    """Hides PyTorch's warnings about the doctor's own machinery; returns the undo."""
    added = []
    for message in _WARNINGS:
        warnings.filterwarnings("ignore", message=message)
        added.append(warnings.filters[0])

    def undo():
        for f in added:
            try:
                warnings.filters.remove(f)
            except ValueError:
                pass
        warnings._filters_mutated()
    return undo

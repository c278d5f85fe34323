"""Shared set-up of the torch_npu tests.

Two emulated devices, so that multi-device tests run in this process: the emulator
reads NPU_EMU_DEVICES at first use, so it must be set before torch is imported
(torch loads torch_npu through its ``torch.backends`` entry point).

Inductor's caches live in a directory of this session: code compiled by an
earlier build of torch_npu's code generation must not stand in for today's.
"""
import atexit
import gc
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("NPU_EMU_DEVICES", "2")
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchinductor-tests-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_npu  # noqa: E402,F401

from helpers import ASYNC_ENV, ASYNC_SCENARIOS, last_line  # noqa: E402
from helpers import run_python as _run_python  # noqa: E402

NUM_DEVICES = int(os.environ["NPU_EMU_DEVICES"])

requires_two_devices = pytest.mark.skipif(
    NUM_DEVICES < 2, reason="needs NPU_EMU_DEVICES >= 2 (conftest sets 2 unless overridden)"
)


@pytest.fixture
def run_python():
    """``run_python(code, env=None)``: runs code in a fresh interpreter (see helpers.py)."""
    return _run_python


@pytest.fixture
def clean_npu():
    """Frees what earlier tests left: no tensors, no cached blocks, peaks reset."""
    if "torch._dynamo" in sys.modules:  # compiled frames keep their example inputs alive
        torch._dynamo.reset()
    gc.collect()
    for index in range(NUM_DEVICES):
        torch.npu.synchronize(index)
    torch.npu.set_device(0)
    torch.npu.empty_cache()
    for index in range(NUM_DEVICES):
        torch.npu.reset_peak_memory_stats(index)
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _restore_device_and_stream():
    """Every test starts on npu:0 with default streams, whatever the last one did."""
    yield
    torch.npu.set_device(0)
    for index in range(NUM_DEVICES):
        torch.npu.set_stream(torch.npu.default_stream(index))
    # A kernel error left pending would surface in the next test: report it here.
    for index in range(NUM_DEVICES):
        try:
            torch.npu.synchronize(index)
        except RuntimeError as error:  # pragma: no cover - only when a test is broken
            pytest.fail(f"the test left a pending kernel error on npu:{index}: {error}")


@pytest.fixture(autouse=True)
def _clean_fallback_state():
    """Every test starts and ends in auto mode, without op policies, retries or statistics."""
    from torch_npu import NPUFallbackMode

    def reset():
        NPUFallbackMode.set("auto")  # also forgets which ops already warned
        NPUFallbackMode.clear_op_fallbacks()
        NPUFallbackMode.set_retry_on_kernel_error(False)
        NPUFallbackMode.reset_fallback_stats()

    reset()
    yield
    reset()


@pytest.fixture(scope="session")
def async_results():
    """{scenario: result} of helpers.ASYNC_SCENARIOS, run once in an always-enqueue child."""
    proc = _run_python(ASYNC_SCENARIOS, env=ASYNC_ENV)
    return json.loads(last_line(proc))


def scenario_result(results, name):
    """One scenario's result; fails with the child's error if the scenario raised."""
    result = results[name]
    assert "error" not in result, result.get("error")
    return result


def pytest_collection_modifyitems(config, items):
    """Under a chip profile, ops outside the chip's native set fall back by design:
    the tests that assert the generic device's op set have nothing to check."""
    profile = torch_npu.npu.get_profile()
    if profile == "generic":
        return
    skip = pytest.mark.skip(reason=f"asserts the generic device's op set; under {profile} the chip's "
                                   "fallbacks are expected (tests/profiles/test_profiles.py checks them)")
    for item in items:
        if "generic_ops" in item.keywords:
            item.add_marker(skip)

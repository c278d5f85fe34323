"""Streams, events, asynchrony and kernel errors reported at synchronisation points."""
import re
import warnings

import pytest
import torch

from conftest import requires_two_devices, scenario_result


def same_stream(a, b):
    return (a.stream_id, a.device_index, a.device_type) == (b.stream_id, b.device_index, b.device_type)


# ---- streams -------------------------------------------------------------------

def test_stream_creation():
    s = torch.npu.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("npu:0")
    assert s.device_type == torch.device("npu").type or s.device.type == "npu"
    assert not same_stream(s, torch.npu.default_stream())
    other = torch.npu.Stream()
    assert other.stream_id != s.stream_id
    high = torch.npu.Stream(priority=-1)
    assert high.device.type == "npu"
    assert s.query()  # nothing queued yet
    s.synchronize()


@requires_two_devices
def test_stream_on_second_device():
    s = torch.npu.Stream(device=1)
    assert s.device == torch.device("npu:1")
    assert torch.npu.default_stream(1).device == torch.device("npu:1")


def test_current_stream_is_default_stream():
    cur = torch.npu.current_stream()
    default = torch.npu.default_stream()
    assert same_stream(cur, default)
    assert cur == default
    assert default.device == torch.device("npu:0")


def test_stream_context_switches_and_restores():
    s = torch.npu.Stream()
    before = torch.npu.current_stream()
    with torch.npu.stream(s) as entered:
        assert entered is s
        assert same_stream(torch.npu.current_stream(), s)
        inner = torch.npu.Stream()
        with torch.npu.stream(inner):
            assert same_stream(torch.npu.current_stream(), inner)
        assert same_stream(torch.npu.current_stream(), s)
    assert same_stream(torch.npu.current_stream(), before)


def test_stream_context_restores_after_exception():
    s = torch.npu.Stream()
    with pytest.raises(ValueError):
        with torch.npu.stream(s):
            raise ValueError("inside")
    assert same_stream(torch.npu.current_stream(), torch.npu.default_stream())


def test_stream_context_none_is_noop():
    with torch.npu.stream(None):
        assert same_stream(torch.npu.current_stream(), torch.npu.default_stream())


@requires_two_devices
def test_stream_context_of_other_device_switches_device():
    s1 = torch.npu.Stream(device=1)
    with torch.npu.stream(s1):
        assert torch.npu.current_device() == 1
        assert same_stream(torch.npu.current_stream(), s1)
        x = torch.ones(3, device="npu")
        assert x.device == torch.device("npu:1")
    assert torch.npu.current_device() == 0
    assert same_stream(torch.npu.current_stream(1), torch.npu.default_stream(1))
    assert same_stream(torch.npu.current_stream(0), torch.npu.default_stream(0))


def test_set_stream():
    s = torch.npu.Stream()
    torch.npu.set_stream(s)
    assert same_stream(torch.npu.current_stream(), s)
    torch.npu.set_stream(None)  # no change
    assert same_stream(torch.npu.current_stream(), s)
    torch.npu.set_stream(torch.npu.default_stream())
    assert same_stream(torch.npu.current_stream(), torch.npu.default_stream())


def test_work_on_side_stream_is_correct():
    s = torch.npu.Stream()
    x = torch.zeros(1000, device="npu")
    s.wait_stream(torch.npu.current_stream())   # x is zeroed on the default stream: a race without it, as on CUDA
    with torch.npu.stream(s):
        x.fill_(4.0)
        y = x.clone()
    s.synchronize()
    assert torch.equal(y.cpu(), torch.full((1000,), 4.0))


# ---- events --------------------------------------------------------------------

def test_event_record_query_synchronize():
    e = torch.npu.Event()
    assert e.query()  # never recorded: nothing to wait for
    x = torch.zeros(1000, device="npu")
    x.fill_(1.0)
    e.record()
    e.synchronize()
    assert e.query()
    s = torch.npu.Stream()
    e2 = s.record_event()
    assert isinstance(e2, torch.npu.Event)
    e2.synchronize()
    assert e2.query()


def test_event_elapsed_time():
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    start.record()
    torch.npu._sleep(30)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert 29.0 <= elapsed < 2000.0


def test_event_elapsed_time_on_side_stream():
    s = torch.npu.Stream()
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    with torch.npu.stream(s):
        start.record()
        torch.npu._sleep(20)
        end.record()
    end.synchronize()
    assert 19.0 <= start.elapsed_time(end) < 2000.0


def test_elapsed_time_needs_timing_events():
    start = torch.npu.Event()
    end = torch.npu.Event()
    start.record()
    end.record()
    end.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        start.elapsed_time(end)


def test_elapsed_time_needs_recorded_events():
    start = torch.npu.Event(enable_timing=True)
    end = torch.npu.Event(enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        start.elapsed_time(end)


def test_wait_stream_in_process():
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    x = torch.zeros(4096, device="npu")
    with torch.npu.stream(s1):
        torch.npu._sleep(10)
        x.fill_(2.0)
    s2.wait_stream(s1)
    with torch.npu.stream(s2):
        y = x.clone()
    s2.synchronize()
    assert torch.equal(y.cpu(), torch.full((4096,), 2.0))


# ---- kernel errors -----------------------------------------------------------------

def test_kernel_error_raised_at_synchronize_once():
    torch.npu._launch_failing_kernel("boom")
    with pytest.raises(RuntimeError) as info:
        torch.npu.synchronize()
    message = str(info.value)
    assert "boom" in message
    assert "_launch_failing_kernel" in message  # names the kernel
    assert "NPU_LAUNCH_BLOCKING" in message
    torch.npu.synchronize()  # reported once
    assert torch.equal(torch.ones(2, device="npu").cpu(), torch.ones(2))


def test_kernel_error_raised_at_cpu():
    y = torch.ones(3, device="npu")
    torch.npu._launch_failing_kernel("boom-at-cpu")
    with pytest.raises(RuntimeError, match="boom-at-cpu"):
        y.cpu()
    assert torch.equal(y.cpu(), torch.ones(3))


def test_kernel_error_raised_at_item():
    y = torch.full((), 2.0, device="npu")
    torch.npu._launch_failing_kernel("boom-at-item")
    with pytest.raises(RuntimeError, match="boom-at-item"):
        y.item()
    assert y.item() == 2.0


def test_kernel_error_on_side_stream_raised_by_stream_and_device_sync():
    s = torch.npu.Stream()
    with torch.npu.stream(s):
        torch.npu._launch_failing_kernel("side-boom")
    with pytest.raises(RuntimeError, match="side-boom"):
        s.synchronize()
    s.synchronize()
    with torch.npu.stream(s):
        torch.npu._launch_failing_kernel("side-boom-2")
    with pytest.raises(RuntimeError, match="side-boom-2"):
        torch.npu.synchronize()
    torch.npu.synchronize()


def test_kernel_error_raised_at_event_synchronize():
    torch.npu._launch_failing_kernel("event-boom")
    e = torch.npu.Event()
    e.record()
    with pytest.raises(RuntimeError, match="event-boom"):
        e.synchronize()
    torch.npu.synchronize()


def test_launch_blocking_raises_at_launch(run_python):
    proc = run_python(
        """
        import torch
        try:
            torch.npu._launch_failing_kernel("boom")
            print("launch returned")
        except RuntimeError as e:
            print("raised at launch:", "boom" in str(e))
        torch.npu.synchronize()
        x = torch.ones(4, device="npu")
        print("after:", x.cpu().tolist())
        """,
        env={"NPU_LAUNCH_BLOCKING": "1"},
    )
    assert proc.stdout.splitlines() == ["raised at launch: True", "after: [1.0, 1.0, 1.0, 1.0]"]


# ---- true asynchrony (the async_results fixture, see conftest.py) -------------------

def test_launch_is_asynchronous(async_results):
    r = scenario_result(async_results, "launch_returns_at_once")
    assert r["launch_ms"] < 100, "the launch waited for the stream"
    assert r["busy"], "stream.query() was True while a 200 ms kernel ran"
    assert r["total_ms"] >= 190, "synchronize() returned before the kernel finished"
    assert r["idle_after"] and r["value_ok"]


def test_event_query_false_while_stream_busy(async_results):
    r = scenario_result(async_results, "event_query_while_busy")
    assert r["pending"], "event.query() was True before its stream reached it"
    assert r["done"]


def test_device_synchronize_waits_for_all_streams(async_results):
    r = scenario_result(async_results, "device_synchronize_waits_for_side_stream")
    assert r["waited_ms"] >= 100 and r["idle"] and r["value_ok"]


def test_cross_stream_ordering_with_wait_event(async_results):
    r = scenario_result(async_results, "cross_stream_wait_event")
    assert r["seen"] == "5", "s2 read the tensor before s1's fill_ ran despite wait_event"
    assert r["host_ms"] < 100, "wait_event blocked the host instead of the stream"


def test_cross_stream_ordering_with_wait_stream(async_results):
    r = scenario_result(async_results, "cross_stream_wait_stream")
    assert r["seen"] == "5", "s2 read the tensor before s1's fill_ ran despite wait_stream"


def test_cross_stream_without_ordering_races(async_results):
    # The control: without ordering s2 copies while s1 still sleeps, so the
    # ordering tests above can fail.
    r = scenario_result(async_results, "cross_stream_unordered")
    assert r["seen"] == "0"


def test_kernel_error_is_asynchronous_when_enqueued(async_results):
    r = scenario_result(async_results, "kernel_error_reported_later")
    assert r["launch_returned"]
    assert r["raised"] is not None, "synchronize() did not raise the kernel's error"
    assert "late-boom" in r["raised"] and "NPU_LAUNCH_BLOCKING" in r["raised"]
    assert r["second_sync_clean"]


@pytest.mark.parametrize("mode", ["warn", 1])
def test_sync_debug_mode_warns_at_each_synchronizing_operation(mode):
    x = torch.arange(6.0, device="npu")
    pinned = torch.empty(6).pin_memory()
    torch.npu.set_sync_debug_mode(mode)
    try:
        assert torch.npu.get_sync_debug_mode() == 1
        for name, op in (("Tensor.item()", lambda: x[2].item()), ("a copy from npu to cpu", lambda: x.cpu()),
                         ("aten::nonzero", lambda: torch.nonzero(x)),
                         ("aten::masked_select", lambda: torch.masked_select(x, x > 2)),
                         ("aten::index", lambda: x[x > 2])):
            with pytest.warns(UserWarning, match=f"synchronizing npu operation: {re.escape(name)}"):
                op()
        with warnings.catch_warnings():
            warnings.simplefilter("error")          # none of these waits for the device
            y = x * 2 + 1
            pinned.copy_(y, non_blocking=True)
            torch.npu.synchronize()                 # explicit: not flagged, as on CUDA
        assert pinned.tolist() == (torch.arange(6.0) * 2 + 1).tolist()
    finally:
        torch.npu.set_sync_debug_mode("default")
    assert torch.npu.get_sync_debug_mode() == 0


def test_sync_debug_mode_error_raises_and_names_the_operation():
    x = torch.ones(3, device="npu")
    torch.npu.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match=r"synchronizing npu operation: Tensor.item\(\).*set_sync_debug_mode"):
            x.sum().item()
    finally:
        torch.npu.set_sync_debug_mode(0)
    assert x.sum().item() == 3.0
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.npu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="invalid value 3"):
        torch.npu.set_sync_debug_mode(3)


# ---- aliases reused across ops -----------------------------------------------------

def test_reused_aliases_never_repoint_one_a_queued_kernel_holds():
    # The structured fast path re-points the CPU alias objects of earlier ops
    # only when no one else holds them: here every op is queued behind a slow
    # kernel, so its aliases are still held, while more ops of other shapes,
    # dtypes, strides and shared storages come after it.
    torch.manual_seed(0)
    big = torch.randn(512, 512, device="npu")
    cpu_in, npu_out = [], []
    for i in range(40):
        dtype = torch.float64 if i % 3 == 0 else torch.float32
        base = torch.randn(6 + i % 5, 8, dtype=dtype)
        other = torch.randn(6 + i % 5, 8, dtype=dtype)
        cpu_in.append((base, other))
        a, b = base.to("npu"), other.to("npu")
        if i % 8 == 0:
            big = big @ big / 512  # a slow kernel: what follows queues behind it
        if i % 4 == 1:
            r = a[:, ::2] * b[:, 1::2]          # non-contiguous views
        elif i % 4 == 2:
            r = (a[1:] + a[:-1]).exp()          # two operands of one storage
        elif i % 4 == 3:
            r = a.clone()
            r.mul_(b)                           # in place
        else:
            r = torch.cat([a, b]).sum(0)
        npu_out.append(r)
    for i, ((base, other), r) in enumerate(zip(cpu_in, npu_out)):
        if i % 4 == 1:
            want = base[:, ::2] * other[:, 1::2]
        elif i % 4 == 2:
            want = (base[1:] + base[:-1]).exp()
        elif i % 4 == 3:
            want = base * other
        else:
            want = torch.cat([base, other]).sum(0)
        torch.testing.assert_close(r.cpu(), want)


def test_reused_aliases_keep_the_overlap_check_of_one_storage():
    a = torch.arange(8.0, device="npu")
    for _ in range(3):  # reused aliases, as fresh ones, share the storage
        with pytest.raises(RuntimeError, match="unsupported operation|overlap"):
            a[1:].add_(a[:-1])
    torch.testing.assert_close(a.cpu(), torch.arange(8.0))

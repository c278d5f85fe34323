"""torch.npu names of the Ascend adapter beyond torch.cuda's: host functions in stream order,
SyncLaunchStream, stop_device/restart_device (MindSpeed's high availability) and
torch_npu._C._storage_Use_Count (trl's activation offloading)."""
import pytest
import torch

import torch_npu


def test_launch_host_func_runs_in_stream_order_and_at_each_replay():
    s = torch.npu.Stream()
    seen = []
    with pytest.raises(RuntimeError, match="_subscribe_report"):
        torch_npu.npu._launch_host_func(s, seen.append, 1)
    torch_npu.npu._subscribe_report(s)
    x = torch.zeros(16, device="npu")
    torch.npu.synchronize()                     # x is written on the default stream, read on s
    with torch.npu.stream(s):
        x.add_(2)
    torch_npu.npu._launch_host_func(s, lambda t: seen.append(t.cpu().tolist()), x)   # after the add, in order
    assert seen == [[2.0] * 16]
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        x.add_(1)
        torch.npu._launch_host_func(s, seen.append, "replayed")
        torch.npu._launch_host_func_pending(s, seen.append, "pending")
    assert len(seen) == 1                                  # captured, not called
    g.replay()
    g.replay()
    assert seen[1:] == ["replayed", "pending"] * 2
    assert x.cpu().tolist() == [4.0] * 16
    torch_npu.npu._unsubscribe_report(s)
    with pytest.raises(RuntimeError, match="not subscribed"):
        torch_npu.npu._launch_host_func(s, seen.append, 2)


def test_sync_launch_stream_is_a_stream_from_a_pool_of_four():
    streams = [torch.npu.SyncLaunchStream() for _ in range(5)]
    assert len({s.stream_id for s in streams[:4]}) == 4
    assert streams[4].stream_id == streams[0].stream_id    # reused in turn, as on the adapter
    x = torch.arange(6.0, device="npu")
    with torch.npu.stream(streams[1]):
        y = x * 3
    streams[1].synchronize()
    assert y.cpu().tolist() == (torch.arange(6.0) * 3).tolist()
    streams[1].set_data_preprocess_stream(True)
    assert isinstance(streams[1], torch.npu.Stream) and "SyncLaunchStream" in repr(streams[1])


def test_stop_device_fails_later_work_until_restart():
    x = torch.ones(4, device="npu")
    torch.npu.synchronize()                     # stop_device skips what is still queued
    assert torch_npu.npu.stop_device(0) == 0
    try:
        with pytest.raises(RuntimeError, match="FORCE STOP.*restart_device"):
            x.add_(1)
        with pytest.raises(RuntimeError, match="FORCE STOP"):
            x.cpu()
    finally:
        torch.npu.restart_device(0)
    x.add_(1)
    assert x.cpu().tolist() == [2.0] * 4
    s = torch.npu.Stream()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, stream=s):
        x.add_(1)
    assert torch_npu.npu.stop_device(0) == 0
    try:
        with pytest.raises(RuntimeError, match="NPUGraph.replay.*FORCE STOP"):
            g.replay()                          # a graph's work stops too
    finally:
        torch.npu.restart_device(0)
    g.replay()
    assert x.cpu().tolist() == [3.0] * 4
    with pytest.warns(UserWarning, match="rebuild_all_resources=True"):
        torch.npu.restart_device(0, rebuild_all_resources=True)


def test_storage_use_count_is_torchs():
    t = torch.ones(8, device="npu")
    count = torch_npu._C._storage_Use_Count(t.untyped_storage()._cdata)
    assert count == torch._C._storage_Use_Count(t.untyped_storage()._cdata)
    views = [t[2:], t.view(2, 4)]
    assert torch_npu._C._storage_Use_Count(t.untyped_storage()._cdata) == count + len(views)
    del views
    assert torch_npu._C._storage_Use_Count(t.untyped_storage()._cdata) == count
    c = torch.ones(8)
    c_views = [c[2:], c.view(2, 4)]
    assert (torch_npu._C._storage_Use_Count(c.untyped_storage()._cdata)
            == torch._C._storage_Use_Count(c.untyped_storage()._cdata))
    storage = c.untyped_storage()
    before = torch_npu._C._storage_Use_Count(storage._cdata)
    del c_views
    assert torch_npu._C._storage_Use_Count(storage._cdata) == before - 2

"""torch.npu graphs: capture and replay, as torch.cuda's, checked against eager results."""
import pytest
import torch

import torch_npu  # noqa: F401


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).npu()


def test_replay_recomputes_from_the_static_input():
    model = _mlp()
    static_x = torch.randn(4, 16, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_y = model(static_x)
    assert g.size() > 0
    for _ in range(3):
        x = torch.randn(4, 16, device="npu")
        static_x.copy_(x)
        g.replay()
        torch.testing.assert_close(static_y, model(x))          # against eager, on new data each time
    cpu = model.cpu()
    torch.testing.assert_close(static_y.cpu(), cpu(static_x.cpu()))


def test_capture_records_without_running():
    x = torch.ones(8, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        assert torch.npu.is_current_stream_capturing()
        x.add_(1)
    assert not torch.npu.is_current_stream_capturing()
    assert x.cpu().tolist() == [1.0] * 8                       # captured, not run
    g.replay()
    g.replay()
    assert x.cpu().tolist() == [3.0] * 8


def test_allocations_during_capture_come_from_the_graph_pool_until_reset():
    x = torch.randn(256, 256, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = (x * 2).relu() + 1
    pool = g.pool()
    assert torch_npu._C._pool_reserved_bytes(0, *pool) >= 256 * 256 * 4
    g.replay()
    torch.testing.assert_close(y, (x * 2).relu() + 1)
    del y
    torch.npu.empty_cache()
    assert torch_npu._C._pool_reserved_bytes(0, *pool) > 0     # kept for the replays
    g.reset()
    torch.npu.empty_cache()
    assert torch_npu._C._pool_reserved_bytes(0, *pool) == 0


def test_graphs_share_a_pool_and_replay_in_order():
    pool = torch.npu.graph_pool_handle()
    x = torch.randn(32, device="npu")
    g1, g2 = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(g1, pool=pool):
        a = x * 3
    with torch.npu.graph(g2, pool=pool):
        b = a + 1
    assert g1.pool() == g2.pool() == pool
    g1.replay()
    g2.replay()
    torch.testing.assert_close(b, x * 3 + 1)


def test_replay_on_another_stream_after_an_event():
    x = torch.zeros(1024, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        x.add_(1)
    s = torch.npu.Stream()
    before = torch.npu.Event()
    torch.npu._sleep(20) if hasattr(torch.npu, "_sleep") else None
    x.fill_(10)                                   # on the default stream
    before.record()
    with torch.npu.stream(s):
        s.wait_event(before)
        g.replay()                                # after the fill, in s's order
    torch.npu.current_stream().wait_stream(s)
    assert x.cpu()[0].item() == 11.0


@pytest.mark.parametrize("what", ["item", "cpu", "synchronize", "nonzero"])
def test_what_cuda_forbids_raises_and_leaves_the_capture(what):
    x = torch.randn(8, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="capture"):
        with torch.npu.graph(g):
            y = x * 2
            if what == "item":
                y.sum().item()
            elif what == "cpu":
                y.cpu()
            elif what == "synchronize":
                torch.npu.synchronize()
            else:
                torch.nonzero(y)
    assert not torch.npu.is_current_stream_capturing()
    assert (x * 2).sum().item() == pytest.approx((x.cpu() * 2).sum().item(), rel=1e-6)   # the device works on


def test_random_ops_replay_with_fresh_numbers_from_the_npu_generator():
    x = torch.ones(64, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.nn.functional.dropout(x, 0.5)       # native_dropout: a new output
        z = torch.empty(64, device="npu").normal_()    # in place, on a tensor of the pool

    def replays(cpu_draws):
        torch.npu.manual_seed(7)                       # the npu's generator alone (torch.manual_seed seeds both)
        torch.rand(cpu_draws)                          # the cpu generator must not matter
        out = []
        for _ in range(2):
            g.replay()
            out.append((y.cpu().clone(), z.cpu().clone()))
        return out

    first, again = replays(1), replays(1000)
    assert not torch.equal(first[0][0], first[1][0]) and not torch.equal(first[0][1], first[1][1])   # fresh
    for (y1, z1), (y2, z2) in zip(first, again):                                                  # seeded
        assert torch.equal(y1, y2) and torch.equal(z1, z2)
    assert set(first[0][0].unique().tolist()) <= {0.0, 2.0}


def test_capture_on_the_default_stream_is_refused():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="capture_error_mode"):
        with torch.npu.stream(torch.npu.Stream()):
            g.capture_begin(capture_error_mode="loose")


def test_relaxed_mode_allows_other_threads_work():
    x = torch.ones(4, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g, capture_error_mode="relaxed"):
        y = x + 1
    g.replay()
    assert y.cpu().tolist() == [2.0] * 4


def test_make_graphed_callables_matches_eager_forward_and_backward():
    model, reference = _mlp(), _mlp()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 16, device="npu", requires_grad=True)
    graphed = torch.npu.make_graphed_callables(model, (x,))
    for _ in range(2):
        data = torch.randn(4, 16, device="npu")
        xa, xb = data.clone().requires_grad_(), data.clone().requires_grad_()
        out = graphed(xa)
        out.square().sum().backward()
        expected = reference(xb)
        expected.square().sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(xa.grad, xb.grad)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    with pytest.raises(ValueError, match="differs from the sample"):
        graphed(torch.randn(5, 16, device="npu"))


def test_torch_accelerator_graph_runs_on_the_npu(tmp_path):
    x = torch.zeros(16, device="npu")
    stream = torch.Stream()
    graph = torch.accelerator.Graph(pool=torch.npu.graph_pool_handle())
    with stream, graph:
        x += 1
    graph.replay()
    graph.replay()
    assert x.cpu().tolist() == [2.0] * 16
    assert isinstance(graph.pool(), tuple)
    npu_graph = torch.npu.NPUGraph()
    npu_graph.enable_debug_mode()
    with torch.npu.graph(npu_graph):
        x.add_(1)
    npu_graph.debug_dump(str(tmp_path / "graph.txt"))
    assert "aten::add_" in (tmp_path / "graph.txt").read_text()
    graph.reset()


def test_transfer_to_npu_names():
    import subprocess
    import sys
    code = """
import torch, torch_npu, torch_npu.contrib.transfer_to_npu
assert torch.cuda.CUDAGraph is torch.npu.NPUGraph and torch.cuda.graph is torch.npu.graph
x = torch.ones(4, device="cuda")
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
    assert torch.cuda.is_current_stream_capturing()
    x.mul_(2)
g.replay()
assert x.tolist() == [2.0] * 4
f = torch.cuda.make_graphed_callables(torch.nn.Linear(4, 2).cuda(), (torch.randn(3, 4, device="cuda"),))
assert f(torch.randn(3, 4, device="cuda")).shape == (3, 2)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_compile_backend_npugraphs_replays_forward_and_backward(monkeypatch):
    import torch._dynamo
    torch._dynamo.reset()
    replays = []
    replay = torch.npu.NPUGraph.replay
    monkeypatch.setattr(torch.npu.NPUGraph, "replay", lambda self: (replays.append(self), replay(self))[1])
    model, reference = _mlp(), _mlp()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="npugraphs")
    for step in range(4):                      # warm-up, capture, then replays
        data = torch.randn(4, 16, device="npu")
        out = compiled(data)
        out.square().sum().backward()
        expected = reference(data)
        expected.square().sum().backward()
        torch.testing.assert_close(out, expected)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    assert len(replays) == 3 * 2 and len(set(map(id, replays))) == 2   # steps 2 (captured) to 4, fwd and bwd
    assert compiled(torch.randn(6, 16, device="npu")).shape == (6, 8)   # a new shape: warm-up again
    torch._dynamo.reset()


def test_compile_mode_reduce_overhead_replays_npu_graphs(monkeypatch):
    import torch._dynamo
    torch._dynamo.reset()
    replays = []
    replay = torch.npu.NPUGraph.replay
    monkeypatch.setattr(torch.npu.NPUGraph, "replay", lambda self: (replays.append(self), replay(self))[1])
    model = _mlp()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):                     # warm-up, capture, replays: inductor's kernels included
            x = torch.randn(4, 16, device="npu")
            torch.testing.assert_close(compiled(x), model(x))
    assert len(replays) == 3, len(replays)
    x = torch.randn(4, 16, device="npu", requires_grad=True)
    reference = x.detach().clone().requires_grad_()
    for _ in range(3):                         # training: forward and backward graphs
        compiled(x).square().sum().backward()
    model(reference).square().sum().backward()
    torch.testing.assert_close(x.grad / 3, reference.grad)
    assert len(replays) > 3
    torch._dynamo.reset()


def test_a_replay_shows_its_kernels_in_the_profiler():
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(64, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.tanh(x * 2)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        g.replay()
        torch.npu.synchronize()
    names = [e.name for e in prof.events()]
    assert "NPUGraph.replay" in names
    device_kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert "aten::mul" in device_kernels and "aten::tanh" in device_kernels, device_kernels
    torch.testing.assert_close(y, torch.tanh(x * 2))


def test_a_graph_is_captured_and_replayed_under_the_doctor():
    from torch_npu.doctor import Doctor
    model = _mlp()
    static_x = torch.randn(4, 16, device="npu")
    with Doctor(profile=False) as d:
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            static_y = model(static_x)
        for _ in range(5):
            static_x.copy_(torch.randn(4, 16, device="npu"))
            g.replay()
            torch.testing.assert_close(static_y, model(static_x))
    assert d.run is not None and d.run.error is None

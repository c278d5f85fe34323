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


@pytest.mark.parametrize("what", ["item", "cpu", "synchronize", "nonzero", "event", "resize", "out_resize"])
def test_what_cuda_forbids_raises_and_invalidates_the_capture(what):
    x = torch.randn(8, device="npu")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="capture") as raised:
        with torch.npu.graph(g):
            y = x * 2
            if what == "item":
                y.sum().item()
            elif what == "cpu":
                y.cpu()
            elif what == "synchronize":
                torch.npu.synchronize()
            elif what == "nonzero":
                torch.nonzero(y)
            elif what == "event":                    # work forked to another stream
                side, forked = torch.npu.Stream(), torch.npu.Event()
                forked.record()
                side.wait_event(forked)
                with torch.npu.stream(side):
                    y * 3
            elif what == "resize":
                y.resize_(64)
            else:
                torch.add(x, 1, out=torch.empty(0, device="npu"))
            y.add_(1)                                  # after the refused call: not kept either
    assert "invalidated" in str(raised.value)
    assert not torch.npu.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()                                     # nothing of the capture is replayed
    assert (x * 2).sum().item() == pytest.approx((x.cpu() * 2).sum().item(), rel=1e-6)   # the device works on
    with torch.npu.graph(g):                           # and the graph captures again
        z = x * 3
    g.replay()
    torch.testing.assert_close(z, x * 3)


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


def test_a_replay_draws_its_random_numbers_when_replay_is_called():
    x = torch.ones(256, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = torch.nn.functional.dropout(x, 0.5)
    torch.npu.manual_seed(0)
    g.replay()
    expected = y.cpu()
    torch.npu.manual_seed(0)
    torch.npu._sleep(50)                       # the stream is busy: the replay queues behind it
    g.replay()
    torch.npu.manual_seed(123)                 # after replay(): the queued replay's numbers are drawn already
    assert torch.equal(y.cpu(), expected)


def test_capture_on_the_default_stream_is_refused():
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="capture_error_mode"):
        with torch.npu.stream(torch.npu.Stream()):
            g.capture_begin(capture_error_mode="loose")


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capture_error_mode_says_whose_waits_are_refused(mode):
    import threading
    x = torch.ones(4, device="npu")
    other = []

    def other_thread():
        try:
            torch.npu.synchronize()
            other.append("ok")
        except RuntimeError as e:
            other.append(str(e))

    g = torch.npu.NPUGraph()
    with torch.npu.stream(torch.npu.Stream()):
        g.capture_begin(capture_error_mode=mode)
        y = x + 1
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        if mode == "global":                           # another thread's wait is refused and invalidates the capture
            assert "not permitted" in other[0]
            with pytest.raises(RuntimeError, match="invalidated"):
                g.capture_end()
            return
        assert other == ["ok"]                         # thread_local and relaxed: another thread may wait
        if mode == "relaxed":
            torch.npu.synchronize()                    # and, relaxed, this one too
        g.capture_end()
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


def test_make_graphed_callables_with_several_callables_and_nested_arguments():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 8).npu(), torch.nn.Linear(8, 4).npu()
    ref_first, ref_second = torch.nn.Linear(8, 8).npu(), torch.nn.Linear(8, 4).npu()
    ref_first.load_state_dict(first.state_dict())
    ref_second.load_state_dict(second.state_dict())
    x = torch.randn(2, 8, device="npu", requires_grad=True)
    h = torch.randn(2, 8, device="npu", requires_grad=True)
    g1, g2 = torch.npu.make_graphed_callables((first, second), ((x,), (h,)))
    for _ in range(2):
        data = torch.randn(2, 8, device="npu")
        g2(g1(data).relu()).square().sum().backward()
        ref_second(ref_first(data).relu()).square().sum().backward()
        for p, q in zip(list(first.parameters()) + list(second.parameters()),
                        list(ref_first.parameters()) + list(ref_second.parameters())):
            torch.testing.assert_close(p.grad, q.grad)    # the first's backward runs after the second's forward
            p.grad = q.grad = None

    def pair(inputs):                                  # nested arguments and outputs
        a, b = inputs
        return {"sum": a + b, "product": a * b}

    a, b = torch.randn(3, device="npu"), torch.randn(3, device="npu")
    graphed = torch.npu.make_graphed_callables(pair, ([a, b],))
    c, d = torch.randn(3, device="npu"), torch.randn(3, device="npu")
    out = graphed([c, d])
    torch.testing.assert_close(out["sum"], c + d)
    torch.testing.assert_close(out["product"], c * d)
    with pytest.raises(TypeError, match="tensors only"):
        torch.npu.make_graphed_callables(lambda t, k: t * k, ((a, 2.0),))


def test_reduce_overhead_keeps_each_models_parameters_its_own():
    import torch._dynamo
    torch._dynamo.reset()
    ma, mb = torch.nn.Linear(8, 8).npu(), torch.nn.Linear(8, 8).npu()
    weights = ma.weight.detach().clone()
    step = torch.compile(lambda m, x: torch.relu(m(x)), mode="reduce-overhead")
    x = torch.randn(2, 8, device="npu")
    with torch.no_grad():
        for m in (ma, ma, ma, mb, mb, mb):
            torch.testing.assert_close(step(m, x), torch.relu(m(x)))
    assert torch.equal(ma.weight, weights)
    torch._dynamo.reset()


def test_npugraphs_backend_with_a_cpu_scalar_input_stays_correct():
    import torch._dynamo
    torch._dynamo.reset()
    f = torch.compile(lambda x, s: x * s, backend="npugraphs")
    x = torch.ones(4, device="npu")
    with pytest.warns(RuntimeWarning, match="cpu tensors"):
        for i in range(4):
            assert f(x, torch.tensor(i + 1.0)).tolist() == [i + 1.0] * 4
    torch._dynamo.reset()


@pytest.mark.child_process
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


def test_a_captured_pinned_copy_keeps_its_host_memory():
    host = torch.arange(1024.0).pin_memory()
    dst = torch.empty(1024, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        dst.copy_(host, non_blocking=True)
    del host                                       # the graph keeps it: a new pin must not take its block
    other = torch.full((1024,), -1.0).pin_memory()
    g.replay()
    torch.npu.synchronize()
    assert dst.cpu().tolist() == torch.arange(1024.0).tolist()
    del other


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_precision_models_replay_again_and_again(dtype):
    # A 16-bit op with a Python scalar (ATen folds the scalar into its loop, changing the op's
    # TensorIterator) and a layer norm (whose statistics' dtype the Meta and CPU kernels give
    # differently) replay as often as asked, each replay as the eager step.
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(32).npu().to(dtype)
    linear = torch.nn.Linear(32, 32).npu().to(dtype)
    static_x = torch.randn(4, 32, device="npu").to(dtype)

    def step(x):
        h = norm(x) * 0.5
        return linear(torch.exp(-0.6 * torch.sigmoid(h)) / 3)

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        static_y = step(static_x)
    for _ in range(3):
        x = torch.randn(4, 32, device="npu").to(dtype)
        static_x.copy_(x)
        g.replay()
        torch.testing.assert_close(static_y, step(x))

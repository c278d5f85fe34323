"""torchair and npugraph_ex, the Ascend adapter's graph-mode modules, on this project's compile
paths: each mode against eager results on the cpu, the options that take effect, the ones that
warn, the config's checks, and the way vllm-ascend's compiler interface calls them."""
import copy
import functools
import os
import warnings

import pytest
import torch
import torch.nn as nn

import torch_npu  # noqa: F401
from helpers import REPO_ROOT

import npugraph_ex  # noqa: E402  (provided by torch_npu)
import torchair  # noqa: E402
from npugraph_ex import npu_fx_compiler as nfx  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    nfx._warned.clear()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def torchair_backend(mode, **debug):
    config = torchair.CompilerConfig()
    config.mode = mode
    for name, value in debug.items():
        setattr(config.debug, name, value)
    return torchair.get_npu_backend(compiler_config=config)


@pytest.fixture
def compiled_graphs(monkeypatch):
    """Every graph the compiler compiles (wrapping _NpuFxCompiler._get_compiled_gm, as vllm-ascend does)."""
    graphs = []
    original = nfx._NpuFxCompiler._get_compiled_gm

    def recording(self, gm, example_inputs):
        compiled = original(self, gm, example_inputs)
        graphs.append(compiled)
        return compiled

    monkeypatch.setattr(nfx._NpuFxCompiler, "_get_compiled_gm", recording)
    return graphs


# ---- the modules ------------------------------------------------------------------------------------

@pytest.mark.child_process
def test_torchair_and_npugraph_ex_import_in_a_fresh_interpreter(run_python):
    out = run_python("""
        import sys
        import torch                      # torch's autoload entry point imports torch_npu
        assert "torch_npu" in sys.modules
        assert "torch_npu._compile.torchair" not in sys.modules   # lazy: nothing loaded yet
        import torchair, npugraph_ex
        config = torchair.CompilerConfig()
        assert "torch._inductor" not in sys.modules               # the config needs no compiler
        from torchair.configs.compiler_config import CompilerConfig
        from npugraph_ex.configs.compiler_config import _process_kwargs_options
        import npugraph_ex.npu_fx_compiler as nfx
        assert nfx is sys.modules["torch_npu._compile.npugraph_ex.npu_fx_compiler"]   # one module, not a copy
        assert CompilerConfig is type(config) and nfx._NpuFxCompiler._get_compiled_gm
        print(sorted(set(torchair.__all__) - set(dir(torchair))), sorted(set(npugraph_ex.__all__) - set(dir(npugraph_ex))))
        try:
            import torchair.no_such_module
        except ModuleNotFoundError as e:
            print(e)
    """)
    assert out.stdout.splitlines() == ["[] []", "No module named 'torchair.no_such_module'"]


def test_dynamo_backend_names():
    names = torch._dynamo.list_backends()
    assert {"npu", "npugraphs", "npugraph_ex"} <= set(names)


@pytest.mark.child_process
def test_dynamo_entry_points_load_the_backends_without_autoload(tmp_path, run_python):
    """pyproject's torch_dynamo_backends entry points (as an installed dist-info lists them):
    with torch_npu not imported, backend="npugraph_ex" and "npu" import it and compile."""
    import tomllib
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        points = tomllib.load(f)["project"]["entry-points"]["torch_dynamo_backends"]
    assert set(points) == {"npu", "npugraphs", "npugraph_ex"}
    info = tmp_path / "torch_npu_backends-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu_backends\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[torch_dynamo_backends]\n"
                                           + "".join(f"{k} = {v}\n" for k, v in points.items()))
    out = run_python(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch
        assert "torch_npu" not in sys.modules
        f = lambda x: (x * 2).sin()
        x = torch.randn(4)
        for name in ("npugraph_ex", "npu", "npugraphs"):
            torch.testing.assert_close(torch.compile(f, backend=name)(x), f(x))
        import torchair
        print("torch_npu" in sys.modules, torchair.CompilerConfig().mode.value)
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert out.stdout.split() == ["True", "max-autotune"]


# ---- each mode against the cpu -------------------------------------------------------------------------

MODES = {
    "torchair max-autotune": lambda: torchair_backend("max-autotune"),
    "torchair reduce-overhead": lambda: torchair_backend("reduce-overhead"),
    "torchair npugraph_ex": lambda: torchair_backend("npugraph_ex"),
    "torchair run_eagerly": lambda: torchair_backend("max-autotune", run_eagerly=True),
    "npugraph_ex.get_npu_backend": lambda: npugraph_ex.get_npu_backend(compiler_config=npugraph_ex.CompilerConfig()),
    'backend="npugraph_ex"': lambda: "npugraph_ex",
    'backend="npu"': lambda: "npu",
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_matches_the_cpu_forward_and_backward(mode):
    model = tiny_model()
    npu_model = copy.deepcopy(model).npu()
    compiled = torch.compile(npu_model, backend=MODES[mode]())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # reduce-overhead's deprecation (tested below)
        for step in range(3):                                  # warm-up, capture, replay
            x = torch.randn(5, 8)
            npu_model.zero_grad()
            out = compiled(x.npu())
            out.square().sum().backward()
            model.zero_grad()
            ref = model(x)
            ref.square().sum().backward()
            close(out.detach().cpu(), ref.detach())
            for p, q in zip(npu_model.parameters(), model.parameters()):
                close(p.grad.cpu(), q.grad, 1e-4)


def test_npugraph_ex_captures_once_per_shape_and_replays(compiled_graphs):
    model = tiny_model().npu()
    compiled = torch.compile(model, backend="npugraph_ex")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(3, 8, device="npu")
            close(compiled(x), model(x))
    (graph,) = compiled_graphs
    assert graph.runner.captures == 1 and len(graph.runner.captured) == 1


def test_capture_limit_force_recapture_and_force_eager(compiled_graphs):
    f = lambda x: (x.sin() * 2).cos()  # noqa: E731
    g = torch.compile(f, backend="npugraph_ex", options={"capture_limit": 1}, dynamic=True)
    with pytest.warns(RuntimeWarning, match="capture limit"):
        for n in (2, 2, 2, 3, 3, 3):
            x = torch.randn(n, device="npu")
            close(g(x), f(x))
    (graph,) = compiled_graphs            # one graph for every length (dynamic=True), one capture
    assert graph.runner.captures == 1

    torch._dynamo.reset()
    compiled_graphs.clear()
    g = torch.compile(f, backend="npugraph_ex", options={"force_recapture": True})
    for _ in range(4):
        x = torch.randn(4, device="npu")
        close(g(x), f(x))
    assert compiled_graphs[0].runner.captures == 3   # every call after the warm-up

    torch._dynamo.reset()
    compiled_graphs.clear()
    g = torch.compile(f, backend="npugraph_ex", options={"force_eager": True})
    for _ in range(3):
        x = torch.randn(4, device="npu")
        close(g(x), f(x))
    assert not hasattr(compiled_graphs[0].runner, "captures")   # run as compiled, no graph


def test_clone_output_and_clone_input(compiled_graphs):
    f = lambda x: x * 3 + 1  # noqa: E731
    # clone_output=False (the default): the graph's own output, overwritten by the next replay.
    g = torch.compile(f, backend="npugraph_ex")
    g(torch.ones(4, device="npu"))
    first = g(torch.ones(4, device="npu"))
    second = g(torch.zeros(4, device="npu"))
    assert first.data_ptr() == second.data_ptr() and torch.equal(first.cpu(), torch.ones(4))
    torch._dynamo.reset()
    g = torch.compile(f, backend="npugraph_ex", options={"clone_output": True})
    g(torch.ones(4, device="npu"))
    first = g(torch.ones(4, device="npu"))
    second = g(torch.zeros(4, device="npu"))
    assert first.data_ptr() != second.data_ptr() and torch.equal(first.cpu(), torch.full((4,), 4.0))

    # clone_input=False: the graph reads the caller's tensor itself; another tensor is another capture.
    torch._dynamo.reset()
    compiled_graphs.clear()
    g = torch.compile(f, backend="npugraph_ex", options={"clone_input": False, "clone_output": True})
    x = torch.ones(4, device="npu")
    g(x)
    g(x)
    x.fill_(2.0)
    close(g(x).cpu(), torch.full((4,), 7.0))
    runner = compiled_graphs[0].runner
    (_, static_inputs, _), = runner.captured.values()
    assert any(t is x for t in static_inputs)
    y = torch.full((4,), 5.0, device="npu")
    g(y)
    close(g(y).cpu(), torch.full((4,), 16.0))
    assert runner.captures == 2


def test_frozen_parameter_keeps_parameters_in_place(compiled_graphs):
    model = nn.Linear(4, 4).npu()
    for frozen in (False, True):
        torch._dynamo.reset()
        compiled_graphs.clear()
        g = torch.compile(model, backend="npugraph_ex", options={"frozen_parameter": frozen})
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 4, device="npu")
                close(g(x), model(x))
        assert bool(compiled_graphs[0].runner.static) == frozen


def test_graph_pool_options():
    f = lambda x: x.exp()  # noqa: E731
    pool = torch.npu.graph_pool_handle()
    for options, expected in (({}, "shared"), ({"reuse_graph_pool_in_same_fx": False}, None),
                              ({"use_graph_pool": pool}, pool)):
        config = npugraph_ex.CompilerConfig()
        npugraph_ex.configs.compiler_config._process_kwargs_options(config, {"options": options})
        s = nfx._settings(config)
        assert s.pool == expected
    torch._dynamo.reset()
    g = torch.compile(f, backend="npugraph_ex", options={"use_graph_pool": pool})
    for _ in range(3):
        x = torch.randn(3, device="npu")
        close(g(x), f(x))


# ---- the FX passes the options switch ------------------------------------------------------------------

def _targets(seen):
    def post_pass(gm):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
    return post_pass


def test_remove_noop_ops_and_the_custom_passes():
    def f(x):
        return torch.cat([x.repeat(1, 1)]) + 1          # repeat by ones and a one-tensor cat: noops
    for remove in (True, False):
        seen = []
        torch._dynamo.reset()
        g = torch.compile(f, backend="npugraph_ex",
                          options={"remove_noop_ops": remove, "post_grad_custom_post_pass": _targets(seen)})
        x = torch.randn(3, 4, device="npu")
        close(g(x), f(x))
        assert (torch.ops.aten.repeat.default in seen[0]) is not remove, seen[0]


def _add_becomes_sub(gm):
    for node in gm.graph.nodes:
        if node.target == torch.ops.aten.add.Tensor:
            node.target = torch.ops.aten.sub.Tensor
    gm.recompile()


@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead", "npugraph_ex"])
def test_the_custom_pre_pass_takes_effect_in_every_mode(mode):
    config = torchair.CompilerConfig()
    config.mode = mode
    config.post_grad_custom_pre_pass = _add_becomes_sub
    g = torch.compile(lambda x, y: x + y, backend=torchair.get_npu_backend(compiler_config=config))
    x, y = torch.randn(4), torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for _ in range(3):
            close(g(x.npu(), y.npu()).cpu(), x - y)


@functools.cache
def _add_one_op():
    @torch.library.custom_op("torchair_test::add_one_", mutates_args=("x",))
    def add_one_(x: torch.Tensor) -> None:
        x.add_(1)
    return add_one_


def test_inplace_pass_runs_a_mutating_op_in_place():
    add_one_ = _add_one_op()

    def f(x):
        y = x * 2
        add_one_(y)
        return y
    for inplace in (True, False):
        seen = []
        torch._dynamo.reset()
        g = torch.compile(f, backend="npugraph_ex",
                          options={"inplace_pass": inplace, "force_eager": True, "post_grad_custom_post_pass":
                                   _targets(seen)})
        x = torch.randn(4, device="npu")
        close(g(x), x * 2 + 1)
        hops = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)
        in_place = torch.ops.torchair_test.add_one_.default in seen[0]
        on_a_copy = any(t in hops for t in seen[0])      # the functional form: the op mutates a clone
        assert (in_place, on_a_copy) == (inplace, not inplace), seen[0]
        assert torch.ops.aten.clone.default not in seen[0]


@pytest.mark.child_process
def test_register_replacement_replaces_a_pattern(run_python):
    out = run_python("""
        import torch, torch_npu, npugraph_ex, torchair
        import npugraph_ex.npu_fx_compiler as nfx

        def search(x):
            return torch.tanh(x) * 3.0
        def replace(x):
            return torch.sigmoid(x)            # a different function: the replacement shows in the result
        npugraph_ex.register_replacement(search_fn=search, replace_fn=replace, example_inputs=[torch.randn(4)])
        x = torch.randn(8, device="npu")
        f = lambda x: torch.tanh(x) * 3.0 + 1
        for backend in ("npugraph_ex", torchair.get_npu_backend()):      # aclgraph mode and max-autotune
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(f, backend=backend)(x), torch.sigmoid(x) + 1)
        torch._dynamo.reset()
        off = torch.compile(f, backend="npugraph_ex", options={"pattern_fusion_pass": False})
        torch.testing.assert_close(off(x), f(x))
        # extra_check decides per match
        torchair.register_replacement(search_fn=lambda x: torch.cos(x) * 5.0, replace_fn=lambda x: torch.sin(x),
                                      example_inputs=[torch.randn(4)], extra_check=lambda match: False)
        torch._dynamo.reset()
        g = lambda x: torch.cos(x) * 5.0
        torch.testing.assert_close(torch.compile(g, backend="npugraph_ex")(x), g(x))
        print("ok")
    """, env={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    assert out.stdout.strip() == "ok"


# ---- the config: checks, warnings -------------------------------------------------------------------------

def test_config_assignments_are_checked():
    config = torchair.CompilerConfig()
    with pytest.raises(ValueError, match=r"_DebugConfig has no option run_eagerlyy, all options \[.*run_eagerly"):
        config.debug.run_eagerlyy = True
    with pytest.raises(ValueError, match="CompilerConfig has no option modes"):
        config.modes = "npugraph_ex"
    with pytest.raises(ValueError, match="not in optional list"):
        config.mode = "fast"
    with pytest.raises(ValueError, match="out of range"):
        config.debug.aclgraph.static_capture_size_limit = 0
    with pytest.raises(TypeError, match="int list"):
        config.experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range = [1, "2"]
    config.debug.aclgraph.clone_input = False
    assert config.debug.aclgraph.clone_input.value == "0" and config.mode.value == "max-autotune"
    assert config != torchair.CompilerConfig()
    flat = npugraph_ex.CompilerConfig()
    assert flat.clone_input.value is True and flat.capture_limit.value == 64
    with pytest.raises(ValueError, match="not in optional list"):
        flat.mode = "max-autotune"
    with pytest.raises(ValueError, match="Invalid option 'capture_limt'.*capture_limit"):
        npugraph_ex.configs.compiler_config._process_kwargs_options(flat, {"options": {"capture_limt": 2}})


def test_unknown_torch_compile_option_fails_naming_it():
    g = torch.compile(lambda x: x + 1, backend="npugraph_ex", options={"no_such_option": 1})
    with pytest.raises(Exception, match="Invalid option 'no_such_option'"):
        g(torch.randn(2, device="npu"))


def test_torchair_takes_npugraph_ex_option_names():
    config = torchair.CompilerConfig()
    from torchair.configs.compiler_config import _process_kwargs_options
    _process_kwargs_options(config, {"options": {"inplace_pass": False, "capture_limit": 3, "force_eager": True}})
    assert bool(config.debug.aclgraph.disable_reinplace_inplaceable_ops_pass)
    assert config.debug.aclgraph.static_capture_size_limit.value == 3 and bool(config.debug.run_eagerly)
    with pytest.raises(ValueError, match="Invalid option 'nope'"):
        _process_kwargs_options(config, {"options": {"nope": 1}})


def _compile_and_run(backend, **options):
    g = torch.compile(lambda x: x * 2, backend=backend, **options)
    for _ in range(2):
        g(torch.randn(3, device="npu"))


def test_unhonoured_options_warn_once_saying_what_they_do_on_the_chip():
    with pytest.warns(UserWarning, match=r"static_kernel_compile = True .*not honoured.*On the chip: compiles aclnn "
                                         r"kernels specialised"):
        _compile_and_run("npugraph_ex", options={"static_kernel_compile": True})
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compile_and_run("npugraph_ex", options={"static_kernel_compile": True})
    assert not [w for w in caught if "static_kernel_compile" in str(w.message)]   # once per option

    config = torchair.CompilerConfig()
    config.ge_config.oo_level = "O1"                        # GE: not in max-autotune here
    config.debug.aclgraph.clone_input = False               # aclgraph-only: no effect in max-autotune
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compile_and_run(torchair.get_npu_backend(compiler_config=config))
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any("ge_config.oo_level = 'O1'" in m and "GE" in m for m in messages), messages
    assert any("debug.aclgraph.clone_input = False" in m and "aclgraph modes" in m for m in messages), messages


@pytest.mark.parametrize("backend, option, value", [
    ("npugraph_ex", "input_inplace_pass", False), ("npugraph_ex", "remove_cat_ops", False),
    ("torchair", "debug.aclgraph.disable_reinplace_input_mutated_ops_pass", True),
    ("torchair", "debug.aclgraph.remove_cat_ops", False)])
def test_rewrites_never_done_here_warn_when_switched(backend, option, value):
    # read by nothing here: not listed as honoured, so a non-default value warns saying so
    nfx._warned.discard(option)
    torch._dynamo.reset()
    if backend == "npugraph_ex":
        run = lambda: _compile_and_run("npugraph_ex", options={option: value})  # noqa: E731
    else:
        config = torchair.CompilerConfig()
        config.mode = "npugraph_ex"
        node = config
        *parents, leaf = option.split(".")
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
        run = lambda: _compile_and_run(torchair.get_npu_backend(compiler_config=config))  # noqa: E731
    with pytest.warns(UserWarning, match=rf"{option} = {value} .*not honoured.*never does this rewrite"):
        run()


def test_torch_compile_options_do_not_leak_into_the_callers_config():
    config = npugraph_ex.CompilerConfig()
    backend = nfx.get_npu_backend(compiler_config=config)
    torch._dynamo.reset()
    g = torch.compile(lambda x: x * 2, backend=backend, options={"force_eager": True, "capture_limit": 3})
    torch.testing.assert_close(g(torch.ones(3, device="npu")).cpu(), torch.full((3,), 2.0))
    assert not bool(config.force_eager) and config.capture_limit.value != 3   # the caller's config untouched
    tconfig = torchair.CompilerConfig()
    torch._dynamo.reset()
    g = torch.compile(lambda x: x + 1, backend=torchair.get_npu_backend(compiler_config=tconfig),
                      options={"force_eager": True})
    torch.testing.assert_close(g(torch.ones(3, device="npu")).cpu(), torch.full((3,), 2.0))
    assert not bool(tconfig.debug.run_eagerly)


def test_honoured_options_do_not_warn_and_every_option_is_classified():
    for config, modes in ((torchair.CompilerConfig(), ("max-autotune", "aclgraph")),
                          (npugraph_ex.CompilerConfig(), ("npugraph_ex_config",))):
        for path, _ in config.leaves():
            for mode in modes:
                assert path in nfx._HONOURED[mode] or path in nfx._ON_THE_CHIP, (path, mode)
    config = torchair.CompilerConfig()
    config.mode = "npugraph_ex"
    config.debug.aclgraph.static_capture_size_limit = 8
    config.debug.aclgraph.enable_output_clone = True
    config.experimental_config.remove_noop_ops = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_and_run(torchair.get_npu_backend(compiler_config=config))


def test_reduce_overhead_is_deprecated_as_on_the_adapter():
    with pytest.warns(DeprecationWarning, match="npugraph_ex"):
        _compile_and_run(torchair_backend("reduce-overhead"))


def test_ge_only_names_are_accepted_or_refused_by_name():
    from torchair import ge
    with pytest.warns(UserWarning, match="GE converters are accepted but not used"):
        @torchair.register_fx_node_ge_converter(torch.ops.aten.add.Tensor)
        def convert(x: ge.Tensor, y: ge.Tensor) -> ge.Tensor:
            return ge.custom_op("Add", inputs={"x": x, "y": y}, outputs=["z"])
    with pytest.raises(RuntimeError, match="custom_op: building GE graph operators needs the chip's graph engine"):
        ge.custom_op("Add")
    with pytest.raises(RuntimeError, match="dynamo_export.*GE"):
        torchair.dynamo_export(lambda x: x)
    assert ge.DataType.DT_FLOAT16 == 1 and ge.DataType.DT_BF16 == 27


# ---- vllm-ascend's compiler interface ------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


def _dynamo_graph(model, x):
    captured = []

    def grab(gm, example_inputs):
        captured.append((gm, example_inputs))
        return gm.forward
    torch.compile(model, backend=grab)(x)
    return captured[0]


def _vllm_ascend_npugraph_ex_compile(graph, example_inputs, cache_dir, enable_static_kernel, use_torchair):
    """vllm_ascend/compilation/compiler_interface.py's npugraph_ex_compile, as written there
    (npugraph_ex first, torchair when it is missing), with its _configure_backend."""
    from torch._inductor.compile_fx import graph_returns_tuple, make_graph_return_tuple

    def configure(config, process_kwargs_options=None):
        if process_kwargs_options is not None:
            options = {"force_eager": True, "inplace_pass": False, "clone_input": False, "clone_output": False}
            if enable_static_kernel:
                options["static_kernel_compile"] = True
                options["_vllm_aclnn_static_kernel_sym_range"] = [1, 2, 4]
            process_kwargs_options(config, {"options": options})
        else:
            config.mode = "reduce-overhead"
            config.debug.run_eagerly = True
            config.debug.aclgraph.disable_reinplace_inplaceable_ops_pass = True
            if enable_static_kernel:
                config.experimental_config.aclgraph._aclnn_static_shape_kernel = True
                config.experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range = [1, 2, 4]

    try:
        if use_torchair:
            raise ImportError("npugraph_ex (taking vllm-ascend's torchair branch)")
        import npugraph_ex as nge
        cache_path = os.path.join(cache_dir, "graph_0")
        torch.npu.set_compile_mode(jit_compile=False)
        config = nge.CompilerConfig()
        try:
            from npugraph_ex.configs.compiler_config import _process_kwargs_options
        except ImportError:
            from npugraph_ex.configs.npugraphex_config import _process_kwargs_options
        configure(config, process_kwargs_options=_process_kwargs_options)
        import npugraph_ex.npu_fx_compiler as nfx_
        original = nfx_._NpuFxCompiler._get_compiled_gm

        def patched_get_compiled_gm(self, graph, example_inputs):
            compiled_gm = original(self, graph, example_inputs)
            py_code = compiled_gm.get_code()
            if py_code and "triton_kernel_wrapper" not in py_code:
                os.makedirs(os.path.dirname(cache_path), exist_ok=True)
                with open(cache_path, "w") as f:
                    f.write(py_code)
            return compiled_gm

        nfx_._NpuFxCompiler._get_compiled_gm = patched_get_compiled_gm
        try:
            backend = nge.get_npu_backend(compiler_config=config)
            if not graph_returns_tuple(graph):
                compiled_fn = make_graph_return_tuple(graph, example_inputs, backend)
            else:
                compiled_fn = backend(graph, example_inputs)
        finally:
            nfx_._NpuFxCompiler._get_compiled_gm = original
        return compiled_fn, cache_path
    except ImportError:
        import torchair as ta
        torch.npu.set_compile_mode(jit_compile=False)
        config = ta.CompilerConfig()
        configure(config)
        backend = ta.get_npu_backend(compiler_config=config)
        if not graph_returns_tuple(graph):
            compiled_fn = make_graph_return_tuple(graph, example_inputs, backend)
        else:
            compiled_fn = backend(graph, example_inputs)
        return compiled_fn, None


@pytest.mark.parametrize("use_torchair", [False, True], ids=["npugraph_ex", "torchair"])
@pytest.mark.parametrize("enable_static_kernel", [False, True], ids=["plain", "static_kernel"])
def test_vllm_ascend_compiler_interface_end_to_end(tmp_path, use_torchair, enable_static_kernel):
    torch.manual_seed(0)
    block = _Block()
    npu_block = copy.deepcopy(block).npu()
    x = torch.randn(4, 8)
    with torch.no_grad():
        graph, example_inputs = _dynamo_graph(npu_block, x.npu())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled_fn, cache_path = _vllm_ascend_npugraph_ex_compile(graph, example_inputs, str(tmp_path),
                                                                       enable_static_kernel, use_torchair)
        static_warnings = [str(w.message) for w in caught if "static" in str(w.message)]
        assert bool(static_warnings) == enable_static_kernel, static_warnings
        inputs = [t for t in example_inputs]            # the graph's inputs: the parameters and x
        if cache_path is not None:                      # vllm-ascend's load of its cache, in place of a compile
            from npugraph_ex.npu_fx_compiler import _CompiledFxArtifacts, _CompiledFxGraph
            artifacts = _CompiledFxArtifacts()
            artifacts.py_code = open(cache_path).read()
            (loaded,) = _CompiledFxGraph.load_artifacts(artifacts)(*inputs)
            close(loaded.cpu(), block(x))
        static_x = next(t for t in inputs if t.shape == (4, 8) and not isinstance(t, nn.Parameter))
        (out,) = compiled_fn(*inputs)
        close(out.cpu(), block(x))
        # vllm-ascend captures the compiled graph in its own npu graph (force_eager: no graph inside).
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            (static_out,) = compiled_fn(*inputs)
        x2 = torch.randn(4, 8)
        static_x.copy_(x2.npu())
        g.replay()
        close(static_out.cpu(), block(x2))


def test_msprobe_dump_configs(tmp_path, run_python):
    """msprobe's set_fx_dump_config: the FX data dump is written as msprobe's torchair compare
    reads it; set_ge_dump_config (GE's dump) is accepted with warnings, the model runs. (In a
    fresh interpreter: importing msprobe.pytorch changes torch.load's safe globals.)"""
    pytest.importorskip("msprobe")
    run_python(f"""
        import pathlib, warnings
        import numpy as np
        import pytest, torch, torch_npu, torchair
        from msprobe.pytorch.torchair_dump import torchair_dump
        tmp_path = pathlib.Path({str(tmp_path)!r})
        close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        f = lambda x, w: (x @ w).relu()
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        config = torchair_dump.set_ge_dump_config(dump_path=str(tmp_path / "ge"))
        with pytest.warns(UserWarning, match="dump_config.enable_dump"):
            g = torch.compile(f, backend=torchair.get_npu_backend(compiler_config=config))
            close(g(x.npu(), w.npu()).cpu(), f(x, w))

        torch._dynamo.reset()
        config = torchair_dump.set_fx_dump_config(dump_path=str(tmp_path / "fx"))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)    # honoured: no warning
            g = torch.compile(f, backend=torchair.get_npu_backend(compiler_config=config))
            for _ in range(2):
                close(g(x.npu(), w.npu()).cpu(), f(x, w))
        files = sorted(p.relative_to(tmp_path / "fx") for p in (tmp_path / "fx").rglob("*.npy"))
        mm_out = [p for p in files if "-aten.mm.default.OUTPUT.0." in p.name]
        assert [p.parts[-2] for p in mm_out] == ["0", "1"], files        # one directory per step
        assert mm_out[0].parts[1] == "worldsize1_global_rank0"
        close(torch.from_numpy(np.load(tmp_path / "fx" / mm_out[1])), x @ w)
        mm_in = sorted(p.name.split(".INPUT.")[1][0] for p in files if "-aten.mm.default.INPUT." in p.name
                       and p.parts[-2] == "0")
        assert mm_in == ["0", "1"]
    """)

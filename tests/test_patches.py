"""torch_npu._patches: every change can be undone, by group, whatever the order."""
import types

from torch_npu import _patches


def test_layers_of_two_groups_undo_in_any_order():
    class Base:
        def method(self):
            return "own"

    class Owner(Base):
        pass

    owner = types.SimpleNamespace(value="own")
    table = {}
    _patches.patch(owner, "value", "first", "group-a")
    _patches.patch(owner, "value", "first again", "group-a")           # same group: one layer
    _patches.wrap(owner, "value", lambda v: f"second over {v}", "group-b")
    _patches.wrap(owner, "value", lambda v: "never made", "group-b")   # once per group
    _patches.patch(Owner, "method", lambda self: "patched", "group-b")  # inherited: undo deletes
    _patches.patch(table, 1, "entry", "group-a")                       # a dict: name is a key
    assert owner.value == "second over first again" and Owner().method() == "patched" and table == {1: "entry"}
    assert _patches.original(owner, "value") == "own"
    assert _patches.applied("group-b") == ["group-b: SimpleNamespace.value", "group-b: Owner.method"]

    assert _patches.undo("group-a") == 2           # the older layer: the newer value stays
    assert owner.value == "second over first again" and table == {}
    assert _patches.undo("group-b") == 2           # and now restores what group-a had replaced
    assert owner.value == "own" and Owner().method() == "own" and "method" not in vars(Owner)
    assert _patches.applied("group-a") == _patches.applied("group-b") == []


def test_compile_and_profiler_changes_are_undone_by_their_groups(run_python):
    # A fresh process without autoload: PyTorch's own objects are captured before torch_npu changes them.
    proc = run_python("""
        import sys
        import torch
        assert "torch_npu" not in sys.modules
        from torch.autograd import profiler as autograd_profiler
        from torch.autograd.profiler_util import FunctionEvent, FunctionEventAvg
        profiler_classes = (autograd_profiler.profile, FunctionEvent, FunctionEventAvg)
        profiler_before = [dict(vars(cls)) for cls in profiler_classes]

        import torch_npu
        from torch_npu import _patches
        profiler_changes = _patches.applied("profiler")
        assert "profiler: profile.__init__" in profiler_changes, profiler_changes
        assert "profiler: FunctionEvent.npu_time_total" in profiler_changes, profiler_changes
        assert "profiler: FunctionEventAvg.self_npu_time_total" in profiler_changes, profiler_changes

        # Loading dynamo registers the backend (import hook); inductor's own objects are changed at the
        # first npu compilation (inductor's backend registration reads torch.npu.Scheduling).
        import torch._inductor.graph, torch._inductor.lowering, torch._inductor.scheduler
        from torch._dynamo.exc import BackendCompilerFailed
        assert _patches.applied("compile") == ["compile: BackendCompilerFailed.__init__"], _patches.applied("compile")
        own_init = _patches.original(BackendCompilerFailed, "__init__")
        assert own_init.__module__ == "torch._dynamo.exc" and own_init is not BackendCompilerFailed.__init__

        def inductor_modules():
            return {n: m for n, m in list(sys.modules.items()) if n.startswith("torch._inductor") and m is not None}
        classes = (torch._inductor.scheduler.BaseSchedulerNode, torch._inductor.graph.GraphLowering)
        modules_before = {n: dict(vars(m)) for n, m in inductor_modules().items()}
        classes_before = [dict(vars(cls)) for cls in classes]
        lowerings = torch._inductor.lowering.lowerings
        lowerings_before = dict(lowerings)

        f = torch.compile(lambda x: torch.cat([x.sin(), x / 3]).argmax(), backend="npu")
        x = torch.randn(8, device="npu")
        assert f(x).item() == torch.cat([x.sin(), x / 3]).argmax().item()

        compile_changes = _patches.applied("compile")
        for expected in ("compile: BackendCompilerFailed.__init__", "compile: BaseSchedulerNode.is_cpu",
                         "compile: GraphLowering.decide_layout_opt", "compile: torch._inductor.lowering.is_triton",
                         "compile: torch._inductor.ir.is_cpu", "compile: torch._inductor.utils.get_current_backend",
                         "compile: torch._inductor.lowering.pointwise_cat"):
            assert expected in compile_changes, (expected, compile_changes)
        assert any(c.startswith("compile: dict[") for c in compile_changes), compile_changes  # lowerings
        ours = [p.replacement for p in _patches._order if p.group == "compile"]   # kept alive: ids stay theirs
        replacements = {id(r) for r in ours}
        assert lowerings is torch._inductor.lowering.lowerings
        assert any(id(v) in replacements for v in lowerings.values())

        assert _patches.undo("compile") == len(compile_changes) and _patches.applied("compile") == []
        assert _patches.undo("profiler") == len(profiler_changes) and _patches.applied("profiler") == []

        def changed(was, now):
            return sorted(str(k) for k in set(was) | set(now) if was.get(k, None) is not now.get(k, None))
        for cls, was in zip(profiler_classes, profiler_before):
            assert not changed(was, dict(vars(cls))), (cls, changed(was, dict(vars(cls))))
        for cls, was in zip(classes, classes_before):
            assert not changed(was, dict(vars(cls))), (cls, changed(was, dict(vars(cls))))
        assert BackendCompilerFailed.__init__ is own_init
        assert not changed(lowerings_before, lowerings)
        for name, module in inductor_modules().items():
            assert not [k for k, v in vars(module).items() if id(v) in replacements], name
            if name in modules_before:   # its functions and classes (its counters and caches are its own business)
                was = {k: v for k, v in modules_before[name].items() if callable(v) and type(v) is not type(sys)}
                now = {k: v for k, v in vars(module).items() if callable(v) and type(v) is not type(sys)}
                assert not changed(was, now), (name, changed(was, now))
        assert not hasattr(FunctionEvent, "npu_time_total")
        error = BackendCompilerFailed(lambda *a: None, RuntimeError("boom"), None)
        assert "fallback" not in str(error)
        print("OK")
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=600)
    assert "OK" in proc.stdout

"""torch_npu._patches: every change can be undone, by group, whatever the order; every
change says why, against which torch it was checked and what PyTorch's object looks like."""
import json
import types

import pytest

from torch_npu import _patches
from helpers import last_line

# The keyword arguments every change carries (a synthetic target: any description does).
WHY = dict(reason="a test", checked=("2.13",))


def test_layers_of_two_groups_undo_in_any_order():
    class Base:
        def method(self):
            return "own"

    class Owner(Base):
        pass

    owner = types.SimpleNamespace(value="own")
    table = {}
    _patches.patch(owner, "value", "first", "group-a", expects="str", **WHY)
    _patches.patch(owner, "value", "first again", "group-a", expects="str", **WHY)          # same group: one layer
    _patches.wrap(owner, "value", lambda v: f"second over {v}", "group-b", expects="str", **WHY)
    _patches.wrap(owner, "value", lambda v: "never made", "group-b", expects="str", **WHY)  # once per group
    # inherited: undo deletes the patch
    _patches.patch(Owner, "method", lambda self: "patched", "group-b", expects="(self)", **WHY)
    _patches.patch(table, 1, "entry", "group-a", expects=_patches.ABSENT, **WHY)            # a dict: name is a key
    assert owner.value == "second over first again" and Owner().method() == "patched" and table == {1: "entry"}
    assert _patches.original(owner, "value") == "own"
    assert _patches.applied("group-b") == ["group-b: SimpleNamespace.value", "group-b: Owner.method"]

    assert _patches.undo("group-a") == 2           # the older layer: the newer value stays
    assert owner.value == "second over first again" and table == {}
    assert _patches.undo("group-b") == 2           # and now restores what group-a had replaced
    assert owner.value == "own" and Owner().method() == "own" and "method" not in vars(Owner)
    assert _patches.applied("group-a") == _patches.applied("group-b") == []


def test_every_change_says_why_and_what_it_expects():
    owner = types.SimpleNamespace(value="own")
    with pytest.raises(TypeError, match="reason"):
        _patches.patch(owner, "value", "new", "group-c", checked=("2.13",), expects="str")
    with pytest.raises(TypeError, match="expects"):
        _patches.wrap(owner, "value", lambda v: v, "group-c", **WHY)
    for bad in ({"reason": ""}, {"reason": "two\nlines"}, {"checked": "2.13"}, {"checked": ()},
                {"checked": ("2",)}, {"expects": None}):
        with pytest.raises(ValueError):
            _patches.patch(owner, "value", "new", "group-c", **{**WHY, "expects": "str", **bad})
    assert owner.value == "own" and _patches.applied("group-c") == []

    # A target that is not what the change expects: a warning when it is made.
    with pytest.warns(_patches.TorchInternalsChanged, match="expected int, found str"):
        _patches.patch(owner, "value", "new", "group-c", expects="int", **WHY)
    entry, = _patches.ledger("group-c")
    assert (entry.expects, entry.found(), entry.reason, entry.checked) == ("int", "str", "a test", ("2.13",))
    assert _patches.undo("group-c") == 1 and owner.value == "own"


def test_describe_says_what_a_change_relies_on():
    import torch

    class Example:
        @staticmethod
        def static(gm, *, is_inference):
            pass

        def method(self, x: int = 1, *args, key=None, **kwargs) -> int:   # annotations left out
            return x

    assert _patches.describe(Example.method) == "(self, x=1, *args, key=None, **kwargs)"
    assert _patches.describe(vars(Example)["static"]) == "staticmethod (gm, *, is_inference)"
    assert _patches.describe(Example) == "class (metaclass type)"
    assert _patches.describe(torch.zeros) == "builtin_function_or_method"
    assert _patches.describe(torch.Tensor.to) == "method_descriptor"
    assert _patches.describe(property(lambda self: 1)) == "property"
    assert _patches.describe(()) == "tuple"
    assert _patches.describe(_patches._ABSENT) == _patches.ABSENT


def test_changes_made_outside_python_are_recorded():
    state = {"on": True}
    entry = _patches.record("a switch", group="group-d", undo=lambda: state.update(on=False), **WHY)
    kept = _patches.record("a C++ change", group="group-d", **WHY)   # no undo: it stays
    assert _patches.record("a switch", group="group-d", **WHY) is entry  # once
    assert _patches.applied("group-d") == ["group-d: a switch", "group-d: a C++ change"]
    assert entry.found() is None and entry.expects is None
    with pytest.raises(ValueError, match="expects"):   # a Python target needs its expectation
        _patches.record("a target", group="group-d", target=(types, "SimpleNamespace"), **WHY)
    assert _patches.undo("group-d") == 1 and state == {"on": False}
    assert _patches.ledger("group-d") == [kept]
    _patches._order.remove(kept)   # (a test's own record: gone with it)


# Run in a child: loads every feature that changes PyTorch (those that do so lazily
# included), then checks every entry of the ledger against the running torch.
LEDGER_CHECK = r"""
import warnings
warnings.simplefilter("error", RuntimeWarning)   # a TorchInternalsChanged warning when a change is made fails
import torch, torch_npu
from torch_npu import _patches

import torch._dynamo, torch._inductor                  # the compile group: dynamo's registry ...
torch.npu.Scheduling                                   # ... and inductor's backend registration
import torch_npu.contrib.transfer_to_npu               # the transfer_to_npu group
from torch_npu.doctor import Doctor

def problems():
    version = _patches.torch_version()
    found = []
    for entry in _patches.ledger():
        if not entry.reason or "\n" in entry.reason:
            found.append(f"{entry.group}: {entry.name}: no one-line reason")
        if version not in entry.checked:
            found.append(f"{entry.group}: {entry.name}: checked against torch {entry.checked}, not {version}")
        if entry.owner is None and entry.attr is None:   # no Python target (a C++ change)
            continue
        now = entry.found()
        if now != entry.expects:
            found.append(f"{entry.group}: {entry.name}: expected {entry.expects}, found {now}")
    return found

with Doctor(profile=False):                            # the doctor group, while a Doctor runs
    groups = {entry.group for entry in _patches.ledger()}
    assert groups >= {"host_execution", "profiler", "distributed", "multiprocessing", "compile",
                      "transfer_to_npu", "profiler_aliases", "doctor"}, groups
    assert problems() == [], "\n".join(problems())
    print("entries", len(_patches.ledger()))

# A deliberately wrong expectation fails the check: torch.nn.functional.relu does not take
# inplace=True by default.
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    _patches.wrap(torch.nn.functional, "relu", lambda relu: relu, "synthetic", reason="a wrong expectation",
                  checked=(_patches.torch_version(),), expects="(input, inplace=True)")
assert [type(w.message) for w in caught] == [_patches.TorchInternalsChanged], caught
assert problems() == ["synthetic: torch.nn.functional.relu: expected (input, inplace=True), "
                      "found (input, inplace=False)"], problems()
_patches.undo("synthetic")
# ... and so does one checked against another torch only.
_patches.record("synthetic switch", group="synthetic", reason="an old entry", checked=("1.0",))
assert problems() == [f"synthetic: synthetic switch: checked against torch ('1.0',), not {_patches.torch_version()}"]
print("OK")
"""


def test_every_ledger_entry_matches_the_pinned_torch(run_python):
    proc = run_python(LEDGER_CHECK, timeout=300)
    assert "OK" in proc.stdout, proc.stdout
    assert int(proc.stdout.split("entries")[1].split()[0]) > 100


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
        assert not hasattr(FunctionEvent, "npu_time_total") and _patches.applied("profiler_aliases") == []
        torch_npu.profiler.enable_npu_column_aliases()          # the npu_* column names: opt-in
        torch_npu.profiler.enable_npu_column_aliases()          # (once)
        alias_changes = _patches.applied("profiler_aliases")
        assert len(alias_changes) == 10, alias_changes
        assert "profiler_aliases: FunctionEvent.npu_time_total" in alias_changes, alias_changes
        assert "profiler_aliases: FunctionEventAvg.self_npu_time_total" in alias_changes, alias_changes

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
        ours = [p.replacement for p in _patches._order if p.group == "compile" and p.is_patch]   # kept alive: ids stay theirs
        replacements = {id(r) for r in ours}
        assert lowerings is torch._inductor.lowering.lowerings
        assert any(id(v) in replacements for v in lowerings.values())

        assert _patches.undo("compile") == len(compile_changes) and _patches.applied("compile") == []
        assert _patches.undo("profiler") == len(profiler_changes) and _patches.applied("profiler") == []
        assert _patches.undo("profiler_aliases") == 10 and _patches.applied("profiler_aliases") == []

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


# What a plain ``import torch_npu`` changes, by group: every entry is one the npu cannot do
# without (PyTorch has no extension point for it, which its reason says). A new default-path
# change must be added here on purpose; compatibility features are opt-in (transfer_to_npu,
# torch_npu.profiler.enable_npu_column_aliases()).
DEFAULT_PATH = {
    "host_execution": 1,    # the CPU allocator wrapper _C installs as it loads
    "profiler": 8,          # use_device="npu" through Kineto (1), the chip projections (7)
    "comm": 6,              # torch.nn.parallel.comm for npu tensors (nn.DataParallel)
    "distributed": 2,       # c10d's default-backend marking, the Ascend adapter's is_hccl_available
    "multiprocessing": 6,   # torch.multiprocessing's reducers
    "autograd": 1,          # the exit drain's use of the engine
}


def test_import_makes_only_the_default_path_changes(run_python):
    proc = run_python("""
        import collections, json
        import torch, torch_npu
        from torch_npu import _patches
        from torch.autograd.profiler_util import FunctionEvent
        entries = _patches.ledger()
        assert all(e.reason and "\\n" not in e.reason for e in entries)
        assert not hasattr(FunctionEvent, "npu_time_total")          # the npu_* names: opt-in
        print(json.dumps(collections.Counter(e.group for e in entries)))
    """, env={"TORCH_TRANSFER_TO_NPU": None})
    assert json.loads(last_line(proc)) == DEFAULT_PATH

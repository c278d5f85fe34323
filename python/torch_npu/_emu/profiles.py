"""Device profiles: which chip the emulated npu behaves as.

A profile is a file in ``torch_npu/profiles/`` (``<name>.toml``): the chip's
identity and properties, its dtypes, the aten overloads it runs natively (a
list it names) and its cost model, each figure with its basis and its source
(a key of ``profiles/sources.toml``). This module reads the files and hands them
to C++ (csrc/core/profile.h), which decides. Adding a chip is adding a file.

Pick one with ``NPU_EMU_PROFILE=<name>`` or ``torch_npu.npu.set_profile(name)``,
before the npu's first use.
"""
import functools
import os
import tomllib
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional

from .. import _C

PROFILE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")   # torch_npu/profiles
GENERIC = "generic"
_SOURCES = "sources.toml"   # the cost figures' sources, not a profile


@dataclass(frozen=True)
class Figure:
    """One figure of a cost model, with where it comes from."""

    value: float
    basis: str       # "ini", "derived", "measured", "calibrated", "transferred" or "estimate"
    source: str      # a key of sources.toml
    figure: str      # the published figure, or the arithmetic, it comes from

    @property
    def label(self):
        """"calibrated: rwkv7-ascend-npu" (what a report prints beside a projected figure)."""
        return f"{self.basis}: {self.source}"


@dataclass(frozen=True)
class Profile:
    """A device profile as its file describes it."""

    name: str
    description: str
    device_name: str
    soc_version: Optional[int]
    family: Optional[str]
    properties: Dict[str, int]
    bfloat16: bool
    inf_nan: bool
    native_ops: Optional[FrozenSet[str]]  # None: every op with an npu kernel (generic)
    cost: Optional[Dict[str, float]]      # the cost model's values by name (COST_FIGURES)
    cost_figures: Optional[Dict[str, Figure]] = None   # ... with their basis and source
    kernel_families: Optional[FrozenSet[str]] = None   # the adapter's kernel families; None: all (generic)

    @property
    def is_chip(self) -> bool:
        return self.soc_version is not None


def names() -> List[str]:
    """Every profile that has a file, generic first."""
    found = sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".toml") and f != _SOURCES)
    return sorted(found, key=lambda n: n != GENERIC)


def _fail(name: str, problem: str):
    raise ValueError(f"torch_npu device profile '{name}' ({os.path.join(PROFILE_DIR, name + '.toml')}): {problem}")


@functools.lru_cache(maxsize=None)
def _native_ops(list_file: str, families: FrozenSet[str]) -> FrozenSet[str]:
    ops = set()
    with open(os.path.join(PROFILE_DIR, list_file)) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            overload, kinds = line.rstrip("\n").split("\t")[:2]
            if families & set(kinds.split("+")):
                ops.add(overload)
    return frozenset(ops)


# The cost model's figures (what each means: csrc/core/profile.h and profiler/_projection.py).
COST_FIGURES = ("host_dispatch_us", "kernel_overhead_us", "graph_kernel_overhead_us", "sync_us", "cube_fp16_tflops",
                "cube_fp32_tflops", "cube_int8_tops", "vector_fp16_tflops", "memory_gbps", "link_gbps")
BASES = ("ini", "derived", "measured", "calibrated", "transferred", "estimate")
_KNOWN = {  # the keys a profile file may have, per table
    "": {"name", "description", "identity", "properties", "dtypes", "ops", "cost"},
    "identity": {"device_name", "soc_version", "family"},
    "properties": {"cube_core_num", "vector_core_num", "ai_core_num", "L2_cache_size", "total_memory"},
    "dtypes": {"bfloat16", "inf_nan"},
    "ops": {"native", "kernel_families", "native_parts"},
    "cost": set(COST_FIGURES),
}
_KERNEL_FAMILIES = {"aclnn", "aclop", "base", "sparse"}


@functools.lru_cache(maxsize=None)
def sources() -> Dict[str, Dict[str, str]]:
    """The published sources the cost figures name (profiles/sources.toml), by key."""
    with open(os.path.join(PROFILE_DIR, _SOURCES), "rb") as f:
        return tomllib.load(f)


def _validate(name: str, data: dict) -> None:
    for table, keys in _KNOWN.items():
        section = data if not table else data.get(table, {})
        if not isinstance(section, dict):
            _fail(name, f"[{table}] must be a table")
        unknown = set(section) - keys
        if unknown:
            _fail(name, f"unknown key(s) {', '.join(sorted(unknown))} in [{table or 'top level'}]; "
                        f"known: {', '.join(sorted(keys))}")
    soc = data.get("identity", {}).get("soc_version")
    if soc is not None and not isinstance(soc, int):
        _fail(name, f"soc_version must be an integer, got {soc!r}")
    for key, value in data.get("properties", {}).items():
        if not isinstance(value, int) or value < 0:
            _fail(name, f"[properties] {key} must be a non-negative integer, got {value!r}")
    for key, value in data.get("dtypes", {}).items():
        if not isinstance(value, bool):
            _fail(name, f"[dtypes] {key} must be true or false, got {value!r}")
    families = set(data.get("ops", {}).get("kernel_families", ()))
    if families - _KERNEL_FAMILIES:
        _fail(name, f"unknown kernel_families {', '.join(sorted(families - _KERNEL_FAMILIES))}; "
                    f"known: {', '.join(sorted(_KERNEL_FAMILIES))}")
    for key, entry in data.get("cost", {}).items():
        if not isinstance(entry, dict) or set(entry) != {"value", "basis", "source", "figure"}:
            _fail(name, f"[cost] {key} must be {{ value = ..., basis = ..., source = ..., figure = ... }}, got {entry!r}")
        value = entry["value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            _fail(name, f"[cost] {key}: value must be a positive number, got {value!r}")
        if entry["basis"] not in BASES:
            _fail(name, f"[cost] {key}: basis {entry['basis']!r} is none of {', '.join(BASES)}")
        if entry["source"] not in sources():
            _fail(name, f"[cost] {key}: source {entry['source']!r} is not a key of sources.toml "
                        f"({', '.join(sorted(sources()))})")
        if not isinstance(entry["figure"], str) or not entry["figure"].strip():
            _fail(name, f"[cost] {key}: figure must say what published figure or arithmetic it comes from")


@functools.lru_cache(maxsize=None)
def load(name: str) -> Profile:
    """The profile ``name`` from its file; ValueError naming the known ones."""
    if not isinstance(name, str) or name not in names():
        raise ValueError(f"torch_npu: no device profile named {name!r}; known: {', '.join(names())} "
                         f"(torch_npu.npu.list_profiles() describes each)")
    with open(os.path.join(PROFILE_DIR, name + ".toml"), "rb") as f:
        data = tomllib.load(f)
    if data.get("name") != name:
        _fail(name, f"its name field is {data.get('name')!r}, not the file's name")
    _validate(name, data)
    identity, dtypes = data.get("identity", {}), data.get("dtypes", {})
    native_ops = families = None
    if "ops" in data:
        families = frozenset(data["ops"].get("kernel_families", ()))
        if not families:
            _fail(name, "[ops] needs kernel_families")
        native_ops = _native_ops(data["ops"]["native"], families) | frozenset(data["ops"].get("native_parts", ()))
    cost = figures = None
    if "cost" in data:
        missing = set(COST_FIGURES) - data["cost"].keys()
        if missing:
            _fail(name, f"[cost] lacks {', '.join(sorted(missing))}")
        figures = {key: Figure(float(e["value"]), e["basis"], e["source"], e["figure"]) for key, e in data["cost"].items()}
        cost = {key: f.value for key, f in figures.items()}
    return Profile(name=name, description=data.get("description", ""),
                   device_name=identity.get("device_name", "Emulated NPU"),
                   soc_version=identity.get("soc_version"), family=identity.get("family"),
                   properties=dict(data.get("properties", {})), bfloat16=dtypes.get("bfloat16", True),
                   inf_nan=dtypes.get("inf_nan", True), native_ops=native_ops, cost=cost, cost_figures=figures,
                   kernel_families=families)


def define(name: str) -> Profile:
    """Loads ``name`` and defines it in C++ (once), so the registry can answer for it."""
    profile = load(name)
    if name not in _defined:
        props = profile.properties
        _C._define_profile({
            "name": profile.name, "description": profile.description, "device_name": profile.device_name,
            "soc_version": profile.soc_version, "cube_core_num": props.get("cube_core_num", 0),
            "vector_core_num": props.get("vector_core_num", 0), "L2_cache_size": props.get("L2_cache_size", 0),
            "total_memory": props.get("total_memory", 0), "bfloat16": profile.bfloat16, "inf_nan": profile.inf_nan,
            "native_ops": None if profile.native_ops is None else sorted(profile.native_ops),
            "kernel_families": None if profile.kernel_families is None else sorted(profile.kernel_families),
            "cost": profile.cost,
        })
        _defined.add(name)
    return profile


_defined = set()


def activate(name: str) -> Profile:
    """Makes the npu behave as ``name`` from its first use on; raises once it started as another.

    NPU_EMU_PROFILE is set to it too, so that child processes (spawned DataLoader
    workers, torch.distributed ranks) see the same chip."""
    profile = define(name)
    _C._activate_profile(name)
    os.environ["NPU_EMU_PROFILE"] = name
    return profile


def active() -> Profile:
    return load(_C._active_profile())


def from_environment() -> None:
    """At import, before the emulator reads its settings: NPU_EMU_PROFILE picks
    the profile (default generic), and under a chip profile the emulator's
    memory (NPU_EMU_MEMORY) defaults to the chip's."""
    name = os.environ.get("NPU_EMU_PROFILE", "").strip()
    if not name:
        return
    try:
        profile = activate(name)
    except ValueError as e:
        raise ValueError(f"NPU_EMU_PROFILE={name!r}: {e}") from None
    memory = profile.properties.get("total_memory")
    if memory and not os.environ.get("NPU_EMU_MEMORY", "").strip():
        os.environ["NPU_EMU_MEMORY"] = str(memory)

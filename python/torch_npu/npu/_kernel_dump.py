"""The kernel-level dump, as the Ascend adapter's ``torch_npu.npu.init_dump`` / ``set_dump`` /
``finalize_dump`` (ACL's aclmdlInitDump / aclmdlSetDump / aclmdlFinalizeDump), which msprobe's
"L2" task calls around one API: while the dump is set, every kernel the npu runs writes its
inputs and outputs to ``{dump_path}/{YYYYmmddHHMMSS}/{device}/{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}``,
in the binary format msprobe's msaccucmp reads (its "nano" dump format: a TLV header, then the
tensors' bytes). The work is C++ (``csrc/profiler/kernel_dump.h``); this reads ACL's JSON configuration.
"""
import json
import os
import warnings

from torch_npu import _C

__all__ = ["finalize_dump", "init_dump", "set_dump"]

# ACL's dump configuration keys (the "dump" object) and what happens to each here.
_MODES = {"input": (True, False), "output": (False, True), "all": (True, True)}
_IGNORED = {"dump_step": "the step filter of graph (GE) models, which this npu does not have",
            "dump_level": "the choice between op and kernel level: here every op is one kernel",
            "dump_debug": "the overflow and exception dump of AI cores"}


def init_dump() -> None:
    """Starts a dump session (aclmdlInitDump); then ``set_dump(config)``, the kernels, ``finalize_dump()``."""
    from ._device import _lazy_init
    _lazy_init()
    _C._npu_initDump()


def set_dump(cfg_file: str) -> None:
    """Dumps every kernel the npu runs from now on as ACL's JSON file ``cfg_file`` says:
    ``{"dump": {"dump_path": DIR, "dump_mode": "input" | "output" | "all", "dump_op_switch": "on",
    "dump_list": []}}`` (ACL's defaults: dump_mode "output", dump_op_switch "off")."""
    from ._device import _lazy_init
    _lazy_init()
    path = os.path.realpath(cfg_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"torch_npu.npu.set_dump: the dump configuration {cfg_file!r} does not exist")
    with open(path, encoding="utf-8") as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"torch_npu.npu.set_dump: {cfg_file!r} is not JSON: {e}") from None
    dump = config.get("dump") if isinstance(config, dict) else None
    if not isinstance(dump, dict):
        raise ValueError(f"torch_npu.npu.set_dump: {cfg_file!r} needs a \"dump\" object, as ACL's aclmdlSetDump: "
                         f"{{\"dump\": {{\"dump_path\": ..., \"dump_mode\": \"all\", \"dump_op_switch\": \"on\"}}}}")
    dump_path = dump.get("dump_path")
    if not isinstance(dump_path, str) or not dump_path:
        raise ValueError(f"torch_npu.npu.set_dump: {cfg_file!r} gives no \"dump_path\" (the folder the kernels' files go to)")
    mode = dump.get("dump_mode", "output")
    if mode not in _MODES:
        raise ValueError(f"torch_npu.npu.set_dump: dump_mode must be \"input\", \"output\" or \"all\", got {mode!r}")
    switch = dump.get("dump_op_switch", "off")
    if switch not in ("on", "off"):
        raise ValueError(f"torch_npu.npu.set_dump: dump_op_switch must be \"on\" or \"off\", got {switch!r}")
    if dump.get("dump_list"):
        raise ValueError("torch_npu.npu.set_dump: dump_list names layers of graph (GE) models, which this npu does "
                         "not have; give an empty list and \"dump_op_switch\": \"on\" to dump every kernel")
    data = dump.get("dump_data", "tensor")
    if data != "tensor":
        raise ValueError(f"torch_npu.npu.set_dump: dump_data {data!r} (ACL's statistics instead of tensors) is not "
                         f"provided; use \"tensor\"")
    for key in dump:
        if key in _IGNORED:
            warnings.warn(f"torch_npu.npu.set_dump: {key} is ignored: it is {_IGNORED[key]}", stacklevel=2)
        elif key not in ("dump_path", "dump_mode", "dump_op_switch", "dump_list", "dump_data"):
            warnings.warn(f"torch_npu.npu.set_dump: unknown key {key!r} in the \"dump\" object is ignored", stacklevel=2)
    if switch == "off":
        warnings.warn("torch_npu.npu.set_dump: with dump_op_switch \"off\" ACL dumps only graph (GE) models, which "
                      "this npu does not have: nothing is dumped; set \"dump_op_switch\": \"on\"", stacklevel=2)
    inputs, outputs = _MODES[mode]
    _C._npu_setDump(os.path.realpath(dump_path), inputs, outputs, switch == "on")


def finalize_dump() -> None:
    """Ends the dump session (aclmdlFinalizeDump): waits until every dumped kernel's file is written."""
    _C._npu_finalizeDump()

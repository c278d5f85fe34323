"""The Ascend adapter's environment switches, as aliases of torch_npu's own.

Read once at import, before the runtime reads its variables, so scripts and launch
files written for a real Ascend machine behave the same here:

* ``ASCEND_LAUNCH_BLOCKING`` is ``NPU_LAUNCH_BLOCKING`` (run each kernel at launch);
* ``TORCH_NPU_FALLBACK_CPU_DISABLE=1`` is ``NPU_FALLBACK_MODE=error`` (no silent CPU fallback);
* ``ASCEND_RT_VISIBLE_DEVICES`` masks the emulated devices as ``CUDA_VISIBLE_DEVICES`` does:
  the listed ids (up to the first that is not a device) are the process's npu:0, npu:1, ...;
* ``TASK_QUEUE_ENABLE`` (0, 1 or 2: the adapter's launch queue levels) is checked; the
  emulator always queues kernels to the stream's worker, so the level changes nothing.

When both names are set with different meanings, the import fails naming both.
"""
import os

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _switch(name, value):
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "1"
    if lowered in _FALSE:
        return "0"
    raise ValueError(f"torch_npu: {name}={value!r} is not a switch: use 1 or 0")


def _alias(ascend, ours, ours_value):
    given = os.environ.get(ours)
    if given is not None and _normalised(ours, given) != ours_value:
        raise ValueError(f"torch_npu: {ascend}={os.environ[ascend]!r} and {ours}={given!r} disagree; set one of them")
    os.environ[ours] = ours_value


def _normalised(name, value):
    if name == "NPU_FALLBACK_MODE":
        return value.strip().lower()
    return _switch(name, value)


def _visible_devices(value, physical):
    """The ids of ASCEND_RT_VISIBLE_DEVICES that name a device, up to the first that does not
    (CUDA_VISIBLE_DEVICES' rule), each once."""
    visible = []
    for item in value.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= physical or int(item) in visible:
            break
        visible.append(int(item))
    return visible


def apply():
    if "ASCEND_LAUNCH_BLOCKING" in os.environ:
        _alias("ASCEND_LAUNCH_BLOCKING", "NPU_LAUNCH_BLOCKING",
               _switch("ASCEND_LAUNCH_BLOCKING", os.environ["ASCEND_LAUNCH_BLOCKING"]))
    if "TORCH_NPU_FALLBACK_CPU_DISABLE" in os.environ:
        if _switch("TORCH_NPU_FALLBACK_CPU_DISABLE", os.environ["TORCH_NPU_FALLBACK_CPU_DISABLE"]) == "1":
            _alias("TORCH_NPU_FALLBACK_CPU_DISABLE", "NPU_FALLBACK_MODE", "error")
    level = os.environ.get("TASK_QUEUE_ENABLE")
    if level is not None and level.strip() not in ("0", "1", "2"):
        raise ValueError(f"torch_npu: TASK_QUEUE_ENABLE={level!r}: use 0, 1 or 2")
    mask = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if mask is not None:
        # The emulator's device count before the mask, kept for child processes, which
        # inherit the masked NPU_EMU_DEVICES and must not mask it again.
        physical = os.environ.get(_PHYSICAL) or os.environ.get("NPU_EMU_DEVICES", "1")
        if not physical.strip().isdigit():
            return   # the runtime reports the bad NPU_EMU_DEVICES value itself
        os.environ[_PHYSICAL] = physical.strip()
        os.environ["NPU_EMU_DEVICES"] = str(len(_visible_devices(mask, int(physical))))


_PHYSICAL = "TORCH_NPU_EMU_DEVICES_BEFORE_MASK"

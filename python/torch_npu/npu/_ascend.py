"""The Ascend adapter's own torch.npu switches that libraries call, with their meaning
on the emulated npu: ``set_compile_mode``/``is_jit_compile_false`` (online compiled
kernels or prebuilt binaries), ``set_option``/``get_option`` (the ACL options a script
sets) and ``config.allow_internal_format`` (whether ops may keep private layouts such as
FRACTAL_NZ). The emulator's kernels are always prebuilt and its layouts are PyTorch's, so
these are recorded and reported, and change no result.
"""
import types

_state = {"jit_compile": False, "options": {}}


def set_compile_mode(jit_compile: bool = True) -> None:
    """``jit_compile=False``: prebuilt binary kernels (the adapter's default on A2/A3);
    True: kernels compiled online. Recorded; the emulator's kernels are prebuilt either way."""
    if not isinstance(jit_compile, bool):
        raise TypeError(f"torch.npu.set_compile_mode: jit_compile must be a bool, got {type(jit_compile).__name__}")
    _state["jit_compile"] = jit_compile


def is_jit_compile_false() -> bool:
    """Whether set_compile_mode chose prebuilt kernels (the default)."""
    return not _state["jit_compile"]


def set_option(option: dict) -> None:
    """The ACL options of the Ascend adapter (``{"ACL_OP_COMPILER_CACHE_MODE": "enable", ...}``):
    str keys and values, recorded (``get_option``); none changes the emulator's kernels."""
    if not isinstance(option, dict):
        raise TypeError(f"torch.npu.set_option: option must be a dict of str to str, got {type(option).__name__}")
    for key, value in option.items():
        if not isinstance(key, str) or not isinstance(value, (str, int, bool)):
            raise TypeError(f"torch.npu.set_option: option {key!r}: keys are str, values str (got "
                            f"{type(value).__name__})")
        _state["options"][key] = str(value)


def get_option() -> dict:
    """The options set_option recorded."""
    return dict(_state["options"])


class _Config(types.ModuleType):
    """torch.npu.config: ``allow_internal_format`` (bool, default False)."""

    allow_internal_format = False

    def __setattr__(self, name, value):
        if name == "allow_internal_format" and not isinstance(value, bool):
            raise TypeError(f"torch.npu.config.allow_internal_format must be a bool, got {type(value).__name__}")
        if name.startswith("_") or name == "allow_internal_format":
            super().__setattr__(name, value)
            return
        raise AttributeError(f"torch.npu.config has no setting {name!r}; it has allow_internal_format")


config = _Config("torch.npu.config")

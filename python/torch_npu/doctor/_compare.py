"""``--compare``: every npu op runs again on the cpu with the same inputs.

The inputs are copied to the host before the npu op runs (an in-place op changes
them), the op runs on both devices, and each result is compared with a tolerance
for its dtype. Random ops and ops whose output is uninitialised or a view are not
compared. The first mismatching call of each op is kept with its shapes, dtypes
and source line.
"""
import torch
from torch.utils._pytree import tree_map

# (rtol, atol) per dtype: torch.testing's defaults; integers and bools exactly.
_TOLERANCE = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
}
_SKIP = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
         "aten::_local_scalar_dense", "aten::set_", "aten::resize_", "aten::lift_fresh", "aten::_to_copy",
         "aten::copy_", "aten::detach", "aten::alias", "aten::record_stream"}


class Mismatch:
    def __init__(self, op, site, inputs, max_abs_diff, dtype):
        self.op, self.site, self.inputs = op, site, inputs
        self.max_abs_diff, self.dtype = max_abs_diff, dtype
        self.bad_calls = 1


def _describe(args):
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
            parts.append("[" + ", ".join(_describe(a)) + "]")
        else:
            parts.append(repr(a) if len(repr(a)) < 40 else type(a).__name__)
    return parts


def _tensor_pairs(got, want):
    """(npu tensor, cpu tensor) pairs of two results, lists (foreach ops) flattened."""
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        return [(got, want)]
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)) and len(got) == len(want):
        return [p for g, w in zip(got, want) for p in _tensor_pairs(g, w)]
    return []


class Comparator:
    """Runs each npu op on the cpu too and keeps the ops whose results differ."""

    def __init__(self):
        self.compared = 0
        self.mismatches = {}   # op -> Mismatch
        self.calls = {}        # op -> compared calls

    @staticmethod
    def wants(func):
        if func._schema.name in _SKIP or torch.Tag.nondeterministic_seeded in func.tags:
            return False
        # Views share their input's storage: nothing computed to compare.
        return not any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)

    @staticmethod
    def to_host(args, kwargs):
        def host(x):
            if isinstance(x, torch.Tensor) and x.device.type == "npu":
                return x.detach().cpu()
            if isinstance(x, torch.device) and x.type == "npu":
                return torch.device("cpu")
            return x

        kwargs = dict(kwargs)
        if "device" in kwargs and kwargs["device"] is not None and torch.device(kwargs["device"]).type == "npu":
            kwargs["device"] = torch.device("cpu")
        return tree_map(host, args), tree_map(host, kwargs)

    def check(self, func, args, kwargs, out, host_args, host_kwargs, site):
        name = func._schema.name
        try:
            expected = func(*host_args, **host_kwargs)
        except Exception:  # noqa: BLE001  the cpu refuses what the npu took: nothing to compare
            return
        if func._schema.is_mutable:   # in-place / out=: compare the written arguments
            pairs = []
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                if i < len(args) and not a.kwarg_only:
                    pairs.append((args[i], host_args[i]))
                elif a.name in kwargs:
                    pairs.append((kwargs[a.name], host_kwargs[a.name]))
        else:
            pairs = [(out, expected)]
        pairs = [(g, w) for got, want in pairs for g, w in _tensor_pairs(got, want)]
        if not pairs:
            return
        self.compared += 1
        self.calls[name] = self.calls.get(name, 0) + 1
        for got, want in pairs:
            diff = self._difference(got, want)
            if diff is None:
                continue
            mismatch = self.mismatches.get(name)
            if mismatch is None:
                self.mismatches[name] = Mismatch(name, site, _describe(args), diff, str(got.dtype))
            else:
                mismatch.bad_calls += 1
            return

    @staticmethod
    def _difference(got, want):
        """None when ``got`` (npu) matches ``want`` (cpu), else the largest absolute difference."""
        got = got.detach().cpu()
        if got.shape != want.shape:
            return float("inf")
        if got.dtype != want.dtype:
            return float("inf")
        if got.numel() == 0:
            return None
        if not got.is_floating_point() and not got.is_complex():
            equal = torch.equal(got, want)
            return None if equal else float((got.long() - want.long()).abs().max())
        rtol, atol = _TOLERANCE.get(got.dtype, (1.3e-6, 1e-5))
        # Sums and products of many terms round differently on another device: an error
        # relative to the output's largest value is rounding, not a wrong kernel.
        scale = want.abs().nan_to_num(0, 0, 0).max().item()
        atol = max(atol, rtol * scale)
        if torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            return None
        return float((got.double() - want.double()).abs().nan_to_num(float("inf")).max())

"""The CPU fallback you control: modes, per-op policies, statistics.

Every aten op on an npu tensor runs as a native npu kernel, as a decomposition,
or on the CPU through the fallback. The fallback is correct but slow (the
inputs travel to the host and back), so it is visible and controllable:

* the mode: "auto" (default: fall back silently, count it), "warn" (fall back,
  warn once per op), "error" (raise, naming the op, its dtypes and the remedy);
* per-op policies: "cpu" forces an op to the CPU even if it has an npu kernel,
  "npu" forbids its fallback;
* statistics: which ops fell back, how often, for how long, how many bytes moved;
* a DEBUG line on the ``torch_npu`` logger for each fallback.

The environment sets the same for scripts one cannot edit: NPU_FALLBACK_MODE,
NPU_FALLBACK_OPS=exp,isin (force to cpu), NPU_FALLBACK_ON_ERROR=1 (retry on the
cpu an op whose npu kernel raised).
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Tuple, Union

from . import _C

__all__ = ["NPUFallbackMode", "NPUOpsFallback", "FallbackStats", "OpFallbackStats",
           "set_fallback_mode", "get_fallback_mode"]

_logger = logging.getLogger("torch_npu")


@dataclass(frozen=True)
class OpFallbackStats:
    count: int                  # times the op ran on the cpu
    kernel_error_retries: int   # of those: retries after the npu kernel raised
    seconds: float              # total time spent in the fallback, copies included
    bytes_to_cpu: int
    bytes_to_npu: int

    @property
    def bytes_copied(self) -> int:
        return self.bytes_to_cpu + self.bytes_to_npu


class FallbackStats:
    """A snapshot of the fallback statistics (NPUFallbackMode.get_fallback_stats())."""

    def __init__(self, per_op: Dict[str, OpFallbackStats]):
        self.ops = per_op

    @property
    def total(self) -> int:
        return sum(s.count for s in self.ops.values())

    @property
    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.ops.values())

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes_copied for s in self.ops.values())

    def top_ops(self, k: int = 10) -> List[Tuple[str, int]]:
        """The ``k`` ops that fell back most often, as (op, count)."""
        ranked = sorted(self.ops.items(), key=lambda item: (-item[1].count, item[0]))
        return [(name, s.count) for name, s in ranked[:k]]

    def __getitem__(self, op: str) -> OpFallbackStats:
        return self.ops[op]

    def __contains__(self, op: str) -> bool:
        return op in self.ops

    def table(self, k: int = 20) -> str:
        lines = [f"{'op':<44} {'count':>7} {'ms':>9} {'MB copied':>10}"]
        ranked = sorted(self.ops.items(), key=lambda item: (-item[1].count, item[0]))[:k]
        for name, s in ranked:
            lines.append(f"{name:<44} {s.count:>7} {s.seconds * 1e3:>9.2f} {s.bytes_copied / 2**20:>10.2f}")
        lines.append(f"{'total':<44} {self.total:>7} {self.total_seconds * 1e3:>9.2f} "
                     f"{self.total_bytes / 2**20:>10.2f}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"FallbackStats(total={self.total}, top_ops={self.top_ops(5)})"


class NPUOpsFallback:
    """Controls of the CPU fallback (all static; the state lives in C++)."""

    AUTO = "auto"
    WARN = "warn"
    ERROR = "error"

    @staticmethod
    def set(mode: Union[str, "NPUOpsFallback"]) -> None:
        """Sets the fallback mode: "auto", "warn" or "error" (any case, as NPU_FALLBACK_MODE)."""
        _C._set_fallback_mode(str(mode))

    @staticmethod
    def get() -> str:
        return _C._fallback_mode()

    @staticmethod
    def set_op_fallback(op: str, policy: str) -> None:
        """``policy`` "cpu": always run ``op`` on the cpu; "npu": never fall back; "default": follow the mode.

        ``op`` is any spelling of an operator ("exp", "torch.exp", "aten::exp");
        the policy covers all its overloads and its in-place variant. An unknown
        op raises ValueError suggesting the closest known names.
        """
        _C._set_op_fallback(op, policy)

    @staticmethod
    def get_op_fallback(op: str) -> str:
        return _C._op_fallback(op)

    @staticmethod
    def op_fallbacks() -> Dict[str, str]:
        """All per-op policies in force, {"aten::exp": "cpu", ...}."""
        return dict(_C._op_fallbacks())

    @staticmethod
    def clear_op_fallbacks() -> None:
        _C._clear_op_fallbacks()

    @staticmethod
    def set_retry_on_kernel_error(enabled: bool) -> None:
        """Retry on the cpu an op whose npu kernel raised (NPU_FALLBACK_ON_ERROR=1)."""
        _C._set_retry_on_kernel_error(bool(enabled))

    @staticmethod
    def get_fallback_stats() -> FallbackStats:
        per_op = {
            name: OpFallbackStats(count, retries, ns / 1e9, to_cpu, to_npu)
            for name, (count, retries, ns, to_cpu, to_npu) in _C._fallback_stats().items()
        }
        return FallbackStats(per_op)

    @staticmethod
    def reset_fallback_stats() -> None:
        _C._reset_fallback_stats()


class NPUFallbackMode(NPUOpsFallback):
    """The fallback mode and its controls: ``NPUFallbackMode.set("warn")``, ``NPUFallbackMode.ERROR``."""


def set_fallback_mode(mode: Union[str, NPUOpsFallback]) -> None:
    """torch_npu.set_fallback_mode("auto" | "warn" | "error")."""
    NPUOpsFallback.set(mode)


def get_fallback_mode() -> str:
    return NPUOpsFallback.get()


# Callables(op, reason) told of each fallback before it runs (torch_npu.doctor).
# reason: "no_kernel", "dtype", "policy" or "kernel_error".
_observers: List = []


def _log_fallback(op: str, reason: str, line: str) -> None:
    if _logger.isEnabledFor(logging.DEBUG):
        _logger.debug(line)
    for observer in _observers:
        observer(op, reason)


def _install() -> None:
    _C._load_fallback_environment()  # raises ValueError for a bad NPU_FALLBACK_* value
    _C._set_fallback_logger(_log_fallback)

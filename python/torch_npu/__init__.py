"""torch_npu: a PyTorch adapter for an NPU.

``import torch_npu`` (or just ``import torch``, through the ``torch.backends``
entry point) gives PyTorch an ``npu`` device: ``torch.randn(3, device="npu")``,
``tensor.npu()``, ``module.npu()``, ``torch.npu.*``. Without hardware the device
is an emulated NPU in host memory (see NPU_EMU_DEVICES and NPU_EMU_MEMORY).
"""


def _autoload():
    """Entry point of the ``torch.backends`` group: importing the package did the work.

    Defined before ``import torch``: when torch_npu is imported first, torch's own
    import loads this entry point from the half-imported package.
    """


import torch  # noqa: E402

from ._core import env as _ascend_env  # noqa: E402
_ascend_env.apply()   # the Ascend adapter's switch names, before the runtime reads ours

import sys as _sys  # noqa: E402

from . import _C  # noqa: E402
from ._core import patches as _patches  # noqa: E402
_sys.modules[__name__ + "._patches"] = _patches   # torch_npu._patches: the ledger's documented path
_patches.record_host_allocator_redirect()  # _C wrapped the process's CPU allocator as it loaded

from ._emu import profiles as _profiles  # noqa: E402
_profiles.from_environment()  # NPU_EMU_PROFILE: before the emulator reads NPU_EMU_MEMORY

_environment_problem = _C._runtime_environment_error()
if _environment_problem:  # a bad NPU_HAL or NPU_EMU_* value: say so now, not at the first npu call
    raise RuntimeError(f"torch_npu: {_environment_problem}")

if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")

from . import npu  # noqa: E402  (needs the renamed backend)

torch._register_device_module("npu", npu)
if not hasattr(torch.Tensor, "npu"):
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )

from .ops import registry as _ops_registry  # noqa: E402
_sys.modules[__name__ + "._ops_registry"] = _ops_registry   # torch_npu._ops_registry: its documented path
from .ops.custom import register_npu_op  # noqa: E402
from . import optim  # noqa: E402
from . import profiler  # noqa: E402
from . import utils  # noqa: E402  (torch_npu.utils: the Ascend adapter's pickle function, for msprobe)
from .ops.attention import npu_fusion_attention  # noqa: E402
from .ops.attention import (  # noqa: E402
    _npu_fused_infer_attention_score_get_max_workspace,
    _npu_fused_infer_attention_score_v2_get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_fusion_attention_grad,
    npu_gather_pa_kv_cache,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
    npu_scatter_pa_kv_cache,
)
from .ops.formats import Format, get_npu_format, npu_format_cast, npu_format_cast_  # noqa: E402
from .ops.fused import (  # noqa: E402
    npu_add_rms_norm,
    npu_fused_add_matmul,
    npu_rms_norm,
    npu_rotary_mul,
    npu_swiglu,
)
from .ops.moe_quant import (  # noqa: E402
    npu_convert_weight_to_int4pack,
    npu_dynamic_quant,
    npu_grouped_matmul,
    npu_moe_gating_top_k_softmax,
    npu_moe_init_routing_v2,
    npu_moe_token_permute,
    npu_moe_token_unpermute,
    npu_quant_matmul,
    npu_trans_quant_param,
)
from .ops.position import (  # noqa: E402
    npu_apply_rotary_pos_emb,
    npu_interleave_rope,
    npu_mrope,
    npu_scaled_masked_softmax,
    npu_top_k_top_p,
    npu_transpose_batchmatmul,
)
from .fallback import (  # noqa: E402
    FallbackStats,
    NPUFallbackMode,
    NPUOpsFallback,
    get_fallback_mode,
    set_fallback_mode,
)
from .fallback import _install as _install_fallback  # noqa: E402

_install_fallback()
from .npu import comm as _comm  # noqa: E402
_comm.install()   # nn.DataParallel over npu devices: torch.nn.parallel.comm for npu tensors

from ._compile import _hooks as _compile_hooks  # noqa: E402
from ._compile.backend import compile  # noqa: E402

_compile_hooks.install()  # torch.compile: the npu registers with dynamo/inductor when they load

from . import distributed  # noqa: E402  (the "hccl" c10d backend for npu tensors)
from .npu import _multiprocessing  # noqa: E402

_multiprocessing.install()  # npu tensors sent to another process: a clear error, never a hang

from ._core import exit as _exit  # noqa: E402

_exit.install()  # backward runs on the npu's autograd thread, as on CUDA: drained at exit

from ._core.version import __version__  # noqa: E402,F401

# TORCH_TRANSFER_TO_NPU=1: a script written for CUDA runs on the npu with no change
# at all, not even an import of torch_npu (torch imports this package through its
# torch.backends entry point): "cuda" means the npu from the start, as when the
# script imports torch_npu.contrib.transfer_to_npu itself.
import os as _os  # noqa: E402

if _os.environ.get("TORCH_TRANSFER_TO_NPU", "").strip().lower() not in ("", "0", "false", "no", "off"):
    from .contrib import transfer_to_npu  # noqa: E402,F401

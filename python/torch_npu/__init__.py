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


import sys as _sys  # noqa: E402

import torch  # noqa: E402

from ._core import bootstrap as _bootstrap  # noqa: E402

_bootstrap.install()   # the ordered install steps: the table STEPS in _core/bootstrap.py

# ---- the public names -------------------------------------------------------------------
from . import distributed, npu, optim, profiler, utils  # noqa: E402,F401  (loaded by the steps)
from ._compile.backend import compile  # noqa: E402,F401
from ._core.version import __version__  # noqa: E402,F401
from .ops.custom import register_npu_op  # noqa: E402,F401
from .ops.attention import (  # noqa: E402
    _npu_fused_infer_attention_score_get_max_workspace,
    _npu_fused_infer_attention_score_v2_get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_fusion_attention,
    npu_fusion_attention_grad,
    npu_gather_pa_kv_cache,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
    npu_scatter_pa_kv_cache,
)
from .ops.collective import (  # noqa: E402
    npu_all_gather_base_mm,
    npu_mm_reduce_scatter_base,
    npu_moe_distribute_combine,
    npu_moe_distribute_combine_v2,
    npu_moe_distribute_dispatch,
    npu_moe_distribute_dispatch_v2,
)
from .ops.formats import Format, get_npu_format, npu_format_cast, npu_format_cast_  # noqa: E402
from .ops.fused import (  # noqa: E402
    npu_add_rms_norm,
    npu_fused_add_matmul,
    npu_rms_norm,
    npu_rotary_mul,
    npu_swiglu,
)
from .ops.inference import (  # noqa: E402
    _npu_paged_attention,
    _npu_paged_attention_get_workspace,
    npu_attention_update,
    npu_dynamic_mx_quant,
    npu_kv_rmsnorm_rope_cache,
    npu_mla_prolog_v2,
    npu_mla_prolog_v3,
    npu_mla_prolog_v3_functional,
    npu_moe_finalize_routing,
    npu_scatter_nd_update,
    npu_scatter_nd_update_,
    npu_weight_quant_batchmatmul,
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
from .ops.training import (  # noqa: E402
    fast_gelu,
    npu_apply_adam,
    npu_apply_adam_w,
    npu_confusion_transpose,
    npu_fast_gelu,
    npu_geglu,
    npu_group_norm_silu,
    npu_layer_norm_eval,
    npu_linear,
    npu_mish,
    npu_sort_v2,
)
from .fallback import (  # noqa: E402
    FallbackStats,
    NPUFallbackMode,
    NPUOpsFallback,
    get_fallback_mode,
    set_fallback_mode,
)

# ---- the Ascend adapter's dtype codes: torch_npu.float8_e8m0fnu == 293, ... (ACL's + 256) -----
from ._C import _cd as _custom_dtypes  # noqa: E402
for _name, _code, _ in _custom_dtypes._names():
    globals()[_name] = _code   # as the adapter: torch_npu.float32 is the int 256, not torch.float32
del _name, _code
from .utils.hif8_tensor import HiFloat8Tensor  # noqa: E402,F401

# ---- the private paths the README and tools name: the same modules ----------------------
from ._core import patches as _patches  # noqa: E402
from .ops import registry as _ops_registry  # noqa: E402

_sys.modules[__name__ + "._patches"] = _patches              # the ledger
_sys.modules[__name__ + "._ops_registry"] = _ops_registry    # the op registry
_sys.modules[__name__ + "._C._cd"] = _custom_dtypes           # the dtype codes, as a submodule of _C

_bootstrap.install_opt_ins()   # TORCH_TRANSFER_TO_NPU=1: last, on the complete package

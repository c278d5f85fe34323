"""torch_npu.utils: the Ascend adapter's helper modules that tools reach by this path
(``storage._rebuild_npu_tensor``, which msprobe allows in ``torch.load(weights_only=True)``;
``collect_env.get_cann_version``, which MindSpeed and vllm-ascend read)."""
from . import collect_env, storage  # noqa: F401
from .collect_env import get_cann_version  # noqa: F401

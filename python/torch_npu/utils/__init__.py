"""torch_npu.utils: the Ascend adapter's helper modules that tools reach by this path
(``storage._rebuild_npu_tensor``, which msprobe allows in ``torch.load(weights_only=True)``)."""
from . import storage  # noqa: F401

"""torchair's FX data dump (``config.debug.data_dump.type = "npy"``, msprobe's
``set_fx_dump_config``): the graph runs op by op, and each ATen op's inputs and outputs are
written as .npy files where the adapter writes them and msprobe's torchair compare reads them:

    <path>/worldsize<W>_global_rank<R>/<graph>/<step>/<node>-<op>.INPUT.<i>[.<j>].<time>.npy
                                                   .../<node>-<op>.OUTPUT.<i>.<time>.npy

``debug.data_dump.filter(node)`` picks the nodes (None skips one), as on the adapter.
"""
import os
from datetime import datetime, timezone

import torch


def _timestamp():
    return datetime.now(tz=timezone.utc).strftime("%Y%m%d%H%M%S%f")


def _as_numpy(x):
    import numpy as np
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    try:
        return np.array(x)
    except Exception:  # noqa: BLE001  (a value numpy cannot hold: its text)
        return np.array(f"{x}")


class FxDumper(torch.fx.Interpreter):
    """Runs ``gm`` with the inputs (a list), writing each ATen op's tensors; one step per call."""

    def __init__(self, gm, path, name, node_filter=None):
        super().__init__(gm)
        self.path, self.name, self.node_filter = path, name, node_filter
        self.step = 0
        self._dumping = None

    def __call__(self, inputs):
        try:
            out = self.run(*inputs)
        finally:
            self.step += 1
        return list(out) if isinstance(out, (tuple, list)) else [out]

    @property
    def step_path(self):
        rank, world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return os.path.join(self.path or ".", f"worldsize{world}_global_rank{rank}", self.name, str(self.step))

    def run_node(self, n):
        if self.node_filter is not None and self.node_filter(n) is None:
            return super().run_node(n)
        self._dumping = n
        try:
            return super().run_node(n)
        finally:
            self._dumping = None

    def call_function(self, target, args, kwargs):
        node = self._dumping
        if node is None or not isinstance(target, torch._ops.OpOverload):
            return super().call_function(target, args, kwargs)
        import numpy as np
        directory = self.step_path
        os.makedirs(directory, exist_ok=True)
        stamp = _timestamp()
        for i, arg in enumerate(args):
            if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
                for j, tensor in enumerate(arg):
                    np.save(os.path.join(directory, f"{node.name}-{target}.INPUT.{i}.{j}.{stamp}"), _as_numpy(tensor))
                continue
            np.save(os.path.join(directory, f"{node.name}-{target}.INPUT.{i}.{stamp}"), _as_numpy(arg))
        result = super().call_function(target, args, kwargs)
        for i, value in enumerate(result if isinstance(result, (list, tuple)) else [result]):
            np.save(os.path.join(directory, f"{node.name}-{target}.OUTPUT.{i}.{stamp}"), _as_numpy(value))
        return result

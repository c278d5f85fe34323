"""The foundations every other part of torch_npu stands on; they import nothing above them.

* ``patches``: the ledger of every change torch_npu makes to PyTorch's internals
  (``torch_npu._patches`` is the same module);
* ``env``: the Ascend adapter's environment switches (``ASCEND_*``) as torch_npu's own;
* ``exit``: what torch_npu does when the interpreter exits;
* ``bootstrap``: what ``import torch_npu`` does, in order (the one module here that
  reaches up: it installs the rest of the package).

Nothing is imported here: importing ``torch_npu._core.patches`` must not run the bootstrap.
"""

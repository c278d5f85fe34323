"""The Python face of the npu op library (csrc/ops): one module per family of C++ ops.

* ``attention``: the attention operators (csrc/ops/fused/attention.cpp) and
  ``npu_fusion_attention``, composed from the flash kernel;
* ``moe_quant``: mixture of experts and quantization (moe_quant.cpp);
* ``inference``: LLM serving: weight-only and MX quantization, paged attention, MLA (inference.cpp);
* ``position``: positional encodings, sampling, masked softmax (position.cpp);
* ``fused``: RMSNorm, SwiGLU, rotary, fused add-matmul (fused.cpp);
* ``collective``: matmul fused with a collective, expert-parallel dispatch and
  combine, over an "hccl" group named by its communicator name (collective.cpp);
* ``training``: GEGLU, fast GELU, Mish, GroupNorm-SiLU, the Adam steps and the other
  training operators of MindSpeed and diffusers (training.cpp);
* ``formats``: the Ascend storage formats, kept as metadata;
* ``custom``: your own operators (``register_npu_op``);
* ``registry``: which implementation serves each op (``torch_npu._ops_registry`` is this module).

Each module defines the derivatives and the public ``npu_*`` names of its family;
``torch_npu`` re-exports the names. Nothing is imported here.
"""

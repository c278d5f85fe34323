"""torch.compile on the npu.

Inductor generates C++ kernels for the npu (its CPU code generator: the emulated
npu's memory is host-addressable) and a Python wrapper that launches them in
stream order with eager work. Nothing that needs dynamo or inductor is imported with
torch_npu: they are heavy, so the registrations happen when PyTorch loads them
(``_hooks.install()``, at import, puts import hooks in place):

* ``torch._dynamo.device_interface``: the npu's ``DeviceInterface``;
* ``torch._inductor.compile_fx``: ``_codegen.register_backend()`` registers the
  npu's scheduling and wrappers (``register_backend_for_device``, with a pass whose
  uuid versions inductor's cache, so code cached by another torch_npu is never
  loaded) and teaches inductor that the npu is served by its C++ backend.
  Inductor's own registration, which reads ``torch.npu.Scheduling`` and the
  wrappers, finds them too when it runs first (``_hooks`` provides those names on
  torch.npu, loaded from ``_codegen`` when first read);
* ``_codegen.register()`` also installs what inductor has no extension point for:
  ``_host_codegen`` (the rules that compile npu graphs as cpu graphs: the npu reuses
  the host's C++ backend) and ``npugraphs.install()`` (the npu's graph policy).

``torch.compile(model, backend="npu")`` (``backend.py``) adds graph passes that
put the fused npu ops in place of their compositions; ``torch_npu.compile``
falls back to eager when compilation fails.

Every change to dynamo's and inductor's own objects goes through
:mod:`torch_npu._patches` in the group ``"compile"``:
``torch_npu._patches.undo("compile")`` takes them back (the registrations made
through PyTorch's APIs, the device interface, the "npu" backend and inductor's
device backend, stay).
"""
GROUP = "compile"   # the torch_npu._patches group of every change made here

"""diffusers on the npu: its NPU code paths against its plain-torch ones on the cpu.

With torch_npu installed, diffusers takes three NPU paths: ``GEGLU`` calls
``torch_npu.npu_geglu(hidden_states, dim=-1, approximate=1)[0]``, ``RMSNorm`` (with a weight) calls
``torch_npu.npu_rms_norm(hidden_states, weight, epsilon=eps)[0]``, and the ``_native_npu``
attention backend of its attention dispatcher calls ``npu_fusion_attention`` in the BSND layout.
A tiny LTX-Video transformer built with a GEGLU feed-forward and affine RMSNorms (its attention
goes through the dispatcher, self- and cross-attention) runs on the npu through all three, each
call counted, and matches the same model on the cpu where diffusers' plain-torch branches (chunk
and F.gelu, the float RMSNorm, the "native" SDPA backend) run instead, forward and backward.
"""
import copy

import pytest
import torch

import torch_npu

diffusers = pytest.importorskip(
    "diffusers", reason="diffusers is not installed (make's .clients target installs it: "
                        "pip install -c .venv/constraints.txt diffusers==0.42.1)")

from diffusers.models import activations, attention_dispatch, normalization  # noqa: E402


def tiny_model():
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        num_layers=2, caption_channels=16, activation_fn="geglu", norm_elementwise_affine=True)
    # Non-trivial RMSNorm weights (they start at one), so that a gamma left out would show.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, normalization.RMSNorm) and module.weight is not None:
                module.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture
def counted(monkeypatch):
    """Counts diffusers' calls of the three npu ops (wrapping the names diffusers looks up)."""
    calls = {"npu_geglu": 0, "npu_rms_norm": 0, "npu_fusion_attention": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(torch_npu, "npu_geglu", counting("npu_geglu", torch_npu.npu_geglu))
    monkeypatch.setattr(torch_npu, "npu_rms_norm", counting("npu_rms_norm", torch_npu.npu_rms_norm))
    monkeypatch.setattr(attention_dispatch, "npu_fusion_attention",
                        counting("npu_fusion_attention", attention_dispatch.npu_fusion_attention))
    return calls


FRAMES, HEIGHT, WIDTH = 2, 3, 2


def run(model, device, dtype, inputs):
    x, context = (t.to(device, dtype).requires_grad_() for t in inputs)
    timestep = torch.tensor([300, 700], device=device)
    out = model.to(device, dtype)(x, context, timestep, None, num_frames=FRAMES, height=HEIGHT, width=WIDTH).sample
    out.float().pow(2).mean().backward()
    grads = {name: p.grad.float().cpu() for name, p in model.named_parameters() if p.grad is not None}
    return out.float().cpu(), x.grad.float().cpu(), context.grad.float().cpu(), grads


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiny_transformer_through_npu_paths_matches_cpu(dtype, counted, monkeypatch):
    assert diffusers.utils.is_torch_npu_available()
    model = tiny_model()
    reference = copy.deepcopy(model)
    inputs = (torch.randn(2, FRAMES * HEIGHT * WIDTH, 8), torch.randn(2, 5, 16))

    model.set_attention_backend("_native_npu")
    out, dx, dcontext, grads = run(model, "npu", dtype, inputs)
    # Per block: GEGLU once, two RMSNorms (before the attention and before the feed-forward),
    # two attentions (self and cross).
    assert counted == {"npu_geglu": 2, "npu_rms_norm": 4, "npu_fusion_attention": 4}, counted

    # The cpu reference: diffusers' branches for a machine without torch_npu, in float32
    # from the same (rounded) weights and inputs.
    monkeypatch.setattr(activations, "is_torch_npu_available", lambda: False)
    monkeypatch.setattr(normalization, "is_torch_npu_available", lambda: False)
    reference = reference.to(dtype).float()
    reference.set_attention_backend("native")
    before = dict(counted)
    ref_out, ref_dx, ref_dcontext, ref_grads = run(reference, "cpu", torch.float32,
                                                   tuple(t.to(dtype).float() for t in inputs))
    assert counted == before, "the cpu reference took an npu path"

    # Each result within a fraction of its largest value: 1% in float16 (a GEGLU off by 5% fails
    # it), 5% in bfloat16, whose 8-bit mantissa the npu's activations are rounded to throughout.
    limit = 1e-2 if dtype == torch.float16 else 5e-2
    assert grads.keys() == ref_grads.keys()
    results = {"out": (out, ref_out), "d hidden_states": (dx, ref_dx),
               "d encoder_hidden_states": (dcontext, ref_dcontext)}
    results.update({f"d {name}": (grad, ref_grads[name]) for name, grad in grads.items()})
    for name, (actual, expected) in results.items():
        error = (actual - expected).abs().max() / expected.abs().max().clamp_min(1e-6)
        assert error <= limit, f"{name}: off by {error:.3g} of its largest value (limit {limit})"

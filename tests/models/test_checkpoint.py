"""Activation checkpointing recomputes with the random numbers of the forward.

torch.utils.checkpoint stashes a device's RNG state only when the device module
says it is initialised (``torch.npu._initialized``, as ``torch.cuda._initialized``),
and restores it for the recomputation. `make test` runs this module again with
NPU_EMU_ALWAYS_ENQUEUE=1.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _random_block(kind, lin):
    def rand_like(t):
        return lin(t) * torch.rand_like(t)

    def drop_path(t):  # timm's DropPath: one Bernoulli draw per sample
        keep = torch.empty(t.shape[0], 1, device=t.device).bernoulli_(0.7)
        return lin(t) * keep / 0.7

    def dropout2d(t):
        return F.dropout2d(lin(t).view(t.shape[0], 4, 2, 1), 0.5, training=True).flatten(1)

    def dropout(t):
        return F.dropout(lin(t), 0.5, training=True)

    return {"rand_like": rand_like, "drop_path": drop_path, "dropout2d": dropout2d, "dropout": dropout}[kind]


def _gradients(kind, use_checkpoint, use_reentrant, cpu_seed, npu_seed=1234):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).npu()
    x = torch.randn(6, 8).npu().requires_grad_()
    block = _random_block(kind, lin)
    torch.npu.manual_seed(npu_seed)                        # the npu generator alone decides
    torch.random.default_generator.manual_seed(cpu_seed)  # the cpu's must have no effect
    out = checkpoint(block, x, use_reentrant=use_reentrant) if use_checkpoint else block(x)
    (out * torch.arange(8., device="npu")).sum().backward()
    return x.grad.cpu(), lin.weight.grad.cpu()


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("kind", ["rand_like", "drop_path", "dropout2d", "dropout"])
def test_checkpoint_recomputes_with_the_forwards_random_numbers(kind, use_reentrant):
    plain = _gradients(kind, use_checkpoint=False, use_reentrant=use_reentrant, cpu_seed=1)
    checkpointed = _gradients(kind, use_checkpoint=True, use_reentrant=use_reentrant, cpu_seed=2)
    for expected, got in zip(plain, checkpointed):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # the draw matters: another npu seed gives other gradients
    assert not torch.equal(_gradients(kind, False, use_reentrant, cpu_seed=1, npu_seed=99)[0], plain[0])


def test_checkpoint_reads_the_flag_torch_cuda_keeps(run_python):
    code = r"""
import json, torch
out = [torch.npu.is_initialized(), getattr(torch.npu, "_initialized", None)]
torch.npu.init()
out += [torch.npu.is_initialized(), torch.npu._initialized]
print(json.dumps(out))
"""
    from helpers import last_line
    assert last_line(run_python(code)) == "[false, false, true, true]"

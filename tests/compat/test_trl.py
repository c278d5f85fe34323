"""trl's activation offloading on the npu: with the accelerator "npu", its streamed
unpacking asks torch_npu._C._storage_Use_Count whether an activation brought back is still
referenced. The loss and the gradients match the cpu's without offloading."""
import copy

import pytest
import torch

import torch_npu

try:
    from trl.models.activation_offloading import get_act_offloading_ctx_manager
except Exception as exc:  # noqa: BLE001  (any failure to import trl is a reason to skip)
    pytest.skip(f"trl cannot be imported ({type(exc).__name__}: {exc}); install it with "
                f"`pip install -c .venv/constraints.txt trl` (make's .clients target does)", allow_module_level=True)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))


@pytest.mark.parametrize("use_streams", [True, False])
def test_activation_offloading_matches_the_cpu(monkeypatch, use_streams):
    assert torch.accelerator.current_accelerator().type == "npu"
    cpu_model = _model()
    npu_model = copy.deepcopy(cpu_model).npu()
    calls = []
    use_count = torch_npu._C._storage_Use_Count
    monkeypatch.setattr(torch_npu._C, "_storage_Use_Count", lambda cdata: calls.append(cdata) or use_count(cdata))
    x = torch.randn(16, 32)
    ctx = get_act_offloading_ctx_manager(npu_model, use_streams=use_streams, min_offload_size=256,
                                         warn_if_no_head=False)
    losses = []
    for _ in range(2):                          # twice: the second pass reuses the manager's state
        npu_model.zero_grad()
        with ctx:
            loss = npu_model(x.npu()).pow(2).mean()
        loss.backward()
        losses.append(loss.detach().cpu())
    expected = cpu_model(x).pow(2).mean()
    expected.backward()
    for got in losses:
        torch.testing.assert_close(got, expected.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(npu_model.named_parameters(), cpu_model.parameters()):
        assert p.grad is not None and p.grad.device.type == "npu", name
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=name)
    if use_streams:
        assert calls, "the streamed unpacking did not ask torch_npu._C._storage_Use_Count"

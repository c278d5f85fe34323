"""torch_npu.optim's NpuFused* optimizers: PyTorch's results, the Ascend signatures."""
import pytest
import torch

import torch_npu

CASES = {
    "NpuFusedAdam": (lambda p: torch_npu.optim.NpuFusedAdam(p, lr=0.05, weight_decay=0.1),
                     lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1)),
    "NpuFusedAdamW": (lambda p: torch_npu.optim.NpuFusedAdamW(p, lr=0.05),
                      lambda p: torch.optim.AdamW(p, lr=0.05)),
    "NpuFusedSGD": (lambda p: torch_npu.optim.NpuFusedSGD(p, lr=0.1, momentum=0.9, nesterov=True),
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    "NpuFusedRMSprop": (lambda p: torch_npu.optim.NpuFusedRMSprop(p, lr=0.01, momentum=0.5),
                        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5)),
    "NpuFusedAdadelta": (lambda p: torch_npu.optim.NpuFusedAdadelta(p, lr=0.5),
                         lambda p: torch.optim.Adadelta(p, lr=0.5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_optimizers_match_pytorchs_on_the_cpu(name):
    make_npu, make_cpu = CASES[name]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    npu_model = torch.nn.Linear(8, 4).npu()
    npu_model.load_state_dict(model.state_dict())
    cpu_opt, npu_opt = make_cpu(model.parameters()), make_npu(npu_model.parameters())
    for _ in range(3):
        x = torch.randn(5, 8)
        for m, opt, data in ((model, cpu_opt, x), (npu_model, npu_opt, x.npu())):
            opt.zero_grad()
            m(data).square().mean().backward()
            opt.step()
    for p, q in zip(npu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_sgd_needs_a_learning_rate():
    with pytest.raises(TypeError, match="lr is required"):
        torch_npu.optim.NpuFusedSGD([torch.nn.Parameter(torch.ones(2, device="npu"))])

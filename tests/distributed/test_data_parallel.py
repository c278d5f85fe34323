"""nn.DataParallel over npu devices, and torch.npu.comm (torch.cuda.comm's collectives)."""
import pytest
import torch

import torch_npu  # noqa: F401
from conftest import requires_two_devices


def _models():
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).npu()  # noqa: E731
    model, reference = make(), make()
    reference.load_state_dict(model.state_dict())
    return model, reference


@pytest.mark.parametrize("device_ids", [[0], pytest.param([0, 1], marks=requires_two_devices)])
def test_data_parallel_matches_one_device(device_ids):
    model, reference = _models()
    seen = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(args[0].device))
    dp = torch.nn.DataParallel(model, device_ids=device_ids)
    x = torch.randn(6, 4, device="npu")
    out = dp(x)
    out.square().sum().backward()
    expected = reference(x)
    expected.square().sum().backward()
    assert out.device == torch.device("npu", 0)
    torch.testing.assert_close(out, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert sorted({d.index for d in seen}) == device_ids          # each replica ran on its device


@requires_two_devices
def test_comm_collectives_between_npu_devices():
    from torch.nn.parallel import comm
    x = torch.arange(12.0, device="npu:0").reshape(6, 2)
    a, b = comm.broadcast(x, [0, 1])
    assert (a.device.index, b.device.index) == (0, 1) and torch.equal(b.cpu(), x.cpu())
    pieces = comm.scatter(x, [0, 1], chunk_sizes=[4, 2])
    assert [p.shape[0] for p in pieces] == [4, 2] and pieces[1].device.index == 1
    back = comm.gather(pieces, 0, destination=0)
    assert torch.equal(back.cpu(), x.cpu()) and back.device.index == 0
    assert comm.gather(pieces, 0, destination=-1).device.type == "cpu"
    total = comm.reduce_add([x, b], destination=1)
    assert total.device.index == 1 and torch.equal(total.cpu(), 2 * x.cpu())
    [(c0,), (c1,)] = comm.broadcast_coalesced([x], [0, 1])
    assert c1.device.index == 1 and torch.equal(c1.cpu(), x.cpu())
    with pytest.raises(ValueError, match="expected"):
        comm.reduce_add([x, x[:3]], destination=0)
    with pytest.raises(AttributeError, match="_broadcast"):
        comm.broadcast(torch.ones(2), [0])     # cpu tensors keep PyTorch's path (CUDA-only in this build)

"""Sparse compressed tensors (CSR, CSC, BSR) on the npu: their components live on the
device, and every op on them takes the CPU fallback (counted, and refused in error mode)."""
import warnings

import pytest
import torch

import torch_npu

DENSE = torch.tensor([[0.0, 2, 0, 1], [3, 0, 4, 0], [0, 0, 5, 0], [1, 0, 0, 6]])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # PyTorch's "sparse CSR support is in beta"
        yield


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_tensors_compute_as_on_the_cpu(layout):
    make = {"csr": lambda t: t.to_sparse_csr(), "csc": lambda t: t.to_sparse_csc(),
            "bsr": lambda t: t.to_sparse_bsr((2, 2))}[layout]
    host = make(DENSE)
    npu = host.npu()
    assert npu.device.type == "npu" and npu.layout == host.layout
    assert npu.values().device.type == "npu" and npu._nnz() == host._nnz()
    x = torch.arange(8.0).reshape(4, 2)
    torch.testing.assert_close((npu @ x.npu()).cpu(), host @ x)
    torch.testing.assert_close(npu.to_dense().cpu(), DENSE)
    doubled = npu * 2
    assert doubled.device.type == "npu" and doubled.layout == host.layout
    torch.testing.assert_close(doubled.to_dense().cpu(), DENSE * 2)
    torch.testing.assert_close(npu.cpu().to_dense(), DENSE)


def test_compressed_ops_are_fallbacks_the_mode_governs():
    npu = DENSE.to_sparse_csr().npu()
    torch_npu.NPUFallbackMode.reset_fallback_stats()
    (npu @ torch.ones(4, 1, device="npu")).cpu()
    stats = dict(torch_npu.NPUFallbackMode.get_fallback_stats().top_ops())
    assert stats.get("aten::mm") == 1, stats
    torch_npu.set_fallback_mode("error")
    with pytest.raises(NotImplementedError, match="aten::mm"):
        npu @ torch.ones(4, 1, device="npu")

"""The npu device: loading, torch.npu device management, tensor and module moves."""
import os

import pytest
import torch
import torch_npu

from conftest import NUM_DEVICES, requires_two_devices
from helpers import GiB, MiB, last_line

DEFAULT_CAPACITY = 4 * GiB


# ---- loading ---------------------------------------------------------------

def test_import_torch_alone_loads_torch_npu(run_python):
    proc = run_python(
        """
        import sys
        import torch
        x = torch.ones(2, device="npu")
        print(x.device, "torch_npu" in sys.modules, x.cpu().tolist())
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": None},
    )
    assert last_line(proc) == "npu:0 True [1.0, 1.0]"


def test_autoload_disabled_does_not_load_torch_npu(run_python):
    proc = run_python(
        """
        import sys
        import torch
        loaded = "torch_npu" in sys.modules
        try:
            torch.ones(2, device="npu")
            outcome = "created"
        except RuntimeError:
            outcome = "RuntimeError"
        print(loaded, outcome)
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert last_line(proc) == "False RuntimeError"


def test_backend_is_renamed_and_registered():
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is torch_npu.npu
    assert torch.device("npu:1").type == "npu"


# ---- torch.npu device management --------------------------------------------

def test_is_available_and_device_count():
    assert torch.npu.is_available()
    assert torch.npu.device_count() == NUM_DEVICES
    assert NUM_DEVICES == int(os.environ["NPU_EMU_DEVICES"])


def test_current_device_defaults_to_zero():
    assert torch.npu.current_device() == 0
    assert torch.empty(1, device="npu").device == torch.device("npu:0")


@requires_two_devices
def test_set_device():
    torch.npu.set_device(1)
    assert torch.npu.current_device() == 1
    assert torch.empty(2, device="npu").device == torch.device("npu:1")
    torch.npu.set_device("npu:0")
    assert torch.npu.current_device() == 0
    torch.npu.set_device(torch.device("npu", 1))
    assert torch.npu.current_device() == 1


@requires_two_devices
def test_device_context_switches_and_restores():
    assert torch.npu.current_device() == 0
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        assert torch.zeros(3, device="npu").device == torch.device("npu:1")
        with torch.npu.device("npu:0"):
            assert torch.npu.current_device() == 0
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0


@requires_two_devices
def test_device_context_restores_after_exception():
    with pytest.raises(KeyError):
        with torch.npu.device(1):
            raise KeyError("inside")
    assert torch.npu.current_device() == 0


def test_device_name_and_properties():
    assert torch.npu.get_device_name() == "Emulated NPU"
    assert torch.npu.get_device_name(0) == torch.npu.get_device_name("npu:0")
    props = torch.npu.get_device_properties(0)
    assert props.name == "Emulated NPU"
    if "NPU_EMU_MEMORY" not in os.environ:
        assert props.total_memory == DEFAULT_CAPACITY
    assert props.multi_processor_count >= 1
    assert "Emulated NPU" in repr(props)
    assert torch.npu.get_device_capability(0) == (props.major, props.minor)


@pytest.mark.skipif("NPU_EMU_MEMORY" in os.environ, reason="checks the default capacity")
def test_mem_get_info_default_capacity():
    free, total = torch.npu.mem_get_info()
    assert total == DEFAULT_CAPACITY
    assert 0 < free <= total
    for index in range(NUM_DEVICES):
        free_i, total_i = torch.npu.mem_get_info(index)
        assert total_i == DEFAULT_CAPACITY and free_i <= total_i


def test_mem_get_info_tracks_reserved_memory(clean_npu):
    free0, _ = torch.npu.mem_get_info()
    reserved0 = torch.npu.memory_reserved()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="npu")
    free1, _ = torch.npu.mem_get_info()
    grown = torch.npu.memory_reserved() - reserved0
    assert grown >= 8 * MiB
    # The device sees exactly what the caching allocator reserved from it.
    assert free0 - free1 == grown
    del x
    torch.npu.empty_cache()
    assert torch.npu.mem_get_info()[0] == free0


def test_accelerator_reports_npu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "npu"
    assert torch.accelerator.device_count() == NUM_DEVICES


# ---- moving tensors and modules -----------------------------------------------

def test_tensor_npu_and_cpu():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = x.npu()
    assert y.device == torch.device("npu:0")
    assert y.is_npu and not x.is_npu
    assert y.shape == x.shape and y.dtype == x.dtype
    z = y.cpu()
    assert z.device.type == "cpu" and not z.is_npu
    assert torch.equal(z, x)


@requires_two_devices
def test_tensor_npu_with_index():
    x = torch.arange(5)
    assert x.npu(1).device == torch.device("npu:1")
    assert torch.equal(x.npu(1).cpu(), x)


def test_to_npu_0():
    x = torch.randn(4, 5)
    y = x.to("npu:0")
    assert y.device == torch.device("npu:0")
    assert torch.equal(y.cpu(), x)
    assert torch.equal(x.to(torch.device("npu")).cpu(), x)


@requires_two_devices
def test_to_npu_1_and_back():
    x = torch.randn(4, 5)
    y = x.to("npu:1")
    assert y.device == torch.device("npu:1")
    assert torch.equal(y.cpu(), x)
    w = y.to("npu:0")
    assert w.device == torch.device("npu:0")
    assert torch.equal(w.cpu(), x)


def test_to_same_device_is_noop():
    y = torch.randn(3).npu()
    assert y.to("npu:0") is y
    assert y.npu() is y


def test_randn_on_npu():
    x = torch.randn(3, device="npu")
    assert x.device == torch.device("npu:0")
    assert x.shape == (3,) and x.dtype == torch.float32
    host = x.cpu()
    assert torch.isfinite(host).all()
    assert len(set(host.tolist())) == 3  # three different draws


def test_module_npu():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    weight, bias = linear.weight.detach().clone(), linear.bias.detach().clone()
    assert linear.npu() is linear
    for param in linear.parameters():
        assert param.device == torch.device("npu:0")
        assert param.is_npu
    assert torch.equal(linear.weight.detach().cpu(), weight)
    assert torch.equal(linear.bias.detach().cpu(), bias)
    linear.cpu()
    assert linear.weight.device.type == "cpu"
    assert torch.equal(linear.weight.detach(), weight)


def test_module_to_npu_keeps_buffers():
    bn = torch.nn.BatchNorm1d(4)
    bn.running_mean.fill_(1.5)
    bn.to("npu")
    assert bn.running_mean.device == torch.device("npu:0")
    assert bn.num_batches_tracked.device == torch.device("npu:0")
    assert torch.equal(bn.running_mean.cpu(), torch.full((4,), 1.5))


# ---- invalid devices ------------------------------------------------------------

@pytest.mark.parametrize(
    "action",
    [
        lambda: torch.ones(2, device="npu:5"),
        lambda: torch.ones(2).to("npu:5"),
        lambda: torch.empty(2, device=torch.device("npu", 5)),
        lambda: torch.npu.set_device(5),
    ],
    ids=["factory", "to", "empty", "set_device"],
)
def test_invalid_device_raises_with_device_count(action):
    with pytest.raises((RuntimeError, ValueError)) as info:
        action()
    message = str(info.value)
    assert "npu:5" in message
    assert f"there are {NUM_DEVICES} npu device" in message
    assert torch.npu.current_device() == 0


# ---- printing -----------------------------------------------------------------

def test_str_of_npu_device_and_dtype_attributes():
    y = torch.zeros(2, 2, device="npu")
    assert str(y.device) == "npu:0"
    assert y.is_contiguous() and y.numel() == 4


def test_repr_of_npu_tensor():
    y = torch.tensor([1.5, -2.0, 3.0]).npu()
    text = repr(y)
    assert "device='npu:0'" in text
    assert "1.5000" in text and "-2.0000" in text


def test_import_torch_npu_first(run_python):
    proc = run_python(
        """
        import torch_npu
        import torch
        print(torch.ones(2, device="npu").device)
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": None},
    )
    assert last_line(proc) == "npu:0"


def test_import_torch_npu_first_without_autoload(run_python):
    proc = run_python(
        """
        import torch_npu
        import torch
        print(torch.ones(2, device="npu").device)
        """,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )
    assert last_line(proc) == "npu:0"

"""The npu's DeviceInterface: what dynamo and inductor ask of a device
(current device and stream, synchronize, properties) answered by torch.npu."""
import torch
from torch._dynamo import device_interface as _di


class NpuInterface(_di.DeviceInterface):
    device = torch.npu.device
    Event = torch.npu.Event
    Stream = torch.npu.Stream

    class Worker:
        """Answers for compile worker processes, which must not initialise the device."""

        @staticmethod
        def set_device(device: int):
            _di.caching_worker_current_devices["npu"] = device

        @staticmethod
        def current_device() -> int:
            if "npu" in _di.caching_worker_current_devices:
                return _di.caching_worker_current_devices["npu"]
            return torch.npu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            if device is not None:
                if isinstance(device, str):
                    device = torch.device(device)
                if isinstance(device, torch.device):
                    device = device.index if device.index is not None else NpuInterface.Worker.current_device()
            else:
                device = NpuInterface.Worker.current_device()
            cache = _di.caching_worker_device_properties
            if "npu" not in cache:
                cache["npu"] = [torch.npu.get_device_properties(i) for i in range(torch.npu.device_count())]
            return cache["npu"][device]

    current_device = staticmethod(torch.npu.current_device)
    set_device = staticmethod(torch.npu.set_device)
    device_count = staticmethod(torch.npu.device_count)
    stream = staticmethod(torch.npu.stream)
    current_stream = staticmethod(torch.npu.current_stream)
    set_stream = staticmethod(torch.npu.set_stream)
    synchronize = staticmethod(torch.npu.synchronize)
    get_device_properties = staticmethod(torch.npu.get_device_properties)
    memory_allocated = staticmethod(torch.npu.memory_allocated)

    @staticmethod
    def is_available() -> bool:
        return torch.npu.is_available()

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = torch.npu.current_device()
        if device >= 0 and device != previous:
            torch.npu.set_device(device)
        return previous

    @staticmethod
    def exchange_device(device: int) -> int:
        return NpuInterface.maybe_exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int):
        torch.npu.set_stream(torch.npu.Stream(stream_id=stream_id, device_index=device_index,
                                              device_type=device_type))

    @staticmethod
    def get_raw_stream(device_index: int) -> int:
        return torch.npu.current_stream(device_index).stream_id

    @staticmethod
    def get_compute_capability(device=None) -> str:
        return ""   # not a Triton target: the C++ code generator serves the npu

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.npu.is_bf16_supported()   # per the device profile's chip

    @staticmethod
    def is_dtype_supported(dtype, including_emulation: bool = False) -> bool:
        return dtype != torch.bfloat16 or torch.npu.is_bf16_supported()

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False


def register():
    _di.register_interface_for_device("npu", NpuInterface)
    for i in range(torch.npu.device_count()):
        _di.register_interface_for_device(f"npu:{i}", NpuInterface)

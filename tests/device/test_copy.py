"""Copies between cpu and npu and between npu devices; views, resize_, set_, fill_."""
import pytest
import torch

from conftest import requires_two_devices, scenario_result

ALL_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
    torch.bool, torch.complex64,
]
# Same-width integer types to compare floating point values bit for bit.
BITS = {
    torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
    torch.float64: torch.int64, torch.complex64: torch.int64,
}


def sample(dtype, shape=(7, 13), seed=0):
    """Values that cover the dtype's range, including its extremes and specials."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)).to(dtype)
    if dtype.is_floating_point:
        x = (torch.randn(shape, generator=gen, dtype=torch.float64) * 1000).to(dtype)
        info = torch.finfo(dtype)
        flat = x.view(-1)
        flat[:6] = torch.tensor([float("inf"), float("-inf"), float("nan"), info.max, info.tiny, -0.0],
                                dtype=torch.float64).to(dtype)
        return x
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)
    x.view(-1)[:2] = torch.tensor([info.min, info.max], dtype=torch.int64).to(dtype)
    return x


def assert_identical(actual, expected):
    """Same dtype, shape and bits (NaN payloads and -0.0 included)."""
    assert actual.device.type == "cpu"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype in BITS:
        a, e = actual.contiguous(), expected.contiguous()
        if expected.is_complex():
            a, e = torch.view_as_real(a), torch.view_as_real(e)
            a, e = a.contiguous().view(torch.int32), e.contiguous().view(torch.int32)
        else:
            a, e = a.view(BITS[expected.dtype]), e.view(BITS[expected.dtype])
        assert torch.equal(a, e)
    else:
        assert torch.equal(actual, expected)


# ---- round trips ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_round_trip_every_dtype(dtype):
    x = sample(dtype)
    y = x.to("npu")
    assert y.device == torch.device("npu:0") and y.dtype == dtype and y.shape == x.shape
    assert_identical(y.cpu(), x)


@requires_two_devices
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64],
                         ids=str)
def test_round_trip_through_second_device(dtype):
    x = sample(dtype, seed=1)
    y = x.to("npu:1")
    assert y.device == torch.device("npu:1")
    assert_identical(y.cpu(), x)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 2), (1 << 20,)], ids=str)
def test_round_trip_shapes(shape):
    x = torch.randn(shape)
    y = x.npu()
    assert y.shape == x.shape
    assert_identical(y.cpu(), x)


def test_tensor_constructor_on_npu():
    y = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32, device="npu")
    assert y.device.type == "npu"
    assert y.cpu().tolist() == [[1, 2], [3, 4]]


# ---- non-contiguous layouts ---------------------------------------------------------

NON_CONTIGUOUS_SOURCES = {
    "transposed": lambda x: x.t(),
    "step_slice": lambda x: x[1::2, ::3],
    "column": lambda x: x[:, 5],
    "expanded": lambda x: x[0:1].expand(6, x.shape[1]),
    "expanded_scalar": lambda x: x[2, 3].expand(4, 5),
    "permuted_3d": lambda x: x.reshape(2, 6, 13).permute(2, 0, 1),
}


@pytest.mark.parametrize("make_view", NON_CONTIGUOUS_SOURCES.values(), ids=NON_CONTIGUOUS_SOURCES.keys())
def test_non_contiguous_cpu_source_to_npu(make_view):
    x = torch.randn(12, 13)
    src = make_view(x)
    assert not src.is_contiguous() or src.dim() < 2
    y = src.to("npu")
    assert y.shape == src.shape
    assert torch.equal(y.cpu(), src)


@pytest.mark.parametrize("make_view", NON_CONTIGUOUS_SOURCES.values(), ids=NON_CONTIGUOUS_SOURCES.keys())
def test_non_contiguous_npu_source_to_cpu(make_view):
    x = torch.randn(12, 13)
    y = x.npu()
    src = make_view(y)
    expected = make_view(x)
    assert src.stride() == expected.stride()
    assert torch.equal(src.cpu(), expected)
    assert torch.equal(src.contiguous().cpu(), expected)


@pytest.mark.parametrize("make_view", NON_CONTIGUOUS_SOURCES.values(), ids=NON_CONTIGUOUS_SOURCES.keys())
def test_non_contiguous_npu_source_to_npu(make_view):
    x = torch.randn(12, 13)
    src = make_view(x.npu())
    out = torch.empty(src.shape, device="npu")
    out.copy_(src)
    assert torch.equal(out.cpu(), make_view(x))
    assert torch.equal(src.clone().cpu(), make_view(x))


def test_non_contiguous_npu_destination_from_cpu():
    expected = torch.zeros(6, 8)
    dst = torch.zeros(6, 8, device="npu")
    src = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    dst[:, ::2].copy_(src)
    expected[:, ::2].copy_(src)
    assert torch.equal(dst.cpu(), expected)
    # a transposed destination
    src_t = torch.randn(8, 6)
    dst.t().copy_(src_t)
    assert torch.equal(dst.cpu(), src_t.t())


def test_non_contiguous_npu_destination_from_npu():
    base = torch.randn(5, 9)
    dst = torch.full((5, 9), -1.0).npu()
    src = base.npu()
    dst[1::2, 2::3].copy_(src[:2, :3].t().t())
    expected = torch.full((5, 9), -1.0)
    expected[1::2, 2::3] = base[:2, :3]
    assert torch.equal(dst.cpu(), expected)


def test_non_contiguous_npu_to_non_contiguous_cpu_destination():
    x = torch.randn(4, 6)
    y = x.npu()
    out = torch.zeros(6, 4)
    out.t().copy_(y)
    assert torch.equal(out, x.t())


# ---- dtype conversion ----------------------------------------------------------

def test_npu_float32_to_cpu_float16():
    x = torch.randn(100) * 100
    y = x.npu()
    z = y.to("cpu", torch.float16)
    assert z.dtype == torch.float16 and z.device.type == "cpu"
    assert torch.equal(z, x.to(torch.float16))


def test_cpu_to_npu_with_dtype_conversion():
    x = torch.arange(-5, 5, dtype=torch.int64)
    y = x.to("npu", torch.float32)
    assert y.dtype == torch.float32 and y.device.type == "npu"
    assert torch.equal(y.cpu(), x.float())


@pytest.mark.parametrize("src_dtype,dst_dtype", [
    (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.float16, torch.float32),
    (torch.float32, torch.int32),
    (torch.int32, torch.bool),
    (torch.float64, torch.float32),
], ids=str)
def test_npu_to_npu_dtype_conversion(src_dtype, dst_dtype):
    x = (torch.randn(50) * 10).to(src_dtype)
    y = x.npu().to(dst_dtype)
    assert y.device.type == "npu" and y.dtype == dst_dtype
    assert torch.equal(y.cpu(), x.to(dst_dtype))


def test_copy_into_npu_of_other_dtype():
    dst = torch.zeros(4, dtype=torch.float32, device="npu")
    dst.copy_(torch.tensor([1.25, 2.5, -3.0, 4.75], dtype=torch.float64))
    assert dst.cpu().tolist() == [1.25, 2.5, -3.0, 4.75]
    dst_int = torch.zeros(4, dtype=torch.int16, device="npu")
    dst_int.copy_(dst)
    assert dst_int.cpu().tolist() == [1, 2, -3, 4]


# ---- npu to npu ------------------------------------------------------------------

def test_npu_to_npu_same_device():
    x = torch.randn(33, 7)
    src = x.npu()
    dst = torch.empty(33, 7, device="npu")
    dst.copy_(src)
    assert dst.data_ptr() != src.data_ptr()
    assert torch.equal(dst.cpu(), x)


@requires_two_devices
def test_npu_to_npu_across_devices():
    x = torch.randn(1000)
    a = x.to("npu:0")
    b = a.to("npu:1")
    assert b.device == torch.device("npu:1")
    assert torch.equal(b.cpu(), x)
    dst0 = torch.zeros(1000, device="npu:0")
    dst0.copy_(b)
    assert torch.equal(dst0.cpu(), x)
    dst1 = torch.zeros(1000, device="npu:1")
    dst1.copy_(a)
    assert torch.equal(dst1.cpu(), x)


@requires_two_devices
def test_npu_to_npu_across_devices_sees_queued_writes():
    a = torch.zeros(1 << 16, device="npu:0")
    for value in range(1, 6):
        a.fill_(float(value))
        b = a.to("npu:1")
        assert torch.equal(b.cpu(), torch.full((1 << 16,), float(value)))


@requires_two_devices
def test_npu_to_npu_across_devices_non_contiguous():
    x = torch.randn(6, 10)
    b = x.npu(0).t().to("npu:1")
    assert torch.equal(b.cpu(), x.t())


# ---- non_blocking -----------------------------------------------------------------

def test_pin_memory_non_blocking_to_npu():
    x = torch.randn(256, 1024)
    pinned = x.pin_memory()
    assert pinned.is_pinned()
    y = pinned.to("npu", non_blocking=True)
    torch.npu.synchronize()
    assert y.device.type == "npu"
    assert torch.equal(y.cpu(), x)


def test_non_blocking_npu_to_pinned_cpu():
    x = torch.randn(256, 1024)
    y = x.npu()
    out = torch.empty(256, 1024, pin_memory=True)
    assert out.is_pinned()
    out.copy_(y, non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(out, x)
    z = y.to("cpu", non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(z, x)


def test_non_blocking_from_pageable_memory_is_still_correct():
    x = torch.randn(1000)
    expected = x.clone()
    y = x.to("npu", non_blocking=True)
    x.fill_(0.0)  # pageable source reused right away: the copy must not depend on it
    del x
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), expected)


def test_non_blocking_pinned_source_freed_before_sync():
    x = torch.randn(1 << 18)
    expected = x.clone()
    pinned = x.pin_memory()
    y = pinned.to("npu", non_blocking=True)
    del pinned
    torch.npu.synchronize()
    assert torch.equal(y.cpu(), expected)


# ---- copy_ broadcasting, clone ---------------------------------------------------------

def test_copy_broadcasts_from_cpu():
    dst = torch.empty(4, 3, device="npu")
    dst.copy_(torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(dst.cpu(), torch.tensor([1.0, 2.0, 3.0]).expand(4, 3))
    dst.copy_(torch.tensor(7.0))
    assert torch.equal(dst.cpu(), torch.full((4, 3), 7.0))


def test_copy_broadcasts_from_npu():
    dst = torch.empty(2, 4, 3, device="npu")
    src = torch.tensor([[1.0], [2.0], [3.0], [4.0]]).npu()
    dst.copy_(src)
    expected = torch.tensor([[1.0], [2.0], [3.0], [4.0]]).expand(2, 4, 3)
    assert torch.equal(dst.cpu(), expected)


def test_copy_broadcasts_to_cpu():
    dst = torch.zeros(3, 2)
    dst.copy_(torch.tensor([5.0, 6.0]).npu())
    assert torch.equal(dst, torch.tensor([[5.0, 6.0]] * 3))


def test_clone():
    x = torch.randn(5, 6)
    y = x.npu()
    c = y.clone()
    assert c.device == y.device and c.data_ptr() != y.data_ptr()
    assert torch.equal(c.cpu(), x)
    c.fill_(0.0)
    assert torch.equal(y.cpu(), x)
    ct = y.t().clone()
    assert ct.stride() == y.t().stride()  # preserve_format keeps the layout
    assert torch.equal(ct.cpu(), x.t())
    cc = y.t().clone(memory_format=torch.contiguous_format)
    assert cc.is_contiguous() and torch.equal(cc.cpu(), x.t())


# ---- views share storage ------------------------------------------------------------

def test_view_shares_storage_and_sees_fill():
    y = torch.zeros(3, 4, device="npu")
    v = y.view(12)
    assert v.data_ptr() == y.data_ptr()
    v[4:8].fill_(2.0)
    expected = torch.zeros(3, 4)
    expected[1] = 2.0
    assert torch.equal(y.cpu(), expected)


def test_transpose_shares_storage_and_sees_fill():
    y = torch.zeros(3, 4, device="npu")
    t = y.t()
    assert t.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    t[0].fill_(5.0)  # column 0 of y
    expected = torch.zeros(3, 4)
    expected[:, 0] = 5.0
    assert torch.equal(y.cpu(), expected)


def test_as_strided_shares_storage():
    x = torch.arange(10, dtype=torch.float32)
    y = x.npu()
    s = torch.as_strided(y, (3, 2), (3, 1), 1)
    assert torch.equal(s.cpu(), torch.as_strided(x, (3, 2), (3, 1), 1))
    s.zero_()
    expected = x.clone()
    torch.as_strided(expected, (3, 2), (3, 1), 1).zero_()
    assert torch.equal(y.cpu(), expected)


def test_reshape_of_contiguous_is_a_view():
    y = torch.ones(2, 6, device="npu")
    r = y.reshape(3, 4)
    assert r.data_ptr() == y.data_ptr()
    r.zero_()
    assert torch.equal(y.cpu(), torch.zeros(2, 6))


def test_reshape_of_non_contiguous_copies():
    x = torch.randn(3, 4)
    y = x.npu()
    r = y.t().reshape(12)
    assert torch.equal(r.cpu(), x.t().reshape(12))
    r.fill_(1.0)
    assert torch.equal(y.cpu(), x)  # a copy, not a view


def test_select_and_slices_are_views():
    y = torch.zeros(4, 5, device="npu")
    y[2].fill_(1.0)
    y[:, 3].fill_(2.0)
    y[0, 0].fill_(3.0)
    expected = torch.zeros(4, 5)
    expected[2] = 1.0
    expected[:, 3] = 2.0
    expected[0, 0] = 3.0
    assert torch.equal(y.cpu(), expected)


def test_unsqueeze_squeeze_flatten_views():
    x = torch.randn(2, 3)
    y = x.npu()
    assert torch.equal(y.unsqueeze(0).cpu(), x.unsqueeze(0))
    assert torch.equal(y.unsqueeze(1).squeeze(1).cpu(), x)
    assert torch.equal(y.flatten().cpu(), x.flatten())
    assert y.flatten().data_ptr() == y.data_ptr()


# ---- resize_ and set_ --------------------------------------------------------------

def test_resize_grows_and_keeps_values():
    y = torch.tensor([1.0, 2.0, 3.0]).npu()
    y.resize_(1000)
    assert y.shape == (1000,)
    assert y.untyped_storage().nbytes() >= 4000
    assert y[:3].cpu().tolist() == [1.0, 2.0, 3.0]
    y[3:].fill_(9.0)
    host = y.cpu()
    assert host[:3].tolist() == [1.0, 2.0, 3.0] and (host[3:] == 9.0).all()


def test_resize_shrinks_and_regrows_within_storage():
    y = torch.arange(10, dtype=torch.float32).npu()
    ptr = y.data_ptr()
    y.resize_(2, 3)
    assert y.shape == (2, 3) and y.data_ptr() == ptr
    assert torch.equal(y.cpu(), torch.arange(6, dtype=torch.float32).reshape(2, 3))
    y.resize_(10)
    assert y.data_ptr() == ptr
    assert torch.equal(y.cpu(), torch.arange(10, dtype=torch.float32))


def test_resize_of_empty_tensor():
    y = torch.empty(0, dtype=torch.int64, device="npu")
    y.resize_(4, 4)
    y.fill_(3)
    assert torch.equal(y.cpu(), torch.full((4, 4), 3, dtype=torch.int64))


def test_untyped_storage_resize_keeps_bytes():
    y = torch.tensor([1.0, 2.0], device="npu")
    storage = y.untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64
    assert y.cpu().tolist() == [1.0, 2.0]


def test_set_tensor_shares_storage():
    src = torch.arange(6, dtype=torch.float32).npu()
    dst = torch.empty(0, device="npu")
    dst.set_(src)
    assert dst.data_ptr() == src.data_ptr() and dst.shape == src.shape
    dst.fill_(4.0)
    assert torch.equal(src.cpu(), torch.full((6,), 4.0))


def test_set_storage_with_offset_size_stride():
    src = torch.arange(10, dtype=torch.float32).npu()
    dst = torch.empty(0, device="npu")
    dst.set_(src.untyped_storage(), 2, (2, 3), (1, 2))
    assert dst.storage_offset() == 2 and dst.stride() == (1, 2)
    expected = torch.as_strided(torch.arange(10, dtype=torch.float32), (2, 3), (1, 2), 2)
    assert torch.equal(dst.cpu(), expected)


def test_set_whole_storage():
    src = torch.arange(5, dtype=torch.int32).npu()
    dst = torch.empty(0, dtype=torch.int32, device="npu")
    dst.set_(src.untyped_storage())
    assert dst.shape == (5,)
    assert dst.cpu().tolist() == [0, 1, 2, 3, 4]


def test_set_empty():
    dst = torch.ones(4, device="npu")
    dst.set_()
    assert dst.shape == (0,) and dst.device.type == "npu"
    assert dst.cpu().numel() == 0


def test_set_cpu_storage_on_npu_tensor_raises():
    dst = torch.empty(0, device="npu")
    with pytest.raises(RuntimeError):
        dst.set_(torch.zeros(3).untyped_storage())


# ---- scalars and factories -----------------------------------------------------------

@pytest.mark.parametrize("value,dtype", [
    (3.5, torch.float32), (-2.25, torch.float16), (1.5, torch.bfloat16), (0.1, torch.float64),
    (-7, torch.int8), (250, torch.uint8), (123456789012, torch.int64), (True, torch.bool),
], ids=str)
def test_item(value, dtype):
    y = torch.tensor(value, dtype=dtype).npu()
    assert y.item() == torch.tensor(value, dtype=dtype).item()


def test_item_of_element_and_complex():
    y = torch.tensor([1.0, 2.0, 3.0]).npu()
    assert y[2].item() == 3.0
    assert torch.tensor(1 + 2j, dtype=torch.complex64).npu().item() == 1 + 2j
    with pytest.raises(RuntimeError):
        y.item()  # more than one element


def test_item_after_queued_fill():
    y = torch.zeros((), device="npu")
    for value in (1.0, 2.0, 3.0):
        y.fill_(value)
        assert y.item() == value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.uint8, torch.bool], ids=str)
def test_factories(dtype):
    z = torch.zeros(3, 4, dtype=dtype, device="npu")
    assert z.device == torch.device("npu:0") and z.dtype == dtype
    assert torch.equal(z.cpu(), torch.zeros(3, 4, dtype=dtype))
    o = torch.ones(5, dtype=dtype, device="npu")
    assert torch.equal(o.cpu(), torch.ones(5, dtype=dtype))
    f = torch.full((2, 2), 1, dtype=dtype, device="npu")
    assert torch.equal(f.cpu(), torch.full((2, 2), 1, dtype=dtype))
    e = torch.empty(2, 3, dtype=dtype, device="npu")
    assert e.shape == (2, 3) and e.dtype == dtype and e.device.type == "npu"


def test_full_and_like_factories():
    f = torch.full((3,), 7.25, device="npu")
    assert f.cpu().tolist() == [7.25] * 3
    assert torch.zeros_like(f).cpu().tolist() == [0.0] * 3
    assert torch.ones_like(f).cpu().tolist() == [1.0] * 3
    assert torch.full_like(f, -1.5).cpu().tolist() == [-1.5] * 3
    e = torch.empty_like(f)
    assert e.device == f.device and e.shape == f.shape
    s = torch.empty_strided((2, 3), (1, 2), device="npu")
    assert s.stride() == (1, 2) and s.device.type == "npu"


def test_fill_scalar_and_tensor():
    x = torch.empty(4, 5, device="npu")
    assert x.fill_(3.5) is x
    assert torch.equal(x.cpu(), torch.full((4, 5), 3.5))
    x.fill_(torch.tensor(-1.0))  # a cpu 0-dim value
    assert torch.equal(x.cpu(), torch.full((4, 5), -1.0))
    x.fill_(torch.tensor(2.0, device="npu"))  # an npu 0-dim value
    assert torch.equal(x.cpu(), torch.full((4, 5), 2.0))
    x.zero_()
    assert torch.equal(x.cpu(), torch.zeros(4, 5))


def test_fill_converts_to_the_tensor_dtype():
    x = torch.empty(3, dtype=torch.int32, device="npu")
    x.fill_(2.9)
    assert x.cpu().tolist() == [2, 2, 2]
    b = torch.empty(3, dtype=torch.bfloat16, device="npu").fill_(1.0 / 3)
    assert torch.equal(b.cpu(), torch.full((3,), 1.0 / 3, dtype=torch.bfloat16))


@requires_two_devices
def test_cross_device_copy_source_freed_before_copy_ran(async_results):
    r = scenario_result(async_results, "cross_device_copy_source_freed_early")
    assert r["values"] == [1.0], f"npu:1 received {r['values']} instead of the source's 1.0"


# ---- large copies: the stream's copy shares them with helper threads ----------------------
# A copy of at least 4 MiB is split into 512 KiB chunks that the copying thread and up to
# torch.get_num_threads() - 1 helpers claim; the sizes below are several chunks and no
# multiple of one, so the last chunk is partial.

BIG = 9 * (1 << 20) + 12345


def big_source(seed):
    return torch.randint(0, 256, (BIG,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=[1, None, 4], ids=["1-thread", "default-threads", "4-threads"])
def intra_op_threads(request):
    before = torch.get_num_threads()
    if request.param is not None:
        torch.set_num_threads(request.param)
    yield
    torch.set_num_threads(before)


def busy_side_stream():
    """A long kernel on another stream, running while the copies under test run."""
    side = torch.npu.Stream()
    a = torch.randn(768, 768, device="npu")
    side.wait_stream(torch.npu.current_stream())  # a's values come from the current stream
    a.record_stream(side)  # and its block must not be reused before the side stream is done with it
    with torch.npu.stream(side):
        for _ in range(6):
            a = a @ a / 768
    return side, a


@pytest.mark.usefixtures("intra_op_threads")
def test_large_copies_every_direction_bit_for_bit():
    side, busy = busy_side_stream()
    x = big_source(1)
    y = x.to("npu")  # pageable cpu -> npu
    assert torch.equal(y.cpu(), x)  # npu -> pageable cpu
    pinned = big_source(2).pin_memory()
    y.copy_(pinned, non_blocking=True)  # pinned cpu -> npu, in stream order
    back = torch.empty(BIG, dtype=torch.uint8, pin_memory=True)
    back.copy_(y, non_blocking=True)  # npu -> pinned cpu
    torch.npu.current_stream().synchronize()
    assert torch.equal(back, pinned)
    z = torch.empty(BIG, dtype=torch.uint8, device="npu")
    z.copy_(y)  # npu -> npu
    assert torch.equal(z.cpu(), pinned)
    side.synchronize()
    assert torch.isfinite(busy).all()


@pytest.mark.usefixtures("intra_op_threads")
def test_large_copy_after_queued_kernel_and_before_the_next():
    # The copy reads what the kernel before it wrote, and the kernel after it reads the copy.
    x = big_source(3)
    y = x.to("npu")
    y.add_(1)  # queued (or run) before the copy back
    expected = x + 1
    assert torch.equal(y.cpu(), expected)
    y.copy_(x)  # overwrites the whole buffer, then a kernel reads it
    y.mul_(3)
    assert torch.equal(y.cpu(), x * 3)


@pytest.mark.usefixtures("intra_op_threads")
def test_large_copies_into_a_buffer_read_back_after_an_event():
    side = torch.npu.Stream()
    pinned = big_source(4).pin_memory()
    buf = torch.empty(BIG, dtype=torch.uint8, device="npu")
    out = torch.empty(BIG, dtype=torch.uint8, pin_memory=True)
    with torch.npu.stream(side):
        buf.copy_(pinned, non_blocking=True)
        copied = side.record_event()
    torch.npu.current_stream().wait_event(copied)
    buf.record_stream(torch.npu.current_stream())
    doubled = buf * 2
    out.copy_(buf, non_blocking=True)
    done = torch.npu.current_stream().record_event()
    done.synchronize()
    assert torch.equal(out, pinned)
    assert torch.equal(doubled.cpu(), pinned * 2)


@pytest.mark.usefixtures("intra_op_threads")
def test_large_non_contiguous_and_converting_copies():
    x = torch.randn(1500, 1025)  # ~6 MiB of float32
    y = x.to("npu")
    assert torch.equal(y.t().contiguous().cpu(), x.t().contiguous())
    assert torch.equal(y.t().cpu(), x.t())
    assert torch.equal(y.to(torch.float64).cpu(), x.to(torch.float64))
    assert torch.equal(x.t().to("npu").cpu(), x.t())
    assert_identical(x.to("npu", torch.float16).cpu(), x.to(torch.float16))
    wide = torch.empty(1500, 1025, dtype=torch.float64)
    wide.copy_(y)
    assert torch.equal(wide, x.to(torch.float64))


def test_large_copy_uses_helpers_only_as_torch_threads_allow():
    # torch.set_num_threads(1) keeps a copy on one thread; with 2 threads one helper joins.
    code = """
        import os, torch, torch_npu
        def helpers():
            names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
            return names.count("npu_copy")
        x = torch.randn(4 << 20)
        torch.set_num_threads(1)
        assert torch.equal(x.to("npu").cpu(), x)
        one = helpers()
        torch.set_num_threads(2)
        assert torch.equal(x.to("npu").cpu(), x)
        print(one, helpers())
    """
    from helpers import run_python
    proc = run_python(code)
    assert proc.stdout.split()[-2:] == ["0", "1"], proc.stdout

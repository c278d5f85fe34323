"""The Ascend adapter's dtype codes (torch_npu.float8_e8m0fnu, float4_e2m1fn_x2, hifloat8, ... and
torch_npu._C._cd.DType: ACL's aclDataType + 256), the ops that take them as `int` dtype arguments,
HiFloat8 (its encoding, torch_npu._C._cd's casts, torch_npu.HiFloat8Tensor), and the msprobe names
torch_npu.npu.utils.get_npu_diff_flag / clear_npu_diff_flag (refused by name)."""
import math
import os
import sys

import pytest
import torch

import torch_npu

# ACL's aclDataType values (acl_base.h), + 256, and the torch dtype each means where torch has one.
CODES = {
    "float32": (256, torch.float32), "float16": (257, torch.float16), "int8": (258, torch.int8),
    "int32": (259, torch.int32), "uint8": (260, torch.uint8), "int16": (262, torch.int16),
    "uint16": (263, torch.uint16), "uint32": (264, torch.uint32), "int64": (265, torch.int64),
    "uint64": (266, torch.uint64), "float64": (267, torch.float64), "bool": (268, torch.bool),
    "string": (269, None), "complex64": (272, torch.complex64), "complex128": (273, torch.complex128),
    "bfloat16": (283, torch.bfloat16), "int4": (285, None), "uint1": (286, None),
    "complex32": (289, torch.complex32), "hifloat8": (290, None), "float8_e5m2": (291, torch.float8_e5m2),
    "float8_e4m3fn": (292, torch.float8_e4m3fn), "float8_e8m0fnu": (293, torch.float8_e8m0fnu),
    "float6_e3m2": (294, None), "float6_e2m3": (295, None), "float4_e2m1fn_x2": (296, torch.float4_e2m1fn_x2),
    "float4_e1m2fn_x2": (297, None),
}


def test_codes_on_torch_npu_and_cd():
    import torch_npu._C._cd as cd   # a real submodule of _C
    assert cd is torch_npu._C._cd
    for name, (code, torch_dtype) in CODES.items():
        assert getattr(torch_npu, name) == code, name
        assert getattr(cd.DType, name) == code, name
        assert isinstance(getattr(torch_npu, name), int)
    assert {n: (c, t) for n, c, t in cd._names()} == CODES
    # vllm-ascend's CPU mocks use the same numbers ("values from real scenarios")
    assert (torch_npu.float4_e2m1fn_x2, torch_npu.hifloat8, torch_npu.float8_e8m0fnu) == (296, 290, 293)


# ---- HiFloat8 -----------------------------------------------------------------------------

def reference_decode(byte):
    """HiF8 from its field definitions, written from the format's description: sign, a prefix-coded dot
    field (11, 10, 01, 001, 0001; 0000 = denormal), the exponent in sign-magnitude with an implicit
    leading 1, the rest mantissa. 0x00 zero, 0x80 NaN, 0x6F/0xEF inf."""
    if byte == 0x00:
        return 0.0
    if byte == 0x80:
        return math.nan
    sign = -1.0 if byte & 0x80 else 1.0
    bits = format(byte & 0x7F, "07b")
    if bits == "1101111":
        return sign * math.inf
    for prefix, width in (("11", 4), ("10", 3), ("01", 2), ("001", 1), ("0001", 0)):
        if bits.startswith(prefix):
            rest = bits[len(prefix):]
            exp_bits, mant_bits = rest[:width], rest[width:]
            if width == 0:
                e = 0
            else:
                magnitude = int("1" + exp_bits[1:], 2)
                e = -magnitude if exp_bits[0] == "1" else magnitude
            return sign * 2.0 ** e * (1 + int(mant_bits, 2) / 2 ** len(mant_bits))
    return sign * 2.0 ** (int(bits[4:], 2) - 23)   # "0000mmm": denormal


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_hif8_decode_table():
    decode = torch_npu._C._cd._hif8_decode
    for byte in range(256):
        assert same(decode(byte), reference_decode(byte)), hex(byte)
    finite = [reference_decode(b) for b in range(256) if math.isfinite(reference_decode(b))]
    assert max(finite) == 32768.0 and min(v for v in finite if v > 0) == 2.0 ** -22
    assert len(set(finite)) == len(finite) - 0   # no two codes for one value (no -0)


def test_hif8_decode_agrees_with_msprobes_decoder():
    msprobe = pytest.importorskip("msprobe", reason="mindstudio-probe is not installed (`make test` installs it)")
    sys.path.insert(0, os.path.join(os.path.dirname(msprobe.__file__), "msaccucmp"))
    try:
        from conversion.dtype_conversion import hifloat8_to_float32
    finally:
        sys.path.pop(0)
    # Ascend's msaccucmp decoder agrees for the dot values 2..4, the denormals and the special codes;
    # for dot 0 and 1 it takes the dot field's own bits as mantissa (so it never yields 2..3.75, which
    # its sibling hif8_to_fp32 in msprobe's acc_check gives 3 mantissa bits to, as here), and it
    # returns +inf for 0xEF, which its own comment calls negative infinity.
    checked = 0
    for byte in range(256):
        low = byte & 0x7F
        if byte == 0xEF:
            assert torch_npu._C._cd._hif8_decode(byte) == -math.inf
        elif (low & 0x60) in (0x20, 0x40, 0x60) or (low & 0x78) == 0 or byte in (0x00, 0x80):
            assert same(torch_npu._C._cd._hif8_decode(byte), float(hifloat8_to_float32(byte))), hex(byte)
            checked += 1
    assert checked > 200


def nearest_code(x):
    """Round to nearest, ties away from zero, over the finite codes; inf at or past 40960."""
    if math.isnan(x):
        return 0x80
    a = abs(x)
    if a >= 40960.0:
        code = 0x6F
    else:
        best = None
        for b in range(0x80):
            v = reference_decode(b)
            if not math.isfinite(v):
                continue
            key = (abs(v - a), -v)      # the nearer; on a tie, the larger magnitude
            if best is None or key < best[0]:
                best = (key, b)
        code = best[1]
    return code | 0x80 if x < 0 and code != 0 else code


def test_hif8_encode_rounds_to_nearest_ties_away():
    encode = torch_npu._C._cd._hif8_encode
    for byte in range(256):   # every finite code round-trips
        v = reference_decode(byte)
        if math.isfinite(v) and byte != 0x80:
            assert encode(v) == byte, hex(byte)
    torch.manual_seed(0)
    samples = torch.cat([torch.randn(300) * 10 ** torch.randint(-7, 5, (300,)).float(),
                         torch.tensor([1.0625, 1.1875, -1.0625, 32768.0, 40959.0, 40960.0, 5e4, 2.0 ** -23,
                                       1.5 * 2.0 ** -23, 2.0 ** -24, 0.0, -0.0, math.inf, -math.inf, math.nan])])
    for x in samples.tolist():
        assert encode(x) == nearest_code(x), x
    assert encode(1.0625) == encode(1.125) and encode(-1.0625) == encode(-1.125)   # a tie goes away from 0


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_cd_casts(device):
    cd = torch_npu._C._cd
    torch.manual_seed(1)
    x = torch.randn(4, 6) * 50
    codes = cd.cast_to_fp8(x.to(device), cd.DType.hifloat8)
    assert codes.dtype == torch.uint8 and codes.device.type == device and codes.shape == x.shape
    assert codes.cpu().tolist() == [[nearest_code(v) for v in row] for row in x.tolist()]
    back = cd.cast_from_fp8(codes, cd.DType.hifloat8, torch.float32)
    want = torch.tensor([[reference_decode(c) for c in row] for row in codes.cpu().tolist()])
    assert torch.equal(back.cpu(), want)
    assert cd.cast_from_fp8(codes, cd.DType.hifloat8, cd.DType.bfloat16).dtype == torch.bfloat16
    out = torch.empty(4, 6, dtype=torch.uint8, device=device)
    cd.cast_to_fp8_noalloc(x.to(device), out, cd.DType.hifloat8)
    assert torch.equal(out.cpu(), codes.cpu())
    # float8 formats torch has: its own conversion
    e4 = cd.cast_to_fp8(x.to(device), cd.DType.float8_e4m3fn)
    assert torch.equal(e4.cpu(), x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(cd.cast_from_fp8(e4, cd.DType.float8_e4m3fn, torch.float32).cpu(),
                       x.to(torch.float8_e4m3fn).float())
    with pytest.raises(RuntimeError, match=r"cast_to_fp8 .*dtype must be torch_npu.hifloat8.*torch_npu.int4 \(285\)"):
        cd.cast_to_fp8(x.to(device), cd.DType.int4)
    with pytest.raises(RuntimeError, match="input must be float32, float16 or bfloat16"):
        cd.cast_to_fp8(x.to(device).int(), cd.DType.hifloat8)


def test_hifloat8_tensor():
    torch.manual_seed(2)
    x = torch.randn(3, 5, dtype=torch.float16)
    h = torch_npu.HiFloat8Tensor.to_hifloat8(x.npu())
    assert isinstance(h, torch_npu.HiFloat8Tensor)
    assert h.dtype == torch.float16 and h._data.dtype == torch.uint8 and h.device.type == "npu"
    want = torch.tensor([[reference_decode(nearest_code(v)) for v in row] for row in x.float().tolist()])
    assert torch.equal(h.float().cpu(), want)
    assert h.from_hifloat8().dtype == torch.float16 and h.bfloat16().dtype == torch.bfloat16
    assert torch.equal(h.cpu().float(), want.half().float())
    # an op on it runs on the dequantised values, in the nominal dtype
    y = h + 1
    assert type(y) is torch.Tensor and y.dtype == torch.float16
    torch.testing.assert_close(y.cpu().float(), want.half().float() + 1)
    assert isinstance(h.detach(), torch_npu.HiFloat8Tensor) and isinstance(h[1:], torch_npu.HiFloat8Tensor)
    assert torch.equal(h[1:].float().cpu(), want[1:])
    # copying into it rounds; out of it, dequantises
    h.copy_(torch.full((3, 5), 3.3, dtype=torch.float16, device="npu"))
    assert torch.equal(h.float().cpu(), torch.full((3, 5), reference_decode(nearest_code(3.3))))
    dst = torch.empty(3, 5, device="npu")
    dst.copy_(h)
    assert torch.equal(dst.cpu(), h.float().cpu())
    # the gradient passes through the rounding, as the adapter's
    w = torch.randn(4, requires_grad=True)
    torch_npu.HiFloat8Tensor.to_hifloat8(w.npu()).float().sum().backward()
    assert torch.equal(w.grad, torch.ones(4))
    with pytest.raises(ValueError, match="1-byte elements"):
        torch_npu.HiFloat8Tensor(data=torch.zeros(3), dtype=torch.float32)


# ---- ops that take the codes ----------------------------------------------------------------

def test_quant_matmul_takes_the_codes():
    torch.manual_seed(3)
    x1 = torch.randint(-128, 128, (4, 32), dtype=torch.int8).npu()
    x2 = torch.randint(-128, 128, (32, 8), dtype=torch.int8).npu()
    scale = (torch.rand(8) * 1e-3).npu()
    by_dtype = torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch.bfloat16)
    by_code = torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch_npu.bfloat16)
    assert by_code.dtype == torch.bfloat16 and torch.equal(by_code.cpu(), by_dtype.cpu())
    expected = (x1.cpu().double() @ x2.cpu().double()) * scale.cpu().double()
    torch.testing.assert_close(by_code.cpu().double(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(RuntimeError, match=r"npu::npu_quant_matmul \(npu:0\): scale_dtype=torch_npu.float8_e8m0fnu "
                                           r"\(293\): .*float8/float4/hifloat8"):
        torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch.bfloat16, scale_dtype=torch_npu.float8_e8m0fnu)
    with pytest.raises(RuntimeError, match=r"output_dtype torch_npu.hifloat8 \(290\) names data in a format torch has "
                                           r"no dtype for"):
        torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=torch_npu.hifloat8)
    with pytest.raises(RuntimeError, match=r"output_dtype must be a torch.dtype or a torch_npu dtype code.*the integer "
                                           r"300"):
        torch_npu.npu_quant_matmul(x1, x2, scale, output_dtype=300)


def test_dynamic_quant_and_grouped_matmul_take_the_codes():
    torch.manual_seed(4)
    x = torch.randn(4, 16, dtype=torch.float16)
    y_dtype, s_dtype = torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch.int8)
    y_code, s_code = torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch_npu.int8)
    assert torch.equal(y_code.cpu(), y_dtype.cpu()) and torch.equal(s_code.cpu(), s_dtype.cpu())
    scale = x.float().abs().amax(-1) / 127
    assert torch.equal(s_code.cpu(), scale)
    with pytest.raises(RuntimeError, match=r"npu::npu_dynamic_quant \(npu:0\): dst_type torch_npu.hifloat8 \(290\)"):
        torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch_npu.hifloat8)
    with pytest.raises(RuntimeError, match=r"dst_type must be torch.int8 or torch.quint4x2 .*got Float8_e4m3fn"):
        torch_npu.npu_dynamic_quant(x.npu(), dst_type=torch_npu.float8_e4m3fn)
    a, w = torch.randn(6, 8).npu(), torch.randn(2, 8, 4).npu()
    with pytest.raises(RuntimeError, match=r"npu_grouped_matmul \(npu:0\): x_dtype=torch_npu.hifloat8 \(290\), "
                                           r"scale_dtype=torch_npu.float8_e8m0fnu \(293\)"):
        torch_npu.npu_grouped_matmul([a], [w], group_list=torch.tensor([3, 6]).npu(), group_type=0, split_item=2,
                                     x_dtype=torch_npu.hifloat8, scale_dtype=torch_npu.float8_e8m0fnu)


def test_format_cast_records_the_layout_dtype():
    x = torch.randn(16, 16).npu()
    y = torch_npu.npu_format_cast(x, 29, customize_dtype=torch.bfloat16)
    assert torch_npu.get_npu_format(y) == torch_npu.Format.FRACTAL_NZ and torch.equal(y.cpu(), x.cpu())
    assert y._npu_format_dtype == (torch.bfloat16, None)
    z = torch_npu.npu_format_cast(x, 29, torch_npu.float4_e2m1fn_x2, input_dtype=torch_npu.bfloat16)
    assert z._npu_format_dtype == (296, 283)
    with pytest.raises(ValueError, match="customize_dtype must be a torch.dtype or a torch_npu dtype code"):
        torch_npu.npu_format_cast(x, 29, customize_dtype=999)


# ---- msprobe's names ---------------------------------------------------------------------------

def test_diff_flag_refused_by_name_overflow_names_work():
    for name in ("get_npu_diff_flag", "clear_npu_diff_flag"):
        with pytest.raises(NotImplementedError, match=rf"torch_npu.npu.utils.{name} is not provided: no version of the "
                                                      r"Ascend adapter defines it.*msprobe 26.2"):
            getattr(torch_npu.npu.utils, name)()
    # the overflow names msprobe's overflow check calls still work (the generic profile has inf/nan)
    assert torch_npu.npu.utils.npu_check_overflow(torch.tensor([1.0, math.inf]).npu())
    assert not torch_npu.npu.utils.npu_check_overflow(torch.tensor([1.0, 2.0]).npu())
    torch.npu.clear_npu_overflow_flag()

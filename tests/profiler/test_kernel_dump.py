"""The kernel-level dump, torch_npu.npu.init_dump / set_dump / finalize_dump (the Ascend adapter's
names for ACL's aclmdlInitDump / SetDump / FinalizeDump, which msprobe's L2 task calls): every kernel
the npu runs while it is set writes its inputs and outputs, in CANN's layout
({dump_path}/{time}/{device}/{op_type}.{op_name}.{task_id}.{stream_id}.{timestamp}) and in the binary
format msprobe's msaccucmp reads ("nano" dump: a TLV header, then the tensors' bytes).

Checked here: each kernel of a small sequence once, in launch order, with its inputs as they were
before it ran (an in-place op's too) and its outputs, against the tensors; a training step of a tiny
model, each file read back by msaccucmp's own loader and by `msprobe parse`; msprobe's
PrecisionDebugger with level L2 dumping one API's kernels; the configuration's errors; the cost when
off (no callback left registered)."""
import glob
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import torch_npu

HERE = os.path.abspath(__file__)


def _config(tmp_path, **dump):
    settings = {"dump_list": [], "dump_path": str(tmp_path / "dump"), "dump_mode": "all", "dump_op_switch": "on"}
    settings.update(dump)
    path = tmp_path / "kernel_config.json"
    path.write_text(json.dumps({"dump": settings}))
    return str(path)


_ACL_TO_TORCH = {0: torch.float32, 1: torch.float16, 2: torch.int8, 3: torch.int32, 4: torch.uint8, 6: torch.int16,
                 9: torch.int64, 11: torch.float64, 12: torch.bool, 27: torch.bfloat16, 37: torch.float8_e8m0fnu,
                 40: torch.float4_e2m1fn_x2}


def read_dump(path, descriptors=None):
    """The file, read by this test's own reader of the format: (inputs, outputs) as cpu tensors;
    `descriptors` (a list) gets each section's (acl dtype, bytes, dims)."""
    raw = open(path, "rb").read()
    (header_len,) = struct.unpack_from("<Q", raw, 0)
    pos = 8
    magic, _version = struct.unpack_from("<II", raw, pos)
    assert magic == 0x5A5A5A5A
    pos += 8
    sections = []
    for tag, output in ((4, False), (5, True)):
        got_tag, _length, count = struct.unpack_from("<III", raw, pos)
        assert got_tag == tag
        pos += 12
        descs = []
        for _ in range(count):
            if output:
                dtype, _fmt, _addr_type, _idx, _odt, _ofmt, _addr, _off, size, _tlv = struct.unpack_from(
                    "<iiiiiiQQQI", raw, pos)
                pos += 24 + 24 + 4
            else:
                dtype, _fmt, _addr_type, _addr, _off, size, _tlv = struct.unpack_from("<iiiQQQI", raw, pos)
                pos += 12 + 24 + 4
            dims = []
            for which in range(2):
                t, n = struct.unpack_from("<II", raw, pos)
                assert t == which
                pos += 8
                d = list(struct.unpack_from(f"<{n // 8}Q", raw, pos))
                pos += n
                dims = dims or d
            descs.append((dtype, size, dims))
        sections.append(descs)
    if descriptors is not None:
        descriptors.extend(sections)
    assert pos == 8 + header_len
    tensors = []
    for descs in sections:
        values = []
        for dtype, size, dims in descs:
            data = bytearray(raw[pos:pos + size])
            pos += size
            if dtype == 40:   # ACL counts float4 elements: two a byte of torch's x2 dtype
                dims = dims[:-1] + [dims[-1] // 2]
            values.append(torch.frombuffer(data, dtype=_ACL_TO_TORCH[dtype]).reshape(dims) if size else
                          torch.empty(dims, dtype=_ACL_TO_TORCH[dtype]))
        tensors.append(values)
    assert pos == len(raw)
    return tensors


def dumped_files(root):
    files = [f for f in glob.glob(os.path.join(root, "*", "*", "*")) if os.path.isfile(f)]
    return sorted(files, key=lambda f: int(os.path.basename(f).split(".")[2]))   # by task id


def test_each_kernel_once_in_order_with_its_tensors(tmp_path):
    torch.manual_seed(0)
    a = torch.randn(3, 4, device="npu")
    b = torch.randn(3, 4, device="npu")
    weight = torch.randn(4, device="npu")
    before = {}
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    c = a + b                                   # aten::add.Tensor (native)
    d = torch.mm(c, b.t())                      # b.t() is a view: no kernel; aten::mm
    e = torch.relu(d)
    before["e"] = e.cpu()                       # aten::_to_copy to the host: a kernel too
    e.mul_(3)                                   # in place: input as it was, output as it is after
    f = a.double().sum()                        # float64: a copy, then the CPU fallback's sum
    g = torch_npu.npu_rms_norm(a, weight)[0]    # a fused op: one kernel
    torch_npu.npu.finalize_dump()
    files = dumped_files(str(tmp_path / "dump"))
    names = [os.path.basename(p).split(".")[0] for p in files]
    # .cpu() and .double() are copy_ kernels (the copy's source is input 1; input 0, the destination's
    # old bytes, is what the kernel was given too)
    assert names == ["add", "mm", "relu", "copy_", "mul_", "copy_", "sum", "npu_rms_norm"], names
    assert [int(os.path.basename(p).split(".")[2]) for p in files] == list(range(len(files)))
    device_dir = os.path.dirname(files[0])
    assert os.path.basename(device_dir) == "0" and len(os.path.basename(os.path.dirname(device_dir))) == 14
    cpu = {k: v.cpu() for k, v in dict(a=a, b=b, c=c, d=d, e=e, f=f, g=g, w=weight).items()}
    expected = [
        ([cpu["a"], cpu["b"]], [cpu["a"] + cpu["b"]]),
        ([cpu["c"], cpu["b"].t()], [cpu["c"] @ cpu["b"].t()]),
        ([cpu["d"]], [torch.relu(cpu["d"])]),
        ([None, before["e"]], [before["e"]]),
        ([before["e"], torch.tensor(3)], [before["e"] * 3]),   # the Python number: a 0-dim cpu tensor
        ([None, cpu["a"]], [cpu["a"].double()]),
        ([cpu["a"].double()], [cpu["a"].double().sum()]),
    ]
    for path, (ins, outs) in zip(files, expected):
        got_in, got_out = read_dump(path)
        assert len(got_in) == len(ins) and len(got_out) == len(outs), path
        for got, want in zip(got_in + got_out, ins + outs):
            if want is not None:
                torch.testing.assert_close(got, want.contiguous(), rtol=1e-5, atol=1e-5, msg=path)
    rms_in, rms_out = read_dump(files[-1])
    torch.testing.assert_close(rms_in[0], cpu["a"])
    torch.testing.assert_close(rms_in[1], cpu["w"])
    ref = cpu["a"] * torch.rsqrt(cpu["a"].pow(2).mean(-1, keepdim=True) + 1e-6) * cpu["w"]
    torch.testing.assert_close(rms_out[0], ref, rtol=1e-5, atol=1e-5)


def test_dump_mode_input_or_output(tmp_path):
    x = torch.randn(5, device="npu")
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path, dump_mode="output"))
    y = torch.exp(x)
    torch_npu.npu.finalize_dump()
    (path,) = dumped_files(str(tmp_path / "dump"))
    ins, outs = read_dump(path)
    assert ins == [] and len(outs) == 1
    torch.testing.assert_close(outs[0], y.cpu())


def test_nothing_dumped_outside_the_session_and_no_cost_left(tmp_path):
    x = torch.randn(4, device="npu")
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    (x * 2).sum()
    torch_npu.npu.finalize_dump()
    count = len(dumped_files(str(tmp_path / "dump")))
    assert count == 2
    initialised, active, _, _ = torch_npu._C._dump_state()
    assert not initialised and not active       # the RecordFunction callback is gone
    (x * 2).sum()
    assert len(dumped_files(str(tmp_path / "dump"))) == count


def test_configuration_errors(tmp_path):
    with pytest.raises(RuntimeError, match="call torch_npu.npu.init_dump"):
        torch_npu.npu.set_dump(_config(tmp_path))
    with pytest.raises(RuntimeError, match="not initialised"):
        torch_npu.npu.finalize_dump()
    torch_npu.npu.init_dump()
    try:
        with pytest.raises(RuntimeError, match="initialised already"):
            torch_npu.npu.init_dump()
        with pytest.raises(FileNotFoundError, match="does not exist"):
            torch_npu.npu.set_dump(str(tmp_path / "missing.json"))
        with pytest.raises(ValueError, match="dump_mode"):
            torch_npu.npu.set_dump(_config(tmp_path, dump_mode="both"))
        with pytest.raises(ValueError, match="graph"):
            torch_npu.npu.set_dump(_config(tmp_path, dump_list=[{"model_name": "m", "layer": ["conv"]}]))
        with pytest.raises(ValueError, match="dump_data 'stats'"):
            torch_npu.npu.set_dump(_config(tmp_path, dump_data="stats"))
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"dump_path": "x"}))
        with pytest.raises(ValueError, match='needs a "dump" object'):
            torch_npu.npu.set_dump(str(bad))
        with pytest.warns(UserWarning, match="nothing is dumped"):
            torch_npu.npu.set_dump(_config(tmp_path, dump_op_switch="off"))
        torch.randn(3, device="npu").exp()
    finally:
        torch_npu.npu.finalize_dump()
    assert dumped_files(str(tmp_path / "dump")) == []
    assert torch.npu.init_dump is torch_npu.npu.utils.init_dump


def test_graph_capture_is_not_dumped(tmp_path):
    x = torch.randn(8, device="npu")
    y = x * 2                                   # warm up outside the capture
    graph = torch.npu.NPUGraph()
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    try:
        with pytest.warns(UserWarning, match="captured are not dumped"):
            with torch.npu.graph(graph):
                y = x * 2
        graph.replay()
        z = y + 1                               # eager again: dumped
    finally:
        torch_npu.npu.finalize_dump()
    names = [os.path.basename(p).split(".")[0] for p in dumped_files(str(tmp_path / "dump"))]
    assert names == ["add"], names
    torch.testing.assert_close(z.cpu(), x.cpu() * 2 + 1)


def test_capture_on_another_thread_leaves_this_threads_kernels_dumped(tmp_path):
    import threading
    x = torch.randn(8, device="npu")
    y = x * 2                                   # warm up outside the capture
    graph = torch.npu.NPUGraph()
    capturing, release = threading.Event(), threading.Event()
    errors = []

    def capture():
        try:
            with torch.npu.graph(graph, capture_error_mode="thread_local"):
                x * 2                           # captured: not dumped
                capturing.set()
                release.wait(30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            capturing.set()

    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    try:
        thread = threading.Thread(target=capture)
        thread.start()
        assert capturing.wait(30)
        z = x + 1                               # this thread's stream is not capturing: dumped
        release.set()
        thread.join(30)
    finally:
        release.set()
        torch_npu.npu.finalize_dump()
    assert not errors, errors
    names = [os.path.basename(p).split(".")[0] for p in dumped_files(str(tmp_path / "dump"))]
    assert names == ["add"], names
    torch.testing.assert_close(z.cpu(), x.cpu() + 1)


def test_float4_dims_count_elements(tmp_path):
    # ACL_FLOAT4_E2M1 (40) counts float4 values: torch's (r, c) float4_e2m1fn_x2 is (r, 2c) in the file
    x = torch.randn(4, 64).half().npu()
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    try:
        y, s = torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float4_e2m1fn_x2)
    finally:
        torch_npu.npu.finalize_dump()
    assert y.shape == (4, 32)
    files = [f for f in dumped_files(str(tmp_path / "dump")) if os.path.basename(f).startswith("npu_dynamic_mx")]
    assert len(files) == 1, files
    descs = []
    _ins, outs = read_dump(files[0], descs)
    dtype, size, dims = descs[1][0]
    assert dtype == 40 and dims == [4, 64] and size == 4 * 32
    assert torch.equal(outs[0].view(torch.uint8), y.cpu().view(torch.uint8))


# --- a training step of a tiny model; msprobe's own readers -----------------------------------------------------------

def _tiny_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)).npu()
    x = torch.randn(4, 6).npu()
    return model, x


def _msaccucmp_loader():
    msprobe = pytest.importorskip("msprobe", reason="mindstudio-probe is not installed (`make test` installs it)")
    root = os.path.join(os.path.dirname(msprobe.__file__), "msaccucmp")
    if root not in sys.path:
        sys.path.insert(0, root)   # msaccucmp imports its modules by their top-level names
    from dump_parse.dump_utils import parse_dump_file
    return parse_dump_file


def test_training_step_read_by_msaccucmp(tmp_path):
    parse_dump_file = _msaccucmp_loader()
    model, x = _tiny_step()
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    out = model(x)
    out.sum().backward()
    torch_npu.npu.finalize_dump()
    files = dumped_files(str(tmp_path / "dump"))
    kinds = [os.path.basename(p).split(".")[0] for p in files]
    for kernel in ("addmm", "gelu", "gelu_backward", "mm", "sum"):
        assert kernel in kinds, kinds
    for path in files:
        ours_in, ours_out = read_dump(path)
        theirs = parse_dump_file(path, 0)
        assert len(theirs.input_data) == len(ours_in) and len(theirs.output_data) == len(ours_out), path
        for mine, tensor in zip(ours_in + ours_out, theirs.input_data + theirs.output_data):
            assert list(tensor.shape) == list(mine.shape)
            assert torch.equal(torch.from_numpy(tensor.data.copy()).reshape(mine.shape).to(mine.dtype), mine), path
    # The model's own tensors: the first addmm read x and the first layer's parameters, the last wrote out.
    first = read_dump(files[kinds.index("addmm")])
    torch.testing.assert_close(first[0][0], model[0].bias.detach().cpu())
    torch.testing.assert_close(first[0][1], x.cpu())
    last_forward = len(kinds) - 1 - kinds[::-1].index("addmm") if "addmm" in kinds else None
    torch.testing.assert_close(read_dump(files[last_forward])[1][0], out.detach().cpu())
    gelu = read_dump(files[kinds.index("gelu")])
    torch.testing.assert_close(gelu[1][0], torch.nn.functional.gelu(gelu[0][0]))


def test_msprobe_parse_converts_to_npy(tmp_path):
    _msaccucmp_loader()
    x = torch.randn(2, 3, device="npu")
    torch_npu.npu.init_dump()
    torch_npu.npu.set_dump(_config(tmp_path))
    y = torch.tanh(x)
    torch_npu.npu.finalize_dump()
    (path,) = dumped_files(str(tmp_path / "dump"))
    command = os.path.join(os.path.dirname(sys.executable), "msprobe")
    if not os.path.exists(command):
        pytest.skip("the msprobe command is not installed")
    result = subprocess.run([command, "parse", "-d", path, "-t", "npy", "-o", str(tmp_path / "npy")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    import numpy as np
    npys = sorted(glob.glob(str(tmp_path / "npy" / "*.npy")))
    by_role = {("input" if ".input." in f else "output"): np.load(f) for f in npys}
    assert set(by_role) == {"input", "output"}, npys
    np.testing.assert_array_equal(by_role["input"].reshape(2, 3), x.cpu().numpy())
    np.testing.assert_array_equal(by_role["output"].reshape(2, 3), y.cpu().numpy())


# --- msprobe's PrecisionDebugger, level L2 (run as a script: msprobe patches torch process-wide) -------------------------

def _l2_script(dump_dir):
    from msprobe.pytorch import PrecisionDebugger

    config = os.path.join(dump_dir, "config.json")
    with open(config, "w") as f:
        json.dump({"task": "tensor", "dump_path": dump_dir, "level": "L2", "rank": [], "step": [],
                   "tensor": {"scope": [], "list": ["Functional.linear.0.forward"]}}, f)
    model, x = _tiny_step()
    debugger = PrecisionDebugger(config_path=config)
    debugger.start()
    out = model(x)
    debugger.stop()
    debugger.step()
    torch.save({"x": x.cpu(), "w": model[0].weight.detach().cpu(), "b": model[0].bias.detach().cpu(),
                "out": out.detach().cpu()}, os.path.join(dump_dir, "reference.pt"))


def test_msprobe_l2_dumps_one_apis_kernels(tmp_path):
    pytest.importorskip("msprobe", reason="mindstudio-probe is not installed (`make test` installs it)")
    result = subprocess.run([sys.executable, HERE, str(tmp_path)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "The kernel data of Functional.linear.0.forward is dumped successfully" in output, output
    assert glob.glob(str(tmp_path / "step0" / "kernel_config_*.json")), output
    files = dumped_files(str(tmp_path / "step0"))
    assert [os.path.basename(p).split(".")[0] for p in files] == ["addmm"], files
    ref = torch.load(str(tmp_path / "reference.pt"))
    ins, outs = read_dump(files[0])
    torch.testing.assert_close(ins[0], ref["b"])
    torch.testing.assert_close(ins[1], ref["x"])
    torch.testing.assert_close(ins[2], ref["w"].t())
    torch.testing.assert_close(outs[0], torch.nn.functional.linear(ref["x"], ref["w"], ref["b"]))


if __name__ == "__main__":
    _l2_script(sys.argv[1])

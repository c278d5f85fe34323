"""Where the host time of one tiny op goes on the npu, layer by layer, against the cpu.

For each op of bench_ops.py's tiny table (16 elements, 4x4 mm) a child process
runs the op in a loop on the cpu, another on the npu, each under
`perf record`; the flat profiles (samples per symbol) are subtracted and
the differences summed per layer of the launch path (the symbol patterns in
LAYERS). Both children pay the same import and Python costs, so what remains
is what the npu adds per op, in microseconds. Sampling makes each figure good
to a few hundredths of a microsecond; layers below 0.02 us are noise.

Needs `perf` (linux-tools) and permission to profile (perf_event_paranoid <= 2).

    python benchmarks/bench_breakdown.py [--ops add,cat] [--iters 300000] [--symbols 10]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FREQUENCY = 20000  # samples per second

# (layer, pattern over symbol names); the first match wins.
LAYERS = [
    ("allocator", r"NPUCachingAllocator|DeviceCache|updateStat|npu::allocator|HostAllocatorRedirect"),
    ("stream/launch", r"EmuStream|npu::launch|npu::runIfIdle|_Function_handler|_Function_base|currentRuntimeStream|"
                      r"runtime::hal|npu::graph::|tracing::|LaunchStamp|DeviceWork|std::deque|KernelRef"),
    ("stream hold", r"StreamHold|holdingStream|acquire|release"),
    ("device guard", r"DeviceGuard|GuardImpl|checkDevice|resolveDevice|currentDevice|exchangeDevice|"
                     r"uncheckedSetDevice|getDevice"),
    ("cpu alias/tensor impl", r"cpuAlias|TensorImpl::TensorImpl|StorageImpl|_refresh_contiguous|set_sizes_and_strides|"
                              r"make_intrusive|TensorImpl::~|intrusive_ptr|SizesAndStrides|refresh_numel|has_storage|"
                              r"compute_contiguous|is_contiguous|ExcludeDispatchKeyGuard|release_resources"),
    ("meta/TensorIterator", r"TensorIterator|internal_overlap|resize_out|partial_overlap|infer_size|compute_|"
                            r"set_output|structured_|meta::|check_names|OperandInfo|DimCounter|SymInt|SymBool|"
                            r"maybe_wrap_dim|get_overlap|propagate_names|result_type|promote|canCast|"
                            r"OpaqueOptionalTensorRef|borrow"),
    ("host execution/boxing", r"HostExecution|IValue|jit::Stack|NativeKernel|mapTensors|forEachTensor|"
                              r"deviceOfArguments|refusedDtype|runCpuKernel|redispatch|boxed|Boxed|_Hashtable|"
                              r"unordered_map|_Map_base|_Prime_rehash|flat_hash|checkChipDtypes|traits|std::vector|"
                              r"FallbackPolicy|profile::|hasOpPolicies|opPolicy|isNpu|drawFor|TypePtr|Type::|Argument"),
    ("malloc/free", r"^malloc|_int_free|_int_malloc|cfree|operator new|operator delete|^free$|malloc_consolidate|"
                    r"tcache|unlink_chunk"),
    ("locks/atomics", r"pthread_mutex|mutex|__lll_|futex|pthread_cond"),
    ("python", r"^_?Py|^PyObject|gc_|visit_|subtype_|dict|unicode|tuple_|list_|long_|frame|siphash|_PyEval|"
               r"method_vectorcall|cfunction|THPVariable|torch::autograd::|PythonArgParser|PyArg|wrap|dispatch_"),
]
OTHER = "other (kernel, dispatcher)"

CHILD = r"""
import sys
import torch, torch.nn.functional as F
import torch_npu
sys.path.insert(0, {here!r})
from bench_ops import op_cases
make, fn = op_cases(16, 4)[{op!r}]
args = [x.to({device!r}) for x in make()]
for _ in range({iters}):
    fn(*args)
torch.npu.synchronize()
"""


def layer_of(symbol):
    for name, pattern in LAYERS:
        if re.search(pattern, symbol):
            return name
    return OTHER


def profile(op, device, iters, workdir):
    """samples per symbol of the op's loop on `device`."""
    data = os.path.join(workdir, f"{op}.{device}.data")
    code = CHILD.format(here=HERE, op=op, device=device, iters=iters)
    subprocess.run(["perf", "record", "-q", "-F", str(FREQUENCY), "-o", data, sys.executable, "-c", code],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio",
                             "-F", "overhead,sample,sym"], check=True, capture_output=True, text=True).stdout
    samples = collections.Counter()
    for line in report.splitlines():
        # "12.3%  456  [.] symbol  -  -": the trailing columns are padded to the report's widths
        match = re.match(r"\s*[\d.]+%\s+(\d+)\s+\[.\]\s+(.*?)(?:\s+-\s+-)?\s*$", line)
        if match:
            samples[match.group(2)] += int(match.group(1))
    return samples


def breakdown(op, iters, symbols, workdir):
    cpu, npu = profile(op, "cpu", iters, workdir), profile(op, "npu", iters, workdir)
    us = lambda n: n / FREQUENCY / iters * 1e6  # noqa: E731
    layers = collections.defaultdict(lambda: [0, 0])
    for symbol in set(cpu) | set(npu):
        layers[layer_of(symbol)][0] += npu[symbol]
        layers[layer_of(symbol)][1] += cpu[symbol]
    total = us(sum(npu.values()) - sum(cpu.values()))
    print(f"\n{op}: the npu adds {total:+.2f} us per op (sampled)")
    for name, (n, c) in sorted(layers.items(), key=lambda kv: kv[1][1] - kv[1][0]):
        print(f"  {name:<28} {us(n - c):+7.3f} us")
    for symbol in sorted(set(cpu) | set(npu), key=lambda s: cpu[s] - npu[s])[:symbols]:
        print(f"      {us(npu[symbol] - cpu[symbol]):+7.3f}  {symbol[:100]}")
    return {name: us(n - c) for name, (n, c) in layers.items()} | {"total": total}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="add,mul_,exp,gelu,sum,softmax,layer_norm,mm,index_select,cat")
    parser.add_argument("--iters", type=int, default=300000)
    parser.add_argument("--symbols", type=int, default=0, help="also list the top symbols per op")
    args = parser.parse_args(argv)
    if shutil.which("perf") is None:
        sys.exit("bench_breakdown.py needs perf (linux-tools)")
    with tempfile.TemporaryDirectory() as workdir:
        return {op: breakdown(op, args.iters, args.symbols, workdir) for op in args.ops.split(",")}


if __name__ == "__main__":
    main()

// Device profiles: which chip the emulated npu behaves as. A profile is data
// (python/torch_npu/profiles/*.toml, read by torch_npu._profiles) handed to C++
// once, before the device starts: the chip's identity and properties, the aten
// overloads it runs natively (others take the CPU fallback, as an op without a
// kernel does), its dtypes (bfloat16, inf/nan), and a cost model that projects
// how long each kernel and copy would take on it (the profiler shows it beside
// the emulator's own time). "generic" is the ideal device: every op the op
// library has is native, no identity of a real chip, no cost model.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>

#include "../runtime/tracing.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace npu::profile {

// The device side of a chip's cost model, each figure from a named source (the
// profile's file gives it). The host side (the adapter's dispatch per op, the
// latency of a wait) is projected in Python (torch_npu/profiler/_projection.py),
// which reads the same file. Absent for the generic device.
struct CostModel {
  double kernel_overhead_us = 0;        // per kernel or copy in an eager stream: scheduling, start, completion
  double graph_kernel_overhead_us = 0;  // the same for a kernel of a replayed graph
  double cube_fp16_tflops = 0;          // matrix unit, float16 and bfloat16
  double cube_fp32_tflops = 0;          // matrix unit, float32
  double cube_int8_tops = 0;            // matrix unit, int8 (and packed int4)
  double vector_fp16_tflops = 0;        // vector units, 16-bit types (float32 at half)
  double memory_gbps = 0;               // device memory bandwidth, GB/s
  double link_gbps = 0;                 // host <-> device link, GB/s each way
};

struct DeviceProfile {
  std::string name = "generic";         // "ascend910b2"
  std::string description;              // one line, for list_profiles()
  std::string device_name = "Emulated NPU";
  std::optional<int> soc_version;       // the Ascend adapter's SocVersion; none on generic
  int cube_core_num = 0;                // a chip's; the generic device reports the host's cores
  int vector_core_num = 0;              // 0 on chips whose vector units sit in the AI cores (910A)
  int64_t l2_cache_size = 0;            // 0: unknown (generic)
  int64_t total_memory = 0;             // 0: the emulator's capacity
  bool bfloat16 = true;
  bool inf_nan = true;                  // false: float16 overflow saturates to +-65504
  // Restricts the native set to `native_ops` ("add.Tensor", "_assert_async"):
  // false on generic, where every op with an npu kernel is native.
  bool restricts_ops = false;
  std::unordered_set<std::string> native_ops;
  // The Ascend adapter's kernel families on the chip ("aclnn", "aclop", ...);
  // empty: every family (generic). The npu:: ops Ascend implements only as
  // aclnn kernels are absent where "aclnn" is (910A, 310P).
  std::unordered_set<std::string> kernel_families;
  std::optional<CostModel> cost;

  bool isChip() const { return soc_version.has_value(); }
  // Whether `op` is in the chip's list (always true when !restricts_ops).
  bool lists(const c10::OperatorName& op) const;
};

// Adds (or replaces) a profile by its name; what python reads from a file.
void define(DeviceProfile profile);
// The profile defined under `name`; throws c10::Error listing the known ones.
std::shared_ptr<const DeviceProfile> find(const std::string& name);
// Makes `name` the active profile. Raises once the npu runtime started: the
// device is that chip from its first use on.
void activate(const std::string& name);
// The active profile (generic until activate()).
const DeviceProfile& active();

// Marks the npu kernel of `op` as one the chip's list governs: the op
// library's kernels (ops/host/op_library.cpp, ops/host/structured.cpp), marked as they
// are registered. Other npu kernels (copies, views' storage, convolution, RNN
// cells, the fused npu:: ops) are the adapter's core, native on every chip.
void governByChipList(const c10::OperatorName& op);
// Whether `chip` runs `op` natively: its kernel is not governed by the list,
// the op returns a view of an input (metadata, no kernel), or the list has it.
// NativeKernel, the structured fast paths and the registry all ask this.
bool runsNatively(const DeviceProfile& chip, const c10::OperatorHandle& op);
// Where the chip lacks an op of the op library: whether PyTorch decomposes it
// (CompositeExplicitAutograd or its NonFunctional wrapper) into other ops.
bool decomposesOffChip(const c10::OperatorHandle& op);

// get_device_properties() of a device whose HAL reports `hal`: the chip's
// identity and cores under a chip profile, its memory capped by the HAL's.
struct ReportedProperties {
  std::string name;
  int64_t total_memory = 0;
  int multi_processor_count = 0;
  int cube_core_num = 0;
  int vector_core_num = 0;
  int64_t l2_cache_size = 0;
};
ReportedProperties deviceProperties(const std::string& hal_name, std::size_t hal_memory, int hal_compute_units);

// Float16 overflow on chips without inf/nan: saturating kernels raise the
// chip's overflow flag (its float status register, one per process here),
// which the GradScaler's unscale kernel reads and clears (ops/host/chip.cpp).
void raiseOverflowFlag();
bool takeOverflowFlag();
// The saturation itself, on a float16 host tensor (a kernel's result or a
// conversion's): +-inf become +-65504, only where `finite_before` if given
// (the elements a kernel may have written, not infs it left alone), raising
// the overflow flag when any did.
void saturateHalf(const at::Tensor& t, const at::Tensor& finite_before = at::Tensor());

// ---- The cost model ---------------------------------------------------------

// The cost model that projects kernels while a profiler runs: the projection
// target's if one is set (torch_npu.doctor --target: "how fast on that chip",
// whatever chip the run emulates), else the active profile's; null when
// neither has one (generic).
const DeviceProfile* projectionProfile();
// Sets the projection target by profile name; "" clears it.
void setProjectionTarget(const std::string& name);

// The cost model of projectionProfile(); throws c10::Error, naming the active
// profile, when there is none.
const CostModel& projectionCost();
// The cost model of profile `name` ("": projectionCost()); throws c10::Error when it has none.
CostModel costOf(const std::string& name);

// What a kernel does, for its projected time, as ATen describes it.
struct KernelWork {
  double flops = 0;
  bool cube = false;  // runs on the matrix unit (matmul, convolution, attention)
  c10::ScalarType dtype = c10::kFloat;
  double bytes = 0;   // read and written in device memory
};
// The same as the runtime's traces carry it (runtime/tracing.h): the precision in bits.
runtime::tracing::Work describe(const KernelWork& work);

// The longer of compute at the chip's peak for the unit and precision and memory
// traffic at its bandwidth, plus the per-kernel overhead of an eager stream or,
// `in_graph`, of a replayed graph; in nanoseconds. Unknown work (nothing described
// it) is projected from its bytes alone.
int64_t projectKernelNs(const CostModel& cost, const runtime::tracing::Work& work, bool in_graph = false);
// A copy of `bytes` over the host link (host_to_or_from_device) or within device memory.
int64_t projectCopyNs(const CostModel& cost, double bytes, bool crosses_link, bool in_graph = false);
// The work of aten op `op` on the arguments in `stack` (its last
// schema().arguments().size() entries): FLOPs by formula for the matrix ops,
// one per output element for the others; bytes of every tensor argument plus
// an estimate of the output.
KernelWork estimateWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// describe(estimateWork(op, stack)): what the kernels stamp on their launch
// (runtime::tracing::WorkHint) while a profiler records or a graph captures.
runtime::tracing::Work workOf(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// Whether a kernel launched now should describe its work (one relaxed load each).
bool describingWork();

}  // namespace npu::profile

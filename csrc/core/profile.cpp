#include "profile.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "device.h"
#include "capture.h"

namespace npu::profile {
namespace {

std::mutex& mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::map<std::string, std::shared_ptr<const DeviceProfile>>& profiles() {
  static auto* all = new std::map<std::string, std::shared_ptr<const DeviceProfile>>{
      {"generic", std::make_shared<const DeviceProfile>()}};
  return *all;
}

// Read on every op: a plain pointer, set before the device starts and never freed.
const DeviceProfile* g_active = nullptr;
// The profile kernels are projected onto (setProjectionTarget), kept alive by profiles().
std::atomic<const DeviceProfile*> g_projection_target{nullptr};

std::string knownNames() {
  std::string out;
  for (const auto& [name, p] : profiles()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

bool DeviceProfile::lists(const c10::OperatorName& op) const {
  if (!restricts_ops) return true;
  if (op.name.rfind("aten::", 0) != 0) return true;  // the chip's list covers aten only
  std::string key = op.name.substr(6);
  if (!op.overload_name.empty()) key += "." + op.overload_name;
  return native_ops.count(key) != 0;
}

void define(DeviceProfile profile) {
  TORCH_CHECK(!profile.name.empty(), "torch_npu: a device profile needs a name");
  std::lock_guard<std::mutex> lock(mutex());
  auto& slot = profiles()[profile.name];
  TORCH_CHECK(slot == nullptr || (slot.get() != g_active && slot.get() != g_projection_target.load()),
              "torch_npu: device profile '", profile.name, "' is in use and cannot be redefined");
  slot = std::make_shared<const DeviceProfile>(std::move(profile));
}

std::shared_ptr<const DeviceProfile> find(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex());
  auto it = profiles().find(name);
  TORCH_CHECK(it != profiles().end(), "torch_npu: no device profile named '", name, "'; known: ", knownNames());
  return it->second;
}

void activate(const std::string& name) {
  auto profile = find(name);
  std::lock_guard<std::mutex> lock(mutex());
  if (&active() == profile.get() || (g_active == nullptr && name == "generic")) return;
  TORCH_CHECK(!runtimeInitialized(), "torch_npu: the device profile is chosen before the npu starts, and it "
              "already started as '", active().name, "'; set NPU_EMU_PROFILE=", name,
              " or call torch_npu.npu.set_profile('", name, "') before the first npu use");
  g_active = profile.get();  // kept alive by profiles(): an active profile is never redefined
}

const DeviceProfile& active() {
  static const DeviceProfile generic;
  const DeviceProfile* p = g_active;
  return p != nullptr ? *p : generic;
}

namespace {
std::mutex& governedMutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_set<c10::OperatorName>& governed() {
  static auto* ops = new std::unordered_set<c10::OperatorName>;
  return *ops;
}
std::atomic<bool> g_overflow{false};
}  // namespace

void governByChipList(const c10::OperatorName& op) {
  std::lock_guard<std::mutex> lock(governedMutex());
  governed().insert(op);
}

namespace {
// Device::supportsOp of the process's HAL for `op` (version 5, op_queries),
// asked once per op: Unknown when the HAL has no opinion.
runtime::OpSupport halSupport(const c10::OperatorHandle& op) {
  static const bool asks = [] {
    if (runtime::halApiVersion() < 5 || runtime::hal().deviceCount() == 0) return false;
    return runtime::hal().device(0).capabilities().op_queries;
  }();
  if (!asks) return runtime::OpSupport::Unknown;
  static std::mutex& mutex = *new std::mutex;
  static auto& answers = *new std::unordered_map<std::string, runtime::OpSupport>;
  const auto& name = op.operator_name();
  std::string key = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = answers.find(key);
  if (it == answers.end()) {
    it = answers.emplace(key, runtime::askSupportsOp(runtime::hal().device(0), key, {})).first;
  }
  return it->second;
}
}  // namespace

bool runsNatively(const DeviceProfile& chip, const c10::OperatorHandle& op) {
  for (const auto& ret : op.schema().returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;  // a view
  }
  {
    std::lock_guard<std::mutex> lock(governedMutex());
    if (governed().count(op.operator_name()) == 0) return true;  // the adapter's core: native everywhere
  }
  // The device's own answer comes first (HAL version 5): the chip profile
  // describes the chip, the HAL what this backend's kernels serve.
  if (&chip == &active()) {
    switch (halSupport(op)) {
      case runtime::OpSupport::Supported: return true;
      case runtime::OpSupport::Unsupported: return false;
      case runtime::OpSupport::Unknown: break;
    }
  }
  return !chip.restricts_ops || chip.lists(op.operator_name());
}

ReportedProperties deviceProperties(const std::string& hal_name, std::size_t hal_memory, int hal_compute_units) {
  const DeviceProfile& chip = active();
  ReportedProperties out;
  out.name = chip.isChip() ? chip.device_name : hal_name;
  const auto memory = static_cast<int64_t>(hal_memory);
  out.total_memory = chip.total_memory > 0 ? std::min(chip.total_memory, memory) : memory;
  // A chip's cores; the generic device computes on the host's.
  out.multi_processor_count = chip.isChip() ? chip.cube_core_num : hal_compute_units;
  out.cube_core_num = chip.isChip() ? chip.cube_core_num : hal_compute_units;
  out.vector_core_num = chip.isChip() ? chip.vector_core_num : hal_compute_units;
  out.l2_cache_size = chip.l2_cache_size;
  return out;
}

void raiseOverflowFlag() { g_overflow.store(true, std::memory_order_relaxed); }
bool takeOverflowFlag() { return g_overflow.exchange(false, std::memory_order_relaxed); }

void saturateHalf(const at::Tensor& t, const at::Tensor& finite_before) {
  constexpr double kHalfMax = 65504.0;
  at::Tensor overflowed = t.isinf();
  if (finite_before.defined()) overflowed.logical_and_(finite_before);
  if (!overflowed.any().item<bool>()) return;
  raiseOverflowFlag();
  t.copy_(at::where(overflowed, t.clamp(-kHalfMax, kHalfMax), t));
}

bool decomposesOffChip(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

// ---- The cost model ---------------------------------------------------------

const DeviceProfile* projectionProfile() {
  const DeviceProfile* target = g_projection_target.load(std::memory_order_relaxed);
  if (target != nullptr) return target;
  const DeviceProfile& chip = active();
  return chip.cost ? &chip : nullptr;
}

const CostModel& projectionCost() {
  const DeviceProfile* chip = projectionProfile();
  TORCH_CHECK(chip != nullptr, "torch_npu: the device profile '", active().name,
              "' has no cost model and no projection target is set");
  return *chip->cost;
}

CostModel costOf(const std::string& name) {
  if (name.empty()) return projectionCost();
  auto profile = find(name);
  TORCH_CHECK(profile->cost.has_value(), "torch_npu: device profile '", name,
              "' has no cost model to project onto; pick a chip profile");
  return *profile->cost;
}

void setProjectionTarget(const std::string& name) {
  if (name.empty()) {
    g_projection_target.store(nullptr);
    return;
  }
  auto profile = find(name);
  TORCH_CHECK(profile->cost.has_value(), "torch_npu: device profile '", name,
              "' has no cost model to project onto; pick a chip profile");
  // An active or target profile is never redefined (define()), so the pointer stays valid.
  std::lock_guard<std::mutex> lock(mutex());
  g_projection_target.store(profile.get());
}

runtime::tracing::Work describe(const KernelWork& work) {
  runtime::tracing::Work out;
  out.flops = work.flops;
  out.bytes = work.bytes;
  out.matrix = work.cube;
  const auto t = work.dtype;
  out.bits = (t == c10::kHalf || t == c10::kBFloat16) ? 16
             : (t == c10::kChar || t == c10::kByte || t == c10::kQInt8 || t == c10::kQUInt8) ? 8
                                                                                              : 32;
  out.known = true;
  return out;
}

int64_t projectKernelNs(const CostModel& cost, const runtime::tracing::Work& work, bool in_graph) {
  double peak_tflops = 0;
  if (work.matrix) {
    peak_tflops = work.bits <= 8 ? cost.cube_int8_tops : work.bits <= 16 ? cost.cube_fp16_tflops : cost.cube_fp32_tflops;
  } else {
    peak_tflops = work.bits <= 16 ? cost.vector_fp16_tflops : cost.vector_fp16_tflops / 2;
  }
  const double compute_ns = work.known && peak_tflops > 0 ? work.flops / (peak_tflops * 1e3) : 0;  // TFLOP/s = 1e3 FLOP/ns
  const double memory_ns = cost.memory_gbps > 0 ? work.bytes / cost.memory_gbps : 0;  // GB/s = B/ns
  const double overhead_us = in_graph ? cost.graph_kernel_overhead_us : cost.kernel_overhead_us;
  return static_cast<int64_t>(overhead_us * 1e3 + std::max(compute_ns, memory_ns) + 0.5);
}

int64_t projectCopyNs(const CostModel& cost, double bytes, bool crosses_link, bool in_graph) {
  const double gbps = crosses_link ? cost.link_gbps : cost.memory_gbps / 2;  // within: read and write
  const double overhead_us = in_graph ? cost.graph_kernel_overhead_us : cost.kernel_overhead_us;
  return static_cast<int64_t>(overhead_us * 1e3 + (gbps > 0 ? bytes / gbps : 0) + 0.5);
}

namespace {

double elements(const at::Tensor& t) { return t.defined() ? static_cast<double>(t.numel()) : 0; }

// Calls f(t) for a tensor argument and each tensor of a list (Tensor[], Tensor?[]).
template <typename F>
void eachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) f(e.toTensor());
    }
  }
}

const at::Tensor* tensorAt(const torch::jit::Stack& stack, size_t begin, size_t i) {
  if (begin + i >= stack.size() || !stack[begin + i].isTensor()) return nullptr;
  return &stack[begin + i].toTensor();
}

// FLOPs of the matrix ops, by the shapes of their operands (multiply-adds count two).
std::optional<double> cubeFlops(const std::string& name, const torch::jit::Stack& stack, size_t begin) {
  auto t = [&](size_t i) { return tensorAt(stack, begin, i); };
  if (name == "aten::mv" || name == "aten::dot" || name == "aten::vdot") {
    const at::Tensor* a = t(0);
    if (a == nullptr) return std::nullopt;
    return 2.0 * elements(*a);
  }
  if (name == "aten::addmv") {
    const at::Tensor* a = t(1);
    if (a == nullptr) return std::nullopt;
    return 2.0 * elements(*a);
  }
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul") {
    const at::Tensor *a = t(0), *b = t(1);
    if (a == nullptr || b == nullptr || a->dim() < 2 || b->dim() < 2) return std::nullopt;
    return 2.0 * elements(*a) * b->size(-1);
  }
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm" ||
      name == "aten::_addmm_activation") {
    const at::Tensor *a = t(1), *b = t(2);
    if (a == nullptr || b == nullptr || a->dim() < 2 || b->dim() < 2) return std::nullopt;
    return 2.0 * elements(*a) * b->size(-1);
  }
  const bool backward = name == "aten::convolution_backward_overrideable" || name == "aten::convolution_backward";
  if (backward || name == "aten::convolution" || name == "aten::_convolution" ||
      name == "aten::convolution_overrideable") {
    // Every output element is a dot product over weight.numel() / Cout
    // inputs: 2 * N * Cout * out_spatial * weight.numel() / Cout. Backward
    // (grad_output, input, weight, ...) computes two such products, from
    // grad_output's size; forward derives the output's from the stride,
    // padding and dilation arguments; a transposed convolution scatters each
    // input element over weight.numel() / Cin outputs.
    const at::Tensor *input = t(backward ? 1 : 0), *weight = t(backward ? 2 : 1);
    if (input == nullptr || weight == nullptr || weight->dim() < 3) return std::nullopt;
    if (weight->size(0) == 0) return 0.0;
    const double per_output = elements(*weight) / static_cast<double>(weight->size(0));
    if (backward) {
      const at::Tensor* grad_output = t(0);
      if (grad_output == nullptr || grad_output->dim() < 2 || grad_output->size(1) == 0) return std::nullopt;
      // Two products (the input's and the weight's gradient), each the forward's
      // size: 2 * numel(grad_output) * weight.numel() / output channels.
      return 2.0 * 2.0 * elements(*grad_output) * elements(*weight) / static_cast<double>(grad_output->size(1));
    }
    const size_t args = stack.size() - begin;
    if (args < 8 || !stack[begin + 3].isIntList() || !stack[begin + 4].isIntList() || !stack[begin + 5].isIntList() ||
        !stack[begin + 6].isBool()) {
      return std::nullopt;
    }
    if (stack[begin + 6].toBool()) return 2.0 * elements(*input) * per_output;  // transposed
    const auto stride = stack[begin + 3].toIntVector(), padding = stack[begin + 4].toIntVector(),
               dilation = stack[begin + 5].toIntVector();
    double spatial = 1;
    for (int64_t d = 2; d < input->dim(); ++d) {
      const size_t i = static_cast<size_t>(d - 2);
      const int64_t s = i < stride.size() ? stride[i] : 1, p = i < padding.size() ? padding[i] : 0,
                    dl = i < dilation.size() ? dilation[i] : 1;
      const int64_t out = (input->size(d) + 2 * p - dl * (weight->size(d) - 1) - 1) / s + 1;
      spatial *= static_cast<double>(std::max<int64_t>(out, 0));
    }
    return 2.0 * static_cast<double>(input->size(0)) * static_cast<double>(weight->size(0)) * spatial * per_output;
  }
  if (name == "npu::npu_grouped_matmul" || name == "npu::npu_quant_matmul") {
    // x (or each x of a list) times a weight of n columns; int32 operands pack eight int4
    const auto tensors = [&](size_t i) {
      std::vector<at::Tensor> list;
      if (begin + i < stack.size()) eachTensor(stack[begin + i], [&](const at::Tensor& t) { list.push_back(t); });
      return list;
    };
    const auto xs = tensors(0), ws = tensors(1);
    if (xs.empty() || ws.empty() || !xs[0].defined() || !ws[0].defined()) return std::nullopt;
    const double unpack = xs[0].scalar_type() == at::kInt ? 8.0 : 1.0;
    double flops = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const at::Tensor& w = ws.size() == xs.size() ? ws[i] : ws[0];
      flops += 2.0 * elements(xs[i]) * unpack * static_cast<double>(w.size(-1)) * unpack;
    }
    return flops;
  }
  if (name.rfind("aten::_scaled_dot_product", 0) == 0 || name.rfind("aten::_flash_attention", 0) == 0) {
    const at::Tensor *q = t(0), *k = t(1);
    if (q == nullptr || k == nullptr || q->dim() < 2) return std::nullopt;
    // QK^T and PV: 2 * (2 * L * S * E) per batch-head.
    return 4.0 * elements(*q) * static_cast<double>(k->size(-2));
  }
  return std::nullopt;
}

}  // namespace

KernelWork estimateWork(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  KernelWork work;
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack.size() >= n ? stack.size() - n : 0;
  double largest = 0;
  bool dtype_set = false;
  bool has_out = false;
  for (size_t i = begin; i < stack.size(); ++i) {
    has_out = has_out || schema.arguments()[i - begin].is_out();
    eachTensor(stack[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      const double bytes = elements(t) * static_cast<double>(t.itemsize());
      work.bytes += bytes;
      largest = std::max(largest, elements(t));
      if (!dtype_set && c10::isFloatingType(t.scalar_type())) {
        work.dtype = t.scalar_type();
        dtype_set = true;
      }
    });
  }
  if (auto flops = cubeFlops(schema.name(), stack, begin)) {
    work.cube = true;
    work.flops = *flops;
    // A matrix product writes its result once: M x N per batch, large beside its operands
    // when the inner dimension is short (attention's scores).
    if (!has_out) {
      const auto& name = schema.name();
      const bool plain = name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul";
      const bool added = name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::_addmm_activation";
      const at::Tensor* a = tensorAt(stack, begin, plain ? 0 : 1);
      const at::Tensor* b = tensorAt(stack, begin, plain ? 1 : 2);
      if ((plain || added) && a != nullptr && b != nullptr && a->dim() >= 2 && b->dim() >= 2 && a->size(-1) > 0) {
        work.bytes += elements(*a) / static_cast<double>(a->size(-1)) * static_cast<double>(b->size(-1)) *
                      static_cast<double>(c10::elementSize(work.dtype));
      }
    }
    // int8 (and int4) matmuls run at the matrix unit's fastest rate, not their float scales'
    if (begin < stack.size()) {
      eachTensor(stack[begin], [&](const at::Tensor& t) {
        if (t.defined() && (t.scalar_type() == at::kChar || t.scalar_type() == at::kInt)) work.dtype = at::kChar;
      });
    }
    return work;
  }
  work.flops = largest;  // one operation per element of the largest operand
  // A functional op also writes a result about the size of its largest operand.
  if (!has_out) work.bytes += largest * static_cast<double>(c10::elementSize(work.dtype));
  return work;
}

runtime::tracing::Work workOf(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  return describe(estimateWork(op, stack));
}

bool describingWork() { return runtime::tracing::enabled() || capture::anyCapture(); }

}  // namespace npu::profile

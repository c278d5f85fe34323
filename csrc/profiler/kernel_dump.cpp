#include "kernel_dump.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "../core/device.h"
#include "../core/graph.h"
#include "../core/launch.h"
#include "../core/stream.h"
#include "../dispatch/registry.h"
#include "../runtime/hal.h"

namespace npu::profiler::dump {
namespace {

constexpr const char* kKernelName = "npu::kernel_dump";

// One tensor of a dumped kernel: its geometry at the call, its bytes once copied in stream order.
struct Slot {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t address = 0;
  at::Tensor data;  // a contiguous CPU copy
};

struct Record {
  std::string op_type;  // "addmm"
  std::string op_name;  // "aten_addmm_default"
  int64_t task_id = 0;
  c10::DeviceIndex device = -1;
  std::vector<Slot> inputs;
  std::vector<Slot> outputs;
};

struct State {
  std::mutex mu;
  bool initialised = false;
  std::optional<at::CallbackHandle> handle;
  Config config;
  std::string folder;  // {path}/{YYYYmmddHHMMSS}
  std::atomic<int64_t> next_task{0};
  std::atomic<int64_t> dumped{0};
  std::string first_error;
  bool warned_capture = false;
  std::unordered_map<std::string, bool> is_kernel;  // by "ns::name.overload"
};

State& state() {
  static State* s = new State();  // outlives the streams' workers at exit
  return *s;
}

thread_local int t_depth = 0;  // > 0 inside a dumped kernel: what it calls is part of it

void recordError(const std::string& what) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.first_error.empty()) s.first_error = what;
}

// Whether the op is one kernel of the npu: served by an npu kernel or by the CPU fallback, not
// decomposed, not a view (no kernel runs), not an allocation.
bool isKernelOp(const c10::OperatorName& name) {
  std::string key = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  auto& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.is_kernel.find(key);
    if (it != s.is_kernel.end()) return it->second;
  }
  bool kernel = false;
  auto handle = c10::Dispatcher::singleton().findSchema(name);
  if (handle) {
    bool view = false;
    for (const auto& ret : handle->schema().returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) view = true;
    }
    static const char* kNoKernel[] = {"aten::empty", "aten::empty_strided", "aten::resize_", "aten::set_",
                                      "aten::lift_fresh", "aten::_local_scalar_dense", "aten::record_stream"};
    bool allocation = false;
    for (const char* n : kNoKernel) allocation |= name.name == n;
    if (!view && !allocation) {
      const auto resolved = dispatch::resolveOp(key);
      if (resolved) {
        kernel = resolved->backend == "npu" || resolved->backend == "cpu";
      } else {
        kernel = handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
      }
    }
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.is_kernel.emplace(std::move(key), kernel);
  return kernel;
}

template <typename F>
void forEachTensor(c10::ArrayRef<c10::IValue> values, F&& f) {
  for (const auto& v : values) {
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
}

bool dumpable(const at::Tensor& t) { return t.defined() && t.layout() == at::kStrided && !t.is_meta(); }
bool onNpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// Slots for `tensors`; a CPU tensor is copied now, an npu tensor's alias is returned for a copy
// in stream order (index in the slots, alias).
std::vector<std::pair<std::size_t, at::Tensor>> collect(c10::ArrayRef<c10::IValue> values, std::vector<Slot>& slots,
                                                       c10::DeviceIndex& device) {
  std::vector<std::pair<std::size_t, at::Tensor>> pending;
  forEachTensor(values, [&](const at::Tensor& t) {
    if (!dumpable(t)) return;
    Slot slot;
    slot.dtype = t.scalar_type();
    slot.shape = t.sizes().vec();
    slot.address = reinterpret_cast<uint64_t>(t.data_ptr());
    if (onNpu(t)) {
      if (device < 0) device = t.device().index();
      pending.emplace_back(slots.size(), cpuAlias(t));
    } else {
      at::RecordFunctionGuard off(false);
      slot.data = t.detach().clone(at::MemoryFormat::Contiguous);
    }
    slots.push_back(std::move(slot));
  });
  return pending;
}

std::size_t bytesOfAll(const std::vector<std::pair<std::size_t, at::Tensor>>& pending) {
  std::size_t n = 0;
  for (const auto& p : pending) n += bytesOf(p.second);
  return n;
}

// ---- the file: msaccucmp's "nano" dump -----------------------------------------------
// | uint64 header length | header | inputs' bytes | outputs' bytes |, the header: uint32 magic
// 0x5A5A5A5A, uint32 version, then a TLV (uint32 tag, uint32 length) of the inputs (tag 4) and of
// the outputs (tag 5), each a uint32 count and per tensor its fixed fields and TLVs of its dims.

int32_t aclDataType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kChar: return 2;
    case at::kInt: return 3;
    case at::kByte: return 4;
    case at::kShort: return 6;
    case at::kUInt16: return 7;
    case at::kUInt32: return 8;
    case at::kLong: return 9;
    case at::kUInt64: return 10;
    case at::kDouble: return 11;
    case at::kBool: return 12;
    case at::kComplexFloat: return 16;
    case at::kComplexDouble: return 17;
    case at::kBFloat16: return 27;
    case at::kComplexHalf: return 33;
    case at::kFloat8_e5m2: return 35;
    case at::kFloat8_e4m3fn: return 36;
    case at::kFloat8_e8m0fnu: return 37;
    case at::kFloat4_e2m1fn_x2: return 40;
    default: return 4;  // other dtypes (quantized, unsigned bits): their bytes, as uint8
  }
}
constexpr int32_t kFormatNd = 2;

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void putDims(std::string& out, uint32_t tag, const std::vector<int64_t>& dims) {
  put<uint32_t>(out, tag);
  put<uint32_t>(out, static_cast<uint32_t>(dims.size() * sizeof(uint64_t)));
  for (int64_t d : dims) put<uint64_t>(out, static_cast<uint64_t>(d));
}

std::vector<int64_t> dimsOf(const Slot& s) {
  if (aclDataType(s.dtype) == 4 && s.dtype != at::kByte) return {static_cast<int64_t>(s.data.nbytes())};
  if (s.dtype == at::kFloat4_e2m1fn_x2) {
    // ACL counts float4 elements; torch's x2 dtype counts bytes of two: the last dim doubles
    std::vector<int64_t> dims = s.shape.empty() ? std::vector<int64_t>{1} : s.shape;
    dims.back() *= 2;
    return dims;
  }
  return s.shape;
}

void putTensor(std::string& out, const Slot& s, bool output) {
  const auto dims = dimsOf(s);
  const uint32_t tlv_bytes = static_cast<uint32_t>(2 * (8 + dims.size() * sizeof(uint64_t)));
  put<int32_t>(out, aclDataType(s.dtype));
  put<int32_t>(out, kFormatNd);
  put<int32_t>(out, 0);  // address type
  if (output) {
    put<int32_t>(out, 0);                      // original index
    put<int32_t>(out, aclDataType(s.dtype));   // original data type
    put<int32_t>(out, kFormatNd);              // original format
  }
  put<uint64_t>(out, s.address);
  put<uint64_t>(out, 0);  // offset
  put<uint64_t>(out, static_cast<uint64_t>(s.data.nbytes()));
  put<uint32_t>(out, tlv_bytes);
  putDims(out, 0, dims);  // shape
  putDims(out, 1, dims);  // original shape
}

std::string section(uint32_t tag, const std::vector<Slot>& slots, bool output) {
  std::string body;
  put<uint32_t>(body, static_cast<uint32_t>(slots.size()));
  for (const auto& s : slots) putTensor(body, s, output);
  std::string out;
  put<uint32_t>(out, tag);
  put<uint32_t>(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

void writeRecord(const Record& r, int64_t stream_id, const Config& config, const std::string& folder) {
  const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const std::filesystem::path dir = std::filesystem::path(folder) / std::to_string(r.device);
  std::filesystem::create_directories(dir);
  const std::string file = r.op_type + "." + r.op_name + "." + std::to_string(r.task_id) + "." +
                           std::to_string(stream_id) + "." + std::to_string(now);
  static const std::vector<Slot> none;
  const auto& ins = config.inputs ? r.inputs : none;
  const auto& outs = config.outputs ? r.outputs : none;
  std::string header;
  put<uint32_t>(header, 0x5A5A5A5A);
  put<uint32_t>(header, 1);
  header += section(4, ins, false);
  header += section(5, outs, true);
  std::ofstream f(dir / file, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(f.good(), "torch_npu.npu.set_dump: cannot write ", (dir / file).string(),
              "; check that dump_path is writable");
  std::string length;
  put<uint64_t>(length, static_cast<uint64_t>(header.size()));
  f.write(length.data(), static_cast<std::streamsize>(length.size()));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto* slots : {&ins, &outs}) {
    for (const auto& s : *slots) {
      f.write(static_cast<const char*>(s.data.const_data_ptr()), static_cast<std::streamsize>(s.data.nbytes()));
    }
  }
  TORCH_CHECK(f.good(), "torch_npu.npu.set_dump: writing ", (dir / file).string(), " failed");
}

// Copies the npu tensors of `pending` into their slots, in stream order on `device`.
void copyInStreamOrder(c10::DeviceIndex device, const std::shared_ptr<Record>& record, bool outputs,
                       std::vector<std::pair<std::size_t, at::Tensor>> pending, bool write) {
  const std::size_t bytes = bytesOfAll(pending);
  const int64_t stream_id = currentRuntimeStream(device).id();
  auto& s = state();
  Config config;
  std::string folder;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    config = s.config;
    folder = s.folder;
  }
  launch(device, kKernelName,
         [record, outputs, pending = std::move(pending), write, stream_id, config, folder]() mutable {
           try {
             at::RecordFunctionGuard off(false);  // the copies are not kernels of the program
             auto& slots = outputs ? record->outputs : record->inputs;
             for (auto& [index, alias] : pending) slots[index].data = alias.clone(at::MemoryFormat::Contiguous);
             pending.clear();
             if (write) {
               writeRecord(*record, stream_id, config, folder);
               state().dumped.fetch_add(1, std::memory_order_relaxed);
             }
           } catch (const std::exception& e) {
             recordError(std::string("kernel dump of ") + record->op_type + ": " + e.what());
           }
         },
         bytes);
}

struct Context : at::ObserverContext {
  std::shared_ptr<Record> record;
  bool inputs_taken = false;  // at the call (npu inputs: in stream order); else at the return
};

bool wantInputs() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.config.inputs;
}

// Whether a kernel launched now on `device` goes into a graph: this thread's current stream of that
// device is capturing (work queued there would be recorded and dump at every replay). A capture on
// another thread, stream or device leaves this launch dumped. Warns once when it skips.
bool capturedOn(c10::DeviceIndex device) {
  if (!graph::anyCapture() || device < 0 || !graph::currentStreamCapturing(device)) return false;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.warned_capture) {
    s.warned_capture = true;
    TORCH_WARN("torch_npu.npu.set_dump: kernels launched while an npu graph is being captured are not dumped");
  }
  return true;
}

std::unique_ptr<at::ObserverContext> onEnter(const at::RecordFunction& fn) {
  if (t_depth > 0) return nullptr;
  try {
    const auto name = fn.operator_name();
    if (!name || !isKernelOp(*name)) return nullptr;
    auto ctx = std::make_unique<Context>();
    ctx->record = std::make_shared<Record>();
    auto& record = *ctx->record;
    const std::string& full = name->name;
    const auto colon = full.find("::");
    record.op_type = colon == std::string::npos ? full : full.substr(colon + 2);
    record.op_name = (colon == std::string::npos ? full : full.substr(0, colon) + "_" + full.substr(colon + 2)) +
                     "_" + (name->overload_name.empty() ? "default" : name->overload_name);
    const auto inputs = fn.inputs();
    bool any_npu = false;
    forEachTensor(inputs, [&](const at::Tensor& t) {
      if (dumpable(t) && onNpu(t)) {
        if (!any_npu) record.device = t.device().index();
        any_npu = true;
      }
    });
    if (any_npu && capturedOn(record.device)) return nullptr;
    // An op on npu tensors: its inputs as the kernel will read them, in stream order. Without npu
    // inputs (a CPU op, or a copy to the npu), they are read at its return, if its outputs are npu's.
    if (any_npu && wantInputs()) {
      const HostOpName named("the kernel dump");
      auto pending = collect(inputs, record.inputs, record.device);
      copyInStreamOrder(record.device, ctx->record, /*outputs=*/false, std::move(pending), /*write=*/false);
      ctx->inputs_taken = true;
    }
    ++t_depth;
    return ctx;
  } catch (const std::exception& e) {
    recordError(std::string("kernel dump of ") + fn.name() + ": " + e.what());
    return nullptr;
  }
}

void onExit(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (raw == nullptr) return;
  --t_depth;
  try {
    auto* ctx = static_cast<Context*>(raw);
    auto record = ctx->record;
    const auto name = fn.operator_name();
    auto handle = name ? c10::Dispatcher::singleton().findSchema(*name) : std::nullopt;
    if (!handle) return;
    const auto& schema = handle->schema();
    // What the kernel wrote: its tensor results, or (an op that returns nothing) the arguments it writes.
    std::vector<c10::IValue> written;
    bool returns_tensors = false;
    for (const auto& ret : schema.returns()) {
      const auto kind = ret.type()->kind();
      returns_tensors |= kind == c10::TypeKind::TensorType || kind == c10::TypeKind::ListType ||
                         kind == c10::TypeKind::OptionalType;
    }
    if (schema.returns().empty()) {
      const auto inputs = fn.inputs();
      for (std::size_t i = 0; i < schema.arguments().size() && i < inputs.size(); ++i) {
        const auto* alias = schema.arguments()[i].alias_info();
        if (alias != nullptr && alias->isWrite()) written.push_back(inputs[i]);
      }
      if (written.empty()) return;  // neither results nor writes: no kernel
    } else {
      if (!returns_tensors) return;  // a query (a bool, a scalar): no kernel
      const auto& outputs = fn.outputs();
      if (outputs.empty()) return;   // the op raised: it ran no kernel
      written.assign(outputs.begin(), outputs.end());
    }
    const HostOpName named("the kernel dump");
    c10::DeviceIndex device = record->device;
    auto pending = collect(written, record->outputs, device);
    if (device < 0) return;  // no npu tensor: not a kernel of the npu
    if (capturedOn(device)) return;
    if (record->device < 0) record->device = device;
    if (!ctx->inputs_taken && wantInputs()) {
      c10::DeviceIndex unused = device;
      auto later = collect(fn.inputs(), record->inputs, unused);  // CPU tensors: copied now
      TORCH_INTERNAL_ASSERT(later.empty());
    }
    record->task_id = state().next_task.fetch_add(1, std::memory_order_relaxed);
    copyInStreamOrder(record->device, record, /*outputs=*/true, std::move(pending), /*write=*/true);
  } catch (const std::exception& e) {
    recordError(std::string("kernel dump of ") + fn.name() + ": " + e.what());
  }
}

std::string timestampFolder() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d%H%M%S", &local);
  return buf;
}

}  // namespace

void init() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  TORCH_CHECK(!s.initialised, "torch_npu.npu.init_dump: the dump is initialised already; call "
              "torch_npu.npu.finalize_dump() first (ACL allows one aclmdlInitDump at a time)");
  s.initialised = true;
  s.first_error.clear();
}

void set(const Config& config) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  TORCH_CHECK(s.initialised, "torch_npu.npu.set_dump: call torch_npu.npu.init_dump() first (the order is init_dump, "
              "set_dump, the kernels to dump, finalize_dump)");
  s.config = config;
  s.folder = (std::filesystem::path(config.path) / timestampFolder()).string();
  s.next_task = 0;
  s.dumped = 0;
  s.warned_capture = false;
  if (config.op_switch && !s.handle) {
    s.handle = at::addGlobalCallback(at::RecordFunctionCallback(onEnter, onExit)
                                         .needsInputs(true)
                                         .needsOutputs(true)
                                         .scopes({at::RecordScope::FUNCTION}));
  } else if (!config.op_switch && s.handle) {
    at::removeCallback(*s.handle);
    s.handle.reset();
  }
}

void finalize() {
  auto& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    TORCH_CHECK(s.initialised, "torch_npu.npu.finalize_dump: the dump is not initialised; call "
                "torch_npu.npu.init_dump() and set_dump() first");
    if (s.handle) {
      at::removeCallback(*s.handle);
      s.handle.reset();
    }
  }
  // The dumps of the kernels launched so far are queued work: wait for them.
  for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
    if (runtimeInitialized()) synchronizeDevice(d);
  }
  std::string error;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.initialised = false;
    std::swap(error, s.first_error);
  }
  TORCH_CHECK(error.empty(), "torch_npu.npu.finalize_dump: a kernel could not be dumped: ", error);
}

bool initialised() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.initialised;
}

bool active() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.handle.has_value();
}

int64_t dumpedCount() { return state().dumped.load(); }

std::string currentFolder() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.folder;
}

}  // namespace npu::profiler::dump

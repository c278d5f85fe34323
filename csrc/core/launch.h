// How work reaches the device, the one submission point: a kernel is a closure
// queued on an npu stream, or recorded by the stream's graph capture (graph.h).
// On the emulated NPU it computes with ATen's CPU kernels on CPU tensors that
// alias device memory (no copy). Closures must not own tensors Python has seen
// (dropping the last reference would need the GIL on the worker thread), so they
// capture aliases made here; the memory stays valid because frees are
// stream-ordered (see allocator.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <functional>

#include "../runtime/hal.h"
#include "../runtime/tracing.h"

namespace npu {

// A CPU tensor over the same memory as the npu tensor `t`: same sizes, strides,
// storage offset, dtype and conjugate/negative bits. An undefined tensor stays
// undefined. With `resize_allocator` (and a resizable npu storage) a kernel may
// resize the alias, taking new memory from that allocator (out= arguments).
// On a device whose HAL keeps memory host kernels cannot reach, raises naming
// the op of the innermost HostOpName on this thread (hostKernelsAllowed()).
at::Tensor cpuAlias(const at::Tensor& t, c10::Allocator* resize_allocator = nullptr);
// cpuAlias in two steps, for aliases of one npu storage that must share one CPU
// storage, so that ATen's overlap checks see them as views of one memory: the
// CPU storage over t's memory, and t's geometry over such a storage.
c10::Storage cpuAliasStorage(const at::Tensor& t, c10::Allocator* resize_allocator = nullptr);
at::Tensor cpuAliasOver(const at::Tensor& t, c10::Storage alias_storage);

// cpuAlias for the operands of one op of the structured fast path: the alias's
// TensorImpl and StorageImpl come from a small pool of this thread's earlier
// aliases, re-pointed at t, when the pool holds their only reference (a queued
// kernel that still holds one keeps it). Its result must stay below Python
// and autograd (a kernel's operand, never returned), as every alias does.
// `share`: an alias made by this call of an operand of the same npu storage,
// whose CPU storage this one shares (overlap checks), or null.
at::Tensor cpuAliasPooled(const at::Tensor& t, const at::Tensor* share);

// Names, for the calling thread's lifetime of this object, the op whose host
// kernel it prepares: what a refusal by cpuAlias() names. `name` has static
// storage (an op's name from the dispatcher, a literal).
class HostOpName {
 public:
  explicit HostOpName(const char* name);
  ~HostOpName();
  HostOpName(const HostOpName&) = delete;
  HostOpName& operator=(const HostOpName&) = delete;
  static const char* current();  // "an npu op" when none is named

 private:
  const char* previous_;
};

// Queues `kernel` on the current stream of `device`. Errors of an asynchronous
// kernel surface at the next synchronisation point; with NPU_LAUNCH_BLOCKING=1
// they are raised here, naming the kernel.
void launch(c10::DeviceIndex device, const char* name, runtime::Kernel kernel, std::size_t bytes);

// Queues a stream-ordered copy of `n` bytes on the current stream of `device`,
// or records it into that stream's capture (graph.h): false when captured.
// `keep` is host memory the copy reads or writes, kept as long as a graph that
// recorded it.
bool launchCopy(c10::DeviceIndex device, void* dst, const void* src, std::size_t n, runtime::CopyKind kind,
                c10::Storage keep = {});

// Runs `kernel` now, on this thread, when the current stream of `device` is
// idle and the launch policy would run it here anyway: its error raises at
// the call, as an error of a synchronous op. False: nothing ran (launch() it).
bool runIfIdle(c10::DeviceIndex device, const char* name, runtime::KernelRef kernel, std::size_t bytes);

// Host code that computes on device memory in stream order (inductor's generated
// kernels, called from Python): runs `kernel` on this thread holding the current
// stream of `device`, after the work queued before it. While a profiler records
// it is one op named `name` and one kernel whose work is `work`, so that it is
// projected as a kernel launch, in a graph replay as a replayed kernel.
void runHostKernel(c10::DeviceIndex device, const char* name, const runtime::tracing::Work& work, std::size_t bytes,
                   const std::function<void()>& kernel);

// Bytes a kernel reads or writes, the size hint for launch().
inline std::size_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * t.itemsize() : 0; }

}  // namespace npu

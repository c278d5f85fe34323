// Running an ATen CPU kernel on npu memory from the caller's thread.
//
// The emulated NPU computes with ATen's CPU kernels on CPU tensors that alias
// device memory (core/launch.h). Kernels whose outputs are only known once they
// ran (shapes from data, new tensors) run here, in stream order: the stream is
// drained first, and while a HostExecution is alive every CPU allocation on
// this thread is served from the npu caching allocator, so the kernel writes
// its outputs straight into device memory; toNpu() then adopts them as npu
// tensors without a copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/flat_hash_map.h>

#include <optional>

#include "../../core/device.h"
#include "../../core/launch.h"
#include "../../core/stream.h"
#include "../../runtime/tracing.h"

namespace npu::ops {

// Installs the CPU allocator that can redirect to npu memory (at module init).
void installHostAllocatorRedirect();

// The kernel of every op on sparse compressed (CSR, CSC, BSR, BSC) npu tensors: the
// CPU fallback, moving their components to the host and results back.
void compressedFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

class HostExecution {
 public:
  // Holds the current stream of `device` (core/stream.h's StreamHold): runs
  // after the work launched before it, before what other threads launch meanwhile.
  // `kernel` (static storage) names the work in the profiler's device trace.
  explicit HostExecution(c10::Device device, const char* kernel = "npu::host_execution");
  ~HostExecution();
  HostExecution(const HostExecution&) = delete;
  HostExecution& operator=(const HostExecution&) = delete;

  // A CPU alias of the npu tensor `t` whose storage the kernel may resize (out=).
  at::Tensor alias(const at::Tensor& t);
  // The npu tensor for a CPU result of the kernel: the original npu tensor for
  // an alias made here, an npu view for a view of one, the adopted memory for a
  // new result, or (rarely, for memory from elsewhere) a copy.
  at::Tensor toNpu(const at::Tensor& result);
  // After the kernel: an out= argument that the kernel resized or restrided
  // gets the alias's new memory and geometry.
  void syncBack(const at::Tensor& npu_tensor);

  c10::Device device() const { return device_; }

 private:
  at::Tensor adoptOrView(const at::Tensor& result);
  at::Tensor viewOf(const at::Tensor& npu_base, const at::Tensor& result);

  HostOpName named_;  // first: refuses on a HAL host kernels cannot run on, before holding its stream
  c10::Device device_;
  c10::DeviceGuard guard_;
  StreamHold hold_;
  c10::DeviceIndex previous_redirect_;
  // Device work that runs on the host thread: one kernel for the outermost scope.
  std::optional<runtime::tracing::Scope> traced_;
  struct Aliased {
    at::Tensor alias;     // kept alive, so no later tensor can reuse its address
    at::Tensor original;  // the npu tensor
  };
  // Open addressing: no heap node per tensor on this per-op path.
  ska::flat_hash_map<const c10::TensorImpl*, Aliased> originals_;        // alias impl -> both
  ska::flat_hash_map<const void*, at::Tensor> by_memory_;                  // storage base -> npu tensor
  ska::flat_hash_map<const c10::StorageImpl*, c10::Storage> adopted_;     // host storage -> npu storage
};

}  // namespace npu::ops

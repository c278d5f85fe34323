#include "launch.h"

#include "../runtime/tracing.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <optional>

#include "device.h"
#include "graph.h"
#include "stream.h"

namespace npu {

namespace {
thread_local const char* t_host_op = nullptr;
}  // namespace

HostOpName::HostOpName(const char* name) : previous_(t_host_op) { t_host_op = name; }
HostOpName::~HostOpName() { t_host_op = previous_; }
const char* HostOpName::current() { return t_host_op != nullptr ? t_host_op : "an npu op"; }

c10::Storage cpuAliasStorage(const at::Tensor& t, c10::Allocator* resize_allocator) {
  // The one door of host kernels into device memory: refused, by name, on a HAL that keeps it out of reach.
  const c10::DeviceIndex device = t.device().index();
  if (C10_UNLIKELY(!hostKernelsAllowed(device))) refuseHostKernel(device, HostOpName::current());
  const auto* storage = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  const bool resizable = resize_allocator != nullptr && storage->resizable();
  return c10::Storage(c10::Storage::use_byte_size_t(), storage->nbytes(),
                      c10::DataPtr(const_cast<void*>(storage->data()), c10::Device(c10::kCPU)),
                      resizable ? resize_allocator : nullptr, resizable);
}

at::Tensor cpuAliasOver(const at::Tensor& t, c10::Storage alias_storage) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(alias_storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  impl->_set_conj(t.is_conj());
  impl->_set_neg(t.is_neg());
  return at::Tensor(std::move(impl));
}

namespace {
// The pool of cpuAliasPooled: aliases this thread made, reused once no one else
// holds them. Thread-local, so only this thread re-points them; another thread
// (a stream worker running the kernel) only drops its references.
struct AliasPool {
  static constexpr int kSize = 8;
  c10::intrusive_ptr<c10::TensorImpl> tensors[kSize];
  int next = 0;  // where the search starts: the slots are used in turn
};
thread_local AliasPool t_alias_pool;

// Whether `p` is held by the caller's reference alone. The acquire fence pairs
// with the release of the last other holder's decrement (intrusive_ptr's is
// acq_rel): what that thread did with the object happens before we re-point it.
template <class T>
bool soleOwner(const c10::intrusive_ptr<T>& p) {
  if (p.use_count() != 1 || p.weak_use_count() != 1) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}
}  // namespace

at::Tensor cpuAliasPooled(const at::Tensor& t, const at::Tensor* share) {
  const c10::DeviceIndex device = t.device().index();
  if (C10_UNLIKELY(!hostKernelsAllowed(device))) refuseHostKernel(device, HostOpName::current());
  auto& pool = t_alias_pool;
  for (int n = 0; n < AliasPool::kSize; ++n) {
    const int i = (pool.next + n) % AliasPool::kSize;
    auto& slot = pool.tensors[i];
    if (slot && !soleOwner(slot)) continue;  // a queued kernel, or a view a kernel kept, still holds it
    pool.next = (i + 1) % AliasPool::kSize;
    if (!slot) {
      at::Tensor made = share ? cpuAliasOver(t, share->storage()) : cpuAlias(t);
      slot = made.getIntrusivePtr();
      return made;
    }
    c10::TensorImpl* impl = slot.get();
    if (share != nullptr) {
      impl->set_storage_and_dtype(share->storage(), t.dtype());
    } else {
      const auto* npu = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      const c10::Storage& own = impl->unsafe_storage();
      if (own.use_count() == 1 && !own.resizable()) {
        // Only this alias holds its storage (no one kept a view of it): re-pointed too.
        std::atomic_thread_fence(std::memory_order_acquire);
        c10::StorageImpl* storage = own.unsafeGetStorageImpl();
        storage->set_data_ptr_noswap(c10::DataPtr(const_cast<void*>(npu->data()), c10::Device(c10::kCPU)));
        storage->set_nbytes(npu->nbytes());
        if (impl->dtype() != t.dtype()) impl->set_storage_and_dtype(own, t.dtype());
      } else {
        impl->set_storage_and_dtype(cpuAliasStorage(t), t.dtype());
      }
    }
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    impl->_set_conj(t.is_conj());
    impl->_set_neg(t.is_neg());
    return at::Tensor(slot);
  }
  // Every slot is held (kernels queued behind a busy stream): a new alias.
  return share ? cpuAliasOver(t, share->storage()) : cpuAlias(t);
}

at::Tensor cpuAlias(const at::Tensor& t, c10::Allocator* resize_allocator) {
  if (!t.defined()) return t;
  return cpuAliasOver(t, cpuAliasStorage(t, resize_allocator));
}

void launch(c10::DeviceIndex device, const char* name, runtime::Kernel kernel, std::size_t bytes) {
  if (C10_UNLIKELY(anyDeviceStopped())) checkNotStopped(device, name);
  if (C10_UNLIKELY(graph::recordKernel(device, name, kernel, bytes))) return;  // captured, not run
  auto& stream = currentRuntimeStream(device);
  const c10::DeviceIndex stream_device = static_cast<c10::DeviceIndex>(stream.device());
  // While a profiler with npu activities runs, the kernel carries the
  // launcher's debug info: what it allocates or frees on a stream worker is
  // reported to that profiler. Only then: that profiler drains the streams
  // before it stops (NpuSession::stop), so no worker reports into a profiler
  // that is being finalised.
  std::shared_ptr<c10::ThreadLocalDebugInfo> debug_info;
  if (C10_UNLIKELY(runtime::tracing::enabled()) &&
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) {
    debug_info = c10::ThreadLocalDebugInfo::current();
  }
  translateRuntimeErrors(name, [&] {
    stream.launch(
        name,
        [kernel = std::move(kernel), debug_info = std::move(debug_info), stream_device]() mutable {
          if (C10_UNLIKELY(anyDeviceStopped()) && deviceStopped(stream_device)) return;  // stop_device: skipped
          std::optional<c10::DebugInfoGuard> profiled;
          if (debug_info) profiled.emplace(debug_info);
          // Destroyed inside the guard: a tensor the kernel held last is freed
          // (and its free reported) here, not after the guard is gone.
          runtime::Kernel run = std::move(kernel);
          // Aliases need no autograd: go straight to the CPU kernels.
          at::AutoDispatchBelowADInplaceOrView below_autograd;
          run();
        },
        bytes);
  });
}

bool launchCopy(c10::DeviceIndex device, void* dst, const void* src, std::size_t n, runtime::CopyKind kind,
                c10::Storage keep) {
  if (C10_UNLIKELY(anyDeviceStopped())) checkNotStopped(device, "copy");
  if (C10_UNLIKELY(graph::recordCopy(device, dst, src, n, kind, std::move(keep)))) return false;  // captured
  currentRuntimeStream(device).copy(dst, src, n, kind);
  return true;
}

void runHostKernel(c10::DeviceIndex device, const char* name, const runtime::tracing::Work& work, std::size_t bytes,
                   const std::function<void()>& kernel) {
  if (C10_LIKELY(!runtime::tracing::enabled())) {
    StreamHold hold(device, name);
    kernel();
    return;
  }
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  StreamHold hold(device, name);
  runtime::tracing::setNextWork(work);
  runtime::tracing::Scope traced(runtime::tracing::ActivityKind::Kernel, name, resolveDevice(device),
                                 currentRuntimeStream(device).id(), bytes);
  kernel();
}

bool runIfIdle(c10::DeviceIndex device, const char* name, runtime::KernelRef kernel, std::size_t bytes) {
  if (C10_UNLIKELY(graph::anyCapture())) return false;   // launch() records it, or refuses it
  if (C10_UNLIKELY(anyDeviceStopped())) checkNotStopped(device, name);
  auto& stream = currentRuntimeStream(device);
  auto below_autograd = [&kernel] {
    at::AutoDispatchBelowADInplaceOrView guard;
    kernel();
  };
  return stream.runIfIdle(name, below_autograd, bytes);
}

}  // namespace npu

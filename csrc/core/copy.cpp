#include "copy.h"

#include <ATen/ops/empty.h>

#include <utility>
#include <c10/core/DeviceGuard.h>

#include "device.h"
#include "capture.h"
#include "host_allocator.h"
#include "launch.h"
#include "profile.h"
#include "stream.h"
#include "../runtime/tracing.h"

namespace npu {
namespace {

bool isPlainCopy(const at::Tensor& dst, const at::Tensor& src) {
  return dst.dtype() == src.dtype() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
         src.is_contiguous() && !dst.is_conj() && !src.is_conj() && !dst.is_neg() && !src.is_neg();
}

// The host side of a copy: waits for the device's queued work on `device`.
void waitForDevice(c10::DeviceIndex device, const char* where) {
  synchronizeStream(currentStream(device), where);
}

// A stream-ordered copy of `n` bytes that has completed when this returns (the
// host memory may be pageable): waits for the copy alone, not for what other
// threads queue after it, and raises an earlier kernel's error.
void copyAndWait(c10::DeviceIndex device, void* dst, const void* src, std::size_t n, runtime::CopyKind kind,
                 const char* where) {
  capture::checkNotCapturing(device, where);
  auto& stream = currentRuntimeStream(device);
  auto done = runtimeDevice(device).createEvent(false);
  translateRuntimeErrors(where, [&] {
    stream.copy(dst, src, n, kind);
    done->record(stream);
    done->synchronize();
  });
}

// ---- devices whose memory the host cannot address ---------------------------------
// Without a kernel of the device, a strided or converting copy goes through the
// host: the bytes of the storage a tensor covers come over with the HAL's copy,
// the host rearranges them, and they go back the same way.

// The first and one past the last element of t's storage that t covers.
std::pair<int64_t, int64_t> extentOf(const at::Tensor& t) {
  int64_t first = t.storage_offset();
  int64_t last = first;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach >= 0 ? last : first) += reach;
  }
  return {first, last + 1};
}

// A host tensor of t's geometry over a host copy of the storage t covers.
at::Tensor hostSpanOf(const at::Tensor& t, const char* where) {
  const auto [first, end] = extentOf(t);
  at::Tensor span = at::empty({end - first}, t.options().device(c10::kCPU));
  copyAndWait(t.device().index(), span.mutable_data_ptr(),
              static_cast<const char*>(t.storage().data()) + first * t.itemsize(), (end - first) * t.itemsize(),
              runtime::CopyKind::DeviceToHost, where);
  at::Tensor view = span.as_strided(t.sizes(), t.strides(), t.storage_offset() - first);
  if (t.is_conj()) view = view.conj();
  if (t.is_neg()) view = view._neg_view();
  return view;
}

// Writes back the storage span of `host`, a hostSpanOf(t) the host changed.
void writeHostSpan(const at::Tensor& t, const at::Tensor& host, const char* where) {
  const auto [first, end] = extentOf(t);
  copyAndWait(t.device().index(), static_cast<char*>(t.storage().mutable_data()) + first * t.itemsize(),
              host.storage().data(), (end - first) * t.itemsize(), runtime::CopyKind::HostToDevice, where);
}

void copyHostToOpaqueDevice(at::Tensor& dst, const at::Tensor& src) {
  const auto device = dst.device().index();
  if (isPlainCopy(dst, src)) {
    copyAndWait(device, dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src), runtime::CopyKind::HostToDevice,
                "copy to npu");
    return;
  }
  at::Tensor host = hostSpanOf(dst, "copy to npu");  // what dst's span holds between its elements stays
  host.copy_(src);
  writeHostSpan(dst, host, "copy to npu");
}

void copyOpaqueDeviceToHost(at::Tensor& dst, const at::Tensor& src) {
  if (isPlainCopy(dst, src)) {
    copyAndWait(src.device().index(), dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src),
                runtime::CopyKind::DeviceToHost, "copy from npu to cpu");
    return;
  }
  dst.copy_(hostSpanOf(src, "copy from npu to cpu"));
}

void copyOnOpaqueDevice(at::Tensor& dst, const at::Tensor& src) {
  if (src.device() == dst.device() && isPlainCopy(dst, src)) {
    copyAndWait(dst.device().index(), dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src),
                runtime::CopyKind::DeviceToDevice, "copy on npu");
    return;
  }
  const at::Tensor from = hostSpanOf(src, "copy between npu tensors");
  at::Tensor host = hostSpanOf(dst, "copy between npu tensors");
  host.copy_(from);
  writeHostSpan(dst, host, "copy between npu tensors");
}

void copyHostToDevice(at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  const auto device = dst.device().index();
  c10::DeviceGuard guard(dst.device());
  auto& stream = currentRuntimeStream(device);
  if (non_blocking && isPinned(src.const_data_ptr()) && isPlainCopy(dst, src)) {
    // Captured, a replay copies from the same pinned memory (the caller keeps it, as on CUDA);
    // queued, the pinned block is kept alive until the copy ran.
    if (launchCopy(device, dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src),
                   runtime::CopyKind::HostToDevice, src.storage())) {
      recordPinnedUse(src.const_data_ptr(), stream);
    }
    return;
  }
  if (!hostAddressable(device)) {
    copyHostToOpaqueDevice(dst, src);
    return;
  }
  // Pageable memory may be freed as soon as we return: copy now, in stream
  // order (after the stream's earlier work on dst, before later kernels).
  StreamHold hold(device, "copy to npu");
  if (isPlainCopy(dst, src)) {
    // The holder's copy runs at once, on this thread: the HAL's memcpy (traced by it).
    stream.copy(dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src), runtime::CopyKind::HostToDevice);
    return;
  }
  runtime::tracing::Scope traced(runtime::tracing::ActivityKind::Memcpy, "Memcpy HtoD", device,
                                 currentStream(device).id(), bytesOf(dst), runtime::CopyKind::HostToDevice,
                                 /*host_synchronous=*/true);
  cpuAlias(dst).copy_(src);
}

void copyDeviceToHost(at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  const auto device = src.device().index();
  if (!(non_blocking && isPinned(dst.const_data_ptr()))) checkSync("a copy from npu to cpu");
  c10::DeviceGuard guard(src.device());
  if (non_blocking && isPinned(dst.const_data_ptr()) && isPlainCopy(dst, src)) {
    if (launchCopy(device, dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src),
                   runtime::CopyKind::DeviceToHost, dst.storage())) {
      recordPinnedUse(dst.const_data_ptr(), currentRuntimeStream(device));
    }
    return;
  }
  if (!hostAddressable(device)) {
    copyOpaqueDeviceToHost(dst, src);
    return;
  }
  StreamHold hold(device, "copy from npu to cpu");
  if (isPlainCopy(dst, src)) {
    // The holder's copy runs at once, on this thread: the HAL's memcpy (traced by it).
    currentRuntimeStream(device).copy(dst.mutable_data_ptr(), src.const_data_ptr(), bytesOf(src),
                                      runtime::CopyKind::DeviceToHost);
    return;
  }
  runtime::tracing::Scope traced(runtime::tracing::ActivityKind::Memcpy, "Memcpy DtoH", device,
                                 currentStream(device).id(), bytesOf(src), runtime::CopyKind::DeviceToHost,
                                 /*host_synchronous=*/true);
  dst.copy_(cpuAlias(src));
}

void copyOnDevice(at::Tensor& dst, const at::Tensor& src) {
  const auto device = dst.device().index();
  if (!hostKernelsAllowed(device) || !hostKernelsAllowed(src.device().index())) {
    if (src.device() != dst.device()) waitForDevice(src.device().index(), "copy between npu devices");
    copyOnOpaqueDevice(dst, src);
    return;
  }
  if (src.device() != dst.device()) {
    // The source device's queued work must be done before the destination's
    // stream reads its memory.
    waitForDevice(src.device().index(), "copy between npu devices");
  }
  c10::DeviceGuard guard(dst.device());
  auto dst_alias = cpuAlias(dst);
  auto src_alias = cpuAlias(src);
  launch(device, "aten::copy_", [dst_alias, src_alias]() mutable { dst_alias.copy_(src_alias); },
         bytesOf(dst) + bytesOf(src));
  if (src.device() != dst.device()) {
    // The source's device must not reuse its memory before the copy read it:
    // its current stream waits for the copy (as CUDA's peer copies do).
    auto copied = runtimeDevice(device).createEvent(false);
    copied->record(currentRuntimeStream(device));
    currentRuntimeStream(src.device().index()).wait(*copied);
  }
}

}  // namespace

at::Tensor& copyTensor(at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  TORCH_CHECK(dst.defined() && src.defined(), "copy_: both tensors must be defined");
  if (dst.numel() == 0 || dst.is_same(src)) return dst;
  const bool dst_npu = dst.device().type() == kNPU;
  const bool src_npu = src.device().type() == kNPU;
  TORCH_CHECK(dst_npu || dst.device().is_cpu(), "copy_: cannot copy from ", src.device(), " to ", dst.device(),
              "; copy through the cpu (tensor.cpu().to(device))");
  TORCH_CHECK(src_npu || src.device().is_cpu(), "copy_: cannot copy from ", src.device(), " to ", dst.device(),
              "; copy through the cpu (tensor.cpu().to(device))");
  if (dst_npu && src_npu) {
    copyOnDevice(dst, src);
  } else if (dst_npu) {
    copyHostToDevice(dst, src, non_blocking);
  } else {
    copyDeviceToHost(dst, src, non_blocking);
  }
  if (dst_npu && dst.scalar_type() == c10::kHalf && src.scalar_type() != c10::kHalf && !profile::active().inf_nan) {
    // A conversion into float16 on a chip without inf/nan saturates, as its cast kernel does.
    launch(dst.device().index(), "saturate float16", [alias = cpuAlias(dst)] { profile::saturateHalf(alias); },
           bytesOf(dst));
  }
  return dst;
}

}  // namespace npu

// The tensor basics of the npu: creation, views, resizing, copies, fill and
// reading a scalar back. Everything else is in the op library (ops/).
#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "../core/allocator.h"
#include "../core/copy.h"
#include "../core/device.h"
#include "../core/launch.h"
#include "../core/stream.h"
#include "host/chip.h"

namespace npu::ops {
namespace {

const c10::DispatchKeySet kNPUKeys(c10::DispatchKey::PrivateUse1);

c10::Device targetDevice(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(kNPU, -1));
  TORCH_CHECK(d.type() == kNPU, "npu empty(): expected an npu device, got ", d);
  return c10::Device(kNPU, resolveDevice(d.index()));
}

void checkLayout(std::optional<c10::Layout> layout, const char* op) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, op, ": the npu supports only torch.strided ",
              "tensors, got layout ", *layout, "; create the tensor on the cpu or convert with to_dense()");
}

at::Tensor empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                 std::optional<c10::Device> device, std::optional<bool> /*pin_memory*/,
                 std::optional<c10::MemoryFormat> memory_format) {
  checkLayout(layout, "aten::empty");
  checkChipDtype(c10::dtype_or_default(dtype), "aten::empty");
  const auto d = targetDevice(device);
  c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, npuAllocator(), kNPUKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                        std::optional<bool> /*pin_memory*/) {
  checkLayout(layout, "aten::empty_strided");
  checkChipDtype(c10::dtype_or_default(dtype), "aten::empty_strided");
  const auto d = targetDevice(device);
  c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, npuAllocator(), kNPUKeys, c10::dtype_or_default(dtype));
}

at::Tensor asStrided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                     std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshapeAlias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Makes sure the storage holds the tensor's current geometry.
void ensureStorageFits(const at::Tensor& self) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.numel() == 0) return;
  const std::size_t needed =
      at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.itemsize(), impl->storage_offset());
  auto* storage = impl->unsafe_storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resizeStorageBytes(storage, needed);
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  for (auto s : size) {
    TORCH_CHECK(s >= 0, "aten::resize_ on npu: sizes must be non-negative, got ", size);
  }
  // Same sizes, no format asked: nothing changes (a non-contiguous tensor stays so), as on the cpu.
  if (self.sizes() == size && !memory_format.has_value()) return self;
  auto* impl = self.unsafeGetTensorImpl();
  TORCH_CHECK(impl->unsafe_storage().resizable() || self.sizes() == size,
              "aten::resize_ on npu: the tensor's storage is not resizable");
  impl->set_sizes_contiguous(size);
  const auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (format != c10::MemoryFormat::Contiguous) impl->empty_tensor_restride(format);
  ensureStorageFits(self);
  return self;
}

at::Tensor& setStorage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                       c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kNPU, "aten::set_ on an npu tensor needs an npu storage, got a ",
              source.device(), " storage; move it with .npu() first");
  // As ATen's checkSetStorage for cpu and cuda tensors: set_ never moves a tensor.
  TORCH_CHECK(source.device() == self.device(), "Attempted to set the storage of a tensor on device \"",
              self.device(), "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  TORCH_CHECK(storage_offset >= 0, "aten::set_: storage offset must be non-negative, got ", storage_offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    TORCH_CHECK(size.size() == stride.size(), "aten::set_: got ", size.size(), " sizes and ", stride.size(),
                " strides");
    impl->set_sizes_and_strides(size, stride);
  }
  ensureStorageFits(self);
  return self;
}

at::Tensor& setStorageWithOffset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                 c10::IntArrayRef size, c10::IntArrayRef stride) {
  return setStorage(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& setWholeStorage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return setStorage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& setFromTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return setStorage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& setEmpty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage empty_storage(c10::Storage::use_byte_size_t(), 0, npuAllocator(), /*resizable=*/true);
  return setStorage(self, std::move(empty_storage), 0, {0}, {});
}

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copyTensor(out, self, non_blocking);
  return out;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor out = dst;
  if (out.sizes() != self.sizes()) out.resize_(self.sizes());
  copyTensor(out, self, false);
  return out;
}

at::Tensor& copy(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  return copyTensor(self, src, non_blocking);
}

at::Tensor& fillScalar(at::Tensor& self, const c10::Scalar& value) {
  if (self.numel() == 0) return self;
  if (!hostKernelsAllowed(self.device().index())) {
    // No kernel reaches this device's memory: the host fills, the HAL's copy carries it.
    const at::Tensor host = at::empty({}, self.options().device(c10::kCPU)).fill_(value);
    copyTensor(self, host.expand(self.sizes()), false);
    return self;
  }
  auto alias = cpuAlias(self);
  launch(self.device().index(), "aten::fill_", [alias, value]() mutable { alias.fill_(value); }, bytesOf(self));
  return self;
}

at::Tensor& fillTensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "aten::fill_ only supports a 0-dimension value tensor, but it has ",
              value.dim(), " dimensions");
  if (value.device().type() == kNPU && hostKernelsAllowed(self.device().index())) {
    TORCH_CHECK(value.device() == self.device(), "aten::fill_: the value is on ", value.device(),
                " but the tensor is on ", self.device());
    auto alias = cpuAlias(self);
    auto value_alias = cpuAlias(value);
    launch(self.device().index(), "aten::fill_", [alias, value_alias]() mutable { alias.fill_(value_alias); },
           bytesOf(self));
    return self;
  }
  return fillScalar(self, value.item());
}

at::Tensor& zero(at::Tensor& self) { return fillScalar(self, 0); }

c10::Scalar localScalarDense(const at::Tensor& self) {
  checkSync("Tensor.item()");
  // Memory the host cannot address comes over by a stream copy.
  if (!hostAddressable(self.device().index())) {
    SyncChecked checked;
    return self.cpu().item();
  }
  StreamHold hold(self.device().index(), "Tensor.item()");
  // A read of device memory by the host, after the stream's work: a copy to the host for the profiler.
  runtime::tracing::Scope traced(runtime::tracing::ActivityKind::Memcpy, "Memcpy DtoH", self.device().index(),
                                 currentStream(self.device().index()).id(), self.itemsize(),
                                 runtime::CopyKind::DeviceToHost, /*host_synchronous=*/true);
  return cpuAlias(self).item();
}

at::Tensor clone(const at::Tensor& self, std::optional<c10::MemoryFormat> memory_format) {
  auto out = at::empty_like(self, self.options(), memory_format.value_or(c10::MemoryFormat::Preserve));
  copyTensor(out, self, false);
  return out;
}

// Tensor.record_stream(s): keep the memory from reuse until s's queued work ran.
void recordStream(at::Tensor& self, c10::Stream stream) {
  allocator::recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

// nn.Module._apply keeps each Parameter object (and so every tie between
// modules, lm_head.weight is wte.weight) when the moved tensor can be
// shallow-copied into it: dense cpu and dense npu tensors can, as dense cpu
// and cuda tensors can (c10's list of dense backends does not name PrivateUse1).
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_nested() && (t.is_cpu() || t.device().type() == kNPU);
  };
  return (dense(self) && dense(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(hasCompatibleShallowCopyType));
  m.impl("empty.memory_format", TORCH_FN(empty));
  m.impl("empty_strided", TORCH_FN(emptyStrided));
  m.impl("as_strided", TORCH_FN(asStrided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshapeAlias));
  m.impl("resize_", TORCH_FN(resize));
  m.impl("set_.source_Storage", TORCH_FN(setWholeStorage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(setStorageWithOffset));
  m.impl("set_.source_Tensor", TORCH_FN(setFromTensor));
  m.impl("set_", TORCH_FN(setEmpty));
  m.impl("_copy_from", TORCH_FN(copyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(copyFromAndResize));
  m.impl("copy_", TORCH_FN(copy));
  m.impl("fill_.Scalar", TORCH_FN(fillScalar));
  m.impl("fill_.Tensor", TORCH_FN(fillTensor));
  m.impl("zero_", TORCH_FN(zero));
  m.impl("_local_scalar_dense", TORCH_FN(localScalarDense));
  m.impl("clone", TORCH_FN(clone));
  m.impl("record_stream", TORCH_FN(recordStream));
}

}  // namespace npu::ops

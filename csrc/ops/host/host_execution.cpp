#include "host_execution.h"

#include <ATen/EmptyTensor.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseCsrTensorUtils.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/_empty_per_channel_affine_quantized_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include <chrono>

#include "../../core/allocator.h"
#include "../../core/copy.h"
#include "../../dispatch/arguments.h"
#include "../../dispatch/fallback.h"
#include "../../dispatch/op_names.h"
#include "../../dispatch/policy.h"
#include "../../core/device.h"
#include "../../core/launch.h"
#include "../../core/stream.h"

namespace npu::ops {

namespace {

thread_local c10::DeviceIndex t_redirect_device = -1;

// The process's CPU allocator, wrapped: inside a HostExecution it serves npu
// memory (a DataPtr that says cpu, for the CPU kernel), elsewhere it forwards.
class HostAllocatorRedirect final : public c10::Allocator {
 public:
  explicit HostAllocatorRedirect(c10::Allocator* host) : host_(host) {}

  c10::DataPtr allocate(std::size_t n) override {
    if (t_redirect_device < 0) return host_->allocate(n);
    c10::DataPtr ptr = npuAllocator()->allocate(n);
    ptr.unsafe_set_device(c10::Device(c10::kCPU));
    return ptr;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &rawDelete; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    default_copy_data(dst, src, count);
  }

  static HostAllocatorRedirect* instance;

 private:
  static void rawDelete(void* ptr) {
    if (allocator::deviceOf(ptr) >= 0) {
      npuAllocator()->raw_deleter()(ptr);
    } else if (auto deleter = instance->host_->raw_deleter()) {
      deleter(ptr);
    }
  }
  c10::Allocator* host_;
};

HostAllocatorRedirect* HostAllocatorRedirect::instance = nullptr;

bool isNpuMemory(const c10::DataPtr& ptr) { return ptr.get_deleter() == npuAllocator()->raw_deleter(); }

}  // namespace

void installHostAllocatorRedirect() {
  if (HostAllocatorRedirect::instance != nullptr) return;
  HostAllocatorRedirect::instance = new HostAllocatorRedirect(c10::GetCPUAllocator());
  c10::SetCPUAllocator(HostAllocatorRedirect::instance, /*priority=*/1);
  TORCH_CHECK(c10::GetCPUAllocator() == HostAllocatorRedirect::instance,
              "torch_npu could not install its CPU allocator wrapper (another library replaced the CPU allocator "
              "with a higher priority); npu kernels cannot allocate their outputs");
}

namespace {
const char* checkedHostKernel(c10::Device device, const char* kernel) {
  if (C10_UNLIKELY(device.is_privateuseone() && !hostKernelsAllowed(device.index()))) {
    refuseHostKernel(device.index(), kernel);
  }
  return kernel;
}
}  // namespace

HostExecution::HostExecution(c10::Device device, const char* kernel)
    : named_(checkedHostKernel(device, kernel)),
      device_(device),
      guard_(device),
      hold_(device.index(), "an npu kernel that runs on the host thread"),
      previous_redirect_(t_redirect_device) {
  t_redirect_device = device.index();
  if (previous_redirect_ < 0 && runtime::tracing::enabled()) {
    traced_.emplace(runtime::tracing::ActivityKind::Kernel, kernel, device.index(),
                    currentStream(device.index()).id());
  }
}

HostExecution::~HostExecution() { t_redirect_device = previous_redirect_; }

namespace {
// A nested tensor of the same layout over `buffer` (its whole storage).
at::Tensor nestedOver(const at::Tensor& buffer, const at::Tensor& nested) {
  const auto* impl = at::native::get_nested_tensor_impl(nested);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}
at::Tensor storageAsTensor(const at::Tensor& nested) {
  return at::native::get_nested_tensor_impl(nested)->get_unsafe_storage_as_tensor();
}

// A quantized tensor (QTensorImpl, with `quantizer`) over the memory and geometry of `plain`.
at::Tensor quantizedOver(const at::Tensor& plain, c10::DispatchKey key, at::QuantizerPtr quantizer) {
  at::Tensor q = at::detail::make_tensor<at::QTensorImpl>(c10::Storage(plain.storage()), c10::DispatchKeySet(key),
                                                          plain.dtype(), std::move(quantizer));
  q.unsafeGetTensorImpl()->set_sizes_and_strides(plain.sizes(), plain.strides(), plain.storage_offset());
  return q;
}

// The quantizer of `q` with its per-channel scales and zero points passed through `move`
// (a per-tensor quantizer holds no tensors and serves every device).
template <class Move>
at::QuantizerPtr quantizerWith(const at::Tensor& q, Move move) {
  const at::QuantizerPtr quantizer = at::get_qtensorimpl(q)->quantizer();
  if (quantizer->qscheme() != c10::kPerChannelAffine && quantizer->qscheme() != c10::kPerChannelAffineFloatQParams) {
    return quantizer;
  }
  const auto* per_channel = static_cast<const at::PerChannelAffineQuantizer*>(quantizer.get());
  return at::make_per_channel_affine_quantizer(move(per_channel->scales()), move(per_channel->zero_points()),
                                               per_channel->axis(), quantizer->scalar_type());
}

at::SparseTensorImpl* sparseImpl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}
// `target` (a sparse COO tensor) takes the layout of `source` over the given
// indices and values.
void setSparse(const at::Tensor& target, const at::Tensor& source, const at::Tensor& indices,
               const at::Tensor& values) {
  auto* impl = sparseImpl(target);
  const auto* from = sparseImpl(source);
  impl->resize_and_clear_(from->sparse_dim(), from->dense_dim(), from->sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(from->coalesced());
}
at::Tensor newSparse(c10::DispatchKey key, const at::Tensor& like, const at::Tensor& indices,
                     const at::Tensor& values) {
  at::Tensor t = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(key), like.dtype());
  setSparse(t, like, indices, values);
  return t;
}
}  // namespace

at::Tensor HostExecution::alias(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNPU) return t;
  if (t.is_nested() || t.layout() == c10::kSparse) {
    // The cpu nested tensor over the same memory (its buffer aliased), or the
    // cpu sparse tensor over its aliased indices and values.
    at::Tensor alias = t.is_nested() ? nestedOver(this->alias(storageAsTensor(t)), t)
                                     : newSparse(c10::DispatchKey::SparseCPU, t, this->alias(sparseImpl(t)->indices()),
                                                 this->alias(sparseImpl(t)->values()));
    originals_.emplace(alias.unsafeGetTensorImpl(), Aliased{alias, t});
    return alias;
  }
  TORCH_CHECK(t.device() == device_, "Expected all tensors to be on the same device, but found at least two "
              "devices, ", device_, " and ", t.device(), "! Move them with .to('", device_, "') first.");
  // Resizable through the CPU allocator, which serves npu memory here (out= resizes).
  at::Tensor alias = cpuAlias(t, c10::GetCPUAllocator());
  if (t.is_quantized()) {
    // The QuantizedCPU tensor over the same memory; per-channel scales are aliased too.
    alias = quantizedOver(alias, c10::DispatchKey::QuantizedCPU,
                          quantizerWith(t, [this](const at::Tensor& q) { return this->alias(q); }));
  }
  const void* memory = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl()->data();
  originals_.emplace(alias.unsafeGetTensorImpl(), Aliased{alias, t});
  if (memory != nullptr) by_memory_.emplace(memory, t);
  return alias;
}

at::Tensor HostExecution::viewOf(const at::Tensor& npu_base, const at::Tensor& result) {
  // The base's keys: with autograd's, so the view is not taken for an inference tensor.
  auto view = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(npu_base.storage()),
                                                       npu_base.key_set(), result.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(result.sizes(), result.strides(), result.storage_offset());
  return view;
}

at::Tensor HostExecution::toNpu(const at::Tensor& result) {
  if (!result.defined() || result.device().type() == kNPU) return result;
  if (result.is_nested() || result.layout() == c10::kSparse) {
    if (auto it = originals_.find(result.unsafeGetTensorImpl()); it != originals_.end()) return it->second.original;
    if (result.is_nested()) return nestedOver(toNpu(storageAsTensor(result)), result);
    return newSparse(c10::DispatchKey::SparsePrivateUse1, result, toNpu(sparseImpl(result)->indices()),
                     toNpu(sparseImpl(result)->values()));
  }
  if (result.is_quantized()) {
    if (auto it = originals_.find(result.unsafeGetTensorImpl()); it != originals_.end()) return it->second.original;
    return quantizedOver(adoptOrView(result), c10::DispatchKey::QuantizedPrivateUse1,
                         quantizerWith(result, [this](const at::Tensor& q) { return toNpu(q); }));
  }
  at::Tensor out = adoptOrView(result);
  // A lazy conjugate or negation (e.g. fft's ret.conj()) stays lazy on the npu.
  out.unsafeGetTensorImpl()->_set_conj(result.is_conj());
  out.unsafeGetTensorImpl()->_set_neg(result.is_neg());
  return out;
}

at::Tensor HostExecution::adoptOrView(const at::Tensor& result) {
  if (auto it = originals_.find(result.unsafeGetTensorImpl()); it != originals_.end()) return it->second.original;
  auto* host_storage = result.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (auto it = by_memory_.find(host_storage->data()); it != by_memory_.end() && host_storage->data() != nullptr) {
    return viewOf(it->second, result);  // a view of an input
  }
  if (auto it = adopted_.find(host_storage); it != adopted_.end()) {
    at::Tensor base = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(it->second), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), result.dtype());
    base.unsafeGetTensorImpl()->set_sizes_and_strides(result.sizes(), result.strides(), result.storage_offset());
    return base;
  }
  if (isNpuMemory(host_storage->data_ptr()) || host_storage->nbytes() == 0) {
    // Written by the kernel into npu memory: hand the memory over, no copy.
    c10::DataPtr memory = host_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    memory.unsafe_set_device(device_);
    c10::Storage storage(c10::Storage::use_byte_size_t(), host_storage->nbytes(), std::move(memory),
                         npuAllocator(), /*resizable=*/true);
    // The host tensor keeps pointing at the memory (it may be returned twice).
    host_storage->set_data_ptr_noswap(c10::DataPtr(storage.mutable_data(), c10::Device(c10::kCPU)));
    adopted_.emplace(host_storage, storage);
    at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), result.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(result.sizes(), result.strides(), result.storage_offset());
    return out;
  }
  // Memory the kernel got elsewhere (a constant, another thread's allocation): copy.
  at::Tensor out = at::detail::empty_strided_generic(result.sizes(), result.strides(), npuAllocator(),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                     result.scalar_type());
  alias(out).copy_(result.resolve_conj().resolve_neg());
  return out;
}

void HostExecution::syncBack(const at::Tensor& npu_tensor) {
  if (!npu_tensor.defined() || npu_tensor.device().type() != kNPU) return;
  at::Tensor host;
  for (const auto& [impl, aliased] : originals_) {
    if (aliased.original.unsafeGetTensorImpl() == npu_tensor.unsafeGetTensorImpl() && !impl->is_nested()) {
      host = aliased.alias;
      break;
    }
  }
  if (!host.defined()) return;
  if (npu_tensor.layout() == c10::kSparse) {
    // The kernel may have given the sparse alias new indices and values (resize_as_, coalesce_).
    setSparse(npu_tensor, host, toNpu(sparseImpl(host)->indices()), toNpu(sparseImpl(host)->values()));
    return;
  }
  auto* npu_impl = npu_tensor.unsafeGetTensorImpl();
  auto* npu_storage = npu_impl->unsafe_storage().unsafeGetStorageImpl();
  auto* host_storage = host.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (host_storage->data() != npu_storage->data() || host_storage->nbytes() != npu_storage->nbytes()) {
    // The kernel resized the output: its new memory came from the npu pool.
    TORCH_INTERNAL_ASSERT(isNpuMemory(host_storage->data_ptr()) || host_storage->nbytes() == 0);
    c10::DataPtr memory = host_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    memory.unsafe_set_device(device_);
    npu_storage->set_data_ptr_noswap(std::move(memory));
    npu_storage->set_nbytes(host_storage->nbytes());
  }
  if (npu_tensor.sizes() != host.sizes() || npu_tensor.strides() != host.strides() ||
      npu_tensor.storage_offset() != host.storage_offset()) {
    npu_impl->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
  }
}

namespace {
// Nested and sparse tensors between devices (.cpu(), .npu(), .to("npu:1")):
// the buffer, or the indices and values, move; the layout stays. (Their
// other ops run through the host-view kernels above; those return npu
// tensors, which a copy to another device must not.)
at::Tensor nestedToCopy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> /*layout*/, std::optional<c10::Device> device,
                        std::optional<bool> /*pin_memory*/, bool non_blocking,
                        std::optional<c10::MemoryFormat> /*memory_format*/) {
  const at::Tensor buffer = storageAsTensor(self).to(device.value_or(self.device()),
                                                     dtype.value_or(self.scalar_type()), non_blocking, /*copy=*/true);
  return nestedOver(buffer, self);
}

at::Tensor sparseToCopy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                        std::optional<bool> /*pin_memory*/, bool non_blocking,
                        std::optional<c10::MemoryFormat> /*memory_format*/) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kSparse, "aten::_to_copy on npu: a sparse COO tensor cannot "
              "change its layout in a copy; call .to_dense() first");
  const c10::Device target = device.value_or(self.device());
  const auto* impl = sparseImpl(self);
  const at::Tensor indices = impl->indices().to(target, non_blocking, /*copy=*/true);
  const at::Tensor values =
      impl->values().to(target, dtype.value_or(self.scalar_type()), non_blocking, /*copy=*/true);
  return at::_sparse_coo_tensor_with_dims_and_tensors(impl->sparse_dim(), impl->dense_dim(), self.sizes(), indices,
                                                      values, values.options().layout(c10::kSparse),
                                                      impl->coalesced());
}
}  // namespace

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) { m.impl("_to_copy", TORCH_FN(nestedToCopy)); }
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) { m.impl("_to_copy", TORCH_FN(sparseToCopy)); }

}  // namespace npu::ops

// ---- sparse compressed tensors (CSR, CSC, BSR, BSC) --------------------------------
// They live on the npu as their component tensors (compressed and plain indices,
// values); every op on them goes through the CPU fallback (dispatch/fallback.h): the
// mode, the per-op policies and the statistics govern it as for any fallback. Their
// accessors and constructor are the CPU's own (they read or set the components).
namespace npu::ops {
namespace {

bool isCompressedLayout(c10::Layout layout) {
  return layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
         layout == c10::kSparseBsc;
}

// The same compressed tensor with its components on `device`.
at::Tensor compressedOn(const at::Tensor& t, c10::Device device) {
  auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
  const at::Tensor values = impl->values().to(device);
  return at::_sparse_compressed_tensor_unsafe(impl->compressed_indices().to(device), impl->plain_indices().to(device),
                                              values, t.sizes(), values.options().layout(t.layout()));
}

int64_t bytesOfCompressed(const at::Tensor& t) {
  auto* impl = at::sparse_csr::get_sparse_csr_impl(t);
  int64_t n = 0;
  for (const at::Tensor& part : {impl->compressed_indices(), impl->plain_indices(), impl->values()}) {
    n += static_cast<int64_t>(part.numel() * part.itemsize());
  }
  return n;
}

}  // namespace

void compressedFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  dispatch::checkFallbackAllowed(op, *stack, dispatch::FallbackReason::NoKernel);
  const auto start = std::chrono::steady_clock::now();
  c10::Device device(kNPU, currentDevice());
  int64_t to_cpu = 0, to_npu = 0;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;   // (npu tensor, its host copy) the op writes
  for (size_t i = begin; i < stack->size(); ++i) {
    const auto* alias = args[i - begin].alias_info();
    const bool writes = alias != nullptr && alias->isWrite();
    (*stack)[i] = dispatch::mapTensors((*stack)[i], [&](const at::Tensor& t, bool) {
      if (!t.defined() || t.device().type() != kNPU) return t;
      device = t.device();
      at::Tensor host;
      if (isCompressedLayout(t.layout())) {
        host = compressedOn(t, c10::Device(c10::kCPU));
        to_cpu += bytesOfCompressed(t);
      } else {
        host = t.cpu();
        to_cpu += static_cast<int64_t>(t.numel() * t.itemsize());
      }
      if (writes) written.emplace_back(t, host);
      return host;
    });
  }
  c10::DeviceGuard guard(device);
  op.callBoxed(stack);   // the cpu's kernels, from the host copies' keys
  // What the op wrote goes back into the npu tensors (a compressed one takes the
  // result's components); new results come to the npu.
  for (auto& [npu_tensor, host] : written) {
    if (isCompressedLayout(npu_tensor.layout())) {
      const at::Tensor moved = compressedOn(host, device);
      auto* impl = at::sparse_csr::get_sparse_csr_impl(moved);
      at::sparse_csr::get_sparse_csr_impl(npu_tensor)->set_member_tensors(
          impl->compressed_indices(), impl->plain_indices(), impl->values(), host.sizes());
      to_npu += bytesOfCompressed(moved);
    } else {
      if (npu_tensor.sizes() != host.sizes()) npu_tensor.resize_(host.sizes());
      npu_tensor.copy_(host);
      to_npu += static_cast<int64_t>(host.numel() * host.itemsize());
    }
  }
  for (size_t i = stack->size() - op.schema().returns().size(); i < stack->size(); ++i) {
    (*stack)[i] = dispatch::mapTensors((*stack)[i], [&](const at::Tensor& t, bool) {
      if (!t.defined() || t.device().type() == kNPU) return t;
      for (const auto& [npu_tensor, host] : written) {
        if (host.is_same(t)) return npu_tensor;
      }
      if (isCompressedLayout(t.layout())) {
        at::Tensor moved = compressedOn(t, device);
        to_npu += bytesOfCompressed(moved);
        return moved;
      }
      to_npu += static_cast<int64_t>(t.numel() * t.itemsize());
      return t.to(device);
    });
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  dispatch::FallbackPolicy::instance().record(dispatch::displayName(op), dispatch::FallbackReason::NoKernel, ns,
                                              to_cpu, to_npu);
}

}  // namespace npu::ops

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu::ops::compressedFallback>());
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse_compressed));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
}

// ---- quantized tensors (torch.quantize_per_tensor, per channel) -----------------------
// A quantized npu tensor is a QTensorImpl over npu memory, its per-channel scales
// and zero points npu tensors. Its kernels are the QuantizedCPU ones, run on host
// views in stream order (op_library.cpp); here are its constructors, accessors,
// views and the copy between devices (bytes, with the quantizer).
namespace npu::ops {
namespace {

// The integer tensor under a quantized one (same memory, same geometry), on its device.
at::Tensor integerView(const at::Tensor& q) {
  const c10::ScalarType type = c10::toUnderlying(q.scalar_type());
  TORCH_CHECK(c10::elementSize(q.scalar_type()) == c10::elementSize(type) &&
                  q.scalar_type() != c10::kQUInt4x2 && q.scalar_type() != c10::kQUInt2x4,
              "aten::copy_ on ", q.device(), ": packed sub-byte quantized tensors (", q.scalar_type(),
              ") cannot move between devices; use qint8, quint8 or qint32");
  const c10::DispatchKey key = q.device().type() == kNPU ? c10::DispatchKey::PrivateUse1 : c10::DispatchKey::CPU;
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(q.storage()), c10::DispatchKeySet(key),
                                                          c10::scalarTypeToTypeMeta(type));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return t;
}

at::Tensor& quantizedCopy(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  TORCH_CHECK(self.is_quantized(), "aten::copy_: copying a quantized tensor (on ", src.device(), ") into a ",
              "non-quantized one (on ", self.device(), ") is not allowed; call .dequantize() first for a float tensor");
  if (!src.is_quantized()) {
    // Quantizing with self's parameters, where self lives.
    if (self.device().type() != kNPU) return self.copy_(src.cpu());
    const at::Tensor source = src.to(self.device());
    HostExecution exec(self.device(), "aten::copy_");
    exec.alias(self).copy_(exec.alias(source));
    return self;
  }
  TORCH_CHECK(self.qscheme() == src.qscheme(), "aten::copy_ on ", self.device(), ": the quantized tensors have ",
              "different schemes (", toString(self.qscheme()), " and ", toString(src.qscheme()), "); quantize both alike");
  TORCH_CHECK(self.scalar_type() == src.scalar_type(), "aten::copy_ on ", self.device(), ": the quantized tensors ",
              "have different dtypes (", self.scalar_type(), " and ", src.scalar_type(), ")");
  const c10::Device target = self.device();
  at::set_quantizer_(self, quantizerWith(src, [&](const at::Tensor& t) { return t.to(target); }));
  at::Tensor dst = integerView(self);
  copyTensor(dst, integerView(src), non_blocking);
  return self;
}

at::Tensor emptyPerChannelQuantized(at::IntArrayRef size, const at::Tensor& scales, const at::Tensor& zero_points,
                                    int64_t axis, std::optional<c10::ScalarType> dtype,
                                    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                    std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  // The scales and zero points live with the tensor, as on CUDA.
  const c10::Device target = device.value_or(c10::Device(kNPU, currentDevice()));
  return at::native::empty_per_channel_affine_quantized(size, scales.to(target), zero_points.to(target), axis, dtype,
                                                        layout, target, pin_memory, memory_format);
}

}  // namespace
}  // namespace npu::ops

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_unknown_quantized));
  m.impl("_empty_affine_quantized", TORCH_FN(at::native::empty_affine_quantized));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(npu::ops::emptyPerChannelQuantized));
  m.impl("empty_quantized", TORCH_FN(at::native::empty_quantized));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
  m.impl("q_per_channel_scales", TORCH_FN(at::native::q_per_channel_scales));
  m.impl("q_per_channel_zero_points", TORCH_FN(at::native::q_per_channel_zero_points));
  m.impl("q_per_channel_axis", TORCH_FN(at::native::q_per_channel_axis));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_qtensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("copy_", TORCH_FN(npu::ops::quantizedCopy));
}

// Asynchronous fast paths for the hottest functional ops. PyTorch's structured
// ops export their meta step (at::meta::structured_<op>): run on the npu
// tensors themselves it yields broadcasting, type promotion and the output's
// shape and strides, and calls set_output_* where we allocate npu memory. The
// CPU out= kernel then runs on the stream, asynchronously, on aliases of that
// memory. Anything unusual (a dtype the npu lacks, an op policy, a cpu tensor
// that is not a scalar) goes to the op library's generic kernel instead.
#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_meta.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_meta.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/add_meta.h>
#include <ATen/ops/addcdiv_cpu_dispatch.h>
#include <ATen/ops/addcdiv_meta.h>
#include <ATen/ops/addcmul_cpu_dispatch.h>
#include <ATen/ops/addcmul_meta.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmm_meta.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/bmm_meta.h>
#include <ATen/ops/clamp_min_cpu_dispatch.h>
#include <ATen/ops/clamp_min_meta.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/div_meta.h>
#include <ATen/ops/eq_cpu_dispatch.h>
#include <ATen/ops/eq_meta.h>
#include <ATen/ops/exp_cpu_dispatch.h>
#include <ATen/ops/exp_meta.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/gelu_meta.h>
#include <ATen/ops/gt_cpu_dispatch.h>
#include <ATen/ops/gt_meta.h>
#include <ATen/ops/log_cpu_dispatch.h>
#include <ATen/ops/log_meta.h>
#include <ATen/ops/lt_cpu_dispatch.h>
#include <ATen/ops/lt_meta.h>
#include <ATen/ops/maximum_cpu_dispatch.h>
#include <ATen/ops/maximum_meta.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/mean_meta.h>
#include <ATen/ops/minimum_cpu_dispatch.h>
#include <ATen/ops/minimum_meta.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/mm_meta.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/mul_meta.h>
#include <ATen/ops/ne_cpu_dispatch.h>
#include <ATen/ops/ne_meta.h>
#include <ATen/ops/neg_cpu_dispatch.h>
#include <ATen/ops/neg_meta.h>
#include <ATen/ops/pow_cpu_dispatch.h>
#include <ATen/ops/pow_meta.h>
#include <ATen/ops/rsqrt_cpu_dispatch.h>
#include <ATen/ops/rsqrt_meta.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/sigmoid_meta.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/silu_meta.h>
#include <ATen/ops/sqrt_cpu_dispatch.h>
#include <ATen/ops/sqrt_meta.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <ATen/ops/sub_meta.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <ATen/ops/sum_meta.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/tanh_meta.h>
#include <ATen/ops/threshold_cpu_dispatch.h>
#include <ATen/ops/threshold_meta.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "../core/allocator.h"
#include "../core/device.h"
#include "../core/launch.h"
#include "../core/profile.h"
#include "../dispatch/fallback.h"
#include "../runtime/tracing.h"
#include "chip.h"
#include "native_kernel.h"

namespace npu::ops {
namespace {

const c10::DispatchKeySet kNPUKeys(c10::DispatchKey::PrivateUse1);

// How an argument is kept by a queued kernel: owning, and never a tensor
// Python has seen (core/launch.h).
template <class T>
struct Capture {
  using type = std::decay_t<T>;
  static type make(const type& v, std::size_t& /*bytes*/) { return v; }
  static const type& use(const type& v) { return v; }
};
template <>
struct Capture<const at::Tensor&> {
  using type = at::Tensor;
  static type make(const at::Tensor& t, std::size_t& bytes) {
    if (t.device().type() != kNPU) return t.clone();  // a cpu scalar
    bytes += bytesOf(t);
    return cpuAlias(t);
  }
  static const at::Tensor& use(const at::Tensor& t) { return t; }
};
template <>
struct Capture<at::OptionalIntArrayRef> {
  using type = std::optional<std::vector<int64_t>>;
  static type make(at::OptionalIntArrayRef v, std::size_t& /*bytes*/) {
    return v.has_value() ? type(v->vec()) : std::nullopt;
  }
  static at::OptionalIntArrayRef use(const type& v) {
    return v.has_value() ? at::OptionalIntArrayRef(*v) : at::OptionalIntArrayRef();
  }
};
template <>
struct Capture<c10::string_view> {
  using type = std::string;
  static type make(c10::string_view v, std::size_t& /*bytes*/) { return std::string(v); }
  static c10::string_view use(const type& v) { return v; }
};

// Whether the fast path may take these arguments, and on which device.
struct FastPathCheck {
  const NativeKernel& kernel;
  std::optional<c10::Device> device;
  bool ok = true;

  void operator()(const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == kNPU) {
      if (!kernel.accepts(t.scalar_type()) || (device && *device != t.device())) ok = false;
      device = t.device();
    } else if (!(t.device().is_cpu() && t.dim() == 0)) {
      ok = false;
    } else if (!kernel.accepts(t.scalar_type()) && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
      ok = false;  // a float64 or complex 0-dim cpu tensor: the generic kernel decides
    }
  }
  void operator()(const at::Scalar& s) {
    if (s.isComplex()) ok = false;
  }
  void operator()(const std::optional<at::ScalarType>& dtype) {
    if (dtype && !kernel.accepts(*dtype)) ok = false;
  }
  template <class T>
  void operator()(const T& /*other*/) {}
};

// The meta step with npu outputs.
template <class Meta>
struct NpuOutputs final : public Meta {
  std::array<at::Tensor, 1> outputs;

  const at::Tensor& maybe_get_output(int64_t index) override { return outputs[index]; }
  void set_output_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    allocate(index, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    allocate(index, sizes, strides, options);
  }

 private:
  void allocate(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
    const auto dtype = c10::typeMetaToScalarType(options.dtype());
    // An empty strides argument means contiguous.
    outputs[index] = strides.empty()
                         ? at::detail::empty_generic(sizes, npuAllocator(), kNPUKeys, dtype, std::nullopt)
                         : at::detail::empty_strided_generic(sizes, strides, npuAllocator(), kNPUKeys, dtype);
    if constexpr (std::is_base_of_v<at::TensorIteratorBase, Meta>) {
      Meta::set_output_raw_strided(index, sizes, strides, options);
    }
  }
};

template <class Op, class MetaFn = decltype(&Op::Meta::meta)>
struct StructuredKernel;

template <class Op, class M, class... Args>
struct StructuredKernel<Op, void (M::*)(Args...)> {
  static at::Tensor run(Args... args) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload);
    static NativeKernel generic(Op::dtypes());
    auto& policy = dispatch::FallbackPolicy::instance();
    auto run_generic = [&] {
      torch::jit::Stack stack;
      torch::jit::push(stack, args...);
      generic(op, kNPUKeys, &stack);
      return std::move(stack.back()).toTensor();
    };
    // The device profile's chip (core/profile.h): an op it lacks, and chips
    // without bfloat16 or inf/nan, are the generic kernel's to handle.
    const auto& chip = profile::active();
    static const bool on_chip = profile::runsNatively(chip, op);
    FastPathCheck check{generic};
    (check(args), ...);
    if (!check.ok || !check.device || policy.retryOnKernelError() || !on_chip || !chip.bfloat16 || !chip.inf_nan ||
        (policy.hasOpPolicies() && policy.opPolicy(Op::name) != dispatch::OpPolicy::Default)) {
      return run_generic();
    }
    c10::DeviceGuard guard(*check.device);
    NpuOutputs<typename Op::Meta> meta;
    meta.meta(args...);
    at::Tensor out = meta.outputs[0];
    // Promotion to a dtype the npu lacks (a Python complex): the generic kernel refuses it.
    // 16-bit matrix products: the generic kernel computes them as the chip's matrix unit does (ops/chip.h).
    const bool low_precision = out.scalar_type() == c10::kHalf || out.scalar_type() == c10::kBFloat16;
    if (!generic.accepts(out.scalar_type()) || (low_precision && isCubeOp(op))) return run_generic();
    std::optional<runtime::tracing::Projection> projection;  // for the profiler: this kernel's time on the chip
    if (C10_UNLIKELY(runtime::tracing::enabled())) {
      torch::jit::Stack stack;
      torch::jit::push(stack, args...);
      projection.emplace(profile::projectedKernelNs(op, stack));
    }
    std::size_t bytes = bytesOf(out);
    auto captured = std::make_tuple(Capture<Args>::make(args, bytes)...);
    launch(check.device->index(), Op::name,
           [out_alias = cpuAlias(out), captured = std::move(captured)]() mutable {
             std::apply([&](auto&... c) { Op::out(out_alias, Capture<Args>::use(c)...); }, captured);
           },
           bytes);
    return out;
  }
};

#define NPU_STRUCTURED(Tag, OpName, Overload, MetaClass, CpuOut, Dtypes) \
  struct Tag {                                                          \
    using Meta = at::meta::MetaClass;                                   \
    static constexpr const char* name = OpName;                         \
    static constexpr const char* overload = Overload;                   \
    static DtypeSet dtypes() { return Dtypes; }                         \
    template <class... A>                                               \
    static void out(at::Tensor& o, A&&... a) {                          \
      at::cpu::CpuOut(o, std::forward<A>(a)...);                         \
    }                                                                   \
  };

#define ALL (floatingTypes() | integralTypes())
#define FLOATING floatingTypes()
NPU_STRUCTURED(AddTensor, "aten::add", "Tensor", structured_add_Tensor, add_out, ALL)
NPU_STRUCTURED(SubTensor, "aten::sub", "Tensor", structured_sub_Tensor, sub_out, ALL)
NPU_STRUCTURED(MulTensor, "aten::mul", "Tensor", structured_mul_Tensor, mul_out, ALL)
NPU_STRUCTURED(DivTensor, "aten::div", "Tensor", structured_div_Tensor, div_out, ALL)
NPU_STRUCTURED(Maximum, "aten::maximum", "", structured_maximum, maximum_out, ALL)
NPU_STRUCTURED(Minimum, "aten::minimum", "", structured_minimum, minimum_out, ALL)
NPU_STRUCTURED(EqTensor, "aten::eq", "Tensor", structured_eq_Tensor, eq_out, ALL)
NPU_STRUCTURED(EqScalar, "aten::eq", "Scalar", structured_eq_Scalar, eq_out, ALL)
NPU_STRUCTURED(NeTensor, "aten::ne", "Tensor", structured_ne_Tensor, ne_out, ALL)
NPU_STRUCTURED(NeScalar, "aten::ne", "Scalar", structured_ne_Scalar, ne_out, ALL)
NPU_STRUCTURED(LtTensor, "aten::lt", "Tensor", structured_lt_Tensor, lt_out, ALL)
NPU_STRUCTURED(LtScalar, "aten::lt", "Scalar", structured_lt_Scalar, lt_out, ALL)
NPU_STRUCTURED(GtTensor, "aten::gt", "Tensor", structured_gt_Tensor, gt_out, ALL)
NPU_STRUCTURED(GtScalar, "aten::gt", "Scalar", structured_gt_Scalar, gt_out, ALL)
NPU_STRUCTURED(PowTensorScalar, "aten::pow", "Tensor_Scalar", structured_pow_Tensor_Scalar, pow_out, ALL)
NPU_STRUCTURED(PowTensorTensor, "aten::pow", "Tensor_Tensor", structured_pow_Tensor_Tensor, pow_out, ALL)
NPU_STRUCTURED(Neg, "aten::neg", "", structured_neg, neg_out, ALL)
NPU_STRUCTURED(ClampMin, "aten::clamp_min", "", structured_clamp_min, clamp_min_out, ALL)
NPU_STRUCTURED(Threshold, "aten::threshold", "", structured_threshold, threshold_out, ALL)
NPU_STRUCTURED(Exp, "aten::exp", "", structured_exp, exp_out, FLOATING)
NPU_STRUCTURED(Log, "aten::log", "", structured_log, log_out, FLOATING)
NPU_STRUCTURED(Sqrt, "aten::sqrt", "", structured_sqrt, sqrt_out, FLOATING)
NPU_STRUCTURED(Rsqrt, "aten::rsqrt", "", structured_rsqrt, rsqrt_out, FLOATING)
NPU_STRUCTURED(Tanh, "aten::tanh", "", structured_tanh, tanh_out, FLOATING)
NPU_STRUCTURED(Sigmoid, "aten::sigmoid", "", structured_sigmoid, sigmoid_out, FLOATING)
NPU_STRUCTURED(Gelu, "aten::gelu", "", structured_gelu, gelu_out, FLOATING)
NPU_STRUCTURED(Silu, "aten::silu", "", structured_silu, silu_out, FLOATING)
NPU_STRUCTURED(Addcmul, "aten::addcmul", "", structured_addcmul, addcmul_out, FLOATING)
NPU_STRUCTURED(Addcdiv, "aten::addcdiv", "", structured_addcdiv, addcdiv_out, FLOATING)
NPU_STRUCTURED(SumDim, "aten::sum", "dim_IntList", structured_sum_dim_IntList, sum_out, ALL)
NPU_STRUCTURED(MeanDim, "aten::mean", "dim", structured_mean_dim, mean_out, FLOATING)
NPU_STRUCTURED(Mm, "aten::mm", "", structured_mm, mm_out, FLOATING)
NPU_STRUCTURED(Bmm, "aten::bmm", "", structured_bmm, bmm_out, FLOATING)
NPU_STRUCTURED(Addmm, "aten::addmm", "", structured_addmm, addmm_out, FLOATING)
NPU_STRUCTURED(Softmax, "aten::_softmax", "", structured__softmax, _softmax_out, FLOATING)
NPU_STRUCTURED(LogSoftmax, "aten::_log_softmax", "", structured__log_softmax, _log_softmax_out, FLOATING)
#undef ALL
#undef FLOATING

template <class Op>
void registerStructured(torch::Library& m) {
  const std::string name = std::string(Op::name).substr(6) + (*Op::overload ? std::string(".") + Op::overload : "");
  m.impl(name.c_str(), TORCH_FN(StructuredKernel<Op>::run));
  profile::governByChipList(c10::OperatorName(Op::name, Op::overload));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  registerStructured<AddTensor>(m);
  registerStructured<SubTensor>(m);
  registerStructured<MulTensor>(m);
  registerStructured<DivTensor>(m);
  registerStructured<Maximum>(m);
  registerStructured<Minimum>(m);
  registerStructured<EqTensor>(m);
  registerStructured<EqScalar>(m);
  registerStructured<NeTensor>(m);
  registerStructured<NeScalar>(m);
  registerStructured<LtTensor>(m);
  registerStructured<LtScalar>(m);
  registerStructured<GtTensor>(m);
  registerStructured<GtScalar>(m);
  registerStructured<PowTensorScalar>(m);
  registerStructured<PowTensorTensor>(m);
  registerStructured<Neg>(m);
  registerStructured<ClampMin>(m);
  registerStructured<Threshold>(m);
  registerStructured<Exp>(m);
  registerStructured<Log>(m);
  registerStructured<Sqrt>(m);
  registerStructured<Rsqrt>(m);
  registerStructured<Tanh>(m);
  registerStructured<Sigmoid>(m);
  registerStructured<Gelu>(m);
  registerStructured<Silu>(m);
  registerStructured<Addcmul>(m);
  registerStructured<Addcdiv>(m);
  registerStructured<SumDim>(m);
  registerStructured<MeanDim>(m);
  registerStructured<Mm>(m);
  registerStructured<Bmm>(m);
  registerStructured<Addmm>(m);
  registerStructured<Softmax>(m);
  registerStructured<LogSoftmax>(m);
}

}  // namespace npu::ops

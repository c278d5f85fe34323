// Asynchronous fast paths for the hottest functional ops. PyTorch's structured
// CPU kernels are classes (at::native::structured_<op>_out...) whose meta step
// (broadcasting, type promotion, the output's shape and strides) and impl step
// (the computation) are separate calls. Here the meta step runs once, at the
// call, on CPU aliases of the npu arguments, and its set_output_* allocates the
// output in npu memory; the impl step then runs on that same state: at once on
// this thread when the stream is idle, else queued on the stream. That is the
// cpu's own functional path plus an alias per tensor, with no second meta step.
// Anything unusual (a dtype the npu lacks, an op policy, a cpu tensor that is
// not a scalar) goes to the op library's generic kernel instead, and so does
// every call while a graph captures: ATen's impl step may change the class's
// TensorIterator (a CPU scalar operand is folded into the loop), so a replay
// must build its own each time, as the generic kernel's recorded call does.
#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <ATen/ops/_log_softmax_native.h>
#include <ATen/ops/_softmax_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/addcdiv_native.h>
#include <ATen/ops/addcmul_native.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/bmm_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/eq_native.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/gelu_native.h>
#include <ATen/ops/gt_native.h>
#include <ATen/ops/log_native.h>
#include <ATen/ops/lt_native.h>
#include <ATen/ops/maximum_native.h>
#include <ATen/ops/mean_native.h>
#include <ATen/ops/minimum_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/ne_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sum_native.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/threshold_native.h>

#include <cstring>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../../core/allocator.h"
#include "../../core/device.h"
#include "../../core/graph.h"
#include "../../core/launch.h"
#include "../../core/profile.h"
#include "../../dispatch/fallback.h"
#include "../../runtime/tracing.h"
#include "chip.h"
#include "native_kernel.h"

namespace npu::ops {
namespace {

const c10::DispatchKeySet kNPUKeys(c10::DispatchKey::PrivateUse1);

// The CPU aliases of one call: tensors over one npu storage get aliases over
// one CPU storage, so ATen's overlap checks (a.add_(a[0])) see what the cpu sees.
struct Aliases {
  std::size_t bytes = 0;  // the launch's size hint
  // The first alias of each npu storage: later operands of that storage share its CPU storage.
  c10::SmallVector<std::pair<const c10::StorageImpl*, at::Tensor>, 4> storages;

  // Reused alias objects (cpuAliasPooled): these are a kernel's operands only.
  at::Tensor of(const at::Tensor& t) {
    bytes += bytesOf(t);
    const auto* npu_storage = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    for (const auto& [npu, first] : storages) {
      if (npu == npu_storage) return cpuAliasPooled(t, &first);
    }
    at::Tensor alias = cpuAliasPooled(t, nullptr);
    storages.emplace_back(npu_storage, alias);
    return alias;
  }
};

// How an argument is kept by a queued kernel: owning, and never a tensor
// Python has seen (core/launch.h).
template <class T>
struct Capture {
  using type = std::decay_t<T>;
  static type make(const type& v, Aliases& /*aliases*/) { return v; }
  static const type& use(const type& v) { return v; }
};
template <>
struct Capture<const at::Tensor&> {
  using type = at::Tensor;
  static type make(const at::Tensor& t, Aliases& aliases) {
    if (!t.defined()) return t;
    if (t.device().type() != kNPU) return copyOfScalar(t);
    return aliases.of(t);
  }
  // A 0-dim cpu tensor (a wrapped Python number, mostly): the kernel may run
  // later, so it gets its own copy of the value, made without the dispatcher.
  static at::Tensor copyOfScalar(const at::Tensor& t) {
    if (!t.defined() || t.is_conj() || t.is_neg() || t.dim() != 0) return t.defined() ? t.clone() : t;
    at::Tensor copy = at::detail::empty_cpu({}, t.scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                            std::nullopt);
    std::memcpy(copy.mutable_data_ptr(), t.const_data_ptr(), t.itemsize());
    copy.unsafeGetTensorImpl()->set_wrapped_number(t.unsafeGetTensorImpl()->is_wrapped_number());
    return copy;
  }
  static const at::Tensor& use(const at::Tensor& t) { return t; }
};
template <>
struct Capture<at::OptionalIntArrayRef> {
  using type = std::optional<std::vector<int64_t>>;
  static type make(at::OptionalIntArrayRef v, Aliases& /*aliases*/) {
    return v.has_value() ? type(v->vec()) : std::nullopt;
  }
  static at::OptionalIntArrayRef use(const type& v) {
    return v.has_value() ? at::OptionalIntArrayRef(*v) : at::OptionalIntArrayRef();
  }
};
template <>
struct Capture<c10::string_view> {
  using type = std::string;
  static type make(c10::string_view v, Aliases& /*aliases*/) { return std::string(v); }
  static c10::string_view use(const type& v) { return v; }
};

// Whether the fast path may take these arguments, and on which device.
// The meta step runs at the call, on CPU aliases: ATen's TensorIterator on the
// cpu converts an input whose dtype is not the computation's right there, which
// would read device memory out of stream order. So every npu operand must have
// one floating dtype, which must also be the promoted result's (noConversion);
// other mixes take the generic kernel.
struct FastPathCheck {
  const NativeKernel& kernel;
  std::optional<c10::Device> device;
  std::optional<c10::ScalarType> npu_dtype;
  at::native::ResultTypeState promotion{};
  bool ok = true;

  // All npu operands share one floating dtype, the result's: no conversion at the call.
  bool noConversion() const {
    return npu_dtype && c10::isFloatingType(*npu_dtype) && at::native::result_type(promotion) == *npu_dtype;
  }

  void operator()(const at::Tensor& t) {
    if (!t.defined()) return;
    promotion = at::native::update_result_type_state(t, promotion);
    if (t.device().type() == kNPU) {
      if (!kernel.accepts(t.scalar_type()) || (device && *device != t.device())) ok = false;
      if (npu_dtype && *npu_dtype != t.scalar_type()) ok = false;
      device = t.device();
      npu_dtype = t.scalar_type();
    } else if (!(t.device().is_cpu() && t.dim() == 0)) {
      ok = false;
    } else if (!kernel.accepts(t.scalar_type()) && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
      ok = false;  // a float64 or complex 0-dim cpu tensor: the generic kernel decides
    }
  }
  void operator()(const at::Scalar& s) {
    if (s.isComplex()) ok = false;
    promotion = at::native::update_result_type_state(s, promotion);
  }
  void operator()(const std::optional<at::ScalarType>& dtype) {
    if (dtype && !kernel.accepts(*dtype)) ok = false;
  }
  template <class T>
  void operator()(const T& /*other*/) {}
};

// The output is allocated on the arguments' device: a guard only when that is
// not the current device already (a guard's exchange costs two device calls).
class OnDevice {
 public:
  explicit OnDevice(c10::Device device) {
    if (device.index() != currentDevice()) guard_.emplace(device);
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

// A structured kernel's output, in npu memory: empty strides mean the options'
// memory format (contiguous unless the meta step says otherwise).
at::Tensor npuOutput(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  return strides.empty()
             ? at::detail::empty_generic(sizes, npuAllocator(), kNPUKeys, dtype, options.memory_format_opt())
             : at::detail::empty_strided_generic(sizes, strides, npuAllocator(), kNPUKeys, dtype);
}

template <class Op, class MetaFn = decltype(&Op::Impl::meta)>
struct StructuredKernel;

template <class Op, class M, class... Args>
struct StructuredKernel<Op, void (M::*)(Args...)> {
  using Impl = typename Op::Impl;

  // One call of the op: the CPU kernel's structured class over CPU aliases of
  // the arguments (owned here, so a queued impl step finds them), with its
  // output in npu memory. Lives on the heap: TensorIterator borrows `args`.
  struct Call final : public Impl {
    std::tuple<typename Capture<Args>::type...> args;
    at::Tensor out;        // the npu result, until run() takes it
    at::Tensor out_alias;  // its CPU alias, which the CPU kernel writes
    bool in_place = false; // the output is the first argument (self's alias, the same tensor)

    template <class Tuple>
    explicit Call(Tuple&& captured) : args(std::forward<Tuple>(captured)) {}

    void runMeta() { runMeta(std::index_sequence_for<Args...>()); }
    void runImpl() { runImpl(std::index_sequence_for<Args...>()); }

    const at::Tensor& maybe_get_output(int64_t /*index*/) override { return out_alias; }
    void set_output_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                            c10::TensorOptions options) override {
      allocate(index, sizes, strides, options);
    }
    void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                                c10::TensorOptions options) override {
      allocate(index, sizes, strides, options);
    }

   private:
    template <std::size_t... I>
    void runMeta(std::index_sequence<I...>) {
      this->Impl::meta(Capture<Args>::use(std::get<I>(args))...);
    }
    template <std::size_t... I>
    void runImpl(std::index_sequence<I...>) {
      this->Impl::impl(Capture<Args>::use(std::get<I>(args))..., out_alias);
    }
    void allocate(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
      TORCH_INTERNAL_ASSERT(index == 0, Op::name, ": the npu fast path has one output");
      if (in_place) {
        // As the cpu's in-place wrapper checks (a TensorIterator passes a defined
        // output's own geometry, without strides).
        TORCH_CHECK(options.dtype() == out_alias.dtype(), "Bad in-place call: input tensor dtype ",
                    out_alias.dtype(), " and output tensor dtype ", options.dtype(), " should match");
        TORCH_CHECK(sizes == out_alias.sizes(), "Bad in-place call: input tensor size ", out_alias.sizes(),
                    " and output tensor size ", sizes, " should match");
        TORCH_INTERNAL_ASSERT(strides.empty() || strides == out_alias.strides(), Op::name,
                              ": an in-place output would need a proxy");
      } else {
        out = npuOutput(sizes, strides, options);
        out_alias = cpuAlias(out);
      }
      if constexpr (std::is_base_of_v<at::TensorIteratorBase, Impl>) {
        Impl::set_output_raw_strided(index, sizes, strides, options);  // borrows out_alias
      }
    }
  };

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
    const HostOpName named(Op::name);  // what a refusal by cpuAlias names
    FastPathCheck check{generic};
    (check(args), ...);
    if (!check.ok || !check.device || !check.noConversion() || policy.retryOnKernelError() || graph::anyCapture() || !on_chip ||
        !chip.bfloat16 || !chip.inf_nan ||
        (policy.hasOpPolicies() && policy.opPolicy(Op::name) != dispatch::OpPolicy::Default)) {
      return run_generic();
    }
    OnDevice guard(*check.device);
    Aliases aliases;
    auto call = std::make_shared<Call>(std::make_tuple(Capture<Args>::make(args, aliases)...));
    std::size_t bytes = aliases.bytes;
    call->runMeta();
    at::Tensor out = std::move(call->out);  // the caller's: a queued kernel never owns it (core/launch.h)
    // Promotion to a dtype the npu lacks (a Python complex): the generic kernel refuses it.
    // 16-bit matrix products: the generic kernel computes them as the chip's matrix unit does (ops/host/chip.h).
    const bool low_precision = out.scalar_type() == c10::kHalf || out.scalar_type() == c10::kBFloat16;
    if (!generic.accepts(out.scalar_type()) || (low_precision && isCubeOp(op))) return run_generic();
    bytes += bytesOf(out);
    std::optional<runtime::tracing::WorkHint> work;  // for the profiler: what the kernel does
    if (C10_UNLIKELY(profile::describingWork())) {
      torch::jit::Stack stack;
      torch::jit::push(stack, args...);
      work.emplace(profile::workOf(op, stack));
    }
    // An idle stream runs the impl step here and now, as the cpu would; else it
    // queues behind the stream's work. (A capture records it: launch().)
    const auto index = check.device->index();
    if (!runIfIdle(index, Op::name, [&call] { call->runImpl(); }, bytes)) {
      launch(index, Op::name, [call] { call->runImpl(); }, bytes);
    }
    return out;
  }
};

// The in-place form (add_, mul_, ...): the same structured class writing into
// self, as the cpu's in-place wrapper does. Idle stream: it runs now and every
// error raises here; queued: the meta step has checked shapes, dtypes and the
// cast into self at the call (docs/design/02-emulated-npu.md, launch policy).
template <class Op, const char* InPlaceName, class MetaFn = decltype(&Op::Impl::meta)>
struct InPlaceKernel;

template <class Op, const char* InPlaceName, class M, class... Rest>
struct InPlaceKernel<Op, InPlaceName, void (M::*)(const at::Tensor&, Rest...)> {
  using Call = typename StructuredKernel<Op>::Call;

  static at::Tensor& run(at::Tensor& self, Rest... rest) {
    static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(InPlaceName, Op::overload);
    static NativeKernel generic(Op::dtypes());
    auto& policy = dispatch::FallbackPolicy::instance();
    auto run_generic = [&]() -> at::Tensor& {
      torch::jit::Stack stack;
      torch::jit::push(stack, self, rest...);
      generic(op, kNPUKeys, &stack);
      return self;
    };
    const auto& chip = profile::active();
    static const bool on_chip = profile::runsNatively(chip, op);
    const HostOpName named(InPlaceName);
    FastPathCheck check{generic};
    check(self);
    (check(rest), ...);
    if (!check.ok || !self.defined() || self.device().type() != kNPU || !check.noConversion() ||
        policy.retryOnKernelError() || graph::anyCapture() || !on_chip ||
        !chip.bfloat16 || !chip.inf_nan ||
        (policy.hasOpPolicies() && policy.opPolicy(InPlaceName) != dispatch::OpPolicy::Default)) {
      return run_generic();
    }
    OnDevice guard(self.device());
    Aliases aliases;
    at::Tensor self_alias = Capture<const at::Tensor&>::make(self, aliases);
    auto call = std::make_shared<Call>(std::make_tuple(self_alias, Capture<Rest>::make(rest, aliases)...));
    const std::size_t bytes = aliases.bytes;
    call->in_place = true;
    call->out_alias = std::move(self_alias);  // the input's own alias: a full overlap, as on the cpu
    call->runMeta();
    std::optional<runtime::tracing::WorkHint> work;
    if (C10_UNLIKELY(profile::describingWork())) {
      torch::jit::Stack stack;
      torch::jit::push(stack, self, rest...);
      work.emplace(profile::workOf(op, stack));
    }
    const auto index = self.device().index();
    if (!runIfIdle(index, InPlaceName, [&call] { call->runImpl(); }, bytes)) {
      launch(index, InPlaceName, [call] { call->runImpl(); }, bytes);
    }
    return self;
  }
};

// cat: structured too, but its meta step returns what the impl step needs
// (the precompute), and it takes a list of tensors.
struct CatCall final : public at::native::structured_cat_out_cpu {
  std::vector<at::Tensor> inputs;  // CPU aliases
  at::Tensor out;                  // the npu result, until catKernel() takes it
  at::Tensor out_alias;
  meta_return_ty precompute;

  const at::Tensor& maybe_get_output(int64_t /*index*/) override { return out_alias; }
  void set_output_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                          c10::TensorOptions options) override {
    allocate(index, sizes, strides, options);
  }
  void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    allocate(index, sizes, strides, options);
  }
  void runImpl() {
    impl(at::ITensorListRef(inputs), precompute.dim, precompute.valid, precompute.all_contiguous,
         precompute.all_same_dtype, precompute.all_same_sizes_and_stride, precompute.memory_format, out_alias);
  }

 private:
  void allocate(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
    TORCH_INTERNAL_ASSERT(index == 0, "aten::cat: the npu fast path has one output");
    out = npuOutput(sizes, strides, options);
    out_alias = cpuAlias(out);
  }
};

at::Tensor catKernel(const at::ITensorListRef& tensors, int64_t dim) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::cat", "");
  static NativeKernel generic(floatingTypes() | integralTypes());
  auto& policy = dispatch::FallbackPolicy::instance();
  auto run_generic = [&] {
    torch::jit::Stack stack;
    torch::jit::push(stack, std::vector<at::Tensor>(tensors.begin(), tensors.end()), dim);
    generic(op, kNPUKeys, &stack);
    return std::move(stack.back()).toTensor();
  };
  const auto& chip = profile::active();
  static const bool on_chip = profile::runsNatively(chip, op);
  const HostOpName named("aten::cat");
  FastPathCheck check{generic};
  bool npu_only = true;
  for (const at::Tensor& t : tensors) {
    check(t);
    npu_only = npu_only && t.defined() && t.device().type() == kNPU;
  }
  if (!npu_only || !check.ok || !check.device || policy.retryOnKernelError() || graph::anyCapture() || !on_chip || !chip.bfloat16 ||
      !chip.inf_nan || (policy.hasOpPolicies() && policy.opPolicy("aten::cat") != dispatch::OpPolicy::Default)) {
    return run_generic();
  }
  OnDevice guard(*check.device);
  auto call = std::make_shared<CatCall>();
  // Inputs are only read and the output is new: no overlap to show, one alias each.
  std::size_t bytes = 0;
  call->inputs.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    bytes += bytesOf(t);
    call->inputs.push_back(cpuAlias(t));
  }
  call->precompute = call->meta(at::ITensorListRef(call->inputs), dim);
  at::Tensor out = std::move(call->out);  // the caller's: a queued kernel never owns it (core/launch.h)
  if (!generic.accepts(out.scalar_type())) return run_generic();
  bytes += bytesOf(out);
  std::optional<runtime::tracing::WorkHint> work;
  if (C10_UNLIKELY(profile::describingWork())) {
    torch::jit::Stack stack;
    torch::jit::push(stack, std::vector<at::Tensor>(tensors.begin(), tensors.end()), dim);
    work.emplace(profile::workOf(op, stack));
  }
  const auto index = check.device->index();
  if (!runIfIdle(index, "aten::cat", [&call] { call->runImpl(); }, bytes)) {
    launch(index, "aten::cat", [call] { call->runImpl(); }, bytes);
  }
  return out;
}

#define NPU_STRUCTURED(Tag, OpName, Overload, ImplClass, Dtypes) \
  struct Tag {                                                     \
    using Impl = at::native::ImplClass;                            \
    static constexpr const char* name = OpName;                    \
    static constexpr const char* overload = Overload;              \
    static DtypeSet dtypes() { return Dtypes; }                    \
  };

constexpr char kAddInPlace[] = "aten::add_";
constexpr char kSubInPlace[] = "aten::sub_";
constexpr char kMulInPlace[] = "aten::mul_";
constexpr char kDivInPlace[] = "aten::div_";

#define ALL (floatingTypes() | integralTypes())
#define FLOATING floatingTypes()
NPU_STRUCTURED(AddTensor, "aten::add", "Tensor", structured_ufunc_add_CPU, ALL)
NPU_STRUCTURED(SubTensor, "aten::sub", "Tensor", structured_sub_out, ALL)
NPU_STRUCTURED(MulTensor, "aten::mul", "Tensor", structured_mul_out, ALL)
NPU_STRUCTURED(DivTensor, "aten::div", "Tensor", structured_div_out, ALL)
NPU_STRUCTURED(Maximum, "aten::maximum", "", structured_maximum_out, ALL)
NPU_STRUCTURED(Minimum, "aten::minimum", "", structured_minimum_out, ALL)
NPU_STRUCTURED(EqTensor, "aten::eq", "Tensor", structured_eq_Tensor_out, ALL)
NPU_STRUCTURED(EqScalar, "aten::eq", "Scalar", structured_eq_Scalar_out, ALL)
NPU_STRUCTURED(NeTensor, "aten::ne", "Tensor", structured_ne_Tensor_out, ALL)
NPU_STRUCTURED(NeScalar, "aten::ne", "Scalar", structured_ne_Scalar_out, ALL)
NPU_STRUCTURED(LtTensor, "aten::lt", "Tensor", structured_lt_Tensor_out, ALL)
NPU_STRUCTURED(LtScalar, "aten::lt", "Scalar", structured_lt_Scalar_out, ALL)
NPU_STRUCTURED(GtTensor, "aten::gt", "Tensor", structured_gt_Tensor_out, ALL)
NPU_STRUCTURED(GtScalar, "aten::gt", "Scalar", structured_gt_Scalar_out, ALL)
NPU_STRUCTURED(PowTensorScalar, "aten::pow", "Tensor_Scalar", structured_pow_Tensor_Scalar_out, ALL)
NPU_STRUCTURED(PowTensorTensor, "aten::pow", "Tensor_Tensor", structured_pow_Tensor_Tensor_out, ALL)
NPU_STRUCTURED(Neg, "aten::neg", "", structured_neg_out, ALL)
NPU_STRUCTURED(ClampMin, "aten::clamp_min", "", structured_clamp_min_out, ALL)
NPU_STRUCTURED(Threshold, "aten::threshold", "", structured_threshold_out, ALL)
NPU_STRUCTURED(Exp, "aten::exp", "", structured_exp_out, FLOATING)
NPU_STRUCTURED(Log, "aten::log", "", structured_log_out, FLOATING)
NPU_STRUCTURED(Sqrt, "aten::sqrt", "", structured_sqrt_out, FLOATING)
NPU_STRUCTURED(Rsqrt, "aten::rsqrt", "", structured_rsqrt_out, FLOATING)
NPU_STRUCTURED(Tanh, "aten::tanh", "", structured_tanh_out, FLOATING)
NPU_STRUCTURED(Sigmoid, "aten::sigmoid", "", structured_sigmoid_out, FLOATING)
NPU_STRUCTURED(Gelu, "aten::gelu", "", structured_gelu_out_cpu, FLOATING)
NPU_STRUCTURED(Silu, "aten::silu", "", structured_silu_out, FLOATING)
NPU_STRUCTURED(Addcmul, "aten::addcmul", "", structured_addcmul_out, FLOATING)
NPU_STRUCTURED(Addcdiv, "aten::addcdiv", "", structured_addcdiv_out, FLOATING)
NPU_STRUCTURED(SumDim, "aten::sum", "dim_IntList", structured_sum_out, ALL)
NPU_STRUCTURED(MeanDim, "aten::mean", "dim", structured_mean_out, FLOATING)
NPU_STRUCTURED(Mm, "aten::mm", "", structured_mm_out_cpu, FLOATING)
NPU_STRUCTURED(Bmm, "aten::bmm", "", structured_bmm_out_cpu, FLOATING)
NPU_STRUCTURED(Addmm, "aten::addmm", "", structured_addmm_out_cpu, FLOATING)
NPU_STRUCTURED(Softmax, "aten::_softmax", "", structured_softmax_cpu_out, FLOATING)
NPU_STRUCTURED(LogSoftmax, "aten::_log_softmax", "", structured_log_softmax_cpu_out, FLOATING)
#undef ALL
#undef FLOATING

at::Tensor sumAll(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return StructuredKernel<SumDim>::run(self, c10::IntArrayRef{}, false, dtype);
}
at::Tensor meanAll(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return StructuredKernel<MeanDim>::run(self, c10::IntArrayRef{}, false, dtype);
}

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
  // sum(x) and mean(x) are the cpu's sum and mean over every dimension (dim=[]):
  // the same fast path, not the generic kernel.
  m.impl("sum", TORCH_FN(sumAll));
  m.impl("mean", TORCH_FN(meanAll));
  profile::governByChipList(c10::OperatorName("aten::sum", ""));
  profile::governByChipList(c10::OperatorName("aten::mean", ""));
  m.impl("cat", TORCH_FN(catKernel));
  // In place: the optimisers' and gradient accumulation's arithmetic.
  m.impl("add_.Tensor", TORCH_FN((InPlaceKernel<AddTensor, kAddInPlace>::run)));
  m.impl("sub_.Tensor", TORCH_FN((InPlaceKernel<SubTensor, kSubInPlace>::run)));
  m.impl("mul_.Tensor", TORCH_FN((InPlaceKernel<MulTensor, kMulInPlace>::run)));
  m.impl("div_.Tensor", TORCH_FN((InPlaceKernel<DivTensor, kDivInPlace>::run)));
  for (const char* name : {"aten::add_", "aten::sub_", "aten::mul_", "aten::div_"}) {
    profile::governByChipList(c10::OperatorName(name, "Tensor"));
  }
  profile::governByChipList(c10::OperatorName("aten::cat", ""));
}

}  // namespace npu::ops

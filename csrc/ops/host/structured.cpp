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
// ATen's DispatchStub declares its per-capability kernels under macros that
// PyTorch's own x86-64 build defines (AVX2, AVX512): calling a stub from here
// (layer_norm's) needs the same declarations to link against libtorch_cpu.
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#define NPU_CALLS_ATEN_STUBS 1
#else
#define NPU_CALLS_ATEN_STUBS 0
#endif
#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/native/layer_norm.h>
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
#include <ATen/ops/index_select_native.h>
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

#include <algorithm>
#include <array>
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
// would read device memory out of stream order. So that path needs every npu
// operand to have one floating dtype, which must also be the promoted result's
// (noConversion); other mixes (float16 * float32, integer division, a bool mask
// times a float) take the converting path (StructuredKernel::runConverting).
struct FastPathCheck {
  const NativeKernel& kernel;
  std::optional<c10::Device> device;
  std::optional<c10::ScalarType> npu_dtype;
  at::native::ResultTypeState promotion{};
  bool ok = true;
  bool mixed = false;  // npu operands of different dtypes

  // All npu operands share one floating dtype, the result's: no conversion at the call.
  bool noConversion() const {
    return !mixed && npu_dtype && c10::isFloatingType(*npu_dtype) &&
           at::native::result_type(promotion) == *npu_dtype;
  }

  void operator()(const at::Tensor& t) {
    if (!t.defined()) return;
    promotion = at::native::update_result_type_state(t, promotion);
    if (t.device().type() == kNPU) {
      if (!kernel.accepts(t.scalar_type()) || (device && *device != t.device())) ok = false;
      if (npu_dtype && *npu_dtype != t.scalar_type()) mixed = true;
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

// A meta tensor of t's geometry and dtype, for a meta step that reads no data
// and converts nothing; cpu operands (scalars) stay as they are.
inline at::Tensor metaOf(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNPU) return t;
  at::Tensor meta = at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type(), std::nullopt,
                                                   std::nullopt, std::nullopt);
  if (t.storage_offset() != 0) meta.unsafeGetTensorImpl()->set_storage_offset(t.storage_offset());
  return meta;
}

// Whether `v` is an npu tensor over self's storage.
template <class T>
bool sharesMemoryWith(const at::Tensor& self, const T& v) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return v.defined() && v.device().type() == kNPU && v.unsafeGetTensorImpl() != self.unsafeGetTensorImpl() &&
           v.storage().is_alias_of(self.storage());
  } else {
    return false;
  }
}

// An argument as a meta step on meta tensors takes it (metaOf).
template <class T>
struct MetaCapture {
  static typename Capture<T>::type make(const std::decay_t<T>& v) {
    Aliases unused;
    return Capture<T>::make(v, unused);
  }
};
template <>
struct MetaCapture<const at::Tensor&> {
  static at::Tensor make(const at::Tensor& t) { return metaOf(t); }
};

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
    bool in_place = false; // the output is given: self's alias (in place), or a converting call's result

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
    if (!check.ok || !check.device || policy.retryOnKernelError() || graph::anyCapture() || !on_chip ||
        !chip.bfloat16 || !chip.inf_nan ||
        (policy.hasOpPolicies() && policy.opPolicy(Op::name) != dispatch::OpPolicy::Default)) {
      return run_generic();
    }
    if (!check.noConversion()) {
      auto converted = runConverting(op, generic, *check.device, args...);
      return converted.defined() ? converted : run_generic();
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

  // A call whose inputs the cpu's meta step would convert (mixed dtypes, integer
  // division): the meta step runs at the call on meta tensors, which shapes and
  // types the result and raises the cpu's errors without reading or converting
  // data; the cpu's meta step (with its conversions) and impl step then run
  // together in stream order, on aliases, writing the result allocated here.
  // Undefined: the generic kernel's call (a result dtype it must refuse).
  static at::Tensor runConverting(const c10::OperatorHandle& op, const NativeKernel& generic, c10::Device device,
                                  Args... args) {
    OnDevice guard(device);
    at::Tensor out;
    {
      Call shape(std::make_tuple(MetaCapture<Args>::make(args)...));
      shape.runMeta();
      out = std::move(shape.out);
    }
    const bool low_precision = out.scalar_type() == c10::kHalf || out.scalar_type() == c10::kBFloat16;
    if (!generic.accepts(out.scalar_type()) || (low_precision && isCubeOp(op))) return {};
    Aliases aliases;
    auto call = std::make_shared<Call>(std::make_tuple(Capture<Args>::make(args, aliases)...));
    call->in_place = true;  // the result is given
    call->out_alias = cpuAlias(out);
    const std::size_t bytes = aliases.bytes + bytesOf(out);
    std::optional<runtime::tracing::WorkHint> work;
    if (C10_UNLIKELY(profile::describingWork())) {
      torch::jit::Stack stack;
      torch::jit::push(stack, args...);
      work.emplace(profile::workOf(op, stack));
    }
    const auto index = device.index();
    auto run = [](Call& c) {
      c.runMeta();
      c.runImpl();
    };
    if (!runIfIdle(index, Op::name, [&call, &run] { run(*call); }, bytes)) {
      launch(index, Op::name, [call, run] { run(*call); }, bytes);
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
    if (!check.ok || !self.defined() || self.device().type() != kNPU ||
        policy.retryOnKernelError() || graph::anyCapture() || !on_chip ||
        !chip.bfloat16 || !chip.inf_nan ||
        (policy.hasOpPolicies() && policy.opPolicy(InPlaceName) != dispatch::OpPolicy::Default)) {
      return run_generic();
    }
    const bool converting = !check.noConversion();
    // Meta tensors share no storage: an operand over self's memory (a.add_(a[0]))
    // would miss the cpu's overlap check at the call; the generic kernel keeps it.
    if (converting && (sharesMemoryWith(self, rest) || ...)) return run_generic();
    OnDevice guard(self.device());
    if (converting) {
      // Inputs the cpu's meta step would convert: that step, with its checks
      // (the cast into self), runs here on meta tensors; the cpu's, with its
      // conversions, runs with the impl step in stream order (runConverting).
      at::Tensor self_meta = metaOf(self);
      Call shape(std::make_tuple(self_meta, MetaCapture<Rest>::make(rest)...));
      shape.in_place = true;
      shape.out_alias = std::move(self_meta);
      shape.runMeta();
    }
    Aliases aliases;
    at::Tensor self_alias = Capture<const at::Tensor&>::make(self, aliases);
    auto call = std::make_shared<Call>(std::make_tuple(self_alias, Capture<Rest>::make(rest, aliases)...));
    const std::size_t bytes = aliases.bytes;
    call->in_place = true;
    call->out_alias = std::move(self_alias);  // the input's own alias: a full overlap, as on the cpu
    if (converting) {
      std::optional<runtime::tracing::WorkHint> work;
      if (C10_UNLIKELY(profile::describingWork())) {
        torch::jit::Stack stack;
        torch::jit::push(stack, self, rest...);
        work.emplace(profile::workOf(op, stack));
      }
      auto run = [](Call& c) {
        c.runMeta();
        c.runImpl();
      };
      const auto index = self.device().index();
      if (!runIfIdle(index, InPlaceName, [&call, &run] { run(*call); }, bytes)) {
        launch(index, InPlaceName, [call, run] { run(*call); }, bytes);
      }
      return self;
    }
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
  if (!npu_only || !check.ok || check.mixed || !check.device || policy.retryOnKernelError() || graph::anyCapture() || !on_chip || !chip.bfloat16 ||
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

// ---- Unboxed paths for hot ops that have no structured kernel ----------------
// native_layer_norm (three results), its backward, and index_select: their cpu
// kernels allocate their outputs themselves, so the structured class above does
// not fit. Each path here computes the outputs' geometry from metadata alone
// (never device data), allocates them in npu memory at the call, and runs the
// cpu kernel's own compute step on CPU aliases: at once when the stream is idle,
// else queued with the aliases it owns. What the cpu kernel would do before its
// compute step with data (a contiguous copy of a strided input) happens inside
// that step, in stream order. Unusual calls, and every call while a graph
// captures, take the generic kernel as before.

// Whether nothing sends the call to the generic kernel: no op policy, no retry on
// kernel errors, no capture, and a chip that runs the op natively.
bool unboxedPathOpen(const char* name, bool on_chip) {
  auto& policy = dispatch::FallbackPolicy::instance();
  const auto& chip = profile::active();
  return on_chip && chip.bfloat16 && chip.inf_nan && !policy.retryOnKernelError() && !graph::anyCapture() &&
         !(policy.hasOpPolicies() && policy.opPolicy(name) != dispatch::OpPolicy::Default);
}

// An optional npu operand of these paths: absent, or on `device` with `dtype`.
bool absentOrOn(const at::Tensor& t, c10::Device device, c10::ScalarType dtype) {
  return !t.defined() || (t.device() == device && t.scalar_type() == dtype);
}

// Runs `call` (a copyable struct with run()) now when the stream is idle, else
// queues it; the call holds only CPU aliases (core/launch.h).
template <class CallT>
void runOrQueue(c10::DeviceIndex index, const char* name, CallT& call, std::size_t bytes) {
  if (!runIfIdle(index, name, [&call] { call.run(); }, bytes)) {
    launch(index, name, [call = std::move(call)]() mutable { call.run(); }, bytes);
  }
}

template <class... Args>
void describeWork(std::optional<runtime::tracing::WorkHint>& work, const c10::OperatorHandle& op,
                  const Args&... args) {
  if (C10_LIKELY(!profile::describingWork())) return;
  torch::jit::Stack stack;
  torch::jit::push(stack, args...);
  work.emplace(profile::workOf(op, stack));
}

at::Tensor contiguousNpu(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::detail::empty_generic(sizes, npuAllocator(), kNPUKeys, dtype, std::nullopt);
}

constexpr char kLayerNorm[] = "aten::native_layer_norm";
constexpr char kLayerNormBackward[] = "aten::native_layer_norm_backward";
constexpr char kIndexSelect[] = "aten::index_select";

#if NPU_CALLS_ATEN_STUBS
struct LayerNormCall {
  at::Tensor input, weight, bias;  // CPU aliases (weight, bias may be undefined)
  at::Tensor out, mean, rstd;      // aliases of the npu results
  int64_t M = 0;
  int64_t N = 0;
  double eps = 0;

  // The cpu kernel's compute step (layer_norm_cpu): contiguous operands, then the stub.
  void run() {
    const auto X = input.expect_contiguous();
    const auto gamma = weight.expect_contiguous();
    const auto beta = bias.expect_contiguous();
    at::native::LayerNormKernel(c10::kCPU, *X, *gamma, *beta, M, N, eps, &out, &mean, &rstd);
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> layerNormKernel(const at::Tensor& input,
                                                               c10::IntArrayRef normalized_shape,
                                                               const std::optional<at::Tensor>& weight_opt,
                                                               const std::optional<at::Tensor>& bias_opt,
                                                               double eps) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(kLayerNorm, "");
  static NativeKernel generic(floatingTypes());
  static const bool on_chip = profile::runsNatively(profile::active(), op);
  const at::Tensor& weight = weight_opt.has_value() ? *weight_opt : at::Tensor();
  const at::Tensor& bias = bias_opt.has_value() ? *bias_opt : at::Tensor();
  const auto dtype = input.scalar_type();
  // One floating dtype for every operand: a mixed call (float16 input, float32
  // weight) has float32 statistics, which the generic kernel handles.
  if (!unboxedPathOpen(kLayerNorm, on_chip) || input.device().type() != kNPU || !c10::isFloatingType(dtype) ||
      !generic.accepts(dtype) || !absentOrOn(weight, input.device(), dtype) ||
      !absentOrOn(bias, input.device(), dtype)) {
    torch::jit::Stack stack;
    torch::jit::push(stack, input, normalized_shape, weight_opt, bias_opt, eps);
    generic(op, kNPUKeys, &stack);
    return {std::move(stack[0]).toTensor(), std::move(stack[1]).toTensor(), std::move(stack[2]).toTensor()};
  }
  const HostOpName named(kLayerNorm);
  // The cpu's own checks, on metadata: its errors, raised at the call.
  const auto [M, N] = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  OnDevice guard(input.device());
  // The cpu's results: Y contiguous like the input; mean and rstd of M elements,
  // shaped as the input's batch dimensions followed by ones.
  at::Tensor out = contiguousNpu(input.sizes(), dtype);
  const std::size_t axis = input.dim() - normalized_shape.size();
  c10::DimVector stat_shape(input.sizes().begin(), input.sizes().begin() + static_cast<std::ptrdiff_t>(axis));
  stat_shape.resize(input.dim(), 1);
  at::Tensor mean = contiguousNpu(stat_shape, dtype);
  at::Tensor rstd = contiguousNpu(stat_shape, dtype);
  LayerNormCall call{cpuAlias(input), cpuAlias(weight), cpuAlias(bias), cpuAlias(out), cpuAlias(mean),
                     cpuAlias(rstd), M, N, eps};
  const std::size_t bytes = bytesOf(input) + bytesOf(weight) + bytesOf(bias) + bytesOf(out) + 2 * bytesOf(mean);
  std::optional<runtime::tracing::WorkHint> work;
  describeWork(work, op, input, normalized_shape, weight_opt, bias_opt, eps);
  runOrQueue(input.device().index(), kLayerNorm, call, bytes);
  return {std::move(out), std::move(mean), std::move(rstd)};
}

struct LayerNormBackwardCall {
  at::Tensor grad_out, input, mean, rstd, weight;  // CPU aliases
  at::Tensor grad_input, grad_weight, grad_bias;   // aliases of the npu results (undefined: not asked)
  int64_t M = 0;
  int64_t N = 0;

  // The cpu kernel's compute step (layer_norm_backward_cpu).
  void run() {
    const auto X = input.expect_contiguous();
    const auto gamma = weight.expect_contiguous();
    at::native::LayerNormBackwardKernel(c10::kCPU, grad_out, *X, mean, rstd, *gamma, M, N, &grad_input,
                                        &grad_weight, &grad_bias);
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> layerNormBackwardKernel(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight_opt, const std::optional<at::Tensor>& bias_opt,
    std::array<bool, 3> output_mask) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(kLayerNormBackward, "");
  static NativeKernel generic(floatingTypes());
  static const bool on_chip = profile::runsNatively(profile::active(), op);
  const at::Tensor& weight = weight_opt.has_value() ? *weight_opt : at::Tensor();
  const at::Tensor& bias = bias_opt.has_value() ? *bias_opt : at::Tensor();
  const auto dtype = input.scalar_type();
  const c10::Device device = input.device();
  auto on = [&](const at::Tensor& t) { return t.defined() && t.device() == device && t.scalar_type() == dtype; };
  // Unusual calls to the generic kernel: mixed dtypes, a gradient asked of an
  // absent parameter, and no rows (M == 0: the cpu returns zeros without its kernel).
  bool fast = unboxedPathOpen(kLayerNormBackward, on_chip) && device.type() == kNPU &&
              c10::isFloatingType(dtype) && generic.accepts(dtype) && on(grad_out) && on(mean) && on(rstd) &&
              absentOrOn(weight, device, dtype) && absentOrOn(bias, device, dtype) &&
              (!output_mask[1] || weight.defined()) && (!output_mask[2] || bias.defined());
  std::pair<int64_t, int64_t> M_N{0, 0};
  if (fast) {
    const HostOpName named(kLayerNormBackward);
    M_N = at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
    fast = M_N.first > 0;
  }
  if (!fast) {
    torch::jit::Stack stack;
    torch::jit::push(stack, grad_out, input, normalized_shape, mean, rstd, weight_opt, bias_opt, output_mask);
    generic(op, kNPUKeys, &stack);
    return {std::move(stack[0]).toTensor(), std::move(stack[1]).toTensor(), std::move(stack[2]).toTensor()};
  }
  const HostOpName named(kLayerNormBackward);
  OnDevice guard(device);
  at::Tensor grad_input = output_mask[0] ? contiguousNpu(input.sizes(), dtype) : at::Tensor();
  at::Tensor grad_weight = output_mask[1] ? contiguousNpu(weight.sizes(), dtype) : at::Tensor();
  at::Tensor grad_bias = output_mask[2] ? contiguousNpu(bias.sizes(), dtype) : at::Tensor();
  LayerNormBackwardCall call{cpuAlias(grad_out),   cpuAlias(input),       cpuAlias(mean),
                             cpuAlias(rstd),       cpuAlias(weight),      cpuAlias(grad_input),
                             cpuAlias(grad_weight), cpuAlias(grad_bias), M_N.first,
                             M_N.second};
  const std::size_t bytes = 2 * bytesOf(grad_out) + bytesOf(input) + 2 * bytesOf(mean) + bytesOf(weight) +
                            bytesOf(grad_input) + bytesOf(grad_weight) + bytesOf(grad_bias);
  std::optional<runtime::tracing::WorkHint> work;
  describeWork(work, op, grad_out, input, normalized_shape, mean, rstd, weight_opt, bias_opt, output_mask);
  runOrQueue(device.index(), kLayerNormBackward, call, bytes);
  return {std::move(grad_input), std::move(grad_weight), std::move(grad_bias)};
}

#endif  // NPU_CALLS_ATEN_STUBS

struct IndexSelectCall {
  at::Tensor self, index, out;  // CPU aliases
  int64_t dim = 0;

  // The cpu kernel's out= form on the result it would allocate (same geometry:
  // its resize is a no-op); it checks every index, raising the cpu's IndexError.
  void run() { at::native::index_select_out_cpu_(self, dim, index, out); }
};

at::Tensor indexSelectKernel(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(kIndexSelect, "");
  static NativeKernel generic(floatingTypes() | integralTypes());
  static const bool on_chip = profile::runsNatively(profile::active(), op);
  const int64_t ndim = std::max<int64_t>(self.dim(), 1);
  // The index on the same npu (a 0-dim cpu index, or one on another device, is
  // the generic kernel's to take or refuse), and metadata the cpu accepts: else
  // the generic kernel raises the cpu's error.
  if (!unboxedPathOpen(kIndexSelect, on_chip) || self.device().type() != kNPU || !generic.accepts(self.scalar_type()) ||
      index.device() != self.device() || (index.scalar_type() != c10::kLong && index.scalar_type() != c10::kInt) ||
      index.dim() > 1 || (self.dim() == 0 && index.numel() != 1) || dim < -ndim || dim >= ndim) {
    torch::jit::Stack stack;
    torch::jit::push(stack, self, dim, index);
    generic(op, kNPUKeys, &stack);
    return std::move(stack.back()).toTensor();
  }
  const HostOpName named(kIndexSelect);
  if (dim < 0) dim += ndim;
  OnDevice guard(self.device());
  c10::DimVector sizes(self.sizes().begin(), self.sizes().end());
  if (self.dim() > 0) sizes[dim] = index.numel();
  at::Tensor out = contiguousNpu(sizes, self.scalar_type());
  IndexSelectCall call{cpuAlias(self), cpuAlias(index), cpuAlias(out), dim};
  const std::size_t bytes = bytesOf(index) + 2 * bytesOf(out);
  std::optional<runtime::tracing::WorkHint> work;
  describeWork(work, op, self, dim, index);
  runOrQueue(self.device().index(), kIndexSelect, call, bytes);
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
  // The unboxed paths of ops without a structured kernel.
#if NPU_CALLS_ATEN_STUBS
  m.impl("native_layer_norm", TORCH_FN(layerNormKernel));
  m.impl("native_layer_norm_backward", TORCH_FN(layerNormBackwardKernel));
  profile::governByChipList(c10::OperatorName(kLayerNorm, ""));
  profile::governByChipList(c10::OperatorName(kLayerNormBackward, ""));
#endif
  m.impl("index_select", TORCH_FN(indexSelectKernel));
  profile::governByChipList(c10::OperatorName(kIndexSelect, ""));
}

}  // namespace npu::ops

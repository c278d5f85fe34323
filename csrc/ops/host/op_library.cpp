// The npu op library: which aten ops have native npu kernels, and for which
// dtypes. Each name covers all its overloads (Tensor, Scalar, out, ...) and
// its in-place variant ("add" also registers "add_"), as long as PyTorch has a
// CPU (or CompositeExplicitAutograd) kernel for it: that kernel is what runs on
// npu memory. Ops PyTorch decomposes (CompositeImplicitAutograd) are left to
// the decomposition, so autograd keeps working through them.
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <memory>
#include <set>
#include <vector>

#include "../../core/device.h"
#include "../../core/profile.h"
#include "../../dispatch/fallback.h"
#include "../../dispatch/arguments.h"
#include "host_execution.h"
#include "native_kernel.h"

namespace npu::ops {
namespace {

struct LibraryEntry {
  const char* name;
  DtypeSet dtypes;
};

std::vector<LibraryEntry> libraryEntries() {
  const DtypeSet all = floatingTypes() | integralTypes();
  const DtypeSet floating = floatingTypes();
  std::vector<LibraryEntry> entries;
  auto add = [&](DtypeSet dtypes, std::initializer_list<const char*> names) {
    for (const char* name : names) entries.push_back({name, dtypes});
  };
  // Elementwise math, comparisons, logic.
  add(all, {"add", "sub", "mul", "div", "pow", "neg", "abs", "sign", "sgn", "remainder", "fmod", "floor_divide",
            "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt",
            "ge", "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and", "bitwise_or",
            "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "where", "masked_fill",
            "masked_scatter", "masked_select", "nonzero", "isnan", "isinf", "isposinf", "isneginf", "signbit",
            "floor", "ceil", "round", "trunc", "relu", "threshold", "threshold_backward", "hypot", "copysign",
            "square"});
  add(floating, {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "sin",
                 "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "tanh",
                 "sigmoid", "erf", "erfc", "erfinv", "frac", "lgamma", "digamma", "gelu", "gelu_backward", "silu",
                 "silu_backward", "sigmoid_backward", "tanh_backward", "hardtanh", "hardtanh_backward",
                 "leaky_relu", "leaky_relu_backward", "elu", "elu_backward", "softplus", "softplus_backward",
                 "hardswish", "hardswish_backward", "hardsigmoid", "hardsigmoid_backward", "mish",
                 "mish_backward", "logit", "logit_backward", "nan_to_num", "xlogy", "lerp", "addcmul", "addcdiv",
                 "glu", "glu_backward", "log_sigmoid_forward", "log_sigmoid_backward", "rrelu_with_noise",
                 "prelu", "_prelu_kernel", "_prelu_kernel_backward", "softshrink", "hardshrink", "polygamma",
                 "_standard_gamma_grad", "binomial", "embedding_renorm"});
  // Reductions, scans, sorting.
  add(all, {"sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "prod", "any", "all", "cumsum",
            "cumprod", "sort", "topk", "kthvalue", "median", "nanmedian", "mode", "count_nonzero", "aminmax",
            "_unique2", "unique_dim", "unique_consecutive", "bincount", "histc", "searchsorted", "bucketize",
            "cummax", "cummin", "_cummax_helper", "_cummin_helper", "nansum", "equal", "logcumsumexp"});
  add(floating, {"var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "logsumexp",
                 "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"});
  // Linear algebra.
  add(floating, {"mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "vdot", "addr", "_addmm_activation",
                 "linalg_cross", "_cdist_forward", "_cdist_backward", "_pdist_forward", "tril_indices",
                 "triu_indices"});
  // Decompositions and solvers (LAPACK on the emulated device).
  add(floating, {"linalg_cholesky_ex", "linalg_inv_ex", "linalg_lu_factor_ex", "linalg_lu", "linalg_lu_solve",
                 "_linalg_det", "_linalg_slogdet", "_linalg_solve_ex", "linalg_solve_triangular",
                 "triangular_solve", "_linalg_eigh", "linalg_eig", "_linalg_svd", "linalg_qr", "geqrf", "ormqr",
                 "linalg_householder_product", "linalg_ldl_factor_ex", "linalg_ldl_solve", "linalg_lstsq",
                 "_cholesky_solve_helper", "cholesky_inverse", "lu_unpack", "linalg_matrix_exp",
                 "_linalg_check_errors", "cholesky", "_linalg_eigvals"});
  // torch.fft: real and complex64 transforms.
  add(floating | DtypeSet{c10::kComplexFloat}, {"_fft_r2c", "_fft_c2r", "_fft_c2c"});
  // Convolution helpers, pooling, upsampling, padding.
  add(floating, {"max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
                 "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d",
                 "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
                 "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "_adaptive_avg_pool3d",
                 "_adaptive_avg_pool3d_backward", "upsample_nearest1d", "upsample_nearest2d",
                 "upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_bilinear2d",
                 "upsample_bilinear2d_backward", "upsample_linear1d", "upsample_linear1d_backward",
                 "upsample_bicubic2d", "upsample_bicubic2d_backward", "reflection_pad1d", "reflection_pad2d",
                 "reflection_pad1d_backward", "reflection_pad2d_backward", "replication_pad1d",
                 "replication_pad2d", "replication_pad1d_backward", "replication_pad2d_backward", "im2col",
                 "col2im", "grid_sampler_2d", "grid_sampler_2d_backward", "pixel_shuffle", "pixel_unshuffle",
                 "channel_shuffle", "upsample_nearest3d", "upsample_nearest3d_backward", "upsample_trilinear3d",
                 "upsample_trilinear3d_backward", "_upsample_nearest_exact1d", "_upsample_nearest_exact1d_backward",
                 "_upsample_nearest_exact2d", "_upsample_nearest_exact2d_backward", "_upsample_nearest_exact3d",
                 "_upsample_nearest_exact3d_backward", "_upsample_bilinear2d_aa", "_upsample_bilinear2d_aa_backward",
                 "_upsample_bicubic2d_aa", "_upsample_bicubic2d_aa_backward", "reflection_pad3d",
                 "reflection_pad3d_backward", "replication_pad3d", "replication_pad3d_backward",
                 "adaptive_avg_pool3d_backward", "adaptive_max_pool3d", "adaptive_max_pool3d_backward",
                 "max_unpool3d", "grid_sampler_3d", "grid_sampler_3d_backward"});
  // Elementwise ops the Ascend chips run natively (profiles/ascend_native_ops_*.tsv).
  add(all, {"rsub", "_add_relu", "gcd", "__lshift__", "__rshift__", "__ilshift__", "__irshift__", "_aminmax"});
  add(floating, {"logaddexp", "logaddexp2", "sinc", "angle", "hardshrink_backward", "softshrink_backward"});
  // Normalisation, dropout, embedding, losses.
  add(floating, {"native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                 "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                 "batch_norm_update_stats", "native_group_norm", "native_group_norm_backward", "_fused_rms_norm",
                 "_fused_rms_norm_backward", "native_dropout", "native_dropout_backward", "bernoulli",
                 "embedding_dense_backward", "_embedding_bag", "_embedding_bag_forward_only",
                 "_embedding_bag_backward", "_embedding_bag_dense_backward", "nll_loss_forward", "nll_loss_backward",
                 "nll_loss2d_forward", "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "smooth_l1_loss",
                 "smooth_l1_loss_backward", "huber_loss", "huber_loss_backward", "binary_cross_entropy",
                 "binary_cross_entropy_backward", "soft_margin_loss", "soft_margin_loss_backward",
                 "multilabel_margin_loss_forward", "multi_margin_loss", "_ctc_loss", "_ctc_loss_backward", "uniform", "random", "exponential", "geometric",
                 "log_normal", "cauchy",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention_for_cpu_backward", "multinomial", "normal", "poisson",
                 "_standard_gamma", "_dirichlet_grad", "_sample_dirichlet"});
  // nn.MultiheadAttention's and nn.TransformerEncoder's inference fast paths
  // (nested tensors for padded batches).
  add(floating, {"_transformer_encoder_layer_fwd", "_native_multi_head_attention", "_transform_bias_rescale_qkv",
                 "_masked_softmax", "_nested_tensor_from_mask", "_nested_from_padded"});
  add(all, {"_nested_tensor_from_mask_left_aligned"});
  // Indexing, shape and creation.
  add(all, {"cat", "index", "_index_put_impl", "index_put", "index_select", "gather", "scatter", "scatter_add",
            "scatter_reduce", "index_add", "index_copy", "index_fill", "index_reduce", "take", "put", "flip",
            "roll", "tril", "triu", "diag_embed", "repeat_interleave", "unfold", "unfold_backward", "arange",
            "linspace", "logspace", "eye", "randperm", "embedding", "one_hot", 
            "constant_pad_nd", "polar", "max_unpool2d", "histogram", "_histogramdd_from_bin_cts",
            "_histogramdd_bin_edges", "_embedding_bag_per_sample_weights_backward", "segment_reduce",
            "_segment_reduce_backward", "renorm", "trace", "diff", "cross",
            "isin", "_assert_async", "view_as_real", "view_as_complex"});
  // Quantization of npu tensors (their quantized results: host_execution.cpp).
  add(floating, {"quantize_per_tensor", "quantize_per_channel", "dequantize"});
  // Optimisers (torch.optim's foreach paths, GradScaler).
  add(all, {"_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_addcmul", "_foreach_addcdiv",
            "_foreach_sqrt", "_foreach_lerp", "_foreach_norm", "_foreach_maximum", "_foreach_minimum",
            "_foreach_neg", "_foreach_zero", "_foreach_copy", "_foreach_pow", "_foreach_abs", "_foreach_exp",
            "_foreach_reciprocal", "_foreach_sign", "_foreach_clamp_min", "_foreach_clamp_max", "_foreach_rsqrt",
            "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale",
            "_fused_adam", "_fused_adamw", "_fused_sgd"});
  return entries;
}

std::vector<std::string>& unmatched() {
  static std::vector<std::string> names;
  return names;
}

bool hasCpuKernel(const c10::OperatorHandle& op) {
  return (op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

// Nested and sparse COO tensors on the npu (nn.TransformerEncoder's fast path
// for padded batches makes nested ones; nn.Embedding(sparse=True) and
// torch.optim.SparseAdam sparse ones): each op runs its NestedTensorCPU or
// SparseCPU kernel on host views of the npu memory, in stream order.
template <c10::DispatchKey CpuKey>
void runOnHostFor(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  static const c10::DispatchKeySet cpu_keys(CpuKey);
  const size_t begin = stack->size() - op.schema().arguments().size();
  NativeKernel::runOnHost(op, stack, dispatch::deviceOfArguments(op, *stack, begin), cpu_keys);
}

// The fallback for the npu key serves ops without a kernel of their own for
// it; ops with a CompositeExplicitAutograd kernel (which would otherwise
// take the npu key, as is_coalesced's "not sparse" default does) get it by name.
void registerLayoutKernels(torch::Library& library, c10::DispatchKey cpu_key, c10::DispatchKey npu_key,
                           torch::CppFunction (*kernel)()) {
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    auto op = c10::Dispatcher::singleton().findSchema(name);
    if (!op || !op->hasKernelForDispatchKey(cpu_key) || op->hasKernelForDispatchKey(npu_key)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    if (name.name.rfind("aten::", 0) != 0) continue;
    const std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    library.impl(full.c_str() + 6, torch::dispatch(npu_key, kernel()));
  }
}

// F.scaled_dot_product_attention asks the device which kernel to run; without
// an answer it takes the unfused math path. The npu answers as the cpu does,
// so both run the same flash kernel (listed above) and agree bit for bit.
int64_t sdpaChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  // A chip without an attention kernel (910A, 310P: it is aclnn-only) runs
  // PyTorch's math decomposition, matmuls and softmax, on the device.
  static const bool chip_has_attention = [] {
    const auto& chip = profile::active();
    return !chip.restricts_ops || chip.lists(c10::OperatorName("aten::scaled_dot_product_attention", ""));
  }();
  if (!chip_has_attention) return static_cast<int64_t>(at::SDPBackend::math);
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::NestedTensorCPU>>());
}
// Quantized npu tensors: their QuantizedCPU kernels (dequantize, int_repr, ...) on host views.
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::QuantizedCPU>>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::SparseCPU>>());
}

void registerOpLibrary() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept alive for the process: a torch::Library deregisters on destruction.
    static auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                               c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    std::map<std::string, std::vector<c10::OperatorName>> overloads;  // "aten::add" -> all overloads
    for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) overloads[name.name].push_back(name);
    std::set<std::string> done;
    for (const auto& entry : libraryEntries()) {
      bool matched = false;
      const std::string base = std::string("aten::") + entry.name;
      for (const std::string& variant : {base, base + "_"}) {
        if (!done.insert(variant).second) continue;
        auto it = overloads.find(variant);
        if (it == overloads.end()) continue;
        for (const auto& name : it->second) {
          auto op = c10::Dispatcher::singleton().findSchema(name);
          if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) || !hasCpuKernel(*op)) continue;
          const std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
          library->impl(full.c_str() + 6,  // without "aten::"
                        torch::CppFunction::makeFromBoxedFunctor(std::make_unique<NativeKernel>(entry.dtypes)));
          profile::governByChipList(name);
          matched = true;
        }
      }
      if (!matched) unmatched().push_back(entry.name);
    }
    DtypeSet native;
    for (const auto& entry : libraryEntries()) native = native | entry.dtypes;
    std::vector<c10::ScalarType> types;
    for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
      if (native.contains(static_cast<c10::ScalarType>(i))) types.push_back(static_cast<c10::ScalarType>(i));
    }
    setNativeDtypes(types);
    static auto* layouts = new torch::Library(torch::Library::IMPL, "aten", std::nullopt, __FILE__, __LINE__);
    registerLayoutKernels(*layouts, c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1, [] {
      return torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::SparseCPU>>();
    });
    registerLayoutKernels(*layouts, c10::DispatchKey::NestedTensorCPU, c10::DispatchKey::NestedTensorPrivateUse1, [] {
      return torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::NestedTensorCPU>>();
    });
    registerLayoutKernels(*layouts, c10::DispatchKey::QuantizedCPU, c10::DispatchKey::QuantizedPrivateUse1, [] {
      return torch::CppFunction::makeFromBoxedFunction<&runOnHostFor<c10::DispatchKey::QuantizedCPU>>();
    });
    registerLayoutKernels(*layouts, c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1, [] {
      return torch::CppFunction::makeFromBoxedFunction<&compressedFallback>();
    });
  });
}

const std::vector<std::string>& unmatchedLibraryNames() { return unmatched(); }

}  // namespace npu::ops

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &npu::ops::sdpaChoice)
}  // namespace at::native

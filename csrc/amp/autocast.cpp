// torch.autocast("npu"): the AutocastPrivateUse1 registrations.
//
// PyTorch registers nothing for AutocastPrivateUse1, so without this file every
// op under autocast("npu") fails ("Could not run 'aten::mm' with arguments from
// the 'Autocastnpu' backend"). The npu casts like CUDA's autocast: ATen's own op
// lists (the ones CUDA registers from) with the same policies, a fallthrough
// for every other op, and binary_cross_entropy refused as CUDA refuses it.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::autocast {
namespace {

// The lists' macros expand to unqualified Tensor/ScalarType: they must live here.
#define NPU_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

Tensor binaryCrossEntropyRefused(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "aten::binary_cross_entropy under torch.autocast(\"npu\"): torch.nn.functional.binary_cross_entropy "
              "and torch.nn.BCELoss are unsafe to autocast (as on CUDA). Use "
              "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which combine "
              "the sigmoid and the loss and are safe to autocast, or run the loss outside the autocast region.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NPU_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NPU_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binaryCrossEntropyRefused));
}

}  // namespace
}  // namespace at::autocast

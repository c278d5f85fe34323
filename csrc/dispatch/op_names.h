// Operator names: the one place that reads what users write ("exp",
// "torch.exp", "aten::exp.out", "torch.ops.npu.my_op") and how messages name ops.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <utility>

namespace npu::dispatch {

// "exp", "torch.exp", "aten::exp", "aten::exp.out", "torch.ops.aten.exp.default",
// "Tensor.exp_" -> {"aten::exp", overload} (overload "" when not given).
// Throws c10::Error for text that is no operator name ("", "aten::", ".").
std::pair<std::string, std::string> canonicalOpName(const std::string& name);
// The canonical name of an operator that exists (any overload), for policies:
// raises for an unknown one, suggesting the closest known names.
std::string existingOpName(const std::string& name);
// "aten::add.Tensor": the name error messages use.
std::string displayName(const c10::OperatorHandle& op);
// " \t\n" stripped from both ends (names and environment values).
std::string trim(const std::string& s);

}  // namespace npu::dispatch

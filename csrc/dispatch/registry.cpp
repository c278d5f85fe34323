#include "registry.h"

#include <tuple>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>

#include "fallback.h"
#include "op_names.h"

namespace npu::dispatch {
namespace {

using c10::DispatchKey;

OpResolution resolve(const c10::OperatorHandle& op, const profile::DeviceProfile& chip) {
  OpResolution out;
  out.name = displayName(op);
  // A kernel of the op library that the chip lacks is not native there
  // (ops/host/native_kernel.cpp decides the same way at run time).
  const bool npu_kernel = op.hasKernelForDispatchKey(DispatchKey::PrivateUse1);
  const bool off_chip = npu_kernel && !profile::runsNatively(chip, op);
  const bool native = npu_kernel && !off_chip;
  const bool cpu_kernel = op.hasKernelForDispatchKey(DispatchKey::CPU);
  // CompositeExplicitAutogradNonFunctional beside a CPU kernel is only the
  // functional wrapper of a structured op; alone (select_backward) it
  // decomposes, and so does the wrapper where a chip lacks the op library's
  // kernel (gelu becomes gelu.out there: profile::decomposesOffChip()).
  const bool composite = op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) ||
                         op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
                         ((!cpu_kernel || off_chip) &&
                          op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional));
  const bool cpu = cpu_kernel || composite;
  if (native) out.backends.push_back("npu");
  if (composite) out.backends.push_back("composite");
  if (cpu) out.backends.push_back("cpu");

  const OpPolicy policy = FallbackPolicy::instance().opPolicy(op.schema().name());
  // A decomposition above the backend (CompositeImplicitAutograd) wins over any
  // kernel: the op never reaches the npu key itself.
  if (op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) && !native) {
    out.backend = "composite";
    out.priority = kCompositePriority;
  } else if (policy == OpPolicy::Cpu && cpu) {
    out.backend = "cpu";
    out.priority = kCpuFallbackPriority;
  } else if (native) {
    out.backend = "npu";
    out.priority = kNativePriority;
  } else if (composite) {
    out.backend = "composite";
    out.priority = kCompositePriority;
  } else if (cpu) {
    out.backend = "cpu";
    out.priority = kCpuFallbackPriority;
  } else {
    out.backend = "none";
    out.priority = -1;
  }
  return out;
}

int overloadRank(const std::string& overload) {
  static const char* preferred[] = {"", "Tensor", "default", "input", "self", "int", "dim"};
  for (int i = 0; i < 7; ++i) {
    if (overload == preferred[i]) return i;
  }
  return 100;
}

}  // namespace

std::optional<OpResolution> resolveOp(const std::string& raw, const profile::DeviceProfile& chip) {
  std::string name;
  std::string overload;
  try {
    std::tie(name, overload) = canonicalOpName(raw);
  } catch (const c10::Error&) {
    return std::nullopt;  // "", "aten::", "." name no operator
  }
  auto& dispatcher = c10::Dispatcher::singleton();
  if (!overload.empty()) {
    auto op = dispatcher.findSchema({name, overload});
    if (!op) return std::nullopt;
    return resolve(*op, chip);
  }
  std::optional<c10::OperatorHandle> best;
  int best_rank = 1 << 30;
  std::string best_overload;
  for (const auto& op_name : dispatcher.getAllOpNames()) {
    if (op_name.name != name) continue;
    auto op = dispatcher.findSchema(op_name);
    if (!op) continue;
    const int rank = overloadRank(op_name.overload_name);
    if (rank < best_rank || (rank == best_rank && op_name.overload_name < best_overload)) {
      best = op;
      best_rank = rank;
      best_overload = op_name.overload_name;
    }
  }
  if (!best) return std::nullopt;
  return resolve(*best, chip);
}

std::vector<OpResolution> allOps(const profile::DeviceProfile& chip) {
  std::vector<OpResolution> out;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& op_name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findSchema(op_name);
    if (op) out.push_back(resolve(*op, chip));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

int64_t numNativeKernels() {
  int64_t count = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& op_name : dispatcher.getAllOpNamesForDispatchKey(DispatchKey::PrivateUse1)) {
    auto op = dispatcher.findSchema(op_name);
    if (op && op->hasKernelForDispatchKey(DispatchKey::PrivateUse1)) ++count;
  }
  return count;
}

}  // namespace npu::dispatch

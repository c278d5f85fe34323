#include "op_names.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace npu::dispatch {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\n");
  return s.substr(begin, end - begin + 1);
}

namespace {
bool startsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
}  // namespace

std::pair<std::string, std::string> canonicalOpName(const std::string& raw) {
  std::string name = trim(raw);
  std::string ns = "aten";
  std::string overload;
  if (startsWith(name, "torch.ops.")) {
    // torch.ops.<ns>.<op>[.<overload>]
    std::vector<std::string> parts;
    std::stringstream in(name.substr(10));
    std::string part;
    while (std::getline(in, part, '.')) parts.push_back(part);
    TORCH_CHECK(parts.size() >= 2 && !parts[0].empty() && !parts[1].empty(), "'", raw,
                "' is not an operator name; expected e.g. torch.ops.aten.exp");
    ns = parts[0];
    name = parts[1];
    if (parts.size() >= 3 && parts[2] != "default") overload = parts[2];
    return {ns + "::" + name, overload};
  }
  for (const char* prefix : {"torch.Tensor.", "torch.nn.functional.", "torch.special.", "torch.linalg.",
                             "torch.", "Tensor.", "F."}) {
    if (startsWith(name, prefix)) {
      name = name.substr(std::string(prefix).size());
      break;
    }
  }
  const auto colons = name.find("::");
  if (colons != std::string::npos) {
    ns = name.substr(0, colons);
    name = name.substr(colons + 2);
  }
  const auto dot = name.find('.');
  if (dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
    if (overload == "default") overload.clear();
  }
  TORCH_CHECK(!name.empty() && !ns.empty(), "'", raw,
              "' is not an operator name; expected e.g. 'exp', 'torch.exp' or 'aten::exp'");
  return {ns + "::" + name, overload};
}

namespace {
std::size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string existingOpName(const std::string& raw) {
  const std::string name = canonicalOpName(raw).first;
  const auto ns_end = name.find("::");
  const std::string ns = name.substr(0, ns_end + 2);
  std::vector<std::pair<std::size_t, std::string>> near;
  for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name == name) return name;
    if (op.name.rfind(ns, 0) != 0) continue;
    const std::string short_name = op.name.substr(ns.size());
    near.emplace_back(editDistance(name.substr(ns.size()), short_name), short_name);
  }
  std::sort(near.begin(), near.end());
  near.erase(std::unique(near.begin(), near.end()), near.end());
  std::string suggestions;
  for (std::size_t i = 0; i < near.size() && i < 3; ++i) suggestions += (i ? ", " : "") + near[i].second;
  TORCH_CHECK_VALUE(false, "'", raw, "' is not an operator (no ", name, " is registered)",
                    suggestions.empty() ? std::string() : "; did you mean " + suggestions + "?");
}

std::string displayName(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

}  // namespace npu::dispatch

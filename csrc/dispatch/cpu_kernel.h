// Running an op's CPU kernel for an npu op, with the npu's random numbers.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace npu::dispatch {

// Runs the kernel of `op` for `cpu_keys` (CPU, SparseCPU, NestedTensorCPU) on
// the host tensors of the stack, as op.redispatchBoxed() does, with the random
// numbers of the npu. A Generator argument already holds the npu's draw (the
// callers take it at launch). The random ops whose schema has no Generator
// argument (native_dropout, randperm) would draw inside their CPU kernel from
// the cpu's default generator: they run their generator-taking form instead,
// with a draw of `device`'s default npu generator, taken here.
void redispatchToCpu(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack,
                     c10::DeviceIndex device);
// The random ops without a Generator argument that redispatchToCpu() gives the
// npu's draw ("aten::native_dropout", ...), for the test that every random op
// PyTorch has is covered.
std::vector<std::string> randomOpsGivenTheNpuDraw();
// Whether `op` is random (tagged nondeterministic_seeded) without a Generator
// argument: its CPU kernel must run through redispatchToCpu, at launch.
bool isRandomWithoutGeneratorArgument(const c10::OperatorHandle& op);

}  // namespace npu::dispatch

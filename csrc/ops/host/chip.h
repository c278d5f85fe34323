// How the chip of the active device profile (core/profile.h) computes, where it
// differs from ATen's CPU kernels that the emulated npu runs:
// - the matrix unit (cube) multiplies float16 and bfloat16 operands with float32
//   accumulation and rounds once at the end (mm, bmm, addmm, baddbmm, addbmm,
//   mv, addmv, dot, vdot, _addmm_activation, and convolution in convolution.cpp); under every profile, generic included:
//   it agrees with ATen's CPU results within the dtype's tolerance, and ATen's
//   CPU float16 GEMM is two orders of magnitude slower where the host has no
//   float16 arithmetic;
// - chips without inf/nan support (910A, 310P) saturate float16 overflow to
//   +-65504 instead of giving inf, and raise their overflow flag, which
//   GradScaler's unscale kernel (_amp_foreach_non_finite_check_and_unscale_)
//   reads as found_inf, as the real adapter reads the chip's float status.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace npu::ops {

// Runs the CPU kernel of `op` on the host tensors of `stack` as the chip
// would (dispatch::redispatchToCpu, with the chip's numerics above).
void runCpuKernel(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys, torch::jit::Stack* stack,
                  c10::DeviceIndex device);

// Whether `op` runs on the matrix unit in float32 for 16-bit operands.
bool isCubeOp(const c10::OperatorHandle& op);

// Raises a clear error when the active profile's chip has no bfloat16 and an
// npu tensor (or dtype argument) of the stack is bfloat16.
void checkChipDtypes(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// The same for one dtype, named by `what` ("torch.empty", "copy to npu").
void checkChipDtype(c10::ScalarType type, const char* what);

// Replaces +-inf in a float16 tensor with +-65504 when the chip saturates
// (raising its overflow flag): for results of kernels and conversions.
void saturateIfChipDoes(const at::Tensor& t);

}  // namespace npu::ops

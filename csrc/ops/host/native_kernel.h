// The op library's native kernel: one boxed kernel serves every aten op the
// library lists, by running ATen's CPU kernel on npu memory. In-place ops are
// queued on the current stream (asynchronous); ops that create tensors run in
// stream order on the caller's thread (host_execution.h). Each op declares the
// dtypes it supports; other dtypes, and ops a policy sends to the cpu, take the
// CPU fallback (dispatch/fallback.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

#include "dtypes.h"

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>

namespace npu::ops {

class NativeKernel final : public c10::OperatorKernel {
 public:
  explicit NativeKernel(DtypeSet dtypes) : dtypes_(dtypes) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
  // Whether tensors of `type` may enter this kernel (else: the CPU fallback).
  bool accepts(c10::ScalarType type) const;

 private:
  struct Traits {
    bool is_view = false;      // returns an alias of an input (no compute)
    bool in_place = false;     // writes only to its arguments, no out=: can be queued
    // The device profile's chip runs it natively (core/profile.h); else it
    // decomposes (off_chip_decomposes) or takes the CPU fallback.
    bool on_chip = true;
    bool off_chip_decomposes = false;
  };
  const Traits& traits(const c10::OperatorHandle& op);
  // The first dtype among the inputs (or a dtype= argument) the kernel lacks.
  std::optional<c10::ScalarType> refusedDtype(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const;
  std::string supportedDtypes() const;
  void runQueued(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device);

 public:
  // Runs the op's kernel for `cpu_keys` (CPU, or NestedTensorCPU) now, on this
  // thread, in stream order, on host views of the npu arguments; results become
  // npu tensors. `device`: the op's npu device, its arguments checked
  // (dispatch::deviceOfArguments).
  static void runOnHost(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device,
                        c10::DispatchKeySet cpu_keys);

 private:

  const DtypeSet dtypes_;
  std::once_flag analysed_;
  Traits traits_;
};

// Registers the op library (op_library.cpp) for the PrivateUse1 key.
void registerOpLibrary();
// Makes the npu library's fused ops (registered for npu and cpu, with a Meta kernel)
// recordable in graph captures: under a capture they are recorded as host ops are.
// Called once the extension's static registrations are done.
void makeFusedOpsCapturable();
// The library's op names that matched no operator with a CPU kernel.
const std::vector<std::string>& unmatchedLibraryNames();

// ATen sends float and double unary ops (sin, exp, sqrt, logit, ...) to MKL's vector
// math library, one call per intra-op thread on its chunk. MKL picks each
// function's kernel on its first call, and when that first call runs on several
// threads at once one of them may compute its whole chunk with a low-accuracy
// kernel (errors of ~1e-4 relative; pytorch/pytorch#188792). Every npu op runs
// ATen's CPU kernels, so a fresh process's first sin on the npu could be silently
// wrong. Calling each such function once, on one element and one thread, at
// import settles MKL's choice first. Returns the ops it called (none without MKL).
const std::vector<std::string>& settleVectorMathDispatch();

}  // namespace npu::ops

// The c10d backend of npu tensors: Gloo's collectives run by the host.
//
// torch.distributed reaches a device through a c10d::Backend registered for
// its device type. Gloo refuses npu tensors, so this backend hands Gloo host
// tensors: where the HAL says the device's memory is host-addressable (the
// emulated npu; unified-memory devices), a cpu alias of a contiguous npu tensor
// once the work queued on its stream is done; otherwise (a device with separate
// memory, or NPU_DIST_STAGING=1) a copy in pinned host memory, copied back
// after the collective. CPU tensors go to Gloo as they are, so one group can
// serve both devices. A collective is complete when it returns: its Work is
// finished and its future holds the output tensors (what DDP's reducer reads).
// Point-to-point ops return at once (a send waits for the peer's receive) and
// finish in wait(). The tensors Gloo sees are aliases or copies made here,
// never the tensors Python holds: its worker threads never need the GIL to drop
// one (with Gloo alone, that aborts a process that exits right after a collective).
//
// Gloo is created in Python (the wheel ships no gloo headers) and held here as
// a c10d::Backend. Errors, a peer that died or the group's timeout among them,
// are raised as DistBackendError naming the collective and the device.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace npu::distributed {

// Pinned host memory for the tensors of one collective at a time: tensors are
// taken from one block, which grows (to twice its size) when a collective
// needs more; reset() starts the next collective at the block's start.
class HostBuffer {
 public:
  at::Tensor take(at::IntArrayRef sizes, at::ScalarType dtype);
  void reset() { used_ = 0; }

 private:
  at::Tensor block_;  // bytes
  std::size_t used_ = 0;
};

class GlooBackend final : public c10d::Backend {
 public:
  // `name`: what getBackendName() reports ("hccl", or the descriptive alias).
  GlooBackend(c10::intrusive_ptr<c10d::Backend> gloo, std::string name);

  const std::string getBackendName() const override { return name_; }
  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }

  // The communicator name of Ascend's ProcessGroupHCCL.get_hccl_comm_name(rank):
  // "hccl_<group name>" (the same on every rank of the group; a backend made
  // outside a group gets "hccl_backend_<n>"). The name is registered, so that
  // the collective ops that take a group by its name (npu_all_gather_base_mm,
  // npu_moe_distribute_dispatch, ...) find this backend with resolve().
  std::string commName();
  // The backend registered under `name` by commName() in this process, or null
  // (never named, or its group was destroyed).
  static c10::intrusive_ptr<GlooBackend> resolve(const std::string& name);
  // The names registered now, for error messages.
  static std::vector<std::string> registeredNames();
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }

 private:
  // One collective: `body(staging)` stages the tensors and starts Gloo's work on
  // them; this waits for it, copies staged results back and returns a finished
  // Work of `outputs`. One collective at a time (they share the host buffer).
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> collective(const char* op, std::vector<at::Tensor> outputs, Body&& body);
  // Starts a send or receive of `tensors` (staged on the host) and returns its pending Work.
  c10::intrusive_ptr<c10d::Work> pointToPoint(
      const char* op, std::vector<at::Tensor>& tensors, bool receive,
      const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& start);

  // Keeps Gloo's work until its worker thread has let go of it, so that the
  // last reference drops here, on a thread that may take the GIL: the work holds
  // the caller's thread-local state, Python objects among it, and a Gloo worker
  // dropping it at interpreter exit aborts the process.
  void retain(c10::intrusive_ptr<c10d::Work> work);

  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::string name_;
  bool always_stage_;  // NPU_DIST_STAGING=1
  std::mutex mutex_;   // one collective at a time uses buffer_
  HostBuffer buffer_;
  std::string comm_name_;  // set by commName()
  std::mutex retained_mutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> retained_;
};

}  // namespace npu::distributed

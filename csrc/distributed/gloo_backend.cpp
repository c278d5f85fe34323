#include "gloo_backend.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <utility>

#include "../core/launch.h"
#include "../core/stream.h"
#include "../runtime/hal.h"

namespace npu::distributed {

namespace {

// NPU_DIST_STAGING=1: stage through pinned host memory even where the device's
// memory is host-addressable (what a device with separate memory does).
bool stagingForced() {
  const char* value = std::getenv("NPU_DIST_STAGING");
  if (value == nullptr || *value == '\0' || std::string(value) == "0") return false;
  TORCH_CHECK_VALUE(std::string(value) == "1", "NPU_DIST_STAGING='", value,
                    "' is not a switch; use 1 (always stage collectives through pinned host memory) or 0");
  return true;
}

bool hostAddressable(const at::Tensor& t) {
  return runtime::hal().device(t.device().index()).capabilities().host_addressable;
}

// A cpu tensor for Gloo: the same memory (and storage, kept alive) under a
// tensor Python has never seen. Gloo's worker thread drops its tensors after
// wait() has returned; dropping one Python holds takes the GIL, and at
// interpreter exit that aborts the process.
at::Tensor ownTensor(const at::Tensor& t) { return t.detach(); }

// Waits for Gloo's work; its failure (a peer that closed its connection, the
// group's timeout) becomes a DistBackendError naming the collective and device.
void waitFor(c10d::Work& work, const char* op, c10::Device device, const std::string& backend,
             std::chrono::milliseconds timeout = kNoTimeout) {
  try {
    work.wait(timeout);
  } catch (const std::exception& e) {
    const auto* error = dynamic_cast<const c10::Error*>(&e);
    C10_THROW_ERROR(DistBackendError,
                    c10::str("c10d::", op, " on ", device, " (the ", backend, " backend: Gloo on the host) failed: ",
                             error != nullptr ? error->what_without_backtrace() : e.what(),
                             "\nIf a peer process exited or stopped, its own output says why; the wait is "
                             "bounded by the group's timeout (init_process_group(timeout=...))."));
  }
}

// The host tensors of one collective. An npu tensor Gloo may use in place (its
// device's memory is host-addressable, it is contiguous) is given to Gloo as a
// cpu alias once its stream's work is done; any other npu tensor is staged in
// the backend's pinned host buffer and, if Gloo writes it, copied back when the
// collective has finished. cpu tensors are used in place (ownTensor).
class Staging {
 public:
  Staging(const char* op, const std::string& backend, HostBuffer& buffer, bool always_stage)
      : op_(op), backend_(backend), buffer_(buffer), always_stage_(always_stage) {
    buffer_.reset();
  }

  // What Gloo reads.
  at::Tensor input(const at::Tensor& t) { return stage(t, /*copy_in=*/true, /*copy_back=*/false); }
  // What Gloo writes.
  at::Tensor output(const at::Tensor& t) { return stage(t, false, true); }
  // What Gloo reads and overwrites (allreduce, broadcast).
  at::Tensor inout(const at::Tensor& t) { return stage(t, true, true); }

  template <typename F>
  std::vector<at::Tensor> each(const std::vector<at::Tensor>& tensors, F stage_one) {
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back((this->*stage_one)(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> outputs(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& list : lists) out.push_back(each(list, &Staging::output));
    return out;
  }
  std::vector<std::vector<at::Tensor>> inputs(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& list : lists) out.push_back(each(list, &Staging::input));
    return out;
  }

  // Runs Gloo's collective on the host tensors, waits for it, and copies the
  // staged results back: the collective is complete when this returns. Errors
  // of the call itself (arguments Gloo refuses) propagate as they are.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> run(Call&& call) {
    c10::intrusive_ptr<c10d::Work> work = call();
    waitFor(*work, op_, device_, backend_);
    for (auto& [device, host] : back_) device.copy_(host);
    return work;
  }

 private:
  at::Tensor stage(const at::Tensor& t, bool copy_in, bool copy_back) {
    if (!t.defined()) return t;
    if (t.device().is_cpu()) return ownTensor(t);
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1, "c10d::", op_, " (the ", backend_,
                      " backend) takes npu and cpu tensors, got one on ", t.device(),
                      "; move it to the npu first (.npu())");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, "c10d::", op_, " (the ", backend_,
                      " backend) takes dense tensors, got a ", t.layout(), " tensor on ", t.device(),
                      "; call .to_dense() first");
    device_ = t.device();
    if (!always_stage_ && t.is_contiguous() && hostAddressable(t)) {
      synchronizeStream(currentStream(t.device().index()), "c10d collective");  // its producers are done
      return cpuAlias(t);
    }
    at::Tensor host = buffer_.take(t.sizes(), t.scalar_type());
    if (copy_in) host.copy_(t);  // waits for the work queued on t's stream
    if (copy_back) back_.emplace_back(t, host);
    return host;
  }

  const char* op_;
  const std::string& backend_;
  HostBuffer& buffer_;
  bool always_stage_;
  c10::Device device_{c10::kCPU};
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (npu tensor, its host copy)
};

// The Work of a collective that has finished: its result and its future's
// value are the output tensors (what DDP's reducer reads).
class FinishedWork final : public c10d::Work {
 public:
  explicit FinishedWork(std::vector<at::Tensor> outputs)
      : outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A send or receive in flight. Point-to-point work cannot complete before it
// returns: a Gloo send waits for the peer's receive, so two ranks that both
// send first (batch_isend_irecv's rings) would wait for each other. The npu
// tensors are staged in host memory of this work's own (pinned, owned by
// Gloo's work as long as it runs); wait() copies a received tensor back.
class PendingWork final : public c10d::Work {
 public:
  PendingWork(c10::intrusive_ptr<c10d::Work> gloo, const char* op, const std::string& backend, c10::Device device,
              std::vector<std::pair<at::Tensor, at::Tensor>> back, std::vector<at::Tensor> tensors)
      : gloo_(std::move(gloo)), op_(op), backend_(backend), device_(device), back_(std::move(back)),
        tensors_(std::move(tensors)) {}

  bool isCompleted() override {
    if (!gloo_->isCompleted()) return false;
    finishOnce(kNoTimeout);  // done means a received tensor is on the npu
    return true;
  }
  bool isSuccess() const override { return gloo_->isSuccess(); }
  int sourceRank() const override { return gloo_->sourceRank(); }
  std::vector<at::Tensor> result() override { return tensors_; }
  bool wait(std::chrono::milliseconds timeout) override {
    finishOnce(timeout);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    finishOnce(kNoTimeout);  // the future of a point-to-point op is a finished one
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(tensors_));
    return future;
  }

 private:
  void finishOnce(std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    waitFor(*gloo_, op_, device_, backend_, timeout);
    for (auto& [device, host] : back_) device.copy_(host);
    back_.clear();
    finished_ = true;
    finish();
  }

  c10::intrusive_ptr<c10d::Work> gloo_;
  const char* op_;
  std::string backend_;
  c10::Device device_;
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (npu tensor, host copy) received
  std::vector<at::Tensor> tensors_;
  std::mutex finish_mutex_;
  bool finished_ = false;
};

// The host tensors Gloo sends from or receives into, for one point-to-point op:
// cpu tensors in place (ownTensor), npu tensors staged in fresh pinned memory.
std::vector<at::Tensor> stagePointToPoint(const std::vector<at::Tensor>& tensors, bool receive, const char* op,
                                          const std::string& backend, c10::Device* device,
                                          std::vector<std::pair<at::Tensor, at::Tensor>>* back) {
  std::vector<at::Tensor> host;
  for (const auto& t : tensors) {
    if (t.device().is_cpu()) {
      host.push_back(ownTensor(t));
      continue;
    }
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1 && t.layout() == at::kStrided, "c10d::", op,
                      " (the ", backend, " backend) takes dense npu and cpu tensors, got a ", t.layout(),
                      " tensor on ", t.device());
    *device = t.device();
    at::Tensor staged = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    if (receive) {
      back->emplace_back(t, staged);
    } else {
      staged.copy_(t);  // waits for the work queued on t's stream
    }
    host.push_back(staged);
  }
  return host;
}

c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<FinishedWork>(std::move(outputs));
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

}  // namespace

at::Tensor HostBuffer::take(at::IntArrayRef sizes, at::ScalarType dtype) {
  constexpr std::size_t kAlign = 64;
  const std::size_t nbytes = c10::multiply_integers(sizes) * c10::elementSize(dtype);
  std::size_t offset = (used_ + kAlign - 1) / kAlign * kAlign;
  if (!block_.defined() || offset + nbytes > static_cast<std::size_t>(block_.numel())) {
    // A new block; tensors taken from the old one keep it alive until they go.
    const auto capacity = std::max<std::size_t>(nbytes, 2 * static_cast<std::size_t>(block_.defined() ? block_.numel() : 0));
    block_ = at::empty({static_cast<int64_t>(capacity)}, at::TensorOptions(at::kByte).pinned_memory(true));
    offset = 0;
  }
  used_ = offset + nbytes;
  return block_.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(nbytes)).view(dtype).view(sizes);
}

void GlooBackend::retain(c10::intrusive_ptr<c10d::Work> work) {
  std::vector<c10::intrusive_ptr<c10d::Work>> released;  // destroyed here, after the lock
  std::lock_guard<std::mutex> lock(retained_mutex_);
  auto still_held = std::partition(retained_.begin(), retained_.end(),
                                   [](const auto& w) { return w.use_count() > 1; });
  released.assign(std::make_move_iterator(still_held), std::make_move_iterator(retained_.end()));
  retained_.erase(still_held, retained_.end());
  retained_.push_back(std::move(work));
}

GlooBackend::GlooBackend(c10::intrusive_ptr<c10d::Backend> gloo, std::string name)
    : c10d::Backend(gloo->getRank(), gloo->getSize()),
      gloo_(std::move(gloo)),
      name_(std::move(name)),
      always_stage_(stagingForced()) {}

template <typename Body>
c10::intrusive_ptr<c10d::Work> GlooBackend::collective(const char* op, std::vector<at::Tensor> outputs, Body&& body) {
  std::lock_guard<std::mutex> lock(mutex_);
  Staging s(op, name_, buffer_, always_stage_);
  retain(s.run([&] { return body(s); }));
  return completed(std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> GlooBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  return collective("broadcast", tensors, [&](Staging& s) {
    auto host = s.each(tensors, &Staging::inout);
    return gloo_->broadcast(host, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  return collective("allreduce", tensors, [&](Staging& s) {
    auto host = s.each(tensors, &Staging::inout);
    return gloo_->allreduce(host, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceCoalescedOptions& opts) {
  return collective("allreduce_coalesced", tensors, [&](Staging& s) {
    auto host = s.each(tensors, &Staging::inout);
    return gloo_->allreduce_coalesced(host, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  return collective("reduce", tensors, [&](Staging& s) {
    auto host = s.each(tensors, &Staging::inout);
    return gloo_->reduce(host, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  return collective("allgather", flatten(outputs), [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.outputs(outputs);
    return gloo_->allgather(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  return collective("_allgather_base", {output}, [&](Staging& s) {
    auto host_in = s.input(input);
    auto host_out = s.output(output);
    return gloo_->_allgather_base(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::AllgatherOptions& opts) {
  return collective("allgather_into_tensor_coalesced", outputs, [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.each(outputs, &Staging::output);
    return gloo_->allgather_into_tensor_coalesced(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  return collective("gather", flatten(outputs), [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.outputs(outputs);
    return gloo_->gather(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  return collective("scatter", outputs, [&](Staging& s) {
    auto host_in = s.inputs(inputs);
    auto host_out = s.each(outputs, &Staging::output);
    return gloo_->scatter(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter", outputs, [&](Staging& s) {
    auto host_in = s.inputs(inputs);
    auto host_out = s.each(outputs, &Staging::output);
    return gloo_->reduce_scatter(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  return collective("_reduce_scatter_base", {output}, [&](Staging& s) {
    auto host_in = s.input(input);
    auto host_out = s.output(output);
    return gloo_->_reduce_scatter_base(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                            std::vector<at::Tensor>& inputs,
                                                                            const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter_tensor_coalesced", outputs, [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.each(outputs, &Staging::output);
    return gloo_->reduce_scatter_tensor_coalesced(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  return collective("alltoall_base", {output}, [&](Staging& s) {
    auto host_in = s.input(input);
    auto host_out = s.output(output);
    return gloo_->alltoall_base(host_out, host_in, output_split_sizes, input_split_sizes, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  return collective("alltoall", outputs, [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.each(outputs, &Staging::output);
    return gloo_->alltoall(host_out, host_in, opts);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return pointToPoint("send", tensors, false, [&](std::vector<at::Tensor>& host) {
    return gloo_->send(host, dst_rank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return pointToPoint("recv", tensors, true, [&](std::vector<at::Tensor>& host) {
    return gloo_->recv(host, src_rank, tag);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return pointToPoint("recvAnysource", tensors, true, [&](std::vector<at::Tensor>& host) {
    return gloo_->recvAnysource(host, tag);
  });
}

c10::intrusive_ptr<c10d::Work> GlooBackend::pointToPoint(
    const char* op, std::vector<at::Tensor>& tensors, bool receive,
    const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& start) {
  c10::Device device(c10::kCPU);
  std::vector<std::pair<at::Tensor, at::Tensor>> back;
  auto host = stagePointToPoint(tensors, receive, op, name_, &device, &back);
  auto work = start(host);
  retain(work);
  return c10::make_intrusive<PendingWork>(std::move(work), op, name_, device, std::move(back), tensors);
}

c10::intrusive_ptr<c10d::Work> GlooBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions& opts) {
  return collective("allgather_coalesced", flatten(outputs), [&](Staging& s) {
    auto host_in = s.each(inputs, &Staging::input);
    auto host_out = s.outputs(outputs);
    return gloo_->allgather_coalesced(host_out, host_in, opts);
  });
}

void GlooBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  gloo_->monitoredBarrier(opts, wait_all_ranks);
}

namespace {

// name -> backend, for the ops that take a group by its communicator name. Weak:
// a destroyed group's backend goes, and its name no longer resolves.
std::mutex& namesMutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, c10::weak_intrusive_ptr<GlooBackend>>& names() {
  static auto* registry = new std::map<std::string, c10::weak_intrusive_ptr<GlooBackend>>();
  return *registry;
}

}  // namespace

std::string GlooBackend::commName() {
  std::lock_guard<std::mutex> lock(namesMutex());
  if (comm_name_.empty()) {
    static std::atomic<int64_t> unnamed{0};
    const std::string& group = getGroupUid();
    comm_name_ = group.empty() ? "hccl_backend_" + std::to_string(unnamed++) : "hccl_" + group;
  }
  // Registered at every call: a group destroyed and made again under the same name
  // takes the name over.
  names().insert_or_assign(comm_name_, c10::weak_intrusive_ptr<GlooBackend>(
                                           c10::intrusive_ptr<GlooBackend>::reclaim_copy(this)));
  return comm_name_;
}

c10::intrusive_ptr<GlooBackend> GlooBackend::resolve(const std::string& name) {
  std::lock_guard<std::mutex> lock(namesMutex());
  auto it = names().find(name);
  if (it == names().end()) return {};
  auto backend = it->second.lock();
  if (!backend) names().erase(it);
  return backend;
}

std::vector<std::string> GlooBackend::registeredNames() {
  std::lock_guard<std::mutex> lock(namesMutex());
  std::vector<std::string> out;
  for (const auto& [name, backend] : names()) {
    if (!backend.expired()) out.push_back(name);
  }
  return out;
}

c10::intrusive_ptr<c10d::Work> GlooBackend::barrier(const c10d::BarrierOptions& opts) {
  return collective("barrier", {}, [&](Staging&) { return gloo_->barrier(opts); });
}

}  // namespace npu::distributed

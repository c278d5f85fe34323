// The npu in PyTorch's profiler (torch.profiler / Kineto).
//
// Device time: a Kineto IActivityProfiler (REGISTER_PRIVATEUSE1_PROFILER) whose
// session turns the runtime's activity trace (runtime/tracing.h) into Kineto
// activities. PyTorch pushes the correlation id of each op it records on the
// thread that dispatches it; the session forwards it to the runtime, which
// stamps it on each kernel at launch, so kernels link to the op that launched
// them (device_time_total, the "NPU total" column, flow arrows in traces).
//
// The legacy autograd profiler with use_kineto=False reads device time through
// ProfilerStubs: timing events on the current stream around each op.
// Kineto's addMetadata (numeric trace args, as CUDA's traces have) formats
// with fmt, whose library torch does not export: compile fmt inline here.
#define FMT_HEADER_ONLY
#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <ThreadUtil.h>
#include <libkineto.h>
#include <output_base.h>

#include <map>
#include <string>
#include <utility>

#include "../core/device.h"
#include "../core/stream.h"
#include "../runtime/hal.h"
#include "../runtime/tracing.h"

namespace npu::profiler {
namespace {

namespace tracing = runtime::tracing;
using libkineto::ActivityType;

ActivityType kinetoType(tracing::ActivityKind kind) {
  switch (kind) {
    case tracing::ActivityKind::Memcpy: return ActivityType::GPU_MEMCPY;
    case tracing::ActivityKind::Synchronize: return ActivityType::PRIVATEUSE1_RUNTIME;
    case tracing::ActivityKind::Kernel:
    case tracing::ActivityKind::Fallback: break;
  }
  return ActivityType::CONCURRENT_KERNEL;
}

const char* copyKindName(runtime::CopyKind kind) {
  switch (kind) {
    case runtime::CopyKind::HostToDevice: return "HtoD";
    case runtime::CopyKind::DeviceToHost: return "DtoH";
    case runtime::CopyKind::DeviceToDevice: break;
  }
  return "DtoD";
}

const char* launchName(tracing::ActivityKind kind) {
  switch (kind) {
    case tracing::ActivityKind::Memcpy: return "npuMemcpy";
    case tracing::ActivityKind::Fallback: return "npuCpuFallback";
    default: break;
  }
  return "npuLaunchKernel";
}

// Waits for the work queued on every npu stream, leaving kernel errors pending
// for the user's next synchronisation.
void drainAllStreams() {
  try {
    auto& hal = runtime::hal();
    for (int i = 0; i < hal.deviceCount(); ++i) hal.device(i).drain();
  } catch (const std::exception&) {
    // A runtime that cannot start has queued nothing; its error reaches the
    // user at the next npu call, not from inside the profiler's stop.
  }
}

class NpuSession final : public libkineto::IActivityProfilerSession {
 public:
  ~NpuSession() override {
    if (status_ == libkineto::TraceStatus::RECORDING) tracing::stop();  // dropped without stop()
  }
  void start() override {
    tracing::start();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    // Queued kernels finish (and report their memory) before the trace ends.
    drainAllStreams();
    activities_ = tracing::stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, std::numeric_limits<int64_t>::max());
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start_ns,
                    int64_t end_ns) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns, end_ns, "NPU");
    const int32_t pid = libkineto::processId();
    for (const tracing::Activity& a : activities_) {
      if (a.end_ns < start_ns || a.start_ns > end_ns) continue;  // outside the profiled window
      const bool fallback = a.kind == tracing::ActivityKind::Fallback;
      buffer_->emplace_activity(buffer_->span, kinetoType(a.kind),
                                fallback ? std::string("cpu_fallback: ") + a.name : std::string(a.name));
      auto& act = *buffer_->activities.back();
      act.startTime = a.start_ns;
      act.endTime = a.end_ns;
      act.id = static_cast<int32_t>(a.correlation);
      if (a.kind == tracing::ActivityKind::Synchronize) {
        // A host-side runtime call: on the waiting thread's row, like cudaStreamSynchronize.
        act.device = pid;
        act.resource = a.host_thread;
        act.threadId = a.host_thread;
      } else {
        act.device = a.device;
        act.resource = static_cast<int32_t>(a.stream);
        streams_[{a.device, a.stream}] = true;
      }
      const libkineto::ITraceActivity* op =
          linked && a.correlation != 0 ? linked(static_cast<int32_t>(a.correlation)) : nullptr;
      act.linked = op;
      if (a.correlation != 0 && a.kind != tracing::ActivityKind::Synchronize) {
        // The flow arrow ends here and starts at the launch, on the host
        // thread inside the op (as cudaLaunchKernel's does for CUDA).
        act.flow.id = static_cast<uint32_t>(a.correlation);
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = 0;
        buffer_->emplace_activity(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME, launchName(a.kind));
        auto& launch = *buffer_->activities.back();
        launch.startTime = launch.endTime = a.launch_ns;
        launch.id = act.id;
        launch.device = pid;
        launch.resource = launch.threadId = a.host_thread;
        launch.linked = op;
        launch.flow.id = act.flow.id;
        launch.flow.type = libkineto::kLinkAsyncCpuGpu;
        launch.flow.start = 1;
        launch.log(logger);
      }
      act.addMetadata("device", a.device);
      act.addMetadata("stream", a.stream);
      act.addMetadata("correlation", a.correlation);
      if (fallback) act.addMetadataQuoted("fallback", "cpu");
      if (a.kind == tracing::ActivityKind::Memcpy) {
        act.addMetadata("bytes", a.bytes);
        act.addMetadataQuoted("kind", copyKindName(a.copy_kind));
      } else if (a.bytes != 0) {
        act.addMetadata("bytes", a.bytes);
      }
      act.log(logger);
    }
    status_ = libkineto::TraceStatus::READY;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(0, 0, "NPU 0", "NPU 0");
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    int64_t sort = 0;
    for (const auto& [key, seen] : streams_) {
      (void)seen;
      out.emplace_back(key.second, sort++, key.first, "Stream " + std::to_string(key.second));
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { tracing::pushCorrelation(id); }
  void popCorrelationId() override { tracing::popCorrelation(); }

 private:
  std::vector<tracing::Activity> activities_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::map<std::pair<int, int64_t>, bool> streams_;
};

class NpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& requested,
                                                                 const libkineto::Config& /*config*/) override {
    // PRIVATEUSE1_RUNTIME comes with every CPU-only request too: only device
    // activities start a session, so CPU-only profiles pay no npu tracing.
    if (requested.count(ActivityType::CONCURRENT_KERNEL) != 0 || requested.count(ActivityType::GPU_MEMCPY) != 0) {
      return std::make_unique<NpuSession>();
    }
    return nullptr;  // no npu activity asked for
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& requested,
                                                                 const libkineto::Config& config) override {
    return configure(requested, config);
  }

 private:
  std::string name_{"npu"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                ActivityType::PRIVATEUSE1_RUNTIME};
};

// ---- the legacy profiler's stubs (use_kineto=False) ---------------------------

class NpuProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex d = currentDevice();
    if (device != nullptr) *device = d;
    auto timed = runtimeDevice(d).createEvent(/*timing=*/true);
    timed->record(currentRuntimeStream(d));
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    runtime::Event* raw = timed.release();
    *event = std::shared_ptr<void>(raw, [](void* e) { delete static_cast<runtime::Event*>(e); });
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    auto* a = static_cast<runtime::Event*>(start->get());
    auto* b = static_cast<runtime::Event*>(end->get());
    checkTimingEvents(static_cast<c10::DeviceIndex>(a->device()), "the legacy profiler (use_kineto=False)");
    a->synchronize();
    b->synchronize();
    return static_cast<float>(a->elapsedMs(*b) * 1000.0);  // microseconds
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = currentDevice();
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) {
      setDevice(d);
      op(d);
    }
    setDevice(previous);
  }
  void synchronize() const override {
    for (c10::DeviceIndex d = 0; d < deviceCount(); ++d) synchronizeDevice(d);
  }
};

NpuProfilerStubs g_stubs;

struct RegisterStubs {
  RegisterStubs() { torch::profiler::impl::registerPrivateUse1Methods(&g_stubs); }
} g_register_stubs;

}  // namespace

// Handed to Kineto when a profiler with ProfilerActivity.NPU starts.
REGISTER_PRIVATEUSE1_PROFILER(NpuActivityProfiler);

}  // namespace npu::profiler

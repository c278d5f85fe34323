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
//
// Under a device profile with a cost model (core/profile.h), each kernel, copy
// and CPU fallback (with the copies inside it) also gets its projected time on
// that chip: `projected_us` in its trace args, and a record the session keeps
// (torch_npu._C._profiler_projections()), laid out per stream as the chip
// would run them. torch_npu.profiler reads those for the "NPU projected"
// column, analyse() and the projected track it adds to exported traces. They
// stay out of Kineto's activities: PyTorch turns every device activity into an
// event that counts as device time.
//
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

#include <algorithm>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "npu_profiler.h"

#include "../core/device.h"
#include "../core/profile.h"
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

// ---- Projection onto the chip of the device profile ---------------------------

const char* projectedKind(tracing::ActivityKind kind) {
  switch (kind) {
    case tracing::ActivityKind::Memcpy: return "memcpy";
    case tracing::ActivityKind::Fallback: return "fallback";
    default: break;
  }
  return "kernel";
}

// What `a` does, for its projection: a kernel's described work (the op library's
// FLOPs and bytes) or, without one, its bytes alone (memory-bound).
tracing::Work workOf(const tracing::Activity& a) {
  tracing::Work work = a.work;
  if (!work.known) work.bytes = static_cast<double>(a.bytes);
  return work;
}

// What `a` would take on the chip: a kernel its projection from its work; a copy
// over the host link or within device memory; a CPU fallback its copies both ways
// over the link plus its host work, which the host does on the real system too:
// its duration less the emulated device work inside it (`nested_ns`, see
// NestedInFallbacks), returned in `host_ns` as well. 0 for host waits.
int64_t projectNs(const profile::CostModel& cost, const tracing::Activity& a, int64_t nested_ns, int64_t* host_ns) {
  switch (a.kind) {
    case tracing::ActivityKind::Kernel: return profile::projectKernelNs(cost, workOf(a), a.in_graph);
    case tracing::ActivityKind::Memcpy:
      return profile::projectCopyNs(cost, static_cast<double>(a.bytes),
                                    a.copy_kind != runtime::CopyKind::DeviceToDevice, a.in_graph);
    case tracing::ActivityKind::Fallback:
      *host_ns = std::max<int64_t>(0, a.end_ns - a.start_ns - nested_ns);
      return profile::projectCopyNs(cost, static_cast<double>(a.bytes), true) + *host_ns;
    case tracing::ActivityKind::Synchronize: break;
  }
  return 0;
}

// The emulated device work inside each CPU fallback: the copies of its
// arguments and results (and any kernel it launched) run on the stream it
// holds, within its span. A fallback's projection covers its copies, so those
// are not projected again; a kernel inside it keeps its own.
struct NestedInFallbacks {
  std::vector<int64_t> device_ns;  // per activity: for a fallback, the measured device work inside it
  std::vector<bool> folded;        // per activity: a copy inside a fallback

  explicit NestedInFallbacks(const std::vector<tracing::Activity>& activities)
      : device_ns(activities.size(), 0), folded(activities.size(), false) {
    // Per stream, its fallbacks by start: a hold lets nothing else run, so they do not overlap.
    std::map<std::pair<int, int64_t>, std::vector<size_t>> fallbacks;
    for (size_t i = 0; i < activities.size(); ++i) {
      const auto& a = activities[i];
      if (a.kind == tracing::ActivityKind::Fallback) fallbacks[{a.device, a.stream}].push_back(i);
    }
    if (fallbacks.empty()) return;
    auto starts_before = [&](int64_t t, size_t f) { return t < activities[f].start_ns; };
    for (auto& [key, list] : fallbacks) {
      (void)key;
      std::sort(list.begin(), list.end(),
                [&](size_t x, size_t y) { return activities[x].start_ns < activities[y].start_ns; });
    }
    for (size_t i = 0; i < activities.size(); ++i) {
      const auto& a = activities[i];
      if (a.kind != tracing::ActivityKind::Kernel && a.kind != tracing::ActivityKind::Memcpy) continue;
      const auto found = fallbacks.find({a.device, a.stream});
      if (found == fallbacks.end()) continue;
      const auto& list = found->second;
      const auto after = std::upper_bound(list.begin(), list.end(), a.start_ns, starts_before);
      if (after == list.begin()) continue;
      const size_t f = *(after - 1);  // the last fallback that began before it
      if (a.end_ns > activities[f].end_ns) continue;
      device_ns[f] += a.end_ns - a.start_ns;
      folded[i] = a.kind == tracing::ActivityKind::Memcpy;
    }
  }
};

// The last processed session's projections (empty under a profile without a
// cost model), until the next profiler is configured.
std::mutex g_projections_mutex;
std::vector<Projected> g_projections;

void setProjections(std::vector<Projected> projections) {
  std::lock_guard<std::mutex> lock(g_projections_mutex);
  g_projections = std::move(projections);
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
    if (status_ == libkineto::TraceStatus::RECORDING) {  // dropped without stop()
      tracing::setProjecting(false);
      tracing::stop();
    }
  }
  void start() override {
    // Projected onto a chip, the host's own time between launches counts: the
    // runtime keeps device work off the host's threads meanwhile (tracing.h).
    tracing::setProjecting(profile::projectionProfile() != nullptr);
    tracing::start();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    // Queued kernels finish (and report their memory) before the trace ends.
    drainAllStreams();
    tracing::setProjecting(false);
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
    const profile::DeviceProfile* chip = profile::projectionProfile();
    const std::optional<profile::CostModel> cost = chip != nullptr ? chip->cost : std::nullopt;
    std::vector<Projected> projections;
    std::map<std::pair<int, int64_t>, int64_t> chip_stream_end;  // where each stream's projected work ends
    std::set<uint64_t> flow_started;                             // correlation ids whose launch is recorded
    const std::optional<NestedInFallbacks> nested =
        cost ? std::optional<NestedInFallbacks>(std::in_place, activities_) : std::nullopt;
    for (size_t index = 0; index < activities_.size(); ++index) {
      const tracing::Activity& a = activities_[index];
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
        // thread inside the op (as cudaLaunchKernel's does for CUDA). The kernels
        // of one op share its correlation id: the flow starts once, at the first
        // launch (a graph replay's kernels too, as cudaGraphLaunch's do).
        act.flow.id = static_cast<uint32_t>(a.correlation);
        act.flow.type = libkineto::kLinkAsyncCpuGpu;
        act.flow.start = 0;
      }
      if (a.correlation != 0 && a.kind != tracing::ActivityKind::Synchronize &&
          flow_started.insert(a.correlation).second) {
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
      if (cost && a.kind != tracing::ActivityKind::Synchronize && !nested->folded[index]) {
        // In stream order on the chip: no earlier than its launch, after the
        // stream's previous work (activities are recorded as they complete,
        // in each stream's order).
        Projected p;
        p.correlation = a.correlation;
        p.device = a.device;
        p.stream = a.stream;
        p.projected_ns = projectNs(*cost, a, nested->device_ns[index], &p.host_ns);
        p.work = workOf(a);
        p.in_graph = a.in_graph;
        p.host_synchronous = a.host_synchronous;
        p.crosses_link = a.kind == tracing::ActivityKind::Fallback ||
                         (a.kind == tracing::ActivityKind::Memcpy && a.copy_kind != runtime::CopyKind::DeviceToDevice);
        int64_t& stream_end = chip_stream_end[{a.device, a.stream}];
        p.start_ns = std::max(a.launch_ns, stream_end);
        stream_end = p.start_ns + p.projected_ns;
        p.kind = projectedKind(a.kind);
        p.name = act.activityName;
        p.measured_start_ns = a.start_ns;
        act.addMetadata("projected_us", static_cast<double>(p.projected_ns) / 1e3);
        projections.push_back(std::move(p));
      }
      act.log(logger);
    }
    setProjections(std::move(projections));
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
    setProjections({});  // a new profile: the last one's projections are not its
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

std::vector<Projected> lastProjections() {
  std::lock_guard<std::mutex> lock(g_projections_mutex);
  return g_projections;
}

}  // namespace npu::profiler

#include "graph.h"

#include "capture.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <atomic>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "allocator.h"
#include "device.h"
#include "generator.h"
#include "external_event.h"
#include "stream.h"
#include "../runtime/tracing.h"

namespace npu::graph {
namespace {

// A capture in progress: which graph records the work of which stream.
struct Capture {
  Graph* graph;
  c10::DeviceIndex device;
  int64_t stream;
  std::string mode;
  std::thread::id thread;
  std::string invalid;   // what invalidated it (a refused call), "" while it is valid
  bool update = false;   // a task group's update (taskUpdateBegin): records into graph->update_nodes_
};

// Launches check `g_active` first: no lock and no lookup when nothing captures.
std::atomic<int> g_active{0};
std::mutex g_mutex;
std::vector<Capture> g_captures;
thread_local int t_host_work_allowed = 0;
struct StreamKey {
  c10::DeviceIndex device;
  int64_t stream;
  bool operator==(const StreamKey& o) const { return device == o.device && stream == o.stream; }
};
struct StreamKeyHash {
  std::size_t operator()(const StreamKey& k) const { return std::hash<int64_t>()(k.stream * 64 + k.device); }
};
std::unordered_map<const void*, StreamKey> g_event_capture;           // event -> capture it was recorded in
std::unordered_map<StreamKey, StreamKey, StreamKeyHash> g_joined;    // stream -> capture it waited for
std::atomic<int> g_joined_count{0};
std::unordered_set<const Graph*> g_graphs;   // live graphs: what a task group handle may name
std::atomic<uint64_t> g_generation{0};

bool activeCapture(const StreamKey& key) {
  return std::any_of(g_captures.begin(), g_captures.end(),
                     [&](const Capture& c) { return c.device == key.device && c.stream == key.stream; });
}

const char* kRemedy =
    "do it before torch.npu.graph()/capture_begin() or after the capture ends (or capture with "
    "capture_error_mode=\"relaxed\" when it does not depend on the captured work). The capture is invalidated, "
    "as on CUDA: end it (capture_end() raises, nothing is replayed) and capture again without it";

// Node names live as long as the process: a profiler's activities keep the pointer.
const char* intern(const char* name) { return runtime::tracing::intern(name); }

// The capture of this thread's current stream of `device`, or nullptr. Needs g_mutex.
Capture* captureOfCurrentStream(c10::DeviceIndex device) {
  const int64_t stream = currentStream(device).id();
  for (auto& c : g_captures) {
    if (c.device == device && c.stream == stream) return &c;
  }
  return nullptr;
}

}  // namespace

bool anyCapture() { return g_active.load(std::memory_order_acquire) != 0; }

bool currentStreamCapturing(c10::DeviceIndex device) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  return captureOfCurrentStream(device) != nullptr;
}

template <class Fill>
bool Graph::record(c10::DeviceIndex device, Fill fill) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Capture* c = captureOfCurrentStream(device);
  if (c == nullptr) return false;
  Node node;
  fill(node);
  (c->update ? c->graph->update_nodes_ : c->graph->nodes_).push_back(std::move(node));
  return true;
}

bool recordKernel(c10::DeviceIndex device, const char* name, const runtime::Kernel& kernel, std::size_t bytes) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  device = resolveDevice(device);
  refuseIfJoined(device, name);
  return Graph::record(device, [&](Graph::Node& node) {
    node.name = intern(name);
    node.kernel = kernel;
    node.bytes = bytes;
    node.work = runtime::tracing::takeNextWork();
    // Its record comes from outside the graph, maybe after the replay returns.
    node.blocks = std::strcmp(name, "ExternalEvent.wait") == 0;
  });
}

bool recordRandomKernel(c10::DeviceIndex device, const char* name, std::vector<c10::IValue> sources,
                        RandomKernel kernel, std::size_t bytes) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  return Graph::record(resolveDevice(device), [&](Graph::Node& node) {
    node.name = intern(name);
    node.random = std::move(kernel);
    node.sources = std::move(sources);
    node.bytes = bytes;
    node.work = runtime::tracing::takeNextWork();
  });
}

bool recordCopy(c10::DeviceIndex device, void* dst, const void* src, std::size_t n, runtime::CopyKind kind,
                c10::Storage keep) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  return Graph::record(resolveDevice(device), [&](Graph::Node& node) {
    node.name = kind == runtime::CopyKind::HostToDevice   ? "Memcpy HtoD"
                : kind == runtime::CopyKind::DeviceToHost ? "Memcpy DtoH"
                                                          : "Memcpy DtoD";
    node.dst = dst;
    node.src = src;
    node.bytes = n;
    node.kind = kind;
    node.keep = std::move(keep);
  });
}

HostWorkAllowed::HostWorkAllowed() { ++t_host_work_allowed; }
HostWorkAllowed::~HostWorkAllowed() { --t_host_work_allowed; }

bool recordHostWork(c10::DeviceIndex device, const char* name, std::function<void()> work) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  return Graph::record(resolveDevice(device), [&](Graph::Node& node) {
    node.name = intern(name);
    node.host = std::move(work);
  });
}

void checkNotCapturing(c10::DeviceIndex device, const char* what) {
  if (g_active.load(std::memory_order_acquire) == 0 || t_host_work_allowed > 0) return;
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& c : g_captures) {
    if (c.device != device || c.mode == "relaxed") continue;
    if (c.mode == "thread_local" && c.thread != std::this_thread::get_id()) continue;
    if (c.invalid.empty()) c.invalid = what;
    TORCH_CHECK(false, what, " is not permitted while npu:", static_cast<int>(device), " captures a graph (stream ",
                c.stream, ", capture_error_mode=\"", c.mode,
                "\"): a captured graph replays device work only, and this waits for the device or runs on the "
                "host; ", kRemedy, ".");
  }
}

void eventRecorded(const void* event, c10::DeviceIndex device, int64_t stream_id) {
  if (g_active.load(std::memory_order_acquire) == 0) return;   // (tags go when their capture ends)
  std::lock_guard<std::mutex> lock(g_mutex);
  if (activeCapture({device, stream_id})) {
    g_event_capture[event] = {device, stream_id};
  } else if (!g_event_capture.empty()) {
    g_event_capture.erase(event);
  }
}

void eventWaited(const void* event, c10::DeviceIndex device, int64_t stream_id) {
  if (g_active.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_event_capture.find(event);
  if (it == g_event_capture.end() || !activeCapture(it->second) || activeCapture({device, stream_id})) return;
  g_joined[{device, stream_id}] = it->second;
  g_joined_count.store(static_cast<int>(g_joined.size()), std::memory_order_release);
}

void eventDestroyed(const void* event) {
  if (g_active.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_event_capture.erase(event);
}

void refuseIfJoined(c10::DeviceIndex device, const char* what) {
  if (g_joined_count.load(std::memory_order_acquire) == 0) return;
  device = resolveDevice(device);
  const int64_t stream = currentStream(device).id();
  StreamKey capture{};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_joined.find({device, stream});
    if (it == g_joined.end()) return;
    if (!activeCapture(it->second)) {
      g_joined.erase(it);
      g_joined_count.store(static_cast<int>(g_joined.size()), std::memory_order_release);
      return;
    }
    capture = it->second;
  }
  refuseInCapture(capture.device, capture.stream, std::string(what) + " on stream " + std::to_string(stream),
                  "that stream waited for an event of the capturing stream " + std::to_string(capture.stream) +
                  ", so this work belongs to the capture, but npu graphs capture one stream: it would run once, "
                  "now, not at each replay; launch it on the capturing stream");
}

bool streamCapturing(c10::DeviceIndex device, int64_t stream_id) {
  if (g_active.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::any_of(g_captures.begin(), g_captures.end(),
                     [&](const Capture& c) { return c.device == device && c.stream == stream_id; });
}

void refuseInCapture(c10::DeviceIndex device, int64_t stream_id, const std::string& what, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& c : g_captures) {
      if (c.device == device && c.stream == stream_id && c.invalid.empty()) c.invalid = what;
    }
  }
  TORCH_CHECK(false, what, " cannot be captured into an npu graph: ", why, ". The capture is invalidated: end it "
              "(capture_end() raises, nothing is replayed) and capture again without it.");
}

Graph::Graph(bool /*keep_graph*/) {   // the record is kept whatever keep_graph says: replay needs it
  std::lock_guard<std::mutex> lock(g_mutex);
  g_graphs.insert(this);
}

void Graph::capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal: captureBegin(pool, "thread_local"); break;
    case at::GraphCaptureMode::Relaxed: captureBegin(pool, "relaxed"); break;
    default: captureBegin(pool, "global"); break;
  }
}

void Graph::debug_dump(const std::string& path) {
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "NPUGraph.debug_dump: cannot write ", path);
  out << describe();
}

void registerGraphImpl() {
  const std::string key = c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false);
  if (at::GraphImplRegistry()->Has(key)) return;
  at::GraphImplRegistry()->Register(
      key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
        return std::make_unique<Graph>(args);
      });
}

Graph::~Graph() {
  try {
    reset();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_graphs.erase(this);
}

void Graph::captureBegin(c10::MempoolId_t pool, const std::string& mode) {
  TORCH_CHECK(mode == "global" || mode == "thread_local" || mode == "relaxed",
              "NPUGraph.capture_begin: capture_error_mode must be \"global\", \"thread_local\" or \"relaxed\", got \"",
              mode, "\"");
  TORCH_CHECK(!capturing_, "NPUGraph.capture_begin: this graph is already capturing");
  TORCH_CHECK(!captured_, "NPUGraph.capture_begin: this graph holds a capture already: call reset() first");
  const c10::DeviceIndex device = resolveDevice(-1);
  const int64_t stream = currentStream(device).id();
  TORCH_CHECK(stream != 0,
              "NPUGraph.capture_begin: npu:", static_cast<int>(device), " cannot capture on its default stream, as "
              "CUDA cannot: capture on a side stream (torch.npu.graph() uses one; or with torch.npu.stream(s))");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& c : g_captures) {
      TORCH_CHECK(!(c.device == device && c.stream == stream), "NPUGraph.capture_begin: stream ", stream,
                  " of npu:", static_cast<int>(device), " is capturing another graph already");
    }
  }
  // The capture starts after the work queued so far ran: nothing recorded
  // depends on work that a replay would not repeat.
  synchronizeStream(currentStream(device), "NPUGraph.capture_begin");
  pool_ = (pool.first == 0 && pool.second == 0) ? allocator::newPoolId(false) : pool;
  allocator::beginAllocateToPool(device, pool_, [stream](int64_t id) { return id == stream; });
  holds_pool_ = true;
  device_ = device;
  stream_id_ = stream;
  mode_ = mode;
  thread_ = std::this_thread::get_id();
  nodes_.clear();
  published_.reset();
  invalid_.clear();
  groups_.clear();
  open_group_ = SIZE_MAX;
  generation_ = g_generation.fetch_add(1) + 1;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_captures.push_back({this, device, stream, mode, thread_, ""});
  capturing_ = true;
  g_active.fetch_add(1, std::memory_order_release);
}

void Graph::leaveCapture() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& c : g_captures) {
      if (c.graph == this) invalid_ = c.invalid;
    }
    const StreamKey mine{device_, stream_id_};
    for (auto it = g_event_capture.begin(); it != g_event_capture.end();) {
      it = it->second == mine ? g_event_capture.erase(it) : std::next(it);
    }
    for (auto it = g_joined.begin(); it != g_joined.end();) {
      it = it->second == mine ? g_joined.erase(it) : std::next(it);
    }
    g_joined_count.store(static_cast<int>(g_joined.size()), std::memory_order_release);
    g_captures.erase(std::remove_if(g_captures.begin(), g_captures.end(),
                                    [this](const Capture& c) { return c.graph == this && !c.update; }),
                     g_captures.end());
  }
  capturing_ = false;
  g_active.fetch_sub(1, std::memory_order_release);
  allocator::endAllocateToPool(device_, pool_);
}

void Graph::captureEnd() {
  TORCH_CHECK(capturing_, "NPUGraph.capture_end: this graph is not capturing (call capture_begin() first)");
  const int64_t stream = currentStream(device_).id();
  TORCH_CHECK(stream == stream_id_, "NPUGraph.capture_end: the current stream of npu:", static_cast<int>(device_),
              " is ", stream, ", not the capturing stream ", stream_id_, ": end the capture on the stream it began on");
  leaveCapture();
  if (invalid_.empty() && open_group_ != SIZE_MAX) {
    invalid_ = "torch.npu.graph_task_group_begin() without its graph_task_group_end()";
  }
  if (!invalid_.empty()) {
    nodes_.clear();
    groups_.clear();
    open_group_ = SIZE_MAX;
    if (holds_pool_) {   // nothing will replay: the pool's memory goes back
      holds_pool_ = false;
      allocator::releasePool(device_, pool_);
    }
    TORCH_CHECK(false, "NPUGraph.capture_end: the capture was invalidated by ", invalid_,
                ", which a graph cannot replay: nothing was captured; capture again without it");
  }
  captured_ = true;
}

void Graph::replay() {
  TORCH_CHECK(captured_, "NPUGraph.replay: nothing captured (capture_begin() and capture_end() first)");
  TORCH_CHECK(!currentStreamCapturing(device_),
              "NPUGraph.replay: the current stream of npu:", static_cast<int>(device_),
              " is capturing: a replay cannot be captured into another graph");
  TORCH_CHECK(update_group_ == SIZE_MAX, "NPUGraph.replay: task group ", update_group_, " of this graph is being "
              "updated (torch.npu.graph_task_update_begin()): call graph_task_update_end() first");
  checkNotStopped(device_, "NPUGraph.replay");
  auto& stream = currentRuntimeStream(device_);
  releaseRetired(false);
  if (!published_) published_ = std::make_shared<const NodeList>(nodes_);
  const std::shared_ptr<const NodeList> nodes = published_;   // the queued batches keep it
  const c10::DeviceIndex device = device_;
  // One op in a profile (the kernels link to it), and its work is a replay's:
  // a chip runs it without launching each kernel from the host.
  RECORD_FUNCTION("NPUGraph.replay", std::vector<c10::IValue>());
  runtime::tracing::ReplayScope replaying;
  // Consecutive kernels run as one launch; copies are the stream's own; host work
  // runs here, in stream order, as it does eagerly. Random kernels draw now, here.
  // A batch with an ExternalEvent wait never runs on this thread: its record may
  // come from this thread after the replay returns (vllm-ascend's order).
  auto isKernel = [](const Node& n) { return static_cast<bool>(n.kernel) || static_cast<bool>(n.random); };
  auto launchOn = [&stream](const char* name, runtime::Kernel kernel, std::size_t bytes, bool blocks) {
    if (blocks) {
      launchOffThread(stream, name, std::move(kernel), bytes);
    } else {
      stream.launch(name, std::move(kernel), bytes);
    }
  };
  const NodeList& list = *nodes;
  std::size_t i = 0;
  while (i < list.size()) {
    const Node& node = list[i];
    if (node.host) {
      node.host();   // takes the GIL, then holds the stream (module.cpp): never the other way round
      ++i;
      continue;
    }
    if (!isKernel(node)) {
      translateRuntimeErrors("NPUGraph.replay", [&] { stream.copy(node.dst, node.src, node.bytes, node.kind); });
      ++i;
      continue;
    }
    std::size_t end = i;
    std::size_t bytes = 0;
    bool blocks = false;
    while (end < list.size() && isKernel(list[end])) {
      blocks = blocks || list[end].blocks;
      bytes += list[end++].bytes;
    }
    const std::size_t offset = i;
    const std::size_t count = end - i;
    std::shared_ptr<std::vector<std::vector<at::Generator>>> draws;
    for (std::size_t k = 0; k < count; ++k) {
      const Node& n = list[offset + k];
      if (n.sources.empty()) continue;
      if (!draws) draws = std::make_shared<std::vector<std::vector<at::Generator>>>(count);
      for (const auto& source : n.sources) {
        (*draws)[k].push_back(drawFor(source.isGenerator() ? std::optional<at::Generator>(source.toGenerator())
                                                           : std::nullopt,
                                      device_));
      }
    }
    auto run = [nodes, offset, draws](std::size_t k) {
      const Node& n = (*nodes)[offset + k];
      if (n.random) {
        n.random((*draws)[k]);
      } else {
        n.kernel();
      }
    };
    if (C10_UNLIKELY(runtime::tracing::enabled())) {
      // While a profiler records, each kernel is launched (and traced) on its own,
      // named by its op, under the replay's correlation id.
      for (std::size_t k = 0; k < count; ++k) {
        const Node& n = list[offset + k];
        runtime::tracing::setNextWork(n.work);
        translateRuntimeErrors("NPUGraph.replay", [&] {
          launchOn(
              n.name,
              [run, k, device] {
                if (C10_UNLIKELY(anyDeviceStopped()) && deviceStopped(device)) return;  // stop_device: skipped
                at::AutoDispatchBelowADInplaceOrView below_autograd;
                run(k);
              },
              n.bytes, n.blocks);
        });
      }
      i = end;
      continue;
    }
    translateRuntimeErrors("NPUGraph.replay", [&] {
      launchOn(
          "npu.graph_replay",
          [run, count, device] {
            if (C10_UNLIKELY(anyDeviceStopped()) && deviceStopped(device)) return;  // stop_device: skipped
            at::AutoDispatchBelowADInplaceOrView below_autograd;
            for (std::size_t k = 0; k < count; ++k) run(k);
          },
          bytes, blocks);
    });
    i = end;
  }
}

void Graph::releaseRetired(bool all) {
  auto done = [all](const Retired& r) { return all || r.snapshot.use_count() == 1; };
  for (const auto& r : retired_) {
    if (done(r) && (r.pool.first != 0 || r.pool.second != 0)) allocator::releasePool(device_, r.pool);
  }
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(), done), retired_.end());
}

void Graph::reset() {
  if (capturing_) leaveCapture();
  endUpdate();
  if ((!nodes_.empty() || !retired_.empty()) && device_ >= 0) {
    // Queued replays still read the nodes: they go once the device is done.
    translateRuntimeErrors("NPUGraph.reset", [&] { runtimeDevice(device_).synchronize(); });
  }
  nodes_.clear();
  published_.reset();
  releaseRetired(true);   // the device is done: no replay reads them
  for (auto& g : groups_) {
    if (g.update_pool.first != 0 || g.update_pool.second != 0) allocator::releasePool(device_, g.update_pool);
  }
  groups_.clear();
  open_group_ = SIZE_MAX;
  generation_ = 0;
  captured_ = false;
  invalid_.clear();
  if (holds_pool_) {
    holds_pool_ = false;
    allocator::releasePool(device_, pool_);
  }
}

c10::MempoolId_t Graph::pool() const {
  TORCH_CHECK(pool_.first != 0 || pool_.second != 0,
              "NPUGraph.pool: the graph has no pool before capture_begin()");
  return pool_;
}

std::string Graph::describe() const {
  std::ostringstream out;
  out << "npu graph on npu:" << static_cast<int>(device_) << ", " << nodes_.size() << " nodes\n";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    out << "  " << i << ": " << nodes_[i].name << " (" << nodes_[i].bytes << " bytes)\n";
  }
  return out.str();
}

// ---- task groups -------------------------------------------------------------------------

namespace {
const char* kGroupRemedy = "call it on the stream that captures, inside torch.npu.graph(g, stream=s) (or between "
                           "g.capture_begin() and g.capture_end())";

// The (non-update) capture of stream `stream_id` of `device`, or raises naming `what`. Needs g_mutex.
Capture& captureOfStream(c10::DeviceIndex device, int64_t stream_id, const char* what) {
  Capture* found = nullptr;
  for (auto& c : g_captures) {
    if (c.device == device && c.stream == stream_id && !c.update) found = &c;
  }
  TORCH_CHECK(found != nullptr, what, ": stream ", stream_id, " of npu:", static_cast<int>(device),
              " is not capturing a graph; ", kGroupRemedy);
  return *found;
}
}  // namespace

void taskGroupBegin(c10::DeviceIndex device, int64_t stream_id) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  Graph* g = captureOfStream(device, stream_id, "torch.npu.graph_task_group_begin").graph;
  TORCH_CHECK(g->open_group_ == SIZE_MAX, "torch.npu.graph_task_group_begin: stream ", stream_id, " of npu:",
              static_cast<int>(device), " is in a task group already (begun at node ", g->open_group_,
              "): call torch.npu.graph_task_group_end(stream) first; groups do not nest");
  g->open_group_ = g->nodes_.size();
}

TaskGroupHandle taskGroupEnd(c10::DeviceIndex device, int64_t stream_id) {
  device = resolveDevice(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  Graph* g = captureOfStream(device, stream_id, "torch.npu.graph_task_group_end").graph;
  TORCH_CHECK(g->open_group_ != SIZE_MAX, "torch.npu.graph_task_group_end: stream ", stream_id, " of npu:",
              static_cast<int>(device), " has no task group open: call torch.npu.graph_task_group_begin(stream) "
              "on it first");
  g->groups_.push_back({g->open_group_, g->nodes_.size(), {0, 0}});
  g->open_group_ = SIZE_MAX;
  return {g, g->generation_, g->groups_.size() - 1};
}

void taskUpdateBegin(c10::DeviceIndex device, int64_t stream_id, const TaskGroupHandle& handle) {
  device = resolveDevice(device);
  const c10::MempoolId_t pool = allocator::newPoolId(false);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto* g = const_cast<Graph*>(static_cast<const Graph*>(handle.graph));
    TORCH_CHECK(handle.graph != nullptr && g_graphs.count(g) != 0 && (g->captured_ || g->capturing_) &&
                    g->generation_ == handle.generation && handle.group < g->groups_.size(),
                "torch.npu.graph_task_update_begin: the task group handle belongs to a graph that was reset, "
                "captured again or destroyed since graph_task_group_end() returned it; use a handle of the graph's "
                "current capture");
    TORCH_CHECK(g->device_ == device, "torch.npu.graph_task_update_begin: the task group belongs to a graph of npu:",
                static_cast<int>(g->device_), ", the update stream to npu:", static_cast<int>(device),
                "; update it from a stream of the graph's device");
    for (const auto& c : g_captures) {
      TORCH_CHECK(!(c.device == device && c.stream == stream_id),
                  "torch.npu.graph_task_update_begin: stream ", stream_id, " of npu:", static_cast<int>(device),
                  c.update ? " is updating a task group already: call torch.npu.graph_task_update_end(stream) first"
                           : " is capturing a graph: the update stream must be another stream, one that does not "
                             "capture (as on the chip); make one with torch.npu.Stream()");
    }
    TORCH_CHECK(g->captured_, "torch.npu.graph_task_update_begin: the task group's graph is still capturing: "
                "update its task groups after the capture ends (capture_end(), the end of torch.npu.graph())");
    TORCH_CHECK(g->update_group_ == SIZE_MAX, "torch.npu.graph_task_update_begin: task group ", g->update_group_,
                " of this graph is being updated from stream ", g->update_stream_,
                ": call torch.npu.graph_task_update_end() on that stream first");
    g->update_nodes_.clear();
    g->update_group_ = handle.group;
    g->update_stream_ = stream_id;
    g->update_pool_ = pool;
    // This thread's host reads raise while it updates, as in a capture ("thread_local").
    g_captures.push_back({g, device, stream_id, "thread_local", std::this_thread::get_id(), "", true});
    g_active.fetch_add(1, std::memory_order_release);
  }
  // What the update allocates stays reserved for its nodes: a pool of its own.
  allocator::beginAllocateToPool(device, pool, [stream_id](int64_t id) { return id == stream_id; });
}

void Graph::endUpdate() {
  if (update_group_ == SIZE_MAX) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_captures.erase(std::remove_if(g_captures.begin(), g_captures.end(),
                                    [this](const Capture& c) { return c.graph == this && c.update; }),
                     g_captures.end());
  }
  g_active.fetch_sub(1, std::memory_order_release);
  allocator::endAllocateToPool(device_, update_pool_);
  allocator::releasePool(device_, update_pool_);
  update_nodes_.clear();
  update_group_ = SIZE_MAX;
  update_stream_ = -1;
  update_pool_ = {0, 0};
}

void taskUpdateEnd(c10::DeviceIndex device, int64_t stream_id) {
  device = resolveDevice(device);
  Graph* g = nullptr;
  std::string invalid;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& c : g_captures) {
      if (c.device == device && c.stream == stream_id && c.update) {
        g = c.graph;
        invalid = c.invalid;
        c.invalid = "";
      }
    }
  }
  TORCH_CHECK(g != nullptr, "torch.npu.graph_task_update_end: stream ", stream_id, " of npu:",
              static_cast<int>(device), " is not updating a task group: call torch.npu.graph_task_update_begin("
              "stream, handle) on it first");
  if (!invalid.empty()) {
    g->endUpdate();
    TORCH_CHECK(false, "torch.npu.graph_task_update_end: the update was invalidated by ", invalid,
                ", which a graph cannot replay; the task group keeps its previous work: update it again without it");
  }
  // Queued replays read their own snapshot (published_): the edit waits for none of
  // them, so a replay waiting for this update's record (ExternalEvent) cannot hang it.
  g->releaseRetired(false);
  std::vector<Graph::Node> fresh = std::move(g->update_nodes_);
  const c10::MempoolId_t pool = g->update_pool_;
  g->update_nodes_.clear();
  g->update_pool_ = {0, 0};   // the group's now (endUpdate must not release it)
  const std::size_t index = g->update_group_;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_captures.erase(std::remove_if(g_captures.begin(), g_captures.end(),
                                    [g](const Capture& c) { return c.graph == g && c.update; }),
                     g_captures.end());
  }
  g_active.fetch_sub(1, std::memory_order_release);
  allocator::endAllocateToPool(device, pool);
  g->update_group_ = SIZE_MAX;
  g->update_stream_ = -1;
  Graph::Group& group = g->groups_[index];
  const std::size_t old_count = group.end - group.begin;
  const std::size_t new_count = fresh.size();
  g->nodes_.erase(g->nodes_.begin() + static_cast<std::ptrdiff_t>(group.begin),
                  g->nodes_.begin() + static_cast<std::ptrdiff_t>(group.end));
  g->nodes_.insert(g->nodes_.begin() + static_cast<std::ptrdiff_t>(group.begin),
                   std::make_move_iterator(fresh.begin()), std::make_move_iterator(fresh.end()));
  group.end = group.begin + new_count;
  for (auto& other : g->groups_) {   // the groups after it move with its new size
    if (&other != &group && other.begin >= group.begin + old_count) {
      other.begin = other.begin + new_count - old_count;
      other.end = other.end + new_count - old_count;
    }
  }
  // The previous update's memory: released now if no replay read its nodes, else once
  // the queued replays that read them are done.
  if (g->published_) {
    g->retired_.push_back({std::move(g->published_), group.update_pool});
  } else if (group.update_pool.first != 0 || group.update_pool.second != 0) {
    allocator::releasePool(device, group.update_pool);
  }
  group.update_pool = pool;
  g->published_.reset();   // the next replay publishes the new nodes
}

// The primitives ask through capture.h, which does not know this file.
namespace {
const capture::Hooks kCaptureHooks{&anyCapture,   &currentStreamCapturing, &checkNotCapturing, &refuseIfJoined,
                                   &refuseInCapture, &eventRecorded,        &eventWaited,       &eventDestroyed};
const bool kCaptureInstalled = (capture::install(&kCaptureHooks), true);
}  // namespace

}  // namespace npu::graph

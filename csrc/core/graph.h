// Graph capture and replay for the npu, after CUDA graphs: while a stream
// captures, the kernels and asynchronous copies launched on it are recorded
// (their arguments already resolved to device memory) instead of run; a replay
// queues them again, in order, on the current stream, as one launch: no
// Python, no dispatcher, no allocation. Memory allocated on the capturing
// stream comes from the graph's private pool (or a shared pool id) and stays
// reserved until the graph is reset. Ops the npu runs on the host thread are
// recorded with outputs from their Meta kernel (ops/host/native_kernel.cpp); random
// kernels draw at each replay(). What CUDA forbids during capture (waiting for
// the device or a stream, host reads, shapes that depend on data, work forked to
// another stream) raises a clear error and invalidates the capture, as on CUDA.
#pragma once

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <ATen/core/Generator.h>
#include <ATen/core/ivalue.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../runtime/hal.h"
#include "../runtime/tracing.h"

namespace npu::graph {

// Whether the current stream of `device` (this thread's) is capturing.
bool currentStreamCapturing(c10::DeviceIndex device);
// Whether any stream of any device captures (one atomic load): while one does,
// work is launched, never run at once, so that launch() records it or refuses it
// (a stream joined to a capture by an event).
bool anyCapture();

// The launch path: records `kernel` into the capture of this thread's current
// stream of `device` and returns true, or returns false when it is not capturing.
bool recordKernel(c10::DeviceIndex device, const char* name, const runtime::Kernel& kernel, std::size_t bytes);
// A random kernel: `sources` are its draws (an npu Generator, or None for the
// device's default one). At each replay they are drawn on the replaying thread,
// in order, at replay() (as CUDA advances its philox offsets there), and handed
// to the kernel.
using RandomKernel = std::function<void(const std::vector<at::Generator>& draws)>;
bool recordRandomKernel(c10::DeviceIndex device, const char* name, std::vector<c10::IValue> sources,
                        RandomKernel kernel, std::size_t bytes);
// The same for an asynchronous copy (pinned host memory <-> device). `keep`: host
// memory the copy reads or writes, kept alive as long as the graph (a freed pinned
// block must not be reused while a replay may still copy from it).
bool recordCopy(c10::DeviceIndex device, void* dst, const void* src, std::size_t n, runtime::CopyKind kind,
                c10::Storage keep = {});

// Host code that runs device work in stream order (inductor's generated C++
// kernels, called from Python): recorded when the current stream captures, and
// run at replay on the replaying thread, holding the stream (StreamHold), after
// the replay's earlier work, as it runs eagerly. False: not capturing, run it now.
bool recordHostWork(c10::DeviceIndex device, const char* name, std::function<void()> work);

// Events and captures: an event recorded on a capturing stream is tagged with that
// capture; another stream that waits for it joins the capture's work, and work
// launched there while the capture lasts would run once, at capture time, not at
// each replay: it is refused (npu graphs capture one stream). Waits of a capturing
// stream, and events of the same stream, need nothing at replay: one stream keeps order.
void eventRecorded(const void* event, c10::DeviceIndex device, int64_t stream_id);
void eventWaited(const void* event, c10::DeviceIndex device, int64_t stream_id);
void eventDestroyed(const void* event);
// Raises (invalidating the capture) when this thread's current stream of `device`
// joined a capture's work by waiting for one of its events. `what` names the work.
void refuseIfJoined(c10::DeviceIndex device, const char* what);

// Whether stream `stream_id` of `device` is capturing (any thread's).
bool streamCapturing(c10::DeviceIndex device, int64_t stream_id);
// Invalidates the capture of that stream and raises: `what` cannot be captured, `why`.
[[noreturn]] void refuseInCapture(c10::DeviceIndex device, int64_t stream_id, const std::string& what,
                                  const std::string& why);

// Raises when `what` (a wait for the device or a stream, a host read, a host-run
// op) would run while a capture forbids it: in "global" mode any capture on
// `device`, in "thread_local" mode one begun by this thread; "relaxed" forbids nothing.
void checkNotCapturing(c10::DeviceIndex device, const char* what);

// While one lives on this thread, checkNotCapturing lets host work through: for
// work that reads no device data (views, metadata).
class HostWorkAllowed {
 public:
  HostWorkAllowed();
  ~HostWorkAllowed();
  HostWorkAllowed(const HostWorkAllowed&) = delete;
  HostWorkAllowed& operator=(const HostWorkAllowed&) = delete;
};

// Task groups (torch.npu.graph_task_group_begin/end, graph_task_update_begin/end):
// the work a capturing stream records between group begin and end is a group of the
// graph; later, the work launched on another stream between update begin and end is
// recorded, not run, and replaces the group's nodes (same place in the graph), so the
// next replay runs the new launches: new arguments without a new capture. Memory the
// update allocates comes from a pool of its own, kept until the group is updated again
// or the graph is reset. A handle names its group; a reset or a new capture of the
// graph voids it.
struct TaskGroupHandle {
  const void* graph = nullptr;
  uint64_t generation = 0;   // the capture it belongs to
  std::size_t group = 0;     // its index in that capture
};
void taskGroupBegin(c10::DeviceIndex device, int64_t stream_id);
TaskGroupHandle taskGroupEnd(c10::DeviceIndex device, int64_t stream_id);
void taskUpdateBegin(c10::DeviceIndex device, int64_t stream_id, const TaskGroupHandle& handle);
void taskUpdateEnd(c10::DeviceIndex device, int64_t stream_id);

// Also PyTorch's graph interface for the npu: torch.accelerator.Graph (registerGraphImpl).
class Graph final : public at::GraphImplInterface {
 public:
  explicit Graph(bool keep_graph = false);
  explicit Graph(const at::GraphImplArgs& args) : Graph(args.keep_graph) {}
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Captures the work this thread launches on its current stream of the current
  // device. pool {0, 0}: a private pool of its own; otherwise a pool id from
  // graph_pool_handle() or another graph's pool(). mode: "global",
  // "thread_local" or "relaxed" (torch.cuda's capture_error_mode).
  void captureBegin(c10::MempoolId_t pool, const std::string& mode);
  void captureEnd();
  // replay(): queues the recorded work on the current stream of the graph's device.
  // reset(): drops the recorded work and gives the pool back (its memory is freed
  // once no graph or tensor uses it).
  c10::MempoolId_t pool() const override;
  std::size_t size() const { return nodes_.size(); }
  c10::DeviceIndex device() const { return device_; }
  // The recorded work, one line per node (enable_debug_mode/debug_dump).
  std::string describe() const;

  // at::GraphImplInterface (torch.accelerator.Graph). GraphCaptureMode::Default is "global", as on CUDA.
  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override;
  void capture_end() override { captureEnd(); }
  void instantiate() override {}   // a capture is ready to replay as it ends
  void replay() override;
  void reset() override;
  void enable_debug_mode() override {}   // the record is always kept: debug_dump works without it
  void debug_dump(const std::string& path) override;

 private:
  struct Node {
    const char* name = "";       // interned: traces keep the pointer past the graph
    runtime::Kernel kernel;      // empty for a copy and for host work
    std::function<void()> host;  // host work (recordHostWork)
    RandomKernel random;         // a random kernel (recordRandomKernel) and its draws' sources
    std::vector<c10::IValue> sources;
    std::size_t bytes = 0;
    runtime::tracing::Work work; // what a kernel does (its launch's WorkHint), for the profiler at replay
    void* dst = nullptr;         // a copy's
    const void* src = nullptr;
    runtime::CopyKind kind = runtime::CopyKind::HostToDevice;
    c10::Storage keep;           // a copy's pinned host memory
    bool blocks = false;         // may wait for the host's later work (ExternalEvent.wait): never run inline
  };
  using NodeList = std::vector<Node>;
  friend bool recordKernel(c10::DeviceIndex, const char*, const runtime::Kernel&, std::size_t);
  friend bool recordCopy(c10::DeviceIndex, void*, const void*, std::size_t, runtime::CopyKind, c10::Storage);
  friend bool recordHostWork(c10::DeviceIndex, const char*, std::function<void()>);
  friend bool recordRandomKernel(c10::DeviceIndex, const char*, std::vector<c10::IValue>, RandomKernel, std::size_t);
  friend void taskGroupBegin(c10::DeviceIndex, int64_t);
  friend TaskGroupHandle taskGroupEnd(c10::DeviceIndex, int64_t);
  friend void taskUpdateBegin(c10::DeviceIndex, int64_t, const TaskGroupHandle&);
  friend void taskUpdateEnd(c10::DeviceIndex, int64_t);
  void leaveCapture();
  void endUpdate();   // drops an update in progress (taskUpdateBegin) without applying it
  // Appends a node that `fill` fills to the capture of this thread's current stream
  // of `device` (the record* functions); false when that stream is not capturing.
  template <class Fill>
  static bool record(c10::DeviceIndex device, Fill fill);

  std::vector<Node> nodes_;
  // Task groups: [begin, end) of nodes_, and the pool of their latest update.
  struct Group {
    std::size_t begin = 0;
    std::size_t end = 0;
    c10::MempoolId_t update_pool{0, 0};
  };
  std::vector<Group> groups_;
  std::size_t open_group_ = SIZE_MAX;   // where an unfinished group began
  uint64_t generation_ = 0;             // process-unique per capture: voids older handles
  // An update in progress: the nodes it recorded, its group, stream and pool.
  std::vector<Node> update_nodes_;
  std::size_t update_group_ = SIZE_MAX;
  int64_t update_stream_ = -1;
  c10::MempoolId_t update_pool_{0, 0};
  // What replays read: a copy of nodes_ made at the first replay after a capture or
  // an update. Queued replays keep theirs, so an update (which edits nodes_ and
  // drops this) never waits for them, even for one that waits for the update's record.
  std::shared_ptr<const NodeList> published_;
  // Snapshots an update replaced, with the update pool of the group work they read
  // ({0, 0}: none), until no queued replay holds them (releaseRetired, on the graph's
  // own calls): so the last reference never goes on a stream's worker, where a host
  // node's Python objects could not be let go.
  struct Retired {
    std::shared_ptr<const NodeList> snapshot;
    c10::MempoolId_t pool;
  };
  std::vector<Retired> retired_;
  void releaseRetired(bool all);
  c10::DeviceIndex device_ = -1;
  int64_t stream_id_ = 0;
  c10::MempoolId_t pool_{0, 0};
  bool capturing_ = false;
  bool captured_ = false;
  bool holds_pool_ = false;
  std::string mode_ = "global";
  std::string invalid_;   // what invalidated the last capture
  std::thread::id thread_;
};

// Registers Graph as the npu's implementation of PyTorch's graph interface, under
// the name PyTorch looks it up by (the PrivateUse1 backend's, once renamed).
void registerGraphImpl();

}  // namespace npu::graph

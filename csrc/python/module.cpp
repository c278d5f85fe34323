// torch_npu._C: the Python bindings. No logic here: each function exposes one
// C++ call of a lower layer (this is the only file that includes torch/extension.h).
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <chrono>
#include <thread>

#include "../core/allocator.h"
#include "../core/device.h"
#include "../core/external_event.h"
#include "../core/generator.h"
#include "../core/graph.h"
#include "../core/host_allocator.h"
#include "../core/ipc.h"
#include "../core/launch.h"
#include "../core/profile.h"
#include "../profiler/kernel_dump.h"
#include "../profiler/npu_profiler.h"
#include "../ops/fused/custom_dtype.h"
#include "../core/stream.h"
#include "../dispatch/fallback.h"
#include "../dispatch/cpu_kernel.h"
#include "../dispatch/op_names.h"
#include "../distributed/gloo_backend.h"
#include "../dispatch/registry.h"
#include "../ops/host/host_execution.h"
#include "../ops/host/native_kernel.h"

namespace npu {
void registerHooks();  // core/hooks.cpp
}

// torch/csrc/profiler/python/combined_traceback.h declares these (exported by
// libtorch_python), but includes nlohmann/json.hpp, which the wheel does not ship.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void freeDeadCapturedTracebackFrames();
}  // namespace torch


namespace {

namespace py = pybind11;

py::tuple packStream(const c10::Stream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device_index()), static_cast<int>(s.device_type()));
}

c10::Stream unpackStream(int64_t id, int64_t device) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(npu::kNPU, npu::toDeviceIndex(device, /*allow_current=*/false)),
                     id);
}

void bindRuntime(py::module_& m) {
  m.def("_device_count", [] { return static_cast<int>(npu::deviceCount()); });
  m.def("_current_device", [] { return static_cast<int>(npu::currentDevice()); });
  m.def("_set_device", [](int64_t d) { npu::setDevice(npu::toDeviceIndex(d, /*allow_current=*/false)); });
  m.def("_synchronize", [](int64_t d) { npu::synchronizeDevice(npu::toDeviceIndex(d)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_hal_name", [] { return npu::runtime::hal().name(); });
  m.def("_set_sync_debug_mode", [](int mode) { npu::setSyncDebugMode(mode); });
  m.def("_get_sync_debug_mode", [] { return npu::syncDebugMode(); });
  // A bad NPU_HAL / NPU_EMU_* / NPU_LAUNCH_BLOCKING value, or "" (checked at import).
  m.def("_runtime_environment_error", []() -> std::string {
    try {
      npu::runtime::hal();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  });
  m.def("_is_in_bad_fork", [] { return npu::inBadFork(); });
  m.def("_is_initialized", [] { return npu::runtimeInitialized(); });
  m.def("_init", [] { npu::initialize(); });
  // Validates a device index (ints of any size, and torch.device's wrapped ones).
  m.def("_check_device_index", [](int64_t d) { return static_cast<int>(npu::toDeviceIndex(d)); });
  m.def("_device_type", [] { return static_cast<int>(npu::kNPU); });
  // Validates a stream id of an npu device (torch.npu.Stream(stream_id=...)).
  m.def("_check_stream", [](int64_t id, int64_t d) { npu::runtimeStream(unpackStream(id, d)); });
  m.def("_pinned_pending_uses", [] { return npu::pinnedPendingUses(); });
  // The HAL's properties, with the identity of the device profile's chip.
  m.def("_device_properties", [](int64_t d) {
    const auto& hal = npu::runtimeDevice(npu::toDeviceIndex(d)).properties();
    const auto p = npu::profile::deviceProperties(hal.name, hal.total_memory, hal.compute_units);
    py::dict out;
    out["name"] = p.name;
    out["total_memory"] = p.total_memory;
    out["multi_processor_count"] = p.multi_processor_count;
    out["major"] = hal.major;
    out["minor"] = hal.minor;
    out["cube_core_num"] = p.cube_core_num;
    out["vector_core_num"] = p.vector_core_num;
    out["L2_cache_size"] = p.l2_cache_size;
    return out;
  });
  // Device profiles (core/profile.h): torch_npu._profiles reads the files and defines them here.
  m.def("_define_profile", [](py::dict d) {
    npu::profile::DeviceProfile p;
    p.name = d["name"].cast<std::string>();
    p.description = d["description"].cast<std::string>();
    p.device_name = d["device_name"].cast<std::string>();
    if (!d["soc_version"].is_none()) p.soc_version = d["soc_version"].cast<int>();
    p.cube_core_num = d["cube_core_num"].cast<int>();
    p.vector_core_num = d["vector_core_num"].cast<int>();
    p.l2_cache_size = d["L2_cache_size"].cast<int64_t>();
    p.total_memory = d["total_memory"].cast<int64_t>();
    p.bfloat16 = d["bfloat16"].cast<bool>();
    p.inf_nan = d["inf_nan"].cast<bool>();
    if (d.contains("kernel_families") && !d["kernel_families"].is_none()) {
      for (const auto& family : d["kernel_families"]) p.kernel_families.insert(family.cast<std::string>());
    }
    if (!d["native_ops"].is_none()) {
      p.restricts_ops = true;
      for (const auto& name : d["native_ops"]) p.native_ops.insert(name.cast<std::string>());
    }
    if (!d["cost"].is_none()) {
      py::dict c = d["cost"];
      npu::profile::CostModel cost;
      cost.kernel_overhead_us = c["kernel_overhead_us"].cast<double>();
      cost.graph_kernel_overhead_us = c["graph_kernel_overhead_us"].cast<double>();
      cost.cube_fp16_tflops = c["cube_fp16_tflops"].cast<double>();
      cost.cube_fp32_tflops = c["cube_fp32_tflops"].cast<double>();
      cost.cube_int8_tops = c["cube_int8_tops"].cast<double>();
      cost.vector_fp16_tflops = c["vector_fp16_tflops"].cast<double>();
      cost.memory_gbps = c["memory_gbps"].cast<double>();
      cost.link_gbps = c["link_gbps"].cast<double>();
      p.cost = cost;
    }
    npu::profile::define(std::move(p));
  });
  // The last profiling session's projections onto the profile's chip:
  // (correlation, device, stream, start_ns, projected_ns, kind, name, measured_start_ns,
  //  flops, bytes, matrix, bits, known, in_graph, crosses_link, host_ns, host_synchronous).
  m.def("_profiler_projections", [] {
    py::list out;
    for (const auto& p : npu::profiler::lastProjections()) {
      out.append(py::make_tuple(p.correlation, p.device, p.stream, p.start_ns, p.projected_ns, p.kind, p.name,
                                p.measured_start_ns, p.work.flops, p.work.bytes, p.work.matrix,
                                static_cast<int>(p.work.bits), p.work.known, p.in_graph, p.crosses_link, p.host_ns,
                                p.host_synchronous));
    }
    return out;
  });
  m.def("_activate_profile", [](const std::string& name) { npu::profile::activate(name); });
  m.def("_active_profile", [] { return npu::profile::active().name; });
  // The profile the profiler projects onto ("" clears the target: the active profile's).
  m.def("_set_projection_target", [](const std::string& name) { npu::profile::setProjectionTarget(name); });
  m.def("_projection_profile", []() -> py::object {
    const auto* chip = npu::profile::projectionProfile();
    return chip != nullptr ? py::cast(chip->name) : py::none();
  });
  // The device side of the cost model of profile `name` (None: the projection
  // profile's), for torch_npu.profiler's projection onto other chips and for tests: ns.
  m.def("_project_kernel_ns", [](py::object name, double flops, double bytes, bool matrix, int bits, bool known,
                                 bool in_graph) {
    npu::runtime::tracing::Work work;
    work.flops = flops;
    work.bytes = bytes;
    work.matrix = matrix;
    work.bits = static_cast<uint8_t>(bits);
    work.known = known;
    return npu::profile::projectKernelNs(npu::profile::costOf(name.is_none() ? "" : name.cast<std::string>()), work,
                                         in_graph);
  }, py::arg("profile"), py::arg("flops"), py::arg("bytes"), py::arg("matrix") = false, py::arg("bits") = 32,
     py::arg("known") = true, py::arg("in_graph") = false);
  m.def("_project_copy_ns", [](py::object name, double bytes, bool crosses_link, bool in_graph) {
    return npu::profile::projectCopyNs(npu::profile::costOf(name.is_none() ? "" : name.cast<std::string>()), bytes,
                                       crosses_link, in_graph);
  }, py::arg("profile"), py::arg("bytes"), py::arg("crosses_link"), py::arg("in_graph") = false);
  // Kernels for tests of asynchrony and error reporting (torch.npu._sleep, ...).
  m.def("_launch_sleep", [](int64_t d, double ms) {
    npu::launch(npu::toDeviceIndex(d), "npu._sleep", [ms] {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
    }, 0);
  });
  m.def("_launch_failing", [](int64_t d, const std::string& message) {
    npu::launch(npu::toDeviceIndex(d), "npu._launch_failing_kernel",
                [message] { throw std::runtime_error(message); }, 0);
  });
  // The HAL's capabilities of a device (hal.h), as a dict.
  m.def("_device_capabilities", [](int64_t d) {
    const auto caps = npu::runtimeDevice(npu::toDeviceIndex(d)).capabilities();
    py::dict out;
    out["host_addressable"] = caps.host_addressable;
    out["async_streams"] = caps.async_streams;
    out["multiple_streams"] = caps.multiple_streams;
    out["timing_events"] = caps.timing_events;
    out["stream_priorities"] = caps.stream_priorities;
    return out;
  });
  m.def("_mem_get_info", [](int64_t d) {
    std::size_t free = 0, total = 0;
    npu::runtimeDevice(npu::toDeviceIndex(d)).memoryInfo(&free, &total);
    return py::make_tuple(free, total);
  });
}

void bindStreams(py::module_& m) {
  m.def("_current_stream", [](int64_t d) { return packStream(npu::currentStream(npu::toDeviceIndex(d))); });
  m.def("_default_stream", [](int64_t d) { return packStream(npu::defaultStream(npu::toDeviceIndex(d))); });
  // torch.Event.elapsed_time rejects subclasses such as torch.npu.Event.
  m.def("_event_elapsed_time", [](py::handle start, py::handle end) {
    for (auto h : {start, end}) {
      TORCH_CHECK(PyObject_IsInstance(h.ptr(), reinterpret_cast<PyObject*>(&THPEventType)) == 1,
                  "elapsed_time: expected a torch.npu.Event");
    }
    auto& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
    auto& b = reinterpret_cast<THPEvent*>(end.ptr())->event;
    return a.elapsedTime(b);
  });
  m.def("_stream_priority", [](int64_t id, int64_t d) { return npu::runtimeStream(unpackStream(id, d)).priority(); });
  // Stream.npu_stream: the runtime's stream object, as an integer (CUDA's cudaStream_t);
  // ExternalStream finds the stream of such a handle again.
  m.def("_stream_handle", [](int64_t id, int64_t d) {
    return reinterpret_cast<intptr_t>(&npu::runtimeStream(unpackStream(id, d)));
  });
  m.def("_stream_of_handle", [](intptr_t handle, int64_t d) -> int64_t {
    auto& device = npu::runtimeDevice(npu::toDeviceIndex(d));
    for (int64_t id = 0;; ++id) {
      npu::runtime::Stream* stream = nullptr;
      try {
        stream = &device.stream(id);
      } catch (const std::out_of_range&) {
        break;
      }
      if (reinterpret_cast<intptr_t>(stream) == handle) return id;
    }
    throw py::value_error("torch.npu.ExternalStream: " + std::to_string(handle) + " is not the handle of a stream "
                          "of npu:" + std::to_string(d) + " (Stream.npu_stream gives one); the npu runtime can only "
                          "wrap its own streams");
  });
  m.def("_set_stream", [](int64_t id, int64_t d) { npu::exchangeStream(unpackStream(id, d)); });
  // torch_npu.npu.stop_device / torch.npu.restart_device (device.h).
  m.def("_stop_device", [](int64_t d) { npu::stopDevice(npu::toDeviceIndex(d)); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_restart_device", [](int64_t d) { npu::restartDevice(npu::toDeviceIndex(d)); });
  m.def("_device_stopped", [](int64_t d) { return npu::deviceStopped(npu::resolveDevice(npu::toDeviceIndex(d))); });
  // torch._C._storage_Use_Count's twin (trl's activation offloading calls this one on the npu):
  // the use count of the StorageImpl whose address is `cdata` (UntypedStorage._cdata).
  m.def("_storage_Use_Count", [](uintptr_t cdata) -> int64_t {
    TORCH_CHECK(cdata != 0, "torch_npu._C._storage_Use_Count: expected a storage's _cdata, got 0");
    return static_cast<int64_t>(c10::raw::intrusive_ptr::use_count(reinterpret_cast<c10::StorageImpl*>(cdata)));
  });
  // Compiled code (inductor's C++ kernels) runs on the calling thread as work of the
  // current stream: it holds the stream (after the work queued before it, before what
  // other threads launch meanwhile; device memory is the device's to use then), calls
  // the kernel, and lets go. Cheap when the stream is idle. The GIL is kept
  // throughout, as by every op that runs on the host: a holder must never wait for
  // the GIL, or a thread that has it and waits for the stream would wait forever.
  // (device, the kernel's name in the generated code, the kernel, its arguments...); code
  // generated before kernels were named (an inductor cache) passes no name.
  m.def("_run_in_stream_order", [](int64_t d, py::args given) -> py::object {
    const auto device = npu::toDeviceIndex(d);
    const bool named = given.size() > 0 && py::isinstance<py::str>(given[0]);
    TORCH_CHECK(given.size() > (named ? 1 : 0), "torch_npu._C._run_in_stream_order: no kernel to run");
    const std::string kernel_name = named ? given[0].cast<std::string>() : "compiled kernel";
    py::function kernel = given[named ? 1 : 0];
    py::tuple args(given.size() - (named ? 2 : 1));
    for (size_t i = 0; i < args.size(); ++i) args[i] = given[i + (named ? 2 : 1)];
    // What the kernel does, for the profiler and graph capture: the bytes of its tensor
    // arguments (inputs and outputs), an operation per element of the largest.
    const char* name = "compiled kernel";
    npu::runtime::tracing::Work work;
    std::size_t bytes = 0;
    if (C10_UNLIKELY(npu::profile::describingWork())) {
      npu::profile::KernelWork described;
      for (const auto& a : args) {
        if (!THPVariable_Check(a.ptr())) continue;
        const at::Tensor& t = THPVariable_Unpack(a.ptr());
        bytes += npu::bytesOf(t);
        described.flops = std::max(described.flops, static_cast<double>(t.numel()));
        if (c10::isFloatingType(t.scalar_type())) described.dtype = t.scalar_type();
      }
      described.bytes = static_cast<double>(bytes);
      work = npu::profile::describe(described);
      name = npu::runtime::tracing::intern(kernel_name);
    }
    if (C10_UNLIKELY(npu::graph::currentStreamCapturing(device))) {
      // Recorded, and called at each replay by the replaying thread (which released
      // the GIL: the node takes it); the Python objects it keeps are let go under the
      // GIL, whichever thread drops the graph.
      using Call = std::pair<py::function, py::args>;
      std::shared_ptr<Call> call(new Call(kernel, args), [](Call* p) {
        py::gil_scoped_acquire gil;
        delete p;
      });
      npu::graph::recordHostWork(device, name, [call, device, name, work, bytes] {
        py::gil_scoped_acquire gil;   // first the GIL, then the stream: a stream holder never waits for the GIL
        npu::runHostKernel(device, name, work, bytes, [&] { call->first(*call->second); });
      });
      return py::none();
    }
    py::object result;
    npu::runHostKernel(device, name, work, bytes, [&] { result = kernel(*args); });
    return result;
  });
}

void bindGraphs(py::module_& m) {
  using npu::graph::Graph;
  py::class_<Graph>(m, "_NPUGraph")
      .def(py::init<bool>(), py::arg("keep_graph") = false)
      .def("capture_begin",
           [](Graph& g, uint64_t a, uint64_t b, const std::string& mode) {
             g.captureBegin(c10::MempoolId_t(a, b), mode);
           },
           py::call_guard<py::gil_scoped_release>())
      .def("capture_end", &Graph::captureEnd, py::call_guard<py::gil_scoped_release>())
      // Without the GIL: a replay may wait (for a full stream queue, a hold); its host
      // nodes take the GIL themselves (recordHostWork above).
      .def("replay", &Graph::replay, py::call_guard<py::gil_scoped_release>())
      .def("reset", &Graph::reset, py::call_guard<py::gil_scoped_release>())
      .def("pool", [](const Graph& g) { auto p = g.pool(); return py::make_tuple(p.first, p.second); })
      .def("size", &Graph::size)
      .def("describe", &Graph::describe)
      .def("enable_debug_mode", &Graph::enable_debug_mode)
      .def("debug_dump", &Graph::debug_dump);
  // Task groups (graph.h): the handle torch.npu.graph_task_group_end() returns.
  using npu::graph::TaskGroupHandle;
  py::class_<TaskGroupHandle>(m, "_NPUTaskGroupHandle")
      .def_property_readonly("task_group", [](const TaskGroupHandle& h) { return h.group; })
      .def("__repr__", [](const TaskGroupHandle& h) {
        return "<torch_npu._C._NPUTaskGroupHandle task_group=" + std::to_string(h.group) + ">";
      });
  m.def("_graph_task_group_begin", [](int64_t id, int64_t d) {
    npu::graph::taskGroupBegin(npu::toDeviceIndex(d, false), id);
  });
  m.def("_graph_task_group_end", [](int64_t id, int64_t d) {
    return npu::graph::taskGroupEnd(npu::toDeviceIndex(d, false), id);
  });
  m.def("_graph_task_update_begin", [](int64_t id, int64_t d, const TaskGroupHandle& h) {
    npu::graph::taskUpdateBegin(npu::toDeviceIndex(d, false), id, h);
  });
  m.def("_graph_task_update_end", [](int64_t id, int64_t d) {
    npu::graph::taskUpdateEnd(npu::toDeviceIndex(d, false), id);
  }, py::call_guard<py::gil_scoped_release>());
  // torch.npu.ExternalEvent (external_event.h).
  py::class_<npu::ExternalEvent>(m, "_ExternalEvent")
      .def(py::init<>())
      .def("record", [](npu::ExternalEvent& e, int64_t id, int64_t d) { e.record(unpackStream(id, d)); })
      .def("wait", [](npu::ExternalEvent& e, int64_t id, int64_t d) { e.wait(unpackStream(id, d)); },
           py::call_guard<py::gil_scoped_release>())
      .def("reset", [](npu::ExternalEvent& e, int64_t id, int64_t d) { e.reset(unpackStream(id, d)); })
      .def("pending", &npu::ExternalEvent::pending)
      .def_property_readonly("handle", &npu::ExternalEvent::handle);
  // torch.npu.Event(external=True) recorded or waited on a capturing stream: a node
  // that records the event on, or makes wait, the replaying stream at each replay.
  m.def("_graph_event_node", [](py::object event, int64_t id, int64_t d, bool wait) {
    TORCH_CHECK(PyObject_IsInstance(event.ptr(), reinterpret_cast<PyObject*>(&THPEventType)) == 1,
                "torch.npu.Event: expected a torch.npu.Event");
    const c10::Stream stream = unpackStream(id, d);
    const auto device = stream.device_index();
    std::shared_ptr<py::object> keep(new py::object(event), [](py::object* p) {
      py::gil_scoped_acquire gil;
      delete p;
    });
    c10::Event* ev = &reinterpret_cast<THPEvent*>(event.ptr())->event;
    const c10::Stream previous = npu::exchangeStream(stream);
    bool recorded = false;
    try {
      recorded = npu::graph::recordHostWork(device, wait ? "Event.wait (external)" : "Event.record (external)",
                                            [keep, ev, device, wait] {
                                              const c10::Stream now = npu::currentStream(device);
                                              if (wait) {
                                                ev->block(now);
                                              } else {
                                                ev->record(now);
                                              }
                                            });
    } catch (...) {
      npu::exchangeStream(previous);
      throw;
    }
    npu::exchangeStream(previous);
    return recorded;
  });
  m.def("_register_graph_impl", [] { npu::graph::registerGraphImpl(); });
  m.def("_is_current_stream_capturing",
        [](int64_t d) { return npu::graph::currentStreamCapturing(npu::toDeviceIndex(d)); });
}

void bindMemory(py::module_& m) {
  m.def("_memory_stats", [](int64_t d) { return npu::allocator::memoryStats(npu::toDeviceIndex(d)); });
  m.def("_reset_peak_memory_stats", [](int64_t d) { npu::allocator::resetPeakStats(npu::toDeviceIndex(d)); });
  m.def("_reset_accumulated_memory_stats",
        [](int64_t d) { npu::allocator::resetAccumulatedStats(npu::toDeviceIndex(d)); });
  m.def("_memory_summary", [](int64_t d) { return npu::allocator::memorySummary(npu::toDeviceIndex(d)); });
  m.def("_empty_cache", [] { npu::allocator::emptyCache(); }, py::call_guard<py::gil_scoped_release>());
  m.def("_caching_allocator_enable", [](bool enabled) { npu::allocator::setCachingEnabled(enabled); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_caching_allocator_is_enabled", [] { return npu::allocator::cachingEnabled(); });
  // Pluggable allocators: the alloc/free functions' addresses, from ctypes.
  using SegmentSource = npu::allocator::SegmentSource;
  py::class_<SegmentSource, std::shared_ptr<SegmentSource>>(m, "_PluggableAllocator")
      .def(py::init([](uintptr_t alloc, uintptr_t free) {
        TORCH_CHECK(alloc != 0 && free != 0, "NPUPluggableAllocator: the alloc and free functions must not be null");
        auto source = std::make_shared<SegmentSource>();
        source->alloc = reinterpret_cast<SegmentSource::AllocFn>(alloc);
        source->free = reinterpret_cast<SegmentSource::FreeFn>(free);
        return source;
      }));
  m.def("_change_current_allocator", [](std::shared_ptr<SegmentSource> source) {
    npu::allocator::setCurrentSource(std::move(source));
  });
  m.def("_using_pluggable_allocator", [] { return npu::allocator::usingPluggableAllocator(); });
  m.def("_set_pool_allocator", [](uint64_t a, uint64_t b, std::shared_ptr<SegmentSource> source) {
    npu::allocator::setPoolSource(c10::MempoolId_t(a, b), std::move(source));
  });

  // The pinned host allocator: torch.cuda.host_memory_stats_as_nested_dict()'s structure.
  m.def("_host_memory_stats", [] {
    at::HostStats stats;
    {
      py::gil_scoped_release release;
      stats = npu::pinnedHostAllocator()->get_stats();
    }
    auto stat = [](const c10::CachingAllocator::Stat& s) {
      py::dict d;
      d["current"] = s.current;
      d["peak"] = s.peak;
      d["allocated"] = s.allocated;
      d["freed"] = s.freed;
      return d;
    };
    auto duration = [](const c10::CachingAllocator::DurationStat& s) {
      py::dict d;
      d["total"] = s.total;
      d["max"] = s.max;
      d["min"] = s.min;
      d["count"] = s.count;
      d["avg"] = s.count == 0 ? 0 : s.total / s.count;
      return d;
    };
    py::dict result;
    result["num_host_alloc"] = stats.num_host_alloc;
    result["num_host_free"] = stats.num_host_free;
    result["allocations"] = stat(stats.allocations);
    result["allocated_bytes"] = stat(stats.allocated_bytes);
    result["active_requests"] = stat(stats.active_requests);
    result["active_bytes"] = stat(stats.active_bytes);
    result["host_alloc_time"] = duration(stats.host_alloc_time);
    result["host_free_time"] = duration(stats.host_free_time);
    return result;
  });
  m.def("_reset_peak_host_memory_stats", [] { npu::pinnedHostAllocator()->reset_peak_stats(); });
  m.def("_reset_accumulated_host_memory_stats", [] { npu::pinnedHostAllocator()->reset_accumulated_stats(); });
  m.def("_host_empty_cache", [] { npu::pinnedHostAllocator()->empty_cache(); },
        py::call_guard<py::gil_scoped_release>());

  // Private memory pools (torch.npu.MemPool, use_mem_pool).
  using PoolId = c10::MempoolId_t;
  auto poolTuple = [](PoolId id) { return py::make_tuple(id.first, id.second); };
  m.def("_new_pool_id", [poolTuple](bool user_created) { return poolTuple(npu::allocator::newPoolId(user_created)); });
  m.def("_begin_allocate_current_thread_to_pool", [](int64_t d, uint64_t a, uint64_t b) {
    npu::allocator::beginAllocateToPool(npu::toDeviceIndex(d), PoolId(a, b),
                                        [tid = std::this_thread::get_id()](int64_t) {
                                          return std::this_thread::get_id() == tid;
                                        });
  });
  // What a graph capture on `stream` does: that stream's allocations (on any thread) go to the pool.
  m.def("_begin_allocate_stream_to_pool", [](int64_t d, uint64_t a, uint64_t b, int64_t stream) {
    npu::allocator::beginAllocateToPool(npu::toDeviceIndex(d), PoolId(a, b),
                                        [stream](int64_t id) { return id == stream; });
  });
  m.def("_end_allocate_to_pool", [](int64_t d, uint64_t a, uint64_t b) {
    npu::allocator::endAllocateToPool(npu::toDeviceIndex(d), PoolId(a, b));
  });
  m.def("_retain_pool", [](int64_t d, uint64_t a, uint64_t b) {
    npu::allocator::retainPool(npu::toDeviceIndex(d), PoolId(a, b));
  });
  m.def("_release_pool", [](int64_t d, uint64_t a, uint64_t b) {
    npu::allocator::releasePool(npu::toDeviceIndex(d), PoolId(a, b));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_pool_use_count", [](int64_t d, uint64_t a, uint64_t b) {
    return npu::allocator::poolUseCount(npu::toDeviceIndex(d), PoolId(a, b));
  });
  m.def("_pool_reserved_bytes", [](int64_t d, uint64_t a, uint64_t b) {
    return npu::allocator::poolReservedBytes(npu::toDeviceIndex(d), PoolId(a, b));
  });
  m.def("_empty_cache_pool", [](uint64_t a, uint64_t b) { npu::allocator::emptyCache(PoolId(a, b)); },
        py::call_guard<py::gil_scoped_release>());

  // caching_allocator_alloc/delete: on the current device and stream.
  m.def("_caching_allocator_alloc", [](std::size_t size) {
    return reinterpret_cast<uintptr_t>(npu::allocator::rawAlloc(size));
  });
  m.def("_caching_allocator_delete", [](uintptr_t ptr) { npu::allocator::rawDelete(reinterpret_cast<void*>(ptr)); });

  m.def("_set_memory_fraction", [](double fraction, int64_t d) {
    npu::allocator::setMemoryFraction(fraction, npu::toDeviceIndex(d));
  });
  m.def("_get_memory_fraction", [](int64_t d) { return npu::allocator::getMemoryFraction(npu::toDeviceIndex(d)); });

  m.def("_set_allocator_settings", &npu::allocator::setAllocatorSettings);
  m.def("_load_allocator_settings", &npu::allocator::loadAllocatorSettingsFromEnv);
  m.def("_allocator_settings", &npu::allocator::allocatorSettings);

  // _record_memory_history: Python's stacks (and C++'s with cpp_stacks), gathered
  // and symbolized by PyTorch's CapturedTraceback as torch.cuda's are.
  m.def("_record_memory_history", [](bool record_state, bool record_history, int context, bool cpp_stacks,
                                     std::size_t max_entries, bool clear_history) {
    npu::allocator::HistoryOptions options;
    options.record_state = record_state;
    options.record_history = record_history;
    options.context = static_cast<c10::CachingDeviceAllocator::RecordContext>(context);
    options.max_entries = max_entries;
    options.clear_history = clear_history;
    options.gather = cpp_stacks ? +[]() -> std::shared_ptr<c10::GatheredContext> {
      return torch::CapturedTraceback::gather(true, true, true);
    } : +[]() -> std::shared_ptr<c10::GatheredContext> {
      return torch::CapturedTraceback::gather(true, true, false);
    };
    if (context == 0) options.gather = nullptr;
    npu::allocator::recordHistory(options);
  });

  // torch.cuda.memory._snapshot()'s structure, which torch.cuda._memory_viz renders.
  m.def("_memory_snapshot", [poolTuple](uint64_t a, uint64_t b, bool include_traces) {
    npu::allocator::Snapshot snapshot;
    {
      py::gil_scoped_release release;
      snapshot = npu::allocator::snapshot(PoolId(a, b), include_traces);
    }
    std::vector<std::pair<py::dict, torch::CapturedTraceback*>> to_symbolize;
    auto frames = [&](py::dict& entry, const std::shared_ptr<c10::GatheredContext>& context) {
      entry["frames"] = py::list();
      if (auto* traceback = dynamic_cast<torch::CapturedTraceback*>(context.get())) {
        to_symbolize.emplace_back(entry, traceback);
      }
    };
    auto streamId = [](void* stream) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(stream)); };
    py::list segments;
    for (const auto& segment : snapshot.segments) {
      py::dict s;
      s["device"] = static_cast<int>(segment.device);
      s["address"] = segment.address;
      s["total_size"] = segment.total_size;
      s["allocated_size"] = segment.allocated_size;
      s["active_size"] = segment.active_size;
      s["requested_size"] = segment.requested_size;
      s["stream"] = streamId(segment.stream);
      s["segment_type"] = segment.is_large ? "large" : "small";
      s["segment_pool_id"] = poolTuple(segment.owner_private_pool_id);
      s["is_expandable"] = segment.is_expandable;
      frames(s, segment.context_when_allocated);
      py::list blocks;
      std::size_t address = segment.address;
      for (const auto& block : segment.blocks) {
        py::dict b;
        b["address"] = address;
        b["size"] = block.size;
        b["requested_size"] = block.requested_size;
        b["state"] = block.allocated ? "active_allocated" : block.active ? "active_awaiting_free" : "inactive";
        frames(b, block.context_when_allocated);
        blocks.append(b);
        address += block.size;
      }
      s["blocks"] = blocks;
      segments.append(s);
    }
    static const char* actions[] = {"alloc",        "free_requested", "free_completed", "segment_alloc", "segment_free",
                                    "segment_map",  "segment_unmap",  "snapshot",       "oom"};
    py::list device_traces;
    for (const auto& entries : snapshot.device_traces) {
      py::list trace;
      for (const auto& entry : entries) {
        py::dict e;
        e["action"] = actions[entry.action_];
        if (entry.action_ == c10::CachingDeviceAllocator::TraceEntry::OOM) e["device_free"] = entry.addr_;
        else e["addr"] = entry.addr_;
        e["size"] = entry.size_;
        e["stream"] = streamId(entry.stream_);
        e["time_us"] = static_cast<int64_t>(entry.time_.t_);
        e["pool_id"] = poolTuple(entry.mempool_);
        e["compile_context"] = entry.compile_context_;
        e["user_metadata"] = entry.user_metadata_;
        frames(e, entry.context_);
        trace.append(e);
      }
      device_traces.append(trace);
    }
    std::vector<torch::CapturedTraceback*> tracebacks;
    for (auto& [entry, traceback] : to_symbolize) tracebacks.push_back(traceback);
    auto symbolized = torch::py_symbolize(tracebacks);
    for (std::size_t i = 0; i < to_symbolize.size(); ++i) to_symbolize[i].first["frames"] = symbolized[i];
    torch::freeDeadCapturedTracebackFrames();
    py::dict settings;
    for (const auto& [key, value] : npu::allocator::allocatorSettings()) settings[py::str(key)] = value;
    py::dict out;
    out["segments"] = segments;
    out["device_traces"] = device_traces;
    out["allocator_settings"] = settings;
    out["external_annotations"] = py::list();
    return out;
  });

  // Called before an out-of-memory error is raised (OOM_SNAPSHOT_ENABLE's dump).
  m.def("_attach_out_of_memory_observer", [](py::function observer) {
    auto held = std::make_shared<py::object>(std::move(observer));
    npu::allocator::attachOutOfMemoryObserver(
        [held](int64_t device, std::size_t requested, std::size_t reserved, std::size_t device_free) {
          py::gil_scoped_acquire gil;
          try {
            (*held)(device, requested, reserved, device_free);
          } catch (py::error_already_set& error) {
            error.discard_as_unraisable("torch.npu out-of-memory observer");
          }
        });
  });
}

void bindRandom(py::module_& m) {
  m.def("_default_generator", [](int64_t d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(npu::defaultGenerator(npu::toDeviceIndex(d))));
  });
}

npu::dispatch::FallbackMode parseMode(const std::string& mode) {
  try {
    return npu::dispatch::parseFallbackMode(mode);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

npu::dispatch::OpPolicy parsePolicy(const std::string& policy) {
  if (policy == "cpu") return npu::dispatch::OpPolicy::Cpu;
  if (policy == "npu") return npu::dispatch::OpPolicy::Npu;
  if (policy == "default" || policy == "auto") return npu::dispatch::OpPolicy::Default;
  throw py::value_error("'" + policy + "' is not an op fallback policy; use 'cpu' (always run on the cpu), "
                        "'npu' (never fall back) or 'default'");
}

npu::dispatch::FallbackReason parseReason(const std::string& reason) {
  try {
    return npu::dispatch::parseFallbackReason(reason);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

const char* policyName(npu::dispatch::OpPolicy policy) {
  switch (policy) {
    case npu::dispatch::OpPolicy::Cpu: return "cpu";
    case npu::dispatch::OpPolicy::Npu: return "npu";
    default: return "default";
  }
}

py::tuple packResolution(const npu::dispatch::OpResolution& r) {
  return py::make_tuple(r.name, r.backend, r.priority, r.backends);
}

// torch_npu._C._check_custom_op_fallback: see bindDispatch.
void checkCustomOpFallback(const std::string& name, const std::string& reason, const std::string& refused,
                           const std::string& supported, bool announce, py::args args, py::kwargs kwargs) {
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "");
  const torch::jit::Stack stack = torch::jit::createStackForSchema(op.schema(), args, kwargs, std::nullopt);
  const npu::dispatch::DtypeRefusal refusal{refused, supported};
  npu::dispatch::checkFallbackAllowed(op, stack, parseReason(reason), refused.empty() ? nullptr : &refusal,
                                      announce);
}

void bindDispatch(py::module_& m) {
  using npu::dispatch::FallbackPolicy;
  m.def("_fallback_mode", [] { return npu::dispatch::fallbackModeName(FallbackPolicy::instance().mode()); });
  m.def("_set_fallback_mode", [](const std::string& mode) {
    FallbackPolicy::instance().setMode(parseMode(mode));
    FallbackPolicy::instance().resetWarnings();
  });
  m.def("_canonical_op_name", [](const std::string& name) { return npu::dispatch::canonicalOpName(name); });
  m.def("_set_op_fallback", [](const std::string& op, const std::string& policy) {
    const auto parsed = parsePolicy(policy);
    FallbackPolicy::instance().setOpPolicy(npu::dispatch::existingOpName(op), parsed);
  });
  m.def("_op_fallback", [](const std::string& op) {
    if (!FallbackPolicy::instance().hasOpPolicies()) return policyName(npu::dispatch::OpPolicy::Default);
    return policyName(FallbackPolicy::instance().opPolicy(npu::dispatch::canonicalOpName(op).first));
  });
  m.def("_op_fallbacks", [] {
    py::dict out;
    for (const auto& [op, policy] : FallbackPolicy::instance().opPolicies()) out[py::str(op)] = policyName(policy);
    return out;
  });
  m.def("_clear_op_fallbacks", [] { FallbackPolicy::instance().clearOpPolicies(); });
  m.def("_retry_on_kernel_error", [] { return FallbackPolicy::instance().retryOnKernelError(); });
  m.def("_set_retry_on_kernel_error", [](bool on) { FallbackPolicy::instance().setRetryOnKernelError(on); });
  m.def("_load_fallback_environment", [] {
    try {
      FallbackPolicy::instance().loadEnvironment();
    } catch (const std::invalid_argument& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("_fallback_stats", [] {
    py::dict out;
    for (const auto& [op, s] : FallbackPolicy::instance().stats()) {
      out[py::str(op)] = py::make_tuple(s.count, s.kernel_error_retries, s.nanoseconds, s.bytes_to_cpu, s.bytes_to_npu);
    }
    return out;
  });
  m.def("_reset_fallback_stats", [] { FallbackPolicy::instance().resetStats(); });
  // A custom operator's cpu implementation serving npu inputs: the aten ops'
  // decisions (mode, op policy, warning, logger; its warning becomes a Python
  // warning), then its statistics. The copies are made in Python, above
  // autograd, where the implementation runs.
  m.def("_check_custom_op_fallback", torch::wrap_pybind_function(checkCustomOpFallback));
  m.def("_record_fallback", [](const std::string& op, const std::string& reason, int64_t ns, int64_t to_cpu,
                               int64_t to_npu) {
    FallbackPolicy::instance().record(op, parseReason(reason), ns, to_cpu, to_npu);
  });
  m.def("_set_fallback_logger", [](py::object logger) {
    if (logger.is_none()) {
      FallbackPolicy::instance().setLogger(nullptr);
      return;
    }
    // Leaked on purpose: it may be called during interpreter shutdown.
    auto* callable = new py::object(std::move(logger));
    FallbackPolicy::instance().setLogger([callable](const std::string& op, npu::dispatch::FallbackReason reason,
                                                    const std::string& line) {
      py::gil_scoped_acquire gil;
      try {
        (*callable)(op, npu::dispatch::fallbackReasonName(reason), line);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("torch_npu fallback logger");
      }
    });
  });
  // profile: a defined profile's name, or None for the active one.
  m.def("_resolve_op", [](const std::string& name, std::optional<std::string> profile) -> py::object {
    auto chip = profile ? npu::profile::find(*profile) : nullptr;
    auto r = npu::dispatch::resolveOp(name, chip ? *chip : npu::profile::active());
    if (!r) return py::none();
    return packResolution(*r);
  }, py::arg("name"), py::arg("profile") = py::none());
  m.def("_all_ops", [](std::optional<std::string> profile) {
    auto chip = profile ? npu::profile::find(*profile) : nullptr;
    py::list out;
    for (const auto& r : npu::dispatch::allOps(chip ? *chip : npu::profile::active())) out.append(packResolution(r));
    return out;
  }, py::arg("profile") = py::none());
  m.def("_random_ops_given_the_npu_draw", [] { return npu::dispatch::randomOpsGivenTheNpuDraw(); });
  // The npu's floating dtypes ("float32", ...), defined once (csrc/ops/host/dtypes.h).
  m.def("_floating_dtypes", [] {
    std::vector<std::string> names;
    for (auto type : npu::ops::floatingTypes().types()) names.emplace_back(c10::getDtypeNames(type).first);
    return names;
  });
  m.def("_num_native_kernels", [] { return npu::dispatch::numNativeKernels(); });
  m.def("_unmatched_library_names", [] { return npu::ops::unmatchedLibraryNames(); });
  m.def("_vector_math_settled", [] { return npu::ops::settleVectorMathDispatch(); });
}

// torch.multiprocessing and npu tensors (python/torch_npu/_multiprocessing.py), interprocess events.
void bindIpc(py::module_& m) {
  m.def("_ipc_supported", [](int64_t d) { return npu::ipc::supported(npu::toDeviceIndex(d)); });
  m.def("_ipc_share_storage", [](const at::Tensor& t) {
    const auto s = npu::ipc::shareStorage(t.storage());
    return py::make_tuple(s.device, py::bytes(s.handle), s.storage_bytes, s.offset, py::bytes(s.ref_counter_handle),
                          s.ref_counter_slot, py::bytes(s.event_handle), s.event_sync_required);
  });
  m.def("_ipc_open_storage", [](int64_t d, const std::string& handle, std::size_t bytes, std::size_t offset,
                                const std::string& ref_handle, std::size_t slot, const std::string& event_handle,
                                bool event_sync) {
    npu::ipc::SharedStorage s{static_cast<int>(npu::toDeviceIndex(d, false)), handle, bytes, offset, ref_handle,
                              slot, event_handle, event_sync};
    return py::reinterpret_steal<py::object>(THPStorage_Wrap(npu::ipc::openStorage(s)));
  });
  m.def("_ipc_release_counter", [](const std::string& handle, std::size_t slot) {
    npu::ipc::releaseCounter(handle, slot);
  });
  m.def("_ipc_wait_event", [](int64_t d, const std::string& handle) {
    npu::ipc::waitEvent(npu::toDeviceIndex(d, false), handle);
  });
  m.def("_ipc_collect", [] { return npu::ipc::collect(); });
  m.def("_ipc_limbo_count", [] { return npu::ipc::limboCount(); });
  py::class_<npu::runtime::Event, std::shared_ptr<npu::runtime::Event>>(m, "_IpcEvent")
      .def(py::init([](int64_t d) { return npu::ipc::newEvent(npu::toDeviceIndex(d, false)); }))
      .def_static("open", [](int64_t d, const std::string& handle) {
        return npu::ipc::openEvent(npu::toDeviceIndex(d, false), handle);
      })
      .def_property_readonly("device", &npu::runtime::Event::device)
      .def("record", [](npu::runtime::Event& e, int64_t id, int64_t d) { e.record(npu::runtimeStream(unpackStream(id, d))); })
      .def("wait", [](npu::runtime::Event& e, int64_t id, int64_t d) { npu::runtimeStream(unpackStream(id, d)).wait(e); })
      .def("query", &npu::runtime::Event::query)
      .def("synchronize", [](npu::runtime::Event& e) {
        npu::translateRuntimeErrors("Event.synchronize()", [&] { e.synchronize(); });
      }, py::call_guard<py::gil_scoped_release>())
      .def("ipc_handle", [](npu::runtime::Event& e) { return py::bytes(e.ipcHandle()); });
}

void bindDistributed(py::module_& m) {
  // c10d::Backend's Python type exists once torch.distributed has loaded; the
  // npu backend's type derives from it, so torch_npu.distributed makes it then.
  m.def("_init_distributed", [](py::module_ target) {
    using npu::distributed::GlooBackend;
    py::class_<GlooBackend, c10d::Backend, c10::intrusive_ptr<GlooBackend>>(
        target, "GlooBackend", "The c10d backend of npu tensors: Gloo's collectives run by the host, on host-addressable npu memory or on "
        "pinned host copies.")
        .def(py::init<c10::intrusive_ptr<c10d::Backend>, std::string>(), py::arg("gloo"), py::arg("name"))
        .def("get_hccl_comm_name", [](GlooBackend& self, int64_t rank, bool /*init_comm: the group is ready when made*/) {
          TORCH_CHECK_VALUE(rank >= 0, "get_hccl_comm_name(rank): rank must be this process's rank (>= 0), got ", rank);
          return self.commName();
        }, py::arg("rank"), py::arg("init_comm") = true,
        "The group's communicator name (Ascend's ProcessGroupHCCL.get_hccl_comm_name): what the collective ops "
        "(npu_all_gather_base_mm, npu_moe_distribute_dispatch, ...) take as their hcom/group_ep string.");
  });
}

// The kernel dump (torch_npu.npu.init_dump/set_dump/finalize_dump) and torch_npu._C._cd, the
// Ascend adapter's dtype codes (torch_npu.float8_e8m0fnu, ...) and its 8-bit casts.
void bindDumpAndDtypes(py::module_& m) {
  m.def("_npu_initDump", &npu::profiler::dump::init);
  m.def("_npu_setDump", [](const std::string& path, bool inputs, bool outputs, bool op_switch) {
    npu::profiler::dump::set({path, inputs, outputs, op_switch});
  });
  m.def("_npu_finalizeDump", &npu::profiler::dump::finalize, py::call_guard<py::gil_scoped_release>());
  m.def("_dump_state", [] {
    namespace d = npu::profiler::dump;
    return py::make_tuple(d::initialised(), d::active(), d::dumpedCount(), d::currentFolder());
  });

  namespace cd = npu::ops::custom_dtype;
  py::module_ sub = m.def_submodule("_cd", "The Ascend adapter's dtype codes (ACL's aclDataType + 256) and 8-bit casts");
  py::class_<cd::Entry> dtype(sub, "DType", "The Ascend adapter's dtype codes, as read-only integer attributes");
  for (const auto& e : cd::table()) dtype.attr(e.name) = py::int_(e.code());
  sub.def("_names", [] {
    py::list out;
    for (const auto& e : cd::table()) {
      py::object torch_dtype = py::none();
      if (e.torch) torch_dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*e.torch)));
      out.append(py::make_tuple(e.name, e.code(), torch_dtype));
    }
    return out;
  });
  sub.def("_describe", &cd::describe);
  sub.def("cast_to_fp8", &cd::castToFp8, py::arg("input"), py::arg("dtype"));
  sub.def("cast_to_fp8_noalloc", [](const at::Tensor& input, at::Tensor output, int64_t dtype) {
    cd::castToFp8NoAlloc(input, output, dtype);
  }, py::arg("input"), py::arg("output"), py::arg("dtype"));
  sub.def("cast_from_fp8", [](const at::Tensor& input, int64_t itype, py::object otype) {
    // otype: a DType code, or a torch.dtype (its ScalarType)
    const int64_t code = THPDtype_Check(otype.ptr()) ? static_cast<int64_t>(reinterpret_cast<THPDtype*>(otype.ptr())->scalar_type)
                                                     : otype.cast<int64_t>();
    return cd::castFromFp8(input, itype, code);
  }, py::arg("input"), py::arg("itype"), py::arg("otype"));
  sub.def("_hif8_decode", [](int bits) { return cd::hif8Decode(static_cast<uint8_t>(bits)); });
  sub.def("_hif8_encode", [](float x) { return static_cast<int>(cd::hif8Encode(x)); });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  npu::ops::settleVectorMathDispatch();  // before any op runs on two threads
  npu::registerHooks();
  npu::ops::installHostAllocatorRedirect();
  npu::ops::registerOpLibrary();
  npu::ops::makeFusedOpsCapturable();
  bindRuntime(m);
  bindStreams(m);
  bindMemory(m);
  bindGraphs(m);
  bindRandom(m);
  bindDispatch(m);
  bindDistributed(m);
  bindIpc(m);
  bindDumpAndDtypes(m);
}

// The kernel-level dump (ACL's aclmdlInitDump / aclmdlSetDump / aclmdlFinalizeDump, which the
// Ascend adapter exposes as torch_npu.npu.init_dump / set_dump / finalize_dump and msprobe's
// "L2" task calls around one API): while it is set, every kernel the npu runs writes its input
// and output tensors to one file, in CANN's layout and in the binary format that msprobe's
// msaccucmp reads (its "nano" dump: a TLV header, then the inputs' and outputs' bytes).
//
// Where it sees kernels: PyTorch's dispatcher, through an at::RecordFunction callback that is
// registered only while the dump is set (no cost otherwise). Each op on npu tensors that an npu
// kernel or the CPU fallback serves is one kernel (dispatch/registry.h's backend "npu" or "cpu");
// a composite op is not (its parts are), nor is a view, nor an op called inside a dumped one. Its
// inputs are copied in stream order just before it, its outputs just after, by work queued on the
// current stream (core/launch.h), so the values are those the kernel read and wrote.
#pragma once

#include <cstdint>
#include <string>

namespace npu::profiler::dump {

struct Config {
  std::string path;      // "dump_path": files go to {path}/{YYYYmmddHHMMSS}/{device}/
  bool inputs = true;    // "dump_mode": "input", "output" or "all"
  bool outputs = true;
  bool op_switch = true; // "dump_op_switch": "on" dumps single kernels; "off" dumps none (the npu has no graph models)
};

// aclmdlInitDump: raises if already initialised.
void init();
// aclmdlSetDump: needs init(); starts dumping (again) with `config`.
void set(const Config& config);
// aclmdlFinalizeDump: waits for every device, stops dumping; raises the first error a dump met.
void finalize();

bool initialised();
bool active();
// Kernels dumped since the last set(); the folder they went to.
int64_t dumpedCount();
std::string currentFolder();

}  // namespace npu::profiler::dump

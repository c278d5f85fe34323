#include "protection.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace npu::runtime::emu {

namespace {

constexpr int kMaxArenas = 256;  // protected devices alive at once (slots are reused)
constexpr std::size_t kPage = 4096;

// Read by the fault handler: no locks there, only atomics.
struct ArenaRange {
  std::atomic<char*> base{nullptr};
  std::atomic<std::size_t> size{0};
};
ArenaRange g_arenas[kMaxArenas];
std::atomic<int> g_arena_slots{0};  // slots ever used, at most kMaxArenas

std::mutex g_gate_mutex;
int g_open = 0;  // DeviceWork alive (under g_gate_mutex)

struct sigaction g_previous_handler;
std::once_flag g_handler_installed;

// Opening throws when the system refuses (no device work can run then);
// closing only reports it: it runs in destructors, and memory left open only
// catches less.
void protect(char* base, std::size_t size, bool open) {
  if (mprotect(base, size, open ? PROT_READ | PROT_WRITE : PROT_NONE) == 0) return;
  const std::string message = std::string("NPU_EMU_PROTECT: mprotect failed: ") + std::strerror(errno);
  if (open) throw std::runtime_error(message);
  ::write(STDERR_FILENO, message.data(), message.size());
}

// Under g_gate_mutex. Opening stops at the first arena that fails (and
// closes the ones it opened), so a failure leaves every arena closed.
void setEveryArena(bool open) {
  const int slots = g_arena_slots.load();
  for (int i = 0; i < slots; ++i) {
    char* base = g_arenas[i].base.load();
    if (base == nullptr) continue;
    try {
      protect(base, g_arenas[i].size.load(), open);
    } catch (...) {
      for (int j = 0; j < i; ++j) {
        if (char* opened = g_arenas[j].base.load()) protect(opened, g_arenas[j].size.load(), false);
      }
      throw;
    }
  }
}

void writeAll(const char* text) {
  std::size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<std::size_t>(n);
  }
}

// A host access to closed device memory: say what happened, then let the
// handler from before (Python's faulthandler prints the Python stack) or the
// default action take the fault, which recurs when this handler returns.
void onFault(int, siginfo_t* info, void*) {
  const char* address = static_cast<const char*>(info->si_addr);
  const int slots = g_arena_slots.load();
  for (int i = 0; i < slots; ++i) {
    const char* base = g_arenas[i].base.load();
    if (base == nullptr || address < base || address >= base + g_arenas[i].size.load()) continue;
    char hex[2 + 16 + 1] = "0x";
    const auto value = reinterpret_cast<std::uintptr_t>(address);
    for (int d = 0; d < 16; ++d) hex[2 + d] = "0123456789abcdef"[(value >> (60 - 4 * d)) & 0xf];
    hex[18] = '\0';
    writeAll("\nnpu (NPU_EMU_PROTECT=1): the host touched npu memory at ");
    writeAll(hex);
    writeAll(" outside a kernel, a copy or a stream hold. On a device whose memory the host cannot "
             "address this access would be wrong: copy the data to the host (.cpu(), a stream copy) or "
             "run the code as device work in stream order.\n");
    break;
  }
  sigaction(SIGSEGV, &g_previous_handler, nullptr);
}

void installFaultHandler() {
  std::call_once(g_handler_installed, [] {
    struct sigaction action {};
    action.sa_sigaction = &onFault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_handler);
  });
}

std::size_t roundToPage(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

ProtectedArena::ProtectedArena(std::size_t capacity) : capacity_(roundToPage(std::max<std::size_t>(capacity, kPage))) {
  void* memory = mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED) {
    throw std::runtime_error("NPU_EMU_PROTECT: could not reserve " + std::to_string(capacity_) +
                             " bytes of address space: " + std::strerror(errno));
  }
  base_ = static_cast<char*>(memory);
  free_.give(0, capacity_);
  installFaultHandler();
  std::lock_guard<std::mutex> lock(g_gate_mutex);
  int slot = 0;
  const int used = g_arena_slots.load();
  while (slot < used && g_arenas[slot].base.load() != nullptr) ++slot;  // a free one, or the next
  if (slot >= kMaxArenas) {
    munmap(base_, capacity_);
    throw std::runtime_error("NPU_EMU_PROTECT: more than " + std::to_string(kMaxArenas) + " protected devices");
  }
  if (g_open > 0) {  // made while device work runs: open like the others
    try {
      protect(base_, capacity_, true);
    } catch (...) {
      munmap(base_, capacity_);
      throw;
    }
  }
  g_arenas[slot].size.store(capacity_);
  g_arenas[slot].base.store(base_);
  if (slot == used) g_arena_slots.store(used + 1);
}

ProtectedArena::~ProtectedArena() {
  std::lock_guard<std::mutex> lock(g_gate_mutex);
  const int slots = g_arena_slots.load();
  for (int i = 0; i < slots; ++i) {
    if (g_arenas[i].base.load() == base_) g_arenas[i].base.store(nullptr);
  }
  munmap(base_, capacity_);
}

void* ProtectedArena::allocate(std::size_t size) {
  size = roundToPage(std::max<std::size_t>(size, 1));
  std::lock_guard<std::mutex> lock(mutex_);
  const auto offset = free_.take(size);
  return offset ? base_ + *offset : nullptr;
}

void ProtectedArena::free(void* ptr, std::size_t size) {
  size = roundToPage(std::max<std::size_t>(size, 1));
  madvise(ptr, size, MADV_DONTNEED);
  std::lock_guard<std::mutex> lock(mutex_);
  free_.give(static_cast<std::size_t>(static_cast<char*>(ptr) - base_), size);
}

void DeviceWork::begin() {
  std::lock_guard<std::mutex> lock(g_gate_mutex);
  if (g_open == 0) setEveryArena(true);  // throws before counting: the gate stays closed
  ++g_open;
}

void DeviceWork::end() {
  std::lock_guard<std::mutex> lock(g_gate_mutex);
  if (--g_open == 0) setEveryArena(false);
}

DeviceWork::DeviceWork(bool protected_memory) : active_(protected_memory) {
  if (active_) begin();
}

DeviceWork::~DeviceWork() {
  if (active_) end();
}

}  // namespace npu::runtime::emu

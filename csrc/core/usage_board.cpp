#include "usage_board.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace npu::usage_board {
namespace {

// The device ids of ASCEND_RT_VISIBLE_DEVICES, by the rule of torch_npu/_core/env.py: the
// listed ids up to the first that is not a device, each once. Empty: no mask.
std::vector<int> visibleDevices() {
  const char* mask = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  const char* physical = std::getenv("TORCH_NPU_EMU_DEVICES_BEFORE_MASK");
  std::vector<int> visible;
  if (mask == nullptr || physical == nullptr) return visible;
  char* end = nullptr;
  const long count = std::strtol(physical, &end, 10);
  if (end == physical) return visible;
  std::stringstream items(mask);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first == std::string::npos) break;
    item = item.substr(first, last - first + 1);
    if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 9) break;
    const int id = std::stoi(item);
    bool seen = false;
    for (int v : visible) seen = seen || v == id;
    if (id >= count || seen) break;
    visible.push_back(id);
  }
  return visible;
}

std::string directory() {
  if (const char* dir = std::getenv("NPU_EMU_USAGE_DIR"); dir != nullptr && *dir != '\0') return dir;
  const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return base + "/torch_npu-" + std::to_string(getuid());
}

std::string firstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/self/stat (after the command name, which may hold spaces and parentheses).
std::string startTime() {
  const std::string stat = firstLine("/proc/self/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return "0";
  std::stringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field.empty() ? "0" : field;
}

struct Board {
  std::mutex mutex;
  pid_t owner = 0;     // the process that opened `fd` (a forked child opens its own)
  int fd = -1;
  bool off = false;    // could not publish, or the process is exiting
  std::string path, header;
  std::vector<int> visible;
  std::map<int, std::size_t> reserved;   // physical device -> bytes

  bool open() {
    const std::string dir = directory();
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
    owner = getpid();
    path = dir + "/" + std::to_string(owner);
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    std::string name = firstLine("/proc/self/comm");
    if (name.empty()) name = "unknown";
    header = "torch_npu usage 1\npid " + std::to_string(owner) + "\nstart " + startTime() + "\nname " + name + "\n";
    visible = visibleDevices();
    std::atexit([] { remove(); });
    return true;
  }

  void write() {
    std::string text = header;
    for (const auto& [device, bytes] : reserved) text += "npu " + std::to_string(device) + " " + std::to_string(bytes) + "\n";
    text += "end\n";
    // One write from offset 0: a reader sees "end" only after a whole record (a shorter
    // record leaves an old tail after its "end", which readers ignore).
    if (pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) off = true;
  }

  static Board& get() {
    static Board* board = new Board();   // never destroyed: allocators free memory late at exit
    return *board;
  }

  static void remove() {
    Board& board = get();
    std::lock_guard<std::mutex> lock(board.mutex);
    if (board.fd >= 0 && board.owner == getpid()) {
      unlink(board.path.c_str());
      ::close(board.fd);
      board.fd = -1;
    }
    board.off = true;
  }
};

}  // namespace

void reservedChanged(c10::DeviceIndex device, std::size_t reserved) {
  Board& board = Board::get();
  std::lock_guard<std::mutex> lock(board.mutex);
  if (board.off) return;
  if (board.fd >= 0 && board.owner != getpid()) {   // a forked child: its own file
    ::close(board.fd);
    board.fd = -1;
    board.reserved.clear();
  }
  if (board.fd < 0 && !board.open()) {
    board.off = true;
    return;
  }
  const int index = static_cast<int>(device);
  const int physical = index < static_cast<int>(board.visible.size()) ? board.visible[index] : index;
  board.reserved[physical] = reserved;
  board.write();
}

}  // namespace npu::usage_board

// What a host has left for a job (memory_check.hpp): /proc/meminfo and the memory cgroup.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/memory_check.hpp"

namespace a2d {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool readable(const std::string& path) {
  return ::access(path.c_str(), R_OK) == 0;
}

// The number after `key` on the line of `text` that starts with it ("MemAvailable:", or
// "inactive_file " in memory.stat); -1 if there is none.
int64_t keyed_number(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    char* end = nullptr;
    const long long value = std::strtoll(line.c_str() + key.size(), &end, 10);
    if (end == line.c_str() + key.size()) return -1;
    return value;
  }
  return -1;
}

// A field of /proc/self/mountinfo, whose spaces and backslashes are escaped as \040 and \134.
std::string unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string digits = field.substr(i + 1, 3);
      if (digits.size() == 3 && digits.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::strtol(digits.c_str(), nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string word; in >> word;)
    out.push_back(word);
  return out;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, separator))
    out.push_back(item);
  return out;
}

// A memory cgroup hierarchy this process is in: where it is mounted and the process's folder.
struct Hierarchy {
  bool v2 = false;
  std::string mount_point;  // the hierarchy's folder as mounted (under `root`)
  std::string folder;       // the process's cgroup folder (mount_point or below)
};

std::vector<Hierarchy> memory_hierarchies(const std::string& root) {
  // This process's cgroup path in each hierarchy: "ID:CONTROLLERS:PATH" (v2: "0::PATH").
  std::string v1_path, v2_path;
  bool has_v1 = false, has_v2 = false;
  std::istringstream cgroups(read_text(root + "/proc/self/cgroup"));
  for (std::string line; std::getline(cgroups, line);) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      has_v2 = true;
      v2_path = path;
    }
    for (const std::string& c : split(controllers, ',')) {
      if (c == "memory") {
        has_v1 = true;
        v1_path = path;
      }
    }
  }
  // Mounts: "ID PARENT DEV ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS".
  std::vector<Hierarchy> out;
  std::istringstream mounts(read_text(root + "/proc/self/mountinfo"));
  for (std::string line; std::getline(mounts, line);) {
    const std::vector<std::string> f = words(line);
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string fstype = *(dash + 1);
    const std::string super = *(dash + 3);
    bool v2 = false;
    std::string path;
    if (fstype == "cgroup2" && has_v2) {
      v2 = true;
      path = v2_path;
    } else if (fstype == "cgroup" && has_v1) {
      const std::vector<std::string> options = split(super, ',');
      if (std::find(options.begin(), options.end(), "memory") == options.end()) continue;
      path = v1_path;
    } else {
      continue;
    }
    const std::string mount_root = unescape(f[3]);
    const std::string point = root + unescape(f[4]);
    // The process's folder: its path relative to the mount's root (in a cgroup namespace both are
    // "/"); a path outside the mount's root (another namespace's) leaves the mount point.
    std::string relative;
    if (mount_root == "/") {
      relative = path == "/" ? "" : path;
    } else if (path.compare(0, mount_root.size(), mount_root) == 0 &&
               (path.size() == mount_root.size() || path[mount_root.size()] == '/')) {
      relative = path.substr(mount_root.size());
    }
    Hierarchy h;
    h.v2 = v2;
    h.mount_point = point;
    h.folder = point + relative;
    if (!readable(h.folder)) h.folder = point;
    out.push_back(h);
  }
  return out;
}

// The tightest level of `h` from the process's folder up to the mount point: the least limit
// less usage (usage without inactive file pages); false where no level sets a limit.
bool tightest_level(const Hierarchy& h, int64_t& limit, int64_t& usage, std::string& folder) {
  const char* limit_file = h.v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const char* usage_file = h.v2 ? "/memory.current" : "/memory.usage_in_bytes";
  bool found = false;
  int64_t best = 0;
  std::string dir = h.folder;
  while (true) {
    const std::string limit_text = read_text(dir + limit_file);
    const int64_t level_limit = limit_text.empty() ? -1 : parse_cgroup_limit(limit_text);
    if (level_limit >= 0) {
      const std::string usage_text = read_text(dir + usage_file);
      int64_t level_usage = usage_text.empty() ? 0 : std::strtoll(usage_text.c_str(), nullptr, 10);
      const std::string stat = read_text(dir + "/memory.stat");
      int64_t inactive = keyed_number(stat, h.v2 ? "inactive_file " : "total_inactive_file ");
      if (inactive < 0) inactive = keyed_number(stat, "inactive_file ");
      if (inactive > 0) level_usage = std::max<int64_t>(0, level_usage - inactive);
      const int64_t left = std::max<int64_t>(0, level_limit - level_usage);
      if (!found || left < best) {
        found = true;
        best = left;
        limit = level_limit;
        usage = level_usage;
        folder = dir;
      }
    }
    if (dir.size() <= h.mount_point.size()) break;
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos || slash < h.mount_point.size()) {
      dir = h.mount_point;
    } else {
      dir = dir.substr(0, slash);
    }
  }
  return found;
}

}  // namespace

int64_t parse_meminfo_available(const std::string& meminfo) {
  const int64_t available = keyed_number(meminfo, "MemAvailable:");
  if (available >= 0) return available * 1024;
  const int64_t free = keyed_number(meminfo, "MemFree:");
  if (free < 0) return -1;
  const int64_t buffers = keyed_number(meminfo, "Buffers:");
  const int64_t cached = keyed_number(meminfo, "Cached:");
  return 1024 * (free + std::max<int64_t>(0, buffers) + std::max<int64_t>(0, cached));
}

int64_t parse_cgroup_limit(const std::string& text) {
  const size_t start = text.find_first_not_of(" \t\n");
  if (start == std::string::npos || text.compare(start, 3, "max") == 0) return -1;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str() + start, &end, 10);
  if (end == text.c_str() + start || value < 0) return -1;
  // cgroup v1 writes "no limit" as 2^63 - 1 rounded down to a page.
  if (value >= (int64_t{1} << 62)) return -1;
  return value;
}

HostMemory read_host_memory(const std::string& root) {
  HostMemory m;
  m.mem_available = parse_meminfo_available(read_text(root + "/proc/meminfo"));
  for (const Hierarchy& h : memory_hierarchies(root)) {
    int64_t limit = -1, usage = -1;
    std::string folder;
    if (!tightest_level(h, limit, usage, folder)) continue;
    if (m.cgroup_limit < 0 || limit - usage < m.cgroup_limit - m.cgroup_usage) {
      m.cgroup_limit = limit;
      m.cgroup_usage = usage;
      m.cgroup = folder;
    }
  }
  m.available = m.mem_available;
  if (m.cgroup_limit >= 0) {
    const int64_t left = std::max<int64_t>(0, m.cgroup_limit - m.cgroup_usage);
    if (m.available < 0 || left < m.available) m.available = left;
  }
  return m;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string host_memory_key(const std::string& root) {
  std::string id = read_text(root + "/proc/sys/kernel/random/boot_id");
  while (!id.empty() && (id.back() == '\n' || id.back() == ' '))
    id.pop_back();
  return id.empty() ? "host " + host_name() : "boot " + id;
}

}  // namespace a2d

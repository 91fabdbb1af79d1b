// The registry of backends (backend.hpp): one line per backend, each entry made by the backend's
// own folder. make_backend, backend_names and default_device are queries of it.
#include <algorithm>
#include <string>

#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "backends.hpp"

namespace a2d {

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> entries = {
      backends::cpu_backend_entry(),          // cpu/cpu_backend.cpp
      backends::cuda_backend_entry(),         // cuda/cuda_entry.cpp (A2D_WITH_CUDA)
      backends::fenced_backend_entry(false),  // fenced/fenced_backend.cpp
      backends::fenced_backend_entry(true),   // fenced-cuda, the same
      backends::sim_backend_entry(),          // sim/sim_backend.cpp (inside SimGrid only)
  };
  return entries;
}

int BackendEntry::devices() const {
  if (!built || !make) return 0;
  return device_count ? device_count() : 1;
}

const BackendEntry* find_backend(const std::string& device) {
  for (const BackendEntry& entry : backend_registry()) {
    const std::string name = entry.name;
    if (device == name || (entry.takes_ordinal && device.rfind(name + ":", 0) == 0)) return &entry;
  }
  return nullptr;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendEntry& entry : backend_registry()) {
    if (entry.built && entry.make) names.push_back(entry.name);
  }
  return names;
}

std::string default_device(DType dtype) {
  const BackendEntry* best = nullptr;
  for (const BackendEntry& entry : backend_registry()) {
    if (entry.default_rank <= 0 || !entry.capabilities.computes_in(dtype)) continue;
    if (best && entry.default_rank <= best->default_rank) continue;
    if (entry.devices() > 0) best = &entry;
  }
  return best ? best->name : "cpu";
}

DType default_dtype(const std::string& device) {
  const BackendEntry* entry = find_backend(device);
  return entry && !entry->capabilities.dtypes.empty() ? entry->capabilities.dtypes.front()
                                                      : DType::f32;
}

namespace {

// "an NVIDIA GPU" -> "cuda (an NVIDIA GPU)", for the choices of an unknown --device.
std::string choices() {
  std::vector<const BackendEntry*> named;
  for (const BackendEntry& entry : backend_registry()) {
    if (entry.make || !entry.built) named.push_back(&entry);
  }
  std::string out;
  for (size_t i = 0; i < named.size(); ++i) {
    out += i == 0 ? "" : i + 1 == named.size() ? " or " : ", ";
    out += named[i]->name;
    if (*named[i]->summary) out += std::string(" (") + named[i]->summary + ")";
  }
  return out;
}

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& device) {
  const BackendEntry* entry = find_backend(device);
  A2D_REQUIRE(entry && (entry->make || !entry->built), "unknown device '", device, "'; choose ",
              choices());
  const std::string name = entry->name;
  int ordinal = -1;
  if (device != name) {
    const std::string digits = device.substr(name.size() + 1);
    A2D_REQUIRE(!digits.empty() && digits.size() < 6 &&
                    digits.find_first_not_of("0123456789") == std::string::npos,
                "unknown device '", device, "': ", name, ":N takes a ", entry->unit,
                "'s ordinal N");
    ordinal = std::stoi(digits);
  }
  A2D_REQUIRE(entry->built, "--device ", name, ": this build has no ",
              *entry->title ? entry->title : entry->name, " backend (configure with -D",
              entry->build_option, "=ON where ", entry->toolkit,
              " is installed); use --device cpu");
  return entry->make(ordinal);
}

}  // namespace a2d

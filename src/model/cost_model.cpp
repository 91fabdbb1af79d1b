// The alpha-beta-gamma model: machines, calibration files, per-phase costs and the composition of
// phases into forward and backward times per algorithm (docs/cost-model.md).
#include "attention2d/cost_model.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"
#include "model/model_internal.hpp"
#include "table/table.hpp"

namespace a2d {

// ---- Machines ------------------------------------------------------------------------------
//
// Every number below is a datasheet value or a published measurement; docs/cost-model.md cites
// each. Kernel throughput = peak tensor rate x the attention kernel's published efficiency.

std::vector<std::string> preset_names() {
  return {"a100-hdr", "h100-ndr"};
}

Machine preset_machine(const std::string& name, DType dtype) {
  Machine m;
  m.name = name;
  // fp16 runs at the bf16 tensor-core rate on both GPUs.
  const bool bf16 = dtype != DType::f32;
  // NCCL's own latency model (src/graph/tuning.cc, ring/simple): 3.4 us per step over NVLink,
  // 9.6 us over the network.
  m.intra.latency_s = 3.4e-6;
  m.inter.latency_s = 9.6e-6;
  // A100 SXM 80GB and H100 SXM 80GB: 80 GiB of HBM per GPU (nvidia-smi: 81920 MiB on the A100,
  // 81559 MiB on the H100); what attention may use of it is less (--max-memory).
  m.memory_bytes = int64_t{80} << 30;
  m.gpu = true;
  if (name == "a100-hdr") {
    // A100 SXM: 312 TFLOP/s dense bf16, 19.5 TFLOP/s fp32; FlashAttention-2 reaches 73 % of peak
    // forward and 50 % at the low end of its range (we take it for the backward).
    const double peak = bf16 ? 312e12 : 19.5e12;
    m.kernel_forward_flops = 0.73 * peak;
    m.kernel_backward_flops = 0.50 * peak;
    m.intra.bytes_per_s = 300e9;  // NVLink 3: 600 GB/s bidirectional per GPU
    m.inter.bytes_per_s = 25e9;   // one HDR InfiniBand port (200 Gb/s) per GPU
    m.description = "A100 SXM 80 GB, NVLink 3 in the node, one HDR 200 Gb/s port per GPU";
  } else if (name == "h100-ndr") {
    // H100 SXM: 989 TFLOP/s dense bf16, 67 TFLOP/s fp32; FlashAttention-3 reaches 740 TFLOP/s
    // (75 %) forward and 561 TFLOP/s (57 %) backward, its best published figures.
    const double peak = bf16 ? 989e12 : 67e12;
    m.kernel_forward_flops = 0.75 * peak;
    m.kernel_backward_flops = (561.0 / 989.0) * peak;
    m.intra.bytes_per_s = 450e9;  // NVLink 4: 900 GB/s bidirectional per GPU
    m.inter.bytes_per_s = 50e9;   // one NDR InfiniBand port (400 Gb/s) per GPU
    m.description = "H100 SXM 80 GB, NVLink 4 in the node, one NDR 400 Gb/s port per GPU";
  } else if (name == "local") {
    A2D_FAIL("the local machine comes from a calibration file: use local_machine()");
  } else {
    A2D_FAIL("unknown machine '", name, "'; choose local, a100-hdr or h100-ndr");
  }
  return m;
}

// ---- Calibration files -----------------------------------------------------------------------
//
//   # written by a2d calibrate
//   [ranks 4]
//   cores = 2
//   head_dim = 64
//   kernel_forward_gflops = 20.5      (per rank, all ranks computing at once)
//   kernel_backward_gflops = 18.1
//   latency_us = 1.9                  (per message, all ranks exchanging at once)
//   bandwidth_gbs = 3.2

std::string default_calibration_file() {
  const char* env = std::getenv("A2D_CALIBRATION");
  return env && *env ? env : "a2d-calibration.txt";
}

namespace {

std::map<int, std::map<std::string, double>> read_sections(const std::string& file) {
  std::map<int, std::map<std::string, double>> sections;
  std::ifstream in(file);
  if (!in) return sections;
  std::string line;
  int current = -1;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.find('[') != std::string::npos) {
      A2D_REQUIRE(std::sscanf(line.c_str(), " [ranks %d]", &current) == 1, "malformed section '",
                  line, "' in ", file, "; expected [ranks P]");
      continue;
    }
    const auto eq = line.find('=');
    A2D_REQUIRE(eq != std::string::npos && current >= 1, "malformed line '", line, "' in ", file);
    std::string key = line.substr(0, eq);
    key.erase(key.find_last_not_of(" \t") + 1);
    key.erase(0, key.find_first_not_of(" \t"));
    sections[current][key] = std::atof(line.c_str() + eq + 1);
  }
  return sections;
}

}  // namespace

Calibration average_calibrations(const Calibration& a, const Calibration& b) {
  A2D_REQUIRE(a.ranks == b.ranks && a.block == b.block && a.head_dim == b.head_dim,
              "averaging calibrations of different rank counts, blocks or head dims");
  const auto mean = [](double x, double y) { return (x + y) / 2; };
  const auto rate = [](double x, double y) {  // 0: not measured
    if (x == 0) return y;
    if (y == 0) return x;
    return 2 / (1 / x + 1 / y);
  };
  Calibration c = a;
  c.kernel_forward_flops = rate(a.kernel_forward_flops, b.kernel_forward_flops);
  c.kernel_backward_flops = rate(a.kernel_backward_flops, b.kernel_backward_flops);
  c.kernel_forward_causal_flops =
      rate(a.kernel_forward_causal_flops, b.kernel_forward_causal_flops);
  c.kernel_backward_causal_flops =
      rate(a.kernel_backward_causal_flops, b.kernel_backward_causal_flops);
  c.kernel_forward_panel_s = mean(a.kernel_forward_panel_s, b.kernel_forward_panel_s);
  c.kernel_forward_key_s = mean(a.kernel_forward_key_s, b.kernel_forward_key_s);
  c.permute_bytes_per_s = rate(a.permute_bytes_per_s, b.permute_bytes_per_s);
  c.sum_bytes_per_s = rate(a.sum_bytes_per_s, b.sum_bytes_per_s);
  c.merge_bytes_per_s = rate(a.merge_bytes_per_s, b.merge_bytes_per_s);
  c.wait_share = mean(a.wait_share, b.wait_share);
  c.latency_s = mean(a.latency_s, b.latency_s);
  c.bytes_per_s = rate(a.bytes_per_s, b.bytes_per_s);
  c.sync_s = mean(a.sync_s, b.sync_s);
  c.step_sync_s = mean(a.step_sync_s, b.step_sync_s);
  return c;
}

void save_calibration(const std::string& file, const Calibration& c) {
  auto sections = read_sections(file);
  sections[c.ranks] = {{"cores", c.cores},
                       {"head_dim", static_cast<double>(c.head_dim)},
                       {"block", static_cast<double>(c.block)},
                       {"kernel_forward_gflops", c.kernel_forward_flops / 1e9},
                       {"kernel_backward_gflops", c.kernel_backward_flops / 1e9},
                       {"kernel_forward_causal_gflops", c.kernel_forward_causal_flops / 1e9},
                       {"kernel_backward_causal_gflops", c.kernel_backward_causal_flops / 1e9},
                       {"wait_share", c.wait_share},
                       {"latency_us", c.latency_s * 1e6},
                       {"bandwidth_gbs", c.bytes_per_s / 1e9},
                       {"sync_us", c.sync_s * 1e6},
                       {"step_sync_us", c.step_sync_s * 1e6},
                       {"kernel_forward_panel_us", c.kernel_forward_panel_s * 1e6},
                       {"kernel_forward_key_us", c.kernel_forward_key_s * 1e6},
                       {"permute_gbs", c.permute_bytes_per_s / 1e9},
                       {"sum_gbs", c.sum_bytes_per_s / 1e9},
                       {"merge_gbs", c.merge_bytes_per_s / 1e9}};
  const std::string temporary = file + ".tmp";
  {
    std::ofstream out(temporary);
    A2D_REQUIRE(out, "cannot write the calibration file ", file);
    out << "# written by a2d calibrate; one section per rank count. Throughputs are per rank with\n"
           "# every rank computing (or exchanging) at once, so they include the sharing of "
           "cores.\n";
    for (const auto& [ranks, values] : sections) {
      out << "[ranks " << ranks << "]\n";
      for (const auto& [key, value] : values)
        out << key << " = " << value << "\n";
    }
    A2D_REQUIRE(out.good(), "cannot write the calibration file ", file);
  }
  A2D_REQUIRE(std::rename(temporary.c_str(), file.c_str()) == 0, "cannot replace ", file);
}

Machine local_machine(const std::string& file, int ranks) {
  const auto sections = read_sections(file);
  const auto it = sections.find(ranks);
  A2D_REQUIRE(it != sections.end(), "no calibration for ", ranks, " ranks in ", file,
              "; run: mpirun -np ", ranks, " a2d calibrate --out ", file);
  const auto value = [&](const char* key) {
    const auto v = it->second.find(key);
    A2D_REQUIRE(v != it->second.end() && v->second > 0, "the calibration of ", ranks, " ranks in ",
                file, " has no positive '", key, "'; run a2d calibrate again");
    return v->second;
  };
  Machine m;
  m.name = "local";
  m.kernel_forward_flops = value("kernel_forward_gflops") * 1e9;
  m.kernel_backward_flops = value("kernel_backward_gflops") * 1e9;
  // Files written before the causal rates were measured: the rates above (less exact).
  const auto optional = [&](const char* key) {
    const auto v = it->second.find(key);
    return v == it->second.end() ? 0.0 : v->second;
  };
  m.kernel_forward_causal_flops = optional("kernel_forward_causal_gflops") * 1e9;
  m.kernel_backward_causal_flops = optional("kernel_backward_causal_gflops") * 1e9;
  m.tile_block = static_cast<int64_t>(optional("block"));
  m.intra.latency_s = value("latency_us") * 1e-6;
  m.intra.bytes_per_s = value("bandwidth_gbs") * 1e9;
  m.inter = m.intra;  // one node
  m.shared_cores = static_cast<int>(value("cores"));
  // Files from before these were measured: not charged.
  m.sync_s = optional("sync_us") * 1e-6;
  m.step_sync_s = optional("step_sync_us") * 1e-6;
  m.kernel_forward_panel_s = optional("kernel_forward_panel_us") * 1e-6;
  m.kernel_forward_key_s = optional("kernel_forward_key_us") * 1e-6;
  m.permute_bytes_per_s = optional("permute_gbs") * 1e9;
  m.sum_bytes_per_s = optional("sum_gbs") * 1e9;
  m.merge_bytes_per_s = optional("merge_gbs") * 1e9;
  // This node's physical memory, shared by the ranks (all on this node).
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.memory_bytes = static_cast<int64_t>(pages) * page / ranks;
  std::ostringstream text;
  text << "this machine as calibrated at " << ranks << (ranks == 1 ? " rank" : " ranks") << " on "
       << m.shared_cores << (m.shared_cores == 1 ? " core" : " cores") << " (" << file << "), "
       << format_bytes(static_cast<double>(m.memory_bytes)) << " of memory per rank";
  m.description = text.str();
  return m;
}

bool has_calibration(const std::string& file, int ranks) {
  return read_sections(file).count(ranks) > 0;
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  char buffer[32];
  if (unit == 0 || bytes == std::floor(bytes)) {
    std::snprintf(buffer, sizeof buffer, "%.0f %s", bytes, units[unit]);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1f %s", bytes, units[unit]);
  }
  return buffer;
}

// ---- Machine files ---------------------------------------------------------------------------
//
//   # written by scripts/cluster/cluster.sh
//   name = cluster-16x1-100mbit-per-host
//   ranks_per_node = 1
//   shared_link = 1
//   inter_bandwidth_gbs = 0.0125      (100 Mbit/s per direction)
//   inter_latency_us = 60
//   intra_bandwidth_gbs = 3.1
//   intra_latency_us = 2.2
//   kernel_forward_gflops = 4.1 ...   (as in a calibration file)

namespace {

// One machine file's entries: key -> (value text, line), each key once.
struct MachineFileEntries {
  std::string file;
  std::map<std::string, std::pair<std::string, int>> values;

  bool has(const std::string& key) const { return values.count(key) > 0; }
  std::string where(const std::string& key) const {
    const auto it = values.find(key);
    return it == values.end() ? file : file + ":" + std::to_string(it->second.second);
  }
  // A number >= `least` (> 0 where `positive`), or `fallback` when absent and not required.
  double number(const std::string& key, bool required, bool positive, double fallback = 0) const {
    const auto it = values.find(key);
    if (it == values.end()) {
      A2D_REQUIRE(!required, "the machine file ", file, " needs '", key, "'");
      return fallback;
    }
    const std::string& text = it->second.first;
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    A2D_REQUIRE(!text.empty() && end && *end == '\0' && std::isfinite(value), where(key), ": '",
                key, "' needs a number, got '", text, "'");
    A2D_REQUIRE(positive ? value > 0 : value >= 0, where(key), ": '", key, "' must be ",
                positive ? "positive" : ">= 0", ", got ", text);
    return value;
  }
  // A whole number in [least, most].
  int64_t whole(const std::string& key, bool required, int64_t least, int64_t most,
                int64_t fallback = 0) const {
    if (!has(key)) {
      A2D_REQUIRE(!required, "the machine file ", file, " needs '", key, "'");
      return fallback;
    }
    const std::string& text = values.at(key).first;
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    A2D_REQUIRE(!text.empty() && end && *end == '\0' && errno == 0, where(key), ": '", key,
                "' needs a whole number, got '", text, "'");
    A2D_REQUIRE(value >= least && value <= most, where(key), ": '", key, "' must be between ",
                least, " and ", most, ", got ", text);
    return value;
  }
};

// The kernel-rate keys, each also with a dtype suffix (_fp32, _bf16, _fp16).
const char* const kRateKeys[] = {"kernel_forward_gflops", "kernel_backward_gflops",
                                 "kernel_forward_causal_gflops", "kernel_backward_causal_gflops"};
// Keys of the CPU kernels' terms, which a gpu machine file may not give.
const char* const kCpuKeys[] = {"block",
                                "kernel_forward_panel_us",
                                "kernel_forward_key_us",
                                "permute_gbs",
                                "sum_gbs",
                                "merge_gbs",
                                "cores"};
const char* const kOtherKeys[] = {"name",
                                  "device",
                                  "ranks_per_node",
                                  "shared_link",
                                  "intra_latency_us",
                                  "intra_bandwidth_gbs",
                                  "inter_latency_us",
                                  "inter_bandwidth_gbs",
                                  "memory_gib",
                                  "sync_us",
                                  "step_sync_us",
                                  "cyclic_placement"};

bool known_machine_key(const std::string& key) {
  for (const char* k : kOtherKeys)
    if (key == k) return true;
  for (const char* k : kCpuKeys)
    if (key == k) return true;
  for (const char* k : kRateKeys) {
    if (key == k) return true;
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
      if (key == std::string(k) + "_" + dtype_name(dtype)) return true;
  }
  return false;
}

MachineFileEntries read_machine_file(const std::string& file) {
  std::ifstream in(file);
  A2D_REQUIRE(in, "cannot read the machine file ", file);
  MachineFileEntries entries;
  entries.file = file;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto eq = line.find('=');
    A2D_REQUIRE(eq != std::string::npos, file, ":", number, ": expected 'key = value', got '", line,
                "'");
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    const auto trim = [](std::string& text) {
      text.erase(text.find_last_not_of(" \t\r") + 1);
      text.erase(0, text.find_first_not_of(" \t"));
    };
    trim(key);
    trim(value);
    A2D_REQUIRE(known_machine_key(key), file, ":", number, ": unknown key '", key,
                "' in the machine file (docs/cost-model.md, \"Machine files\", lists them)");
    A2D_REQUIRE(!entries.has(key), file, ":", number, ": '", key,
                "' is given twice (first on line ", entries.values[key].second, ")");
    entries.values[key] = {value, number};
  }
  return entries;
}

bool entries_gpu(const MachineFileEntries& entries) {
  A2D_REQUIRE(entries.has("device"), "the machine file ", entries.file,
              " needs 'device' (gpu: a2d's CUDA backend on every rank; cpu: CPU processes)");
  const std::string& device = entries.values.at("device").first;
  A2D_REQUIRE(device == "gpu" || device == "cpu", entries.where("device"),
              ": 'device' is gpu or cpu, got '", device, "'");
  return device == "gpu";
}

}  // namespace

bool machine_file_is_gpu(const std::string& file) {
  return entries_gpu(read_machine_file(file));
}

Machine load_machine_file(const std::string& file, DType dtype) {
  const MachineFileEntries f = read_machine_file(file);
  Machine m;
  m.gpu = entries_gpu(f);
  m.name = f.has("name") ? f.values.at("name").first : "file";
  A2D_REQUIRE(!m.name.empty(), f.where("name"), ": 'name' is empty");
  m.ranks_per_node = static_cast<int>(f.whole("ranks_per_node", true, 1, 1 << 20));
  m.shared_link = f.whole("shared_link", true, 0, 1) == 1;
  m.intra.latency_s = f.number("intra_latency_us", true, false) * 1e-6;
  m.intra.bytes_per_s = f.number("intra_bandwidth_gbs", true, true) * 1e9;
  m.inter.latency_s = f.number("inter_latency_us", true, false) * 1e-6;
  m.inter.bytes_per_s = f.number("inter_bandwidth_gbs", true, true) * 1e9;
  m.memory_bytes =
      static_cast<int64_t>(f.number("memory_gib", true, true) * 1024.0 * 1024.0 * 1024.0);
  // The kernel rates of `dtype`: its own keys, or on a CPU machine the plain ones (the CPU
  // kernels compute in fp32 whatever the inputs' dtype).
  const std::string suffix = std::string("_") + dtype_name(dtype);
  if (m.gpu) {
    for (const char* key : kRateKeys) {
      A2D_REQUIRE(!f.has(key), f.where(key), ": a gpu machine gives its kernel rates per dtype ('",
                  key, "_bf16', '", key,
                  "_fp16', ...): a GPU's tensor-core rates are not its fp32 "
                  "rates");
    }
    for (const char* key : kCpuKeys) {
      A2D_REQUIRE(!f.has(key), f.where(key), ": '", key,
                  "' describes the CPU kernels; this machine file has device = gpu");
    }
  }
  const auto rate = [&](const std::string& key, bool required) {
    if (f.has(key + suffix)) return f.number(key + suffix, true, true) * 1e9;
    if (!m.gpu && f.has(key)) return f.number(key, true, true) * 1e9;
    A2D_REQUIRE(!required, "the machine file ", file, " gives no '", key, suffix, "'",
                m.gpu ? "" : (" (nor '" + key + "' for every dtype)"),
                ": the kernel rate of --dtype ", dtype_name(dtype), " on this machine");
    return 0.0;
  };
  m.kernel_forward_flops = rate("kernel_forward_gflops", true);
  m.kernel_backward_flops = rate("kernel_backward_gflops", true);
  m.kernel_forward_causal_flops = rate("kernel_forward_causal_gflops", false);
  m.kernel_backward_causal_flops = rate("kernel_backward_causal_gflops", false);
  m.tile_block = f.whole("block", false, 0, int64_t{1} << 20);
  m.kernel_forward_panel_s = f.number("kernel_forward_panel_us", false, false) * 1e-6;
  m.kernel_forward_key_s = f.number("kernel_forward_key_us", false, false) * 1e-6;
  m.permute_bytes_per_s = f.number("permute_gbs", false, false) * 1e9;
  m.sum_bytes_per_s = f.number("sum_gbs", false, false) * 1e9;
  m.merge_bytes_per_s = f.number("merge_gbs", false, false) * 1e9;
  m.shared_cores = static_cast<int>(f.whole("cores", false, 0, 1 << 20));
  m.sync_s = f.number("sync_us", false, false) * 1e-6;
  m.step_sync_s = f.number("step_sync_us", false, false) * 1e-6;
  m.cyclic_placement = f.whole("cyclic_placement", false, 0, 1) == 1;
  std::ostringstream text;
  text << "machine file " << file << ": " << (m.gpu ? "GPUs, " : "CPU processes, ")
       << m.ranks_per_node << (m.ranks_per_node == 1 ? " rank" : " ranks") << " per node, "
       << (m.shared_link ? "one shared link per node" : "one link per rank") << " of "
       << (m.inter.bytes_per_s < 125e6 ? m.inter.bytes_per_s * 8 / 1e6
                                       : m.inter.bytes_per_s * 8 / 1e9)
       << (m.inter.bytes_per_s < 125e6 ? " Mbit/s, " : " Gbit/s, ")
       << format_bytes(static_cast<double>(m.memory_bytes)) << " per rank"
       << (m.cyclic_placement ? ", ranks dealt to nodes in turn" : "");
  m.description = text.str();
  return m;
}

Machine with_kernel_rates(const Machine& links, const Machine& kernel) {
  Machine m = kernel;
  m.name = links.name;
  m.intra = links.intra;
  m.inter = links.inter;
  m.shared_link = links.shared_link;
  m.ranks_per_node = links.ranks_per_node;
  m.cyclic_placement = links.cyclic_placement;
  m.shared_cores = links.shared_cores;
  m.memory_bytes = links.memory_bytes;
  m.gpu = links.gpu;
  m.description = links.description + "; kernel rates of " + kernel.description;
  return m;
}

// ---- Communication groups ---------------------------------------------------------------------

namespace {

using model::Group;

// Which communicator a phase uses, from its name (the algorithms' phase names).
Group group_of(const Plan& plan, const std::string& phase) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  return entry.phase_group ? entry.phase_group(phase.substr(phase.find('.') + 1)) : Group::world;
}

// Whether the phase is a blocking operation (a collective, or an exchange the rank waits for
// with nothing to compute meanwhile), which costs the machine's synchronisation once; the ring
// phases of Ring Attention and ATTENTION2D-O move while the ranks compute.
bool blocking_phase(const Plan& plan, const std::string& phase) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  return entry.blocking ? entry.blocking(phase.substr(phase.find('.') + 1)) : true;
}

// The rate at which a phase reduces what it receives (0: it reduces nothing, or the machine does
// not charge it): partial attention results are merged, gradients summed.
double reduction_bytes_per_s(const Machine& machine, const std::string& phase) {
  const std::string step = phase.substr(phase.find('.') + 1);
  if (step == "merge_reduce_scatter" || step == "partial_ring") return machine.merge_bytes_per_s;
  if (step == "dq_reduce_scatter" || step == "dkv_reduce_scatter" || step == "dq_ring" ||
      step == "dkv_ring") {
    return machine.sum_bytes_per_s;
  }
  return 0;
}

// The node of world rank q: q / G with consecutive ranks per node (block placement), or q mod
// (number of nodes) when the launcher deals ranks out to nodes in turn (cyclic placement,
// mpirun --map-by node).
struct NodeOf {
  int ranks_per_node = 1;
  int nodes = 1;
  bool cyclic = false;
  NodeOf(int ranks, int per_node, bool cyclic_placement)
      : ranks_per_node(per_node),
        nodes((ranks + per_node - 1) / per_node),
        cyclic(cyclic_placement) {}
  int operator()(int rank) const { return cyclic ? rank % nodes : rank / ranks_per_node; }
};

// Whether some rank's `group` spans two nodes.
bool crosses_nodes(const Plan& plan, Group group, const NodeOf& node) {
  const int ranks = plan.grid.size(), rows = plan.grid.rows, cols = plan.grid.cols;
  switch (group) {
    case Group::world:
      for (int rank = 1; rank < ranks; ++rank)
        if (node(rank) != node(0)) return true;
      return false;
    case Group::row:
      for (int r = 0; r < rows; ++r) {
        for (int c = 1; c < cols; ++c)
          if (node(GridCoords::rank_of(plan.grid, r, c)) != node(r)) return true;
      }
      return false;
    case Group::column:
      for (int c = 0; c < cols; ++c) {
        for (int r = 1; r < rows; ++r)
          if (node(GridCoords::rank_of(plan.grid, r, c)) != node(c * rows)) return true;
      }
      return false;
    case Group::pair:
      for (int rank = 0; rank < ranks; ++rank) {
        if (node(rank) != node(GridCoords{plan.grid, rank}.kv_dest_rank())) return true;
      }
      return false;
  }
  return true;
}

}  // namespace

namespace {
// An all-to-all over `ranks` world ranks: every rank sends to every other alike, so a node's link
// carries its ranks' off-node share, G·(P − G)/(P − 1) of a rank's bytes for a node of G ranks.
double all_to_all_link_load(int ranks, int ranks_per_node, bool cyclic_placement) {
  const NodeOf node(ranks, ranks_per_node, cyclic_placement);
  double most = 0;
  std::vector<int> members(static_cast<size_t>(node.nodes), 0);
  for (int rank = 0; rank < ranks; ++rank)
    ++members[static_cast<size_t>(node(rank))];
  for (const int count : members) {
    const double local = count;
    if (ranks > 1) most = std::max(most, local * (ranks - local) / (ranks - 1));
  }
  return most;
}
}  // namespace

double shared_link_load(const Plan& plan, const std::string& phase, int ranks_per_node,
                        bool cyclic_placement) {
  A2D_REQUIRE(ranks_per_node >= 1, "ranks per node must be at least 1");
  const int ranks = plan.grid.size(), rows = plan.grid.rows, cols = plan.grid.cols;
  const NodeOf node(ranks, ranks_per_node, cyclic_placement);
  const int nodes = node.nodes;
  const std::string step = phase.substr(phase.find('.') + 1);
  if (step.find("all_to_all") != std::string::npos)
    return all_to_all_link_load(ranks, ranks_per_node, cyclic_placement);
  // The rank each rank sends to: its ring successor in the phase's communicator, or its
  // transpose partner. Over a union of cycles as many sends leave a node as enter it, so the
  // count is the same for either direction.
  const Group group = group_of(plan, phase);
  const auto successor = [&](int rank) {
    const GridCoords at{plan.grid, rank};
    switch (group) {
      case Group::world:
        return (rank + 1) % ranks;
      case Group::row:
        return GridCoords::rank_of(plan.grid, at.row(), (at.col() + 1) % cols);
      case Group::column:
        return GridCoords::rank_of(plan.grid, (at.row() + 1) % rows, at.col());
      case Group::pair:
        return at.kv_dest_rank();
    }
    return rank;
  };
  std::vector<int> leaving(static_cast<size_t>(nodes), 0);
  for (int rank = 0; rank < ranks; ++rank) {
    if (node(successor(rank)) != node(rank)) ++leaving[static_cast<size_t>(node(rank))];
  }
  return *std::max_element(leaving.begin(), leaving.end());
}

namespace {

// Ranks whose traffic is evaluated; the maximum per phase is taken.
std::vector<int> sample_ranks(const Plan& plan) {
  const int ranks = plan.grid.size();
  std::vector<int> sample;
  for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 64))
    sample.push_back(rank);
  sample.push_back(ranks - 1);
  return sample;
}

// ---- Memory per rank (bytes) -----------------------------------------------------------------
//
// The shards the caller keeps plus the largest of the forward's and the backward's transient
// buffers (every buffer the algorithm allocates in the call, as if all were alive at once), with
// tensors in the dtype's element size e and statistics and partial sums in fp32 (the records of
// wire_records). Index arrays (positions, permutations: 8 bytes per gathered row) are left out.

}  // namespace

double model::shard_bytes(const Problem& p, double tokens, bool with_backward) {
  const double b = static_cast<double>(p.batch), d = static_cast<double>(p.head_dim);
  const double h = static_cast<double>(p.heads), hkv = static_cast<double>(p.kv_heads);
  const double e = static_cast<double>(dtype_bytes(p.dtype));
  const double copies = with_backward ? 4 : 2;  // Q, O (dO, dQ); K, V (dK, dV)
  return b * tokens * (e * (copies * h * d + copies * hkv * d) + 4 * h);
}

namespace {

double memory_bytes(const Problem& p, const Plan& plan, bool with_backward) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.memory_bytes) return entry.memory_bytes(p, plan, with_backward);
  A2D_REQUIRE(entry.memory, "no memory model for ", algorithm_name(plan.algorithm));
  model::MemoryTerms terms;
  terms.b = static_cast<double>(p.batch);
  terms.h = static_cast<double>(p.heads);
  terms.hkv = static_cast<double>(p.kv_heads);
  terms.d = static_cast<double>(p.head_dim);
  terms.e = static_cast<double>(dtype_bytes(p.dtype));
  terms.f = 4;
  terms.narrow = p.dtype != DType::f32;  // fp32 sums go through a rounded copy
  terms.ranks = plan.grid.size();
  const TokenLayout layout(entry.traits.cyclic_only ? LayoutKind::cyclic : plan.layout, p.seq,
                           terms.ranks, plan.stripe);
  terms.n = static_cast<double>(layout.max_count());
  terms.big_n = static_cast<double>(p.seq);
  terms.kv_row = terms.b * terms.hkv * 2 * terms.d;  // elements of one [k v] record row
  terms.q_row = terms.b * terms.h * terms.d;         // elements of one query row over the heads
  const model::Transient transient = entry.memory(p, plan, terms);
  return model::shard_bytes(p, terms.n, with_backward) +
         (with_backward ? std::max(transient.forward, transient.backward) : transient.forward);
}

struct Step {
  double latency_s;
  double bytes_per_s;
  double time(double bytes, double messages) const {
    return messages * latency_s + bytes / bytes_per_s;
  }
};

}  // namespace

double permuted_bytes(const Problem& p, const Plan& plan, bool forward) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  if (entry.group_plan) {
    return permuted_bytes(entry.group_problem(p, plan), entry.group_plan(plan), forward);
  }
  if (!p.mask.hides_pairs() || plan.grid.size() == 1) return 0;
  return entry.permuted_bytes ? entry.permuted_bytes(p, plan, forward) : 0;
}

// ---- Prediction ------------------------------------------------------------------------------

namespace {

// predict() without the caller's shards; the hybrid's is predict_hybrid's.
Prediction predict_algorithm(const Problem& problem, const Plan& plan, const Machine& machine,
                             int ranks_per_node) {
  problem.validate();
  check_plan(plan, problem, plan.grid.size());
  A2D_REQUIRE(ranks_per_node >= 1, "ranks per node must be at least 1 (got ", ranks_per_node, ")");
  Prediction out;
  const int ranks = plan.grid.size();
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));

  // Per phase, the most any rank sends (phases synchronise the ranks, so the slowest sets the
  // time); per direction, the rank that sends the most over all phases (the words per rank).
  std::map<std::string, Traffic> phases;
  for (const int rank : sample_ranks(plan)) {
    Traffic forward, backward;
    double words_forward = 0, words_backward = 0;
    for (const auto& [name, t] : predict_traffic(problem, plan, rank)) {
      Traffic& worst = phases[name];
      worst.bytes = std::max(worst.bytes, t.bytes);
      worst.messages = std::max(worst.messages, t.messages);
      const bool is_forward = name.rfind("forward", 0) == 0;
      Traffic& total = is_forward ? forward : backward;
      total.bytes += t.bytes;
      total.messages += t.messages;
      // Words in units of the dtype's element (fp32 statistics count as two bf16 words).
      (is_forward ? words_forward : words_backward) += static_cast<double>(t.bytes) / element_bytes;
    }
    if (forward.bytes > out.forward.bytes) out.words_forward = words_forward;
    if (backward.bytes > out.backward.bytes) out.words_backward = words_backward;
    out.forward.bytes = std::max(out.forward.bytes, forward.bytes);
    out.forward.messages = std::max(out.forward.messages, forward.messages);
    out.backward.bytes = std::max(out.backward.bytes, backward.bytes);
    out.backward.messages = std::max(out.backward.messages, backward.messages);
  }
  std::map<std::string, double> seconds, reducing;
  for (const auto& [name, t] : phases) {
    PhaseCost cost;
    cost.name = name;
    cost.traffic = t;
    cost.inter_node = crosses_nodes(plan, group_of(plan, name),
                                    NodeOf(ranks, ranks_per_node, machine.cyclic_placement));
    const Link& link = cost.inter_node ? machine.inter : machine.intra;
    // A link shared by the ranks of a node carries all of their off-node traffic at once.
    const double load =
        cost.inter_node && machine.shared_link
            ? std::max(1.0, shared_link_load(plan, name, ranks_per_node, machine.cyclic_placement))
            : 1.0;
    const bool blocking = t.messages > 0 && blocking_phase(plan, name);
    // A reduction's words arrive and are reduced in turn: the busiest rank reduces as many words
    // as it sends (one block per ring step each way).
    const double reduce_rate = reduction_bytes_per_s(machine, name);
    reducing[name] = reduce_rate > 0 ? static_cast<double>(t.bytes) / reduce_rate : 0.0;
    cost.seconds = t.messages * link.latency_s +
                   load * static_cast<double>(t.bytes) / link.bytes_per_s +
                   (blocking ? machine.sync_s : 0.0) + reducing[name];
    seconds[name] = cost.seconds;
    out.phases.push_back(cost);
  }
  out.forward_flops = busiest_forward_flops(problem, plan);
  out.backward_flops = 2.5 * out.forward_flops;
  const bool causal = problem.mask.masks_by_position();
  const double forward_rate = causal && machine.kernel_forward_causal_flops > 0
                                  ? machine.kernel_forward_causal_flops
                                  : machine.kernel_forward_flops;
  const double backward_rate = causal && machine.kernel_backward_causal_flops > 0
                                   ? machine.kernel_backward_causal_flops
                                   : machine.kernel_backward_flops;
  double cf = out.forward_flops / forward_rate;
  double cb = out.backward_flops / backward_rate;
  if (machine.tile_block > 0) {
    // The CPU kernels compute whole tiles: charge those, at the rates the calibration block's
    // tiles ran at (its rates count unmasked FLOPs, so divide by the block's own tile ratio).
    // The forward also pays per 24-row panel and per key of every call: the block's time less
    // their share is what its entries cost.
    const TileEntries entries = busiest_tile_entries(problem, plan);
    if (entries.forward >= 0) {
      std::vector<int64_t> block(static_cast<size_t>(machine.tile_block));
      std::iota(block.begin(), block.end(), int64_t{0});
      const double square = static_cast<double>(machine.tile_block * machine.tile_block);
      const double per_entry = 4.0 * static_cast<double>(problem.head_dim);
      const double batch = static_cast<double>(problem.batch);
      const ForwardCallCosts call = forward_call_costs(machine, problem.head_dim);
      cf = batch * (call.entry_s * entries.forward + call.panel_s * entries.forward_panels +
                    call.key_s * entries.forward_keys);
      cb = 2.5 * batch * per_entry * entries.backward /
           (machine.kernel_backward_flops * backward_tile_entries(Mask::none(), block, block) /
            square);
    }
  }
  if (machine.permute_bytes_per_s > 0) {
    cf += permuted_bytes(problem, plan, true) / machine.permute_bytes_per_s;
    cb += permuted_bytes(problem, plan, false) / machine.permute_bytes_per_s;
  }
  out.forward_compute_s = cf;
  out.backward_compute_s = cb;
  // Overlap hides the shorter of computation and communication, unless the ranks share cores
  // that are all busy (then the CPU does both, one after the other).
  model::PhaseTimes times{seconds, reducing, phases};
  times.forward_compute = cf;
  times.backward_compute = cb;
  times.can_overlap = machine.shared_cores == 0 || ranks < machine.shared_cores;
  times.step_sync_s = machine.step_sync_s;
  times.rows = plan.grid.rows;
  times.cols = plan.grid.cols;
  times.ranks = ranks;
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  A2D_REQUIRE(entry.critical_path, "no critical path for ", algorithm_name(plan.algorithm));
  const model::CriticalPath path = entry.critical_path(times);
  out.forward_s = path.forward_s;
  out.backward_s = path.backward_s;
  out.memory_bytes = static_cast<int64_t>(memory_bytes(problem, plan, true));
  return out;
}

// What the exchanges between the caller's shards and a plan's layout move, at one byte per
// token (docs/cost-model.md, "Relayout"): the most tokens any rank sends into the plan's layout
// and out of it, over every rank (each in O(1): what a rank keeps is one shared_tokens), and the
// traffic of a sample of ranks (each O(P)): every rank up to 64 ranks, else every P/64-th, the
// last and the ranks that send the most. Depends on the two layouts only, so the plan search
// counts it once per plan layout.
struct RelayoutCounts {
  bool moves_nothing = true;
  int64_t most_in = 0, most_out = 0;
  std::vector<int> sample;
  std::vector<Traffic> in, out;  // per sampled rank, one byte per token
};

RelayoutCounts relayout_counts(const TokenLayout& user, const TokenLayout& planned) {
  RelayoutCounts c;
  if (same_assignment(user, planned)) return c;
  c.moves_nothing = false;
  const int ranks = static_cast<int>(user.parts());
  int busiest_in = 0, busiest_out = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const int64_t in = user.count(rank) - shared_tokens(user, rank, planned, rank);
    const int64_t back = planned.count(rank) - shared_tokens(planned, rank, user, rank);
    if (in > c.most_in) c.most_in = in, busiest_in = rank;
    if (back > c.most_out) c.most_out = back, busiest_out = rank;
  }
  for (int rank = 0; rank < ranks; rank += std::max(1, ranks / 64))
    c.sample.push_back(rank);
  c.sample.insert(c.sample.end(), {ranks - 1, busiest_in, busiest_out});
  std::sort(c.sample.begin(), c.sample.end());
  c.sample.erase(std::unique(c.sample.begin(), c.sample.end()), c.sample.end());
  for (const int rank : c.sample) {
    c.in.push_back(exchange_traffic(user, planned, rank, 1));
    c.out.push_back(exchange_traffic(planned, user, rank, 1));
  }
  return c;
}

void require_shards_fit(const Problem& problem, const Plan& plan, const TokenLayout& user) {
  A2D_REQUIRE(user.tokens() == problem.seq && user.parts() == plan.ranks(), "the shards' layout (",
              user.describe(), ") must split the problem's ", problem.seq,
              " tokens over the plan's ", plan.ranks(), " ranks");
}

// Memory the exchanges add (docs/cost-model.md, "Relayout"): the caller's shards beside the
// plan's (which memory_bytes counts as the shards), and the largest exchange's send and receive
// records. 0 where every rank holds the same tokens in both layouts.
double relayout_memory_bytes(const Problem& problem, const Plan& plan, const UserShards& shards,
                             bool with_backward) {
  const TokenLayout planned_layout = plan_layout(problem, plan);
  if (same_assignment(shards.layout, planned_layout)) return 0;
  const RelayoutRecords records = relayout_records(problem, shards.backward);
  const double own = static_cast<double>(shards.layout.max_count());
  const double planned = static_cast<double>(planned_layout.max_count());
  const double largest =
      static_cast<double>(with_backward ? std::max({records.forward_in, records.forward_out,
                                                    records.backward_in, records.backward_out})
                                        : std::max(records.forward_in, records.forward_out));
  return model::shard_bytes(problem, own, with_backward) + largest * (own + planned);
}

// The exchanges added to `out`: per phase the most bytes any rank sends (exact) and the most
// messages (over the sample); the busiest rank's totals per direction, the algorithm's and the
// exchanges' together, over the same sample. Time as an all-to-all of the world: the inter-node
// link once the ranks span nodes, a shared link carrying its node's off-node share, the machine's
// synchronisation once.
void add_relayout(Prediction& out, const Problem& problem, const Plan& plan, const Machine& machine,
                  int ranks_per_node, const UserShards& shards, const RelayoutCounts& counts) {
  if (counts.moves_nothing) return;
  const RelayoutRecords records = relayout_records(problem, shards.backward);
  const int ranks = plan.ranks();
  struct Exchange {
    const char* phase;
    bool into_plan;  // user -> plan (else plan -> user)
    int64_t record;
  };
  const Exchange exchanges[4] = {{kRelayoutForwardIn, true, records.forward_in},
                                 {kRelayoutForwardOut, false, records.forward_out},
                                 {kRelayoutBackwardIn, true, records.backward_in},
                                 {kRelayoutBackwardOut, false, records.backward_out}};
  const auto keep_most = [](Traffic& most, const Traffic& t) {
    most.bytes = std::max(most.bytes, t.bytes);
    most.messages = std::max(most.messages, t.messages);
  };
  std::map<std::string, Traffic> worst;
  Traffic forward_total, backward_total;
  for (size_t i = 0; i < counts.sample.size(); ++i) {
    Traffic forward, backward;
    for (const auto& [name, t] : predict_traffic(problem, plan, counts.sample[i])) {
      Traffic& total = name.rfind("forward", 0) == 0 ? forward : backward;
      total.bytes += t.bytes;
      total.messages += t.messages;
    }
    Traffic moved_forward, moved_backward;
    for (const Exchange& x : exchanges) {
      const Traffic& tokens = x.into_plan ? counts.in[i] : counts.out[i];
      const Traffic t{tokens.bytes * x.record, x.record > 0 ? tokens.messages : 0};
      Traffic& mine = x.phase[0] == 'f' ? moved_forward : moved_backward;
      mine.bytes += t.bytes;
      mine.messages += t.messages;
      worst[x.phase].messages = std::max(worst[x.phase].messages, t.messages);
    }
    forward.bytes += moved_forward.bytes;
    forward.messages += moved_forward.messages;
    backward.bytes += moved_backward.bytes;
    backward.messages += moved_backward.messages;
    keep_most(forward_total, forward);
    keep_most(backward_total, backward);
    keep_most(out.relayout_forward, moved_forward);
    keep_most(out.relayout_backward, moved_backward);
  }
  keep_most(out.forward, forward_total);
  keep_most(out.backward, backward_total);
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));
  out.words_forward = static_cast<double>(out.forward.bytes) / element_bytes;
  out.words_backward = static_cast<double>(out.backward.bytes) / element_bytes;

  const NodeOf node(ranks, ranks_per_node, machine.cyclic_placement);
  const bool inter = node.nodes > 1;
  const Link& link = inter ? machine.inter : machine.intra;
  const double load =
      inter && machine.shared_link
          ? std::max(1.0, all_to_all_link_load(ranks, ranks_per_node, machine.cyclic_placement))
          : 1.0;
  for (const Exchange& x : exchanges) {
    PhaseCost cost;
    cost.name = x.phase;
    cost.traffic = {x.record * (x.into_plan ? counts.most_in : counts.most_out),
                    worst[x.phase].messages};
    cost.inter_node = inter;
    cost.seconds = static_cast<double>(cost.traffic.messages) * link.latency_s +
                   load * static_cast<double>(cost.traffic.bytes) / link.bytes_per_s +
                   (cost.traffic.messages > 0 ? machine.sync_s : 0.0);
    (x.phase[0] == 'f' ? out.relayout_forward_s : out.relayout_backward_s) += cost.seconds;
    out.phases.push_back(cost);
  }
  out.forward_s += out.relayout_forward_s;
  out.backward_s += out.relayout_backward_s;

  out.memory_bytes += static_cast<int64_t>(relayout_memory_bytes(problem, plan, shards, true));
}

Prediction predict_with(const Problem& problem, const Plan& plan, const Machine& machine,
                        int ranks_per_node, const UserShards* shards,
                        const RelayoutCounts* counts) {
  const AlgorithmEntry& entry = algorithm_entry(plan.algorithm);
  Prediction out = entry.predict ? entry.predict(problem, plan, machine, ranks_per_node)
                                 : predict_algorithm(problem, plan, machine, ranks_per_node);
  if (shards) add_relayout(out, problem, plan, machine, ranks_per_node, *shards, *counts);
  return out;
}

}  // namespace

Prediction predict(const Problem& problem, const Plan& plan, const Machine& machine,
                   int ranks_per_node, const UserShards* shards) {
  if (!shards) return predict_with(problem, plan, machine, ranks_per_node, nullptr, nullptr);
  require_shards_fit(problem, plan, shards->layout);
  const RelayoutCounts counts = relayout_counts(shards->layout, plan_layout(problem, plan));
  return predict_with(problem, plan, machine, ranks_per_node, shards, &counts);
}

int64_t memory_per_rank(const Problem& problem, const Plan& plan, const UserShards* shards,
                        bool with_backward) {
  problem.validate();
  check_plan(plan, problem, plan.ranks());
  double bytes = memory_bytes(problem, plan, with_backward);
  if (shards) {
    require_shards_fit(problem, plan, shards->layout);
    bytes += relayout_memory_bytes(problem, plan, *shards, with_backward);
  }
  return static_cast<int64_t>(bytes);
}

RankMemory memory_parts(const Problem& problem, const Plan& plan, const UserShards* shards,
                        bool with_backward) {
  const int64_t total = memory_per_rank(problem, plan, shards, with_backward);
  RankMemory parts;
  parts.shards = std::min(
      total,
      static_cast<int64_t>(model::shard_bytes(
          problem, static_cast<double>(plan_layout(problem, plan).max_count()), with_backward)));
  parts.buffers = total - parts.shards;
  return parts;
}

PlanSearch search_plans(const Problem& problem, int ranks, const Machine& machine,
                        int ranks_per_node, bool include_backward, bool choose_placement,
                        const UserShards* shards, int64_t memory_cap) {
  PlanSearch search;
  // Every algorithm's plans: ATTENTION2D's on every grid of P, with and without the K/V
  // transpose; the baselines' in their default layout and the caller's; the hybrid at every
  // U > 1 dividing P and every grid of P / U (U = 1 is ATTENTION2D). Those the problem does not
  // allow are skipped with check_plan's reason.
  std::vector<Plan> candidates;
  PlanChoices choices;
  choices.both_kv_transposes = true;
  choices.shards = shards;
  for (const Algorithm algorithm : all_algorithms()) {
    for (Plan& plan : algorithm_plans(algorithm, problem, ranks, choices))
      candidates.push_back(std::move(plan));
  }
  // Both placements of the ranks on nodes, where there is a choice (several nodes of several
  // ranks) and the caller lets the search choose.
  std::vector<bool> placements = {machine.cyclic_placement};
  if (choose_placement && ranks_per_node > 1 && ranks_per_node < ranks)
    placements.push_back(!machine.cyclic_placement);
  // What the exchanges move depends on the plan's layout only: counted once per layout.
  std::deque<std::pair<TokenLayout, RelayoutCounts>> counted;  // stable addresses
  const auto counts_for = [&](const Plan& plan) -> const RelayoutCounts* {
    if (!shards) return nullptr;
    const TokenLayout planned = plan_layout(problem, plan);
    for (const auto& [layout, counts] : counted)
      if (layout == planned) return &counts;
    require_shards_fit(problem, plan, shards->layout);
    counted.emplace_back(planned, relayout_counts(shards->layout, planned));
    return &counted.back().second;
  };
  for (const bool cyclic : placements) {
    Machine placed = machine;
    placed.cyclic_placement = cyclic;
    for (const Plan& plan : candidates) {
      try {
        search.ranked.push_back(
            {plan, predict_with(problem, plan, placed, ranks_per_node, shards, counts_for(plan)),
             cyclic});
      } catch (const Error& e) {
        if (cyclic == machine.cyclic_placement)
          search.skipped.emplace_back(algorithm_name(plan.algorithm), e.message());
      }
    }
  }
  const auto total = [&](const RankedPlan& r) {
    return r.prediction.forward_s + (include_backward ? r.prediction.backward_s : 0.0);
  };
  const auto bytes = [](const RankedPlan& r) {
    return r.prediction.forward.bytes + r.prediction.backward.bytes;
  };
  std::stable_sort(search.ranked.begin(), search.ranked.end(),
                   [&](const RankedPlan& a, const RankedPlan& b) { return total(a) < total(b); });
  // Ties: of the plans left, those within kPlanTieTolerance of the fastest of them, the one
  // needing the least memory per rank first, then the fewest bytes per rank, then the machine's
  // own placement of ranks, then the fastest.
  // (Quadratic in the plans within the tolerance only.)
  std::vector<RankedPlan> ordered;
  ordered.reserve(search.ranked.size());
  std::vector<bool> taken(search.ranked.size(), false);
  size_t first_left = 0;
  while (ordered.size() < search.ranked.size()) {
    while (taken[first_left])
      ++first_left;
    const double limit = total(search.ranked[first_left]) * (1 + kPlanTieTolerance);
    size_t best = first_left;
    for (size_t i = first_left + 1; i < search.ranked.size() && total(search.ranked[i]) <= limit;
         ++i) {
      if (taken[i]) continue;
      const RankedPlan& a = search.ranked[i];
      const RankedPlan& b = search.ranked[best];
      if (a.prediction.memory_bytes != b.prediction.memory_bytes) {
        if (a.prediction.memory_bytes < b.prediction.memory_bytes) best = i;
      } else if (bytes(a) != bytes(b)) {
        if (bytes(a) < bytes(b)) best = i;
      } else if (a.cyclic_placement != b.cyclic_placement) {
        // The same plan in both placements: the machine's own (no launcher option to change).
        if (a.cyclic_placement == machine.cyclic_placement) best = i;
      }
    }
    taken[best] = true;
    ordered.push_back(std::move(search.ranked[best]));
  }
  // The plans that do not fit in the cap, apart, in the same order.
  search.memory_cap = memory_cap;
  search.ranked.clear();
  for (RankedPlan& r : ordered) {
    if (memory_cap > 0 && r.prediction.memory_bytes > memory_cap) {
      search.excluded.push_back(std::move(r));
    } else {
      search.ranked.push_back(std::move(r));
    }
  }
  return search;
}

}  // namespace a2d

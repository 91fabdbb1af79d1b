// The machines of the alpha-beta-gamma model (cost_model.hpp, docs/cost-model.md): the presets,
// calibration files (written by a2d calibrate) and machine files (written by scripts/cluster/cluster.sh).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"

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
  c.kernel_forward_flops_bf16 = rate(a.kernel_forward_flops_bf16, b.kernel_forward_flops_bf16);
  c.kernel_backward_flops_bf16 = rate(a.kernel_backward_flops_bf16, b.kernel_backward_flops_bf16);
  c.kernel_forward_causal_flops_bf16 =
      rate(a.kernel_forward_causal_flops_bf16, b.kernel_forward_causal_flops_bf16);
  c.kernel_backward_causal_flops_bf16 =
      rate(a.kernel_backward_causal_flops_bf16, b.kernel_backward_causal_flops_bf16);
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
  if (c.kernel_forward_flops_bf16 > 0) {
    auto& section = sections[c.ranks];
    section["kernel_forward_gflops_bf16"] = c.kernel_forward_flops_bf16 / 1e9;
    section["kernel_backward_gflops_bf16"] = c.kernel_backward_flops_bf16 / 1e9;
    section["kernel_forward_causal_gflops_bf16"] = c.kernel_forward_causal_flops_bf16 / 1e9;
    section["kernel_backward_causal_gflops_bf16"] = c.kernel_backward_causal_flops_bf16 / 1e9;
  }
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

Machine local_machine(const std::string& file, int ranks, DType dtype) {
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
  // bf16 on its own instructions (the amx and avx512bf16 paths): its rates, where the calibration measured them.
  if (dtype == DType::bf16 && optional("kernel_forward_gflops_bf16") > 0) {
    m.kernel_forward_flops = optional("kernel_forward_gflops_bf16") * 1e9;
    m.kernel_backward_flops = optional("kernel_backward_gflops_bf16") * 1e9;
    m.kernel_forward_causal_flops = optional("kernel_forward_causal_gflops_bf16") * 1e9;
    m.kernel_backward_causal_flops = optional("kernel_backward_causal_gflops_bf16") * 1e9;
    A2D_REQUIRE(m.kernel_backward_flops > 0, "the calibration of ", ranks, " ranks in ", file,
                " has bf16 forward rates but no 'kernel_backward_gflops_bf16'; run a2d calibrate "
                "again");
  }
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

}  // namespace a2d

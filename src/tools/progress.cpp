#include "attention2d/tools/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "attention2d/kernel.hpp"
#include "attention2d/timing.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"

namespace a2d {

const char* const kQuietHelp =
    "no prediction and no progress lines on stderr (printed otherwise for runs predicted over\n"
    "~10 s and running over ~30 s)";

namespace {
double from_environment(const char* name, double fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const double parsed = std::strtod(value, &end);
  return end && *end == '\0' && parsed >= 0 ? parsed : fallback;
}

std::string printf_text(const char* format, double a, double b = 0) {
  char text[64];
  std::snprintf(text, sizeof text, format, a, b);
  return text;
}

// One write per line, so that lines of several processes sharing a terminal do not interleave.
void write_line(const std::string& text) {
  const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
  (void)written;
}
}  // namespace

ProgressSettings ProgressSettings::from_environment() {
  ProgressSettings s;
  s.predict_s = a2d::from_environment("A2D_PROGRESS_PREDICT", s.predict_s);
  s.after_s = a2d::from_environment("A2D_PROGRESS_AFTER", s.after_s);
  s.every_s = a2d::from_environment("A2D_PROGRESS_EVERY", s.every_s);
  return s;
}

std::string duration_text(double s) {
  if (!(s >= 0)) return "?";
  if (s < 10) return printf_text("%.1f s", s);
  s = std::round(s);
  if (s < 60) return printf_text("%.0f s", s);
  const double minutes = std::floor(s / 60), hours = std::floor(s / 3600);
  if (s < 3600) return printf_text("%.0f min %.0f s", minutes, std::floor(s - 60 * minutes));
  if (s < 86400) return printf_text("%.0f h %.0f min", hours, std::floor((s - 3600 * hours) / 60));
  const double days = std::floor(s / 86400);
  return printf_text("%.0f d %.0f h", days, std::floor((s - 86400 * days) / 3600));
}

KernelEfficiency kernel_efficiency(const FmaPeak& peak) {
  // Against the AMX tile peak (bf16 on the amx path): the tile kernels reach about a sixth of it
  // (14-17 %, docs/kernels.md, "The AMX path's rates").
  if (peak.isa == "amx-bf16") return {0.15, 0.15};
  // Against the VDPBF16PS peak (bf16 on the avx512bf16 path): 78-89 % forward, 80-84 % backward
  // on Zen 4 (docs/kernels.md, "The AVX512-BF16 path's rates").
  if (peak.isa == "avx512-bf16") return {0.80, 0.80};
  switch (kernel_path()) {
    case KernelPath::avx512:
    case KernelPath::avx512bf16:
    case KernelPath::amx:  // fp32 rates: the bf16 kernels run for bf16 inputs only
      return {0.85, 0.80};
    case KernelPath::avx2:
      // The AVX2 path's 8-lane FMAs reach about half of a 16-lane peak.
      return peak.isa == "avx512-fma" ? KernelEfficiency{0.42, 0.40} : KernelEfficiency{0.85, 0.80};
    case KernelPath::portable:
      break;
  }
  return {0.05, 0.06};
}

bool could_take_longer(double flops_per_rank, int threads, double seconds) {
  return flops_per_rank / (2e9 * std::max(1, threads)) > seconds;
}

LocalMachine local_machine_for_prediction(int ranks, int threads,
                                          const std::string& calibration_file,
                                          const FmaPeak* given_peak, DType dtype) {
  LocalMachine out;
  if (has_calibration(calibration_file, ranks)) {
    out.machine = local_machine(calibration_file, ranks, dtype);
    out.source = "the cost model with this machine's calibration, " + calibration_file;
    return out;
  }
  const FmaPeak peak = given_peak ? *given_peak : measure_product_peak(dtype, 1);
  const KernelEfficiency efficiency = kernel_efficiency(peak);
  // The ranks of this host share its cores (Open MPI says how many ranks it put here).
  int on_host = ranks;
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); local && *local)
    on_host = std::max(1, std::atoi(local));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const double share = std::min(1.0, static_cast<double>(cores) / (on_host * std::max(1, threads)));
  const double per_rank = 1e9 * peak.gflops_per_thread * std::max(1, threads) * share;
  Machine& m = out.machine;
  m.name = "estimate";
  m.kernel_forward_flops = per_rank * efficiency.forward;
  m.kernel_backward_flops = per_rank * efficiency.backward;
  m.intra = {5e-6, 5e9};
  m.inter = {20e-6, 1e9};
  m.shared_cores = cores;
  m.description = "an estimate";
  char text[400];
  std::snprintf(text, sizeof text,
                "an estimate: no calibration of %d rank%s in %s; this machine's FMA peak, %.0f "
                "GFLOP/s per thread (%s), times the kernels' efficiency, %.2f forward and %.2f "
                "backward (docs/performance.md)%s",
                ranks, ranks == 1 ? "" : "s", calibration_file.c_str(), peak.gflops_per_thread,
                peak.isa.c_str(), efficiency.forward, efficiency.backward,
                share < 1 ? ", the cores shared by this host's ranks" : "");
  out.source = text;
  return out;
}

Progress::Progress(std::string command, bool enabled, ProgressSettings settings)
    : command_(std::move(command)),
      enabled_(enabled),
      settings_(settings),
      start_s_(seconds_now()) {
  if (enabled_) thread_ = std::thread([this] { run(); });
}

Progress::~Progress() {
  finish();
}

void Progress::finish() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Progress::predict(double seconds, const std::string& what, const std::string& source) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    total_s_ = seconds;
  }
  if (!enabled_ || !(seconds > settings_.predict_s)) return;
  write_line(command_ + ": predicted " + duration_text(seconds) + " for " + what + " (" + source +
             "); progress on stderr every " + duration_text(settings_.every_s) + " after " +
             duration_text(settings_.after_s) + " (--quiet: none)\n");
}

void Progress::stage(const std::string& name, int64_t iteration, int64_t iterations, double seconds,
                     std::function<double()> done, std::function<std::string()> phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_s_ += stage_s_;
  if (work_start_s_ < 0 && seconds > 0) work_start_s_ = seconds_now();
  name_ = name;
  phase_ = std::move(phase);
  iteration_ = iteration;
  iterations_ = iterations;
  stage_s_ = seconds;
  done_ = std::move(done);
}

std::string Progress::line(double elapsed) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = command_ + ": " + (phase_ ? phase_() : name_);
  if (iterations_ > 0) {
    text += ", iteration " + std::to_string(iteration_) + " of " + std::to_string(iterations_);
  }
  if (total_s_ > 0) {
    const double share = done_ ? std::clamp(done_(), 0.0, 1.0) : 0.0;
    const double fraction = std::min(0.999, (finished_s_ + stage_s_ * share) / total_s_);
    text += printf_text(", %.1f%% done", 100 * fraction);
    text += ", " + duration_text(elapsed) + " elapsed";
    const double working =
        work_start_s_ < 0 ? 0.0 : std::max(0.0, elapsed - (work_start_s_ - start_s_));
    const double left =
        fraction > 0.001 ? working * (1 - fraction) / fraction : std::max(0.0, total_s_ - working);
    text += ", ~" + duration_text(left) + " left";
  } else {
    text += ", " + duration_text(elapsed) + " elapsed";
  }
  return text + "\n";
}

void Progress::run() {
  double due = start_s_ + settings_.after_s;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    const double wait = due - seconds_now();
    if (wait > 0) {
      wake_.wait_for(lock, std::chrono::duration<double>(std::min(wait, 1.0)));
      continue;
    }
    if (name_.empty() && !phase_) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    lock.unlock();
    const double now = seconds_now();
    write_line(line(now - start_s_));
    due = now + settings_.every_s;
    lock.lock();
  }
}

}  // namespace a2d

#include "attention2d/timing.hpp"

#include <time.h>

#ifdef A2D_SMPI
#include <simgrid/engine.h>
#endif

#include <algorithm>
#include <chrono>
#include <numeric>

namespace a2d {

double seconds_now() {
#ifdef A2D_SMPI
  // Inside SimGrid: the simulated clock, which the ranks' kernels and messages advance
  // (docs/simulation.md); the host's own time is not part of the simulation.
  return simgrid_get_clock();
#else
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
}

double cpu_seconds_now() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  return s;
}

}  // namespace a2d

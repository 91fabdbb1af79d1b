// attention2d: wall-clock helpers shared by the commands and benchmarks.
#pragma once

#include <vector>

namespace a2d {

double seconds_now();  // monotonic clock
// CPU time of the whole process (all its threads, user and system), in seconds: on a machine
// shared with other work, the time a run was actually given a CPU (what a wall-clock measurement
// of a CPU-bound run would show on a quiet machine, less what the sharing costs in caches).
double cpu_seconds_now();

struct Summary {
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
  double mean = 0.0;
};
Summary summarize(std::vector<double> samples);

}  // namespace a2d

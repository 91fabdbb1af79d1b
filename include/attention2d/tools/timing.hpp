// attention2d: wall-clock helpers shared by the commands and benchmarks.
#pragma once

#include <vector>

namespace a2d {

double seconds_now();  // monotonic clock

struct Summary {
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
  double mean = 0.0;
};
Summary summarize(std::vector<double> samples);

}  // namespace a2d

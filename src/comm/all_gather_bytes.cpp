// all_gather_bytes (gloo_comm.hpp): variable-length host bytes over any communicator.
#include <cstring>

#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"

namespace a2d {

std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine) {
  const auto ranks = static_cast<size_t>(comm.size());
  int64_t own = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(ranks);
  comm.all_gather(Place::at_host(&own), Place::at_host(sizes.data()),
                  std::vector<int64_t>(ranks, sizeof(int64_t)));
  int64_t total = 0;
  for (const int64_t n : sizes) {
    A2D_REQUIRE(n >= 0, "all_gather_bytes: a rank sent a negative size");
    total += n;
  }
  std::string all(static_cast<size_t>(total), '\0');
  comm.all_gather(Place::at_host(mine.data()), Place::at_host(all.data()), sizes);
  std::vector<std::string> out;
  out.reserve(ranks);
  int64_t at = 0;
  for (const int64_t n : sizes) {
    out.emplace_back(all, static_cast<size_t>(at), static_cast<size_t>(n));
    at += n;
  }
  return out;
}

}  // namespace a2d

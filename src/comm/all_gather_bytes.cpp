// all_gather_bytes (gloo_comm.hpp): variable-length host bytes over any communicator.
#include <algorithm>
#include <cstring>

#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"

namespace a2d {

namespace {

// Each rank's slot of the first round: its size, then up to kInline of its bytes. A small
// exchange (Python's argument checks: a few hundred bytes) is one all_gather; a rank with more
// makes every rank take a second round, for the bytes of those that did not fit.
constexpr int64_t kInline = 1016;
constexpr int64_t kSlot = static_cast<int64_t>(sizeof(int64_t)) + kInline;

}  // namespace

std::vector<std::string> all_gather_bytes(Communicator& comm, const std::string& mine) {
  const auto ranks = static_cast<size_t>(comm.size());
  const auto own = static_cast<int64_t>(mine.size());
  std::string slot(static_cast<size_t>(kSlot), '\0');
  std::memcpy(slot.data(), &own, sizeof own);
  std::memcpy(slot.data() + sizeof own, mine.data(),
              static_cast<size_t>(std::min(own, kInline)));
  std::string slots(ranks * static_cast<size_t>(kSlot), '\0');
  comm.all_gather(Place::at_host(slot.data()), Place::at_host(slots.data()),
                  std::vector<int64_t>(ranks, kSlot));
  std::vector<int64_t> sizes(ranks), rest(ranks);
  bool overflow = false;
  for (size_t r = 0; r < ranks; ++r) {
    std::memcpy(&sizes[r], slots.data() + r * static_cast<size_t>(kSlot), sizeof(int64_t));
    A2D_REQUIRE(sizes[r] >= 0, "all_gather_bytes: a rank sent a negative size");
    rest[r] = std::max<int64_t>(0, sizes[r] - kInline);
    overflow = overflow || rest[r] > 0;
  }
  std::vector<std::string> out(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    out[r].assign(slots, r * static_cast<size_t>(kSlot) + sizeof(int64_t),
                  static_cast<size_t>(std::min(sizes[r], kInline)));
  }
  if (!overflow) return out;
  // The second round: what did not fit, every rank's in rank order (ranks that fitted send none).
  int64_t total = 0;
  for (const int64_t n : rest)
    total += n;
  std::string all(static_cast<size_t>(total), '\0');
  comm.all_gather(Place::at_host(mine.data() + std::min(own, kInline)),
                  Place::at_host(all.data()), rest);
  int64_t at = 0;
  for (size_t r = 0; r < ranks; ++r) {
    out[r].append(all, static_cast<size_t>(at), static_cast<size_t>(rest[r]));
    at += rest[r];
  }
  return out;
}

}  // namespace a2d

#include "attention2d/collective.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace a2d {

void collective_check(Communicator& comm, const std::function<void()>& stage) {
  std::string message;
  bool failed = false;
  try {
    stage();
  } catch (const CollectiveError&) {
    throw;  // already raised on every rank together
  } catch (const Error& e) {
    failed = true;
    message = e.what();
  } catch (const std::exception& e) {
    failed = true;
    message = std::string("unexpected error: ") + e.what();
  }
  // [first failing rank (or size if none), number of failing ranks]
  // The lowest failing rank (as the max of -rank) and the number of failing ranks, in one
  // all-reduce each.
  int64_t first = failed ? -comm.rank() : -comm.size();
  int64_t failures = failed ? 1 : 0;
  comm.all_reduce(&first, 1, Reduction::max);
  comm.all_reduce(&failures, 1, Reduction::sum);
  first = -first;
  if (failures == 0) return;
  int64_t length = comm.rank() == first ? static_cast<int64_t>(message.size()) : 0;
  comm.broadcast(&length, sizeof length, static_cast<int>(first));
  std::vector<char> text(static_cast<size_t>(length));
  if (comm.rank() == first) text.assign(message.begin(), message.end());
  if (length > 0) comm.broadcast(text.data(), length, static_cast<int>(first));
  std::string shared(text.begin(), text.end());
  if (failures == comm.size() && failures > 1) {
    shared += " (on every rank)";
  } else if (failures > 1) {
    shared += " (and " + std::to_string(failures - 1) + " more ranks failed)";
  }
  throw CollectiveError(shared, __FILE__, __LINE__);
}

}  // namespace a2d

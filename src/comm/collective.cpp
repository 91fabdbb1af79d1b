#include "attention2d/collective.hpp"

#include <cstdint>
#include <new>
#include <string>
#include <vector>

namespace a2d {

void collective_check(Communicator& comm, const std::function<void()>& stage) {
  std::string message;  // what(), then '\0', then the message without rank and source line
  bool failed = false;
  try {
    stage();
  } catch (const CollectiveError&) {
    throw;  // already raised on every rank together
  } catch (const Error& e) {
    failed = true;
    message = std::string(e.what()) + '\0' + e.message();
  } catch (const std::bad_alloc&) {
    // A stage that ran out of memory (reading a large input file, say): every rank stops.
    failed = true;
    message = "out of memory (std::bad_alloc)";
    message += '\0' + message;
  } catch (const std::exception& e) {
    failed = true;
    message = std::string("unexpected error: ") + e.what();
    message += '\0' + message;
  }
  // The lowest failing rank, as the max of (size - rank), 0 where none failed: one all-reduce
  // when every rank passed, a second for the number of failing ranks when one did not.
  int64_t seen = failed ? comm.size() - comm.rank() : 0;
  comm.all_reduce(&seen, 1, Reduction::max);
  if (seen == 0) return;
  const int64_t first = comm.size() - seen;
  int64_t failures = failed ? 1 : 0;
  comm.all_reduce(&failures, 1, Reduction::sum);
  int64_t length = comm.rank() == first ? static_cast<int64_t>(message.size()) : 0;
  comm.broadcast(&length, sizeof length, static_cast<int>(first));
  std::vector<char> text(static_cast<size_t>(length));
  if (comm.rank() == first) text.assign(message.begin(), message.end());
  if (length > 0) comm.broadcast(text.data(), length, static_cast<int>(first));
  const std::string both(text.begin(), text.end());
  const size_t split = both.find('\0');
  std::string shared = both.substr(0, split);
  std::string brief = split == std::string::npos ? shared : both.substr(split + 1);
  if (failures == comm.size() && failures > 1) {
    shared += " (on every rank)";
    brief += " (on every rank)";
  } else {
    if (comm.size() > 1) brief = "rank " + std::to_string(first) + ": " + brief;
    if (failures > 1) {
      const std::string more = " (and " + std::to_string(failures - 1) + " more ranks failed)";
      shared += more;
      brief += more;
    }
  }
  throw CollectiveError(shared, brief, __FILE__, __LINE__);
}

}  // namespace a2d

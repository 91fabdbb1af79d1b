// Communicator::merge_scatter: the attention merge of partial records along a communicator. The
// communicator only moves the records; the backend that holds them merges them
// (Backend::merge_partials), on the device where they live. Every communicator (MPI, Gloo, NCCL,
// staged) runs this one schedule: the ring reduce-scatter of P - 1 send/recv steps that the cost
// model charges (docs/attention2d.md, step 5).
//
// Worked example, P = 3, rank 1, counts = {2, 1, 2}: send holds [a0 a1 | b0 | c0 c1], block i
// for rank i. Step 0: rank 1 sends a0 a1 to rank 2 and receives rank 0's contribution to block 2,
// which it merges with its own (c0 c1) into scratch. Step 1: it sends that merged block 2 to
// rank 2 and receives from rank 0 the partial of its own block 1 (rank 2's contribution merged at
// rank 0 with rank 0's), which it merges with b0 into recv.
#include <algorithm>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/error.hpp"

namespace a2d {

void Communicator::merge_scatter(Place send, Place recv, std::span<const int64_t> counts,
                                 int64_t record, Backend& backend) {
  const int ranks = size(), me = rank();
  A2D_REQUIRE(static_cast<int>(counts.size()) == ranks, "merge_scatter needs one count per rank (",
              ranks, "), got ", counts.size());
  A2D_REQUIRE(record >= 3,
              "merged records hold a row max, a row sum and the accumulator: at least 3 floats, "
              "got ",
              record);
  const int64_t unit = record * static_cast<int64_t>(sizeof(float));
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  int64_t largest = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    A2D_REQUIRE(counts[i] >= 0, "merge_scatter: a block of ", counts[i], " records");
    offsets[i + 1] = offsets[i] + counts[i] * unit;
    largest = std::max(largest, counts[i] * unit);
  }
  const auto block = [&](int b) { return static_cast<size_t>((b % ranks + ranks) % ranks); };
  const auto bytes = [&](size_t b) { return counts[b] * unit; };
  if (ranks == 1) {
    if (bytes(0) > 0) backend.copy_bytes(send, recv, bytes(0));
    return;
  }
  // At step k this rank passes the partial of block rank - k - 1 to rank + 1 and merges its own
  // contribution to the partial of block rank - k - 2 that arrives from rank - 1; after the last
  // step it holds its own block, merged over every rank.
  BufferPtr outgoing = backend.allocate(largest), incoming = backend.allocate(largest);
  const int next = (me + 1) % ranks, prev = (me + ranks - 1) % ranks;
  Place to_send = send + offsets[block(me - 1)];
  for (int step = 0; step < ranks - 1; ++step) {
    const size_t sent = block(me - step - 1), got = block(me - step - 2);
    send_recv(to_send, bytes(sent), next, Place::in(*incoming), bytes(got), prev);
    const Place merged = step + 2 == ranks ? recv : Place::in(*outgoing);
    if (bytes(got) > 0) {
      backend.copy_bytes(send + offsets[got], merged, bytes(got));
      backend.merge_partials(merged, Place::in(*incoming), counts[got], record);
    }
    to_send = merged;
  }
}

}  // namespace a2d

// The Gloo communicator (gloo/communicator.hpp): its requests over the mesh, and its views.
#include "communicator.hpp"

#include <gloo/common/error.h>

#include <algorithm>
#include <utility>

#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"

namespace a2d::gloo_detail {
namespace {

constexpr uint64_t kIdMask = (uint64_t{1} << 48) - 1;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t child_id(uint64_t parent, uint64_t split_count, int color) {
  const uint64_t id =
      mix(mix(mix(parent) ^ split_count) ^ static_cast<uint64_t>(static_cast<uint32_t>(color))) &
      kIdMask;
  return id == 0 ? 1 : id;
}

}  // namespace

GlooRequest::~GlooRequest() {
  if (done_) return;
  try {
    wait();
  } catch (...) {
    // A destructor must not throw; the owner's wait() reports errors.
  }
}

void GlooRequest::wait() {
  if (done_) return;
  done_ = true;
  // The I/O thread may preempt this thread from now on (it holds no lock of Gloo's while it
  // waits).
  const comm_detail::IoThreads::Waiting waiting(transfers_.empty() ? nullptr
                                                                   : &mesh_->io_threads());
  for (Transfer& t : transfers_) {
    bool done = false;
    try {
      done = mesh_->wait(*t.buffer, t.peer, t.send);
    } catch (const gloo::Exception& e) {
      mesh_->fail(e.what(), t.peer);
    }
    if (!done) mesh_->fail("Connection closed by peer (the mesh's monitor)", t.peer);
  }
  std::vector<std::unique_ptr<UnboundBuffer>> buffers;
  for (Transfer& t : transfers_)
    buffers.push_back(std::move(t.buffer));
  transfers_.clear();
  mesh_->retire(std::move(buffers));
  complete();
}

void GlooRequest::post(void* data, int64_t bytes, int peer, uint64_t slot, bool send) {
  mesh_->io_threads().posting();  // the I/O thread must not preempt this thread inside Gloo
  Transfer t{mesh_->buffer(data, bytes), peer, send};
  try {
    if (send) {
      t.buffer->send(peer, slot, 0, static_cast<size_t>(bytes));
    } else {
      t.buffer->recv(peer, slot, 0, static_cast<size_t>(bytes));
    }
  } catch (const gloo::Exception& e) {
    done_ = true;  // fail() closes the connections: nothing pending is left to wait for
    mesh_->fail(e.what(), peer);
  }
  transfers_.push_back(std::move(t));
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<Mesh> mesh, std::vector<int> members,
                                   uint64_t id)
    : DirectCollectives(members, comm_detail::rank_among(members, mesh->rank(), "Gloo"), "Gloo"),
      mesh_(std::move(mesh)),
      id_(id) {}

std::unique_ptr<GlooCommunicator> GlooCommunicator::view(int color, int key) {
  A2D_REQUIRE(color >= 0, "split: the color must not be negative (got ", color, ")");
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size()));
  const std::vector<int64_t> bytes(static_cast<size_t>(size()), sizeof mine);
  all_gather(Place::at_host(mine), Place::at_host(all.data()), bytes);
  std::vector<std::pair<int64_t, int>> chosen;  // (key, rank here) of this color
  for (int r = 0; r < size(); ++r) {
    if (all[2 * static_cast<size_t>(r)] == color)
      chosen.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
  }
  std::sort(chosen.begin(), chosen.end());
  std::vector<int> members;
  for (const auto& [k, r] : chosen)
    members.push_back(member(r));
  return std::make_unique<GlooCommunicator>(mesh_, std::move(members),
                                            child_id(id_, splits_++, color));
}

GlooCommunicator* as_gloo(Communicator& comm) {
  Communicator* at = &comm;
  while (auto* counting = dynamic_cast<CountingCommunicator*>(at))
    at = &counting->inner();
  return dynamic_cast<GlooCommunicator*>(at);
}

}  // namespace a2d::gloo_detail

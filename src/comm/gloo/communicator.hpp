// Internal: the Gloo communicator (gloo_comm.hpp), a view of a TCP mesh (gloo/mesh.hpp).
//
// Communicators are views of a mesh: a list of its ranks and a 48-bit id. A message's Gloo slot
// is (id << 16) | tag, tag < 0x8000 for send_recv's tags and 0x8000 | n for the view's n-th
// collective (mod 2^15), so views, their point-to-point tags and their collectives never match
// each other's messages. A child's id is a hash of (parent id, the parent's split count, color):
// every member computes the same one, and two views that share ranks collide with probability
// 2^-48 per pair of views (about n^2 / 2^49 for n views made in a job: 5e-7 for 16,000). The
// collectives are the direct ones of direct_collectives.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/direct_collectives.hpp"
#include "attention2d/comm.hpp"
#include "mesh.hpp"

namespace a2d::gloo_detail {

// The world's view id.
constexpr uint64_t kWorldId = 0xA2D6100;

// A transfer of one request: a send or a receive with one rank of the mesh.
struct Transfer {
  std::unique_ptr<UnboundBuffer> buffer;
  int peer = -1;
  bool send = false;
};

class GlooRequest final : public comm_detail::DirectRequest {
 public:
  explicit GlooRequest(std::shared_ptr<Mesh> mesh) : mesh_(std::move(mesh)) {}
  ~GlooRequest() override;

  // peer: a mesh rank; slot: the view's (GlooCommunicator::slot).
  void post_send(const void* data, int64_t bytes, int peer, uint64_t slot) {
    post(const_cast<void*>(data), bytes, peer, slot, true);
  }
  void post_recv(void* data, int64_t bytes, int peer, uint64_t slot) {
    post(data, bytes, peer, slot, false);
  }

  void wait() override;

 private:
  void post(void* data, int64_t bytes, int peer, uint64_t slot, bool send);

  std::shared_ptr<Mesh> mesh_;
  std::vector<Transfer> transfers_;
  bool done_ = false;
};

class GlooCommunicator final
    : public comm_detail::DirectCollectives<GlooCommunicator, GlooRequest> {
 public:
  // members: mesh ranks, by rank here.
  GlooCommunicator(std::shared_ptr<Mesh> mesh, std::vector<int> members, uint64_t id);

  std::unique_ptr<Communicator> split(int color, int key) override { return view(color, key); }

  // split(), as the Gloo communicator it is.
  std::unique_ptr<GlooCommunicator> view(int color, int key);

  const std::shared_ptr<Mesh>& mesh() const { return mesh_; }
  uint64_t slot(uint32_t tag) const { return (id_ << comm_detail::kTagBits) | tag; }

 private:
  friend DirectCollectives;

  std::unique_ptr<GlooRequest> new_request() { return std::make_unique<GlooRequest>(mesh_); }
  void post_send(GlooRequest& request, const void* data, int64_t bytes, int to, uint32_t tag) {
    request.post_send(data, bytes, member(to), slot(tag));
  }
  void post_recv(GlooRequest& request, void* data, int64_t bytes, int from, uint32_t tag) {
    request.post_recv(data, bytes, member(from), slot(tag));
  }

  std::shared_ptr<Mesh> mesh_;
  uint64_t id_;
  uint64_t splits_ = 0;
};

// The Gloo communicator under `comm` (itself, or inside counting communicators); null if none.
GlooCommunicator* as_gloo(Communicator& comm);

}  // namespace a2d::gloo_detail

// Internal: the all-to-all that trades sequence for heads, shared by Ulysses (over all P ranks)
// and the hybrid (over each sequence group of U ranks).
//
// Every member of a group holds its own tokens of every head. Before the exchange, a member packs
// for every member j, into block j of a send buffer, its own tokens' records for the heads of j;
// after it, member j holds the records of its heads for the tokens of every member, member by
// member (block i = member i's tokens). The way back is the same with the roles swapped: block j
// of what a member receives holds its own tokens' results for the heads of j, which unpack_*
// copies into the shards.
//
// Records are per (token, batch), tokens outermost (HeadRecords), so that the tokens of one member
// are one contiguous block of the all-to-all.
#pragma once

#include <cstdint>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/decomposition.hpp"
#include "attention2d/error.hpp"
#include "records.hpp"

namespace a2d::algorithms {

// A buffer of [tokens, batch, width] bytes whose width bytes per (token, batch) concatenate
// segments: a block of heads x head_dim of some dtype (a TokenTensor) or one fp32 per head (a
// RowTensor), fp32 segments first.
struct HeadRecords {
  int64_t batch = 1;
  int64_t head_dim = 0;
  int64_t width = 0;  // bytes per (token, batch)

  int64_t bytes(int64_t tokens) const { return tokens * batch * width; }
  TokenTensor tokens(Buffer& buffer, int64_t at, int64_t field, DType dtype) const {
    const int64_t e = dtype_bytes(dtype);
    A2D_REQUIRE(width % e == 0 && field % e == 0, "head record of ", width, " bytes cannot hold ",
                dtype_name(dtype), " at byte ", field);
    return {&buffer, at + field, dtype, width / e, batch * width / e, head_dim};
  }
  RowTensor rows(Buffer& buffer, int64_t at, int64_t field) const {
    return {&buffer, at + field, width / kFloatBytes, 1, batch * width / kFloatBytes};
  }
};

class HeadsExchange {
 public:
  // groups[j]: the heads of member j; counts[j]: its own tokens; `member`: this rank's index.
  HeadsExchange(Backend& backend, int64_t batch, int64_t head_dim, std::vector<UlyssesHeads> groups,
                std::vector<int64_t> counts, int member)
      : backend_(backend),
        batch_(batch),
        head_dim_(head_dim),
        groups_(std::move(groups)),
        counts_(std::move(counts)),
        member_(member) {
    A2D_REQUIRE(groups_.size() == counts_.size() && member_ >= 0 && member_ < members(),
                "heads exchange: ", groups_.size(), " head groups for ", counts_.size(),
                " members");
    offsets_ = prefix_offsets(counts_);
  }

  int members() const { return static_cast<int>(counts_.size()); }
  int64_t own_tokens() const { return counts_[static_cast<size_t>(member_)]; }
  int64_t gathered_tokens() const { return offsets_.back(); }
  const UlyssesHeads& heads_of(int member) const { return groups_[static_cast<size_t>(member)]; }
  const UlyssesHeads& own_heads() const { return heads_of(member_); }
  int64_t count_of(int member) const { return counts_[static_cast<size_t>(member)]; }
  // The first token of member i's block in a gathered buffer.
  int64_t offset_of(int member) const { return offsets_[static_cast<size_t>(member)]; }

  // Send side: for every member j, the heads of j (query heads, or K/V heads with kv) of this
  // rank's own tokens of `shard`, into the field at byte `field` of block j of `send`.
  void pack_tokens(const TokenTensor& shard, bool kv, const HeadRecords& rec, Buffer& send,
                   int64_t field, DType dtype) {
    for (int j = 0; j < members(); ++j) {
      const UlyssesHeads& h = heads_of(j);
      backend_.copy_tokens(shard.from_head(kv ? h.first_kv_head : h.first_head),
                           rec.tokens(send, block(rec, j), field, dtype),
                           own_block(kv ? h.kv_heads : h.heads));
    }
  }
  void pack_rows(const RowTensor& shard, const HeadRecords& rec, Buffer& send, int64_t field) {
    for (int j = 0; j < members(); ++j) {
      const UlyssesHeads& h = heads_of(j);
      backend_.copy_rows(shard.from_head(h.first_head), rec.rows(send, block(rec, j), field),
                         batch_, h.heads, own_tokens());
    }
  }
  // Receive side of the way back: block j's field into the heads of member j of `shard`.
  void unpack_tokens(const HeadRecords& rec, Buffer& returned, int64_t field, DType dtype, bool kv,
                     const TokenTensor& shard) {
    for (int j = 0; j < members(); ++j) {
      const UlyssesHeads& h = heads_of(j);
      backend_.copy_tokens(rec.tokens(returned, block(rec, j), field, dtype),
                           shard.from_head(kv ? h.first_kv_head : h.first_head),
                           own_block(kv ? h.kv_heads : h.heads));
    }
  }
  void unpack_rows(const HeadRecords& rec, Buffer& returned, int64_t field,
                   const RowTensor& shard) {
    for (int j = 0; j < members(); ++j) {
      const UlyssesHeads& h = heads_of(j);
      backend_.copy_rows(rec.rows(returned, block(rec, j), field), shard.from_head(h.first_head),
                         batch_, h.heads, own_tokens());
    }
  }

  // The two exchanges to heads, with their records packed (this rank's own heads give the field
  // offsets; every member's records have the same width). Forward: [q(hq x D) k(hkv x D)
  // v(hkv x D)] per (token, batch). Backward: [lse(hq) delta(hq) q(hq x D) dO(hq x D) k(hkv x D)
  // v(hkv x D)]. Both return the gathered buffer (block i = member i's tokens).
  BufferPtr forward_to_heads(const ForwardShards& s, const HeadRecords& in, DType dtype,
                             Communicator& comm) {
    const int64_t e = dtype_bytes(dtype), hq = own_heads().heads, hkv = own_heads().kv_heads;
    BufferPtr send = allocate_own_blocks(in);
    pack_tokens(s.q, false, in, *send, 0, dtype);
    pack_tokens(s.k, true, in, *send, hq * head_dim_ * e, dtype);
    pack_tokens(s.v, true, in, *send, (hq + hkv) * head_dim_ * e, dtype);
    return exchange_to_heads(in, *send, comm, "forward.to_heads_all_to_all");
  }
  BufferPtr backward_to_heads(const BackwardShards& s, const RowTensor& delta,
                              const HeadRecords& in, DType dtype, Communicator& comm) {
    const int64_t e = dtype_bytes(dtype), hq = own_heads().heads, hkv = own_heads().kv_heads;
    const int64_t q_at = 2 * hq * kFloatBytes, do_at = q_at + hq * head_dim_ * e;
    const int64_t k_at = do_at + hq * head_dim_ * e, v_at = k_at + hkv * head_dim_ * e;
    BufferPtr send = allocate_own_blocks(in);
    pack_tokens(s.q, false, in, *send, q_at, dtype);
    pack_tokens(s.d_out, false, in, *send, do_at, dtype);
    pack_tokens(s.k, true, in, *send, k_at, dtype);
    pack_tokens(s.v, true, in, *send, v_at, dtype);
    pack_rows(s.lse, in, *send, 0);
    pack_rows(delta, in, *send, hq * kFloatBytes);
    return exchange_to_heads(in, *send, comm, "backward.to_heads_all_to_all");
  }

  // Buffers and block sizes (bytes) of the two directions: every block holds this rank's own
  // tokens ...
  BufferPtr allocate_own_blocks(const HeadRecords& rec) {
    return backend_.allocate(members() * rec.bytes(own_tokens()));
  }
  std::vector<int64_t> own_block_bytes(const HeadRecords& rec) const {
    return std::vector<int64_t>(counts_.size(), rec.bytes(own_tokens()));
  }
  // ... or block i holds the tokens of member i.
  BufferPtr allocate_gathered(const HeadRecords& rec) {
    return backend_.allocate(rec.bytes(gathered_tokens()));
  }
  std::vector<int64_t> gathered_bytes(const HeadRecords& rec) const {
    return scaled(counts_, rec.bytes(1));
  }
  // Byte offset of block j (own tokens) in a buffer of allocate_own_blocks.
  int64_t block(const HeadRecords& rec, int j) const { return j * rec.bytes(own_tokens()); }

 private:
  BufferPtr exchange_to_heads(const HeadRecords& in, Buffer& send, Communicator& comm,
                              const char* phase) {
    BufferPtr gathered = allocate_gathered(in);
    comm.set_phase(phase);
    comm.all_to_all(Place::in(send), own_block_bytes(in), Place::in(*gathered), gathered_bytes(in));
    return gathered;
  }
  TokenBlock own_block(int64_t heads) const { return {batch_, own_tokens(), heads, head_dim_}; }

  Backend& backend_;
  int64_t batch_ = 1;
  int64_t head_dim_ = 0;
  std::vector<UlyssesHeads> groups_;
  std::vector<int64_t> counts_;
  std::vector<int64_t> offsets_;
  int member_ = 0;
};

}  // namespace a2d::algorithms

// attention2d: which global tokens each part (rank) owns. Pure functions, no MPI.
//
// A layout splits the N tokens of a sequence among P parts. Every token belongs to exactly one
// part; parts may own different numbers of tokens (N not a multiple of P) or none (N < P). Each
// part's tokens are listed in increasing global order, which is the order of its shard.
//
//   cyclic      token t -> part t mod P                       (ATTENTION2D's initial layout)
//   striped(w)  stripes of w tokens dealt round-robin:         part (t / w) mod P
//   contiguous  consecutive blocks; the first N mod P parts get one extra token, or, made by
//               contiguous_counts, blocks of the caller's counts (uneven, zeros allowed)
//   zigzag      2P near-equal chunks; part p gets chunks p and 2P-1-p (balances causal work)
//
// Any of them with its parts renumbered (permuted()): part p owns what part slot(p) of the plain
// layout owns. A caller numbers its shards in one order (torch's ranks of a DeviceMesh) while the
// engine's ranks take the positions of a grid (python/attention2d/_channel.py).
//
// Example, N = 10, P = 3:
//   cyclic      part 0: 0 3 6 9   part 1: 1 4 7     part 2: 2 5 8
//   striped(2)  part 0: 0 1 6 7   part 1: 2 3 8 9   part 2: 4 5
//   contiguous  part 0: 0 1 2 3   part 1: 4 5 6     part 2: 7 8 9
//   zigzag      chunks {0,1} {2,3} {4,5} {6,7} {8} {9}:
//               part 0: 0 1 9     part 1: 2 3 8     part 2: 4 5 6 7
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace a2d {

enum class LayoutKind { cyclic, striped, contiguous, zigzag };

LayoutKind parse_layout(const std::string& name);  // throws a2d::Error naming the choices
std::string layout_name(LayoutKind kind);

class TokenLayout {
 public:
  // stripe is the stripe width of `striped` (>= 1) and ignored otherwise.
  TokenLayout(LayoutKind kind, int64_t tokens, int64_t parts, int64_t stripe = 1);
  // Contiguous blocks of the given sizes: part p owns counts[p] consecutive tokens after those of
  // parts 0 .. p-1 (a user's own cut of the sequence, e.g. 5, 0, 7: one part without tokens).
  // kind() is contiguous; counts equal to the even split give exactly the layout of
  // TokenLayout(contiguous, N, P). Throws unless every count is >= 0 and there is at least one.
  static TokenLayout contiguous_counts(std::vector<int64_t> counts);
  // The same split with the parts renumbered: part p of the result owns the tokens part slots[p]
  // of this layout owns. Throws unless `slots` is a permutation of 0..parts()-1 and this layout
  // is not permuted already. The identity gives this layout back unchanged.
  TokenLayout permuted(std::vector<int64_t> slots) const;

  LayoutKind kind() const { return kind_; }
  int64_t tokens() const { return tokens_; }
  int64_t parts() const { return parts_; }
  int64_t stripe() const { return stripe_; }
  // The part of the plain layout whose tokens `part` owns (itself unless permuted()).
  int64_t slot(int64_t part) const { return slots_ ? (*slots_)[static_cast<size_t>(part)] : part; }
  bool is_permuted() const { return slots_ != nullptr; }

  int64_t count(int64_t part) const;                   // tokens owned by `part`
  int64_t max_count() const;                           // the largest count(part)
  std::vector<int64_t> tokens_of(int64_t part) const;  // increasing global indices

  struct Owner {
    int64_t part;
    int64_t index;  // position within the part's shard
  };
  Owner owner(int64_t token) const;
  // Global index of the `index`-th token of `part` (inverse of owner()).
  int64_t token_at(int64_t part, int64_t index) const;

  // "contiguous over 3 parts, 12 tokens"; with uneven counts "contiguous(5,0,7) over ...".
  std::string describe() const;

  // Whether the counts are a contiguous_counts() cut other than the even split.
  bool uneven() const { return offsets_ != nullptr; }
  // Cyclic and striped layouts deal stripes of stripe() tokens round-robin (periodic); the others
  // give each part at most two runs of consecutive tokens (intervals()).
  bool periodic() const { return kind_ == LayoutKind::cyclic || kind_ == LayoutKind::striped; }
  struct Interval {
    int64_t begin = 0;
    int64_t end = 0;  // exclusive
  };
  struct Intervals {  // at most two, without allocating
    Interval runs[2];
    int count = 0;
    const Interval* begin() const { return runs; }
    const Interval* end() const { return runs + count; }
  };
  // Contiguous and zigzag layouts: the part's tokens as runs [begin, end) in increasing order
  // (one for contiguous, two for zigzag; a run may be empty). Throws for periodic layouts.
  Intervals intervals(int64_t part) const;
  // How many tokens below `token` (0 <= token <= tokens()) `part` owns, in O(1) for every kind.
  int64_t count_below(int64_t part, int64_t token) const;

  // Same kind, sizes, stripe, counts and part order (two layouts that are not equal may still give every part
  // the same tokens, e.g. any two over one part: see same_assignment in relayout.hpp).
  bool operator==(const TokenLayout& other) const;

 private:
  int64_t chunk_begin(int64_t chunk) const;  // zigzag: first token of chunk (of 2P)
  int64_t chunk_size(int64_t chunk) const;
  // The plain layout's answers for its part `slot` (the public ones map parts to slots first).
  int64_t slot_count(int64_t slot) const;
  int64_t slot_token_at(int64_t slot, int64_t index) const;
  Owner slot_owner(int64_t token) const;
  Intervals slot_intervals(int64_t slot) const;
  void require_part(int64_t part) const;

  LayoutKind kind_;
  int64_t tokens_;
  int64_t parts_;
  int64_t stripe_;
  // contiguous_counts() with uneven counts: the first token of every part (P + 1 entries, N
  // last), shared between copies so that a layout stays a cheap value; null otherwise.
  std::shared_ptr<const std::vector<int64_t>> offsets_;
  // permuted(): the slot of every part and the part of every slot; null otherwise.
  std::shared_ptr<const std::vector<int64_t>> slots_;
  std::shared_ptr<const std::vector<int64_t>> parts_of_slots_;
};

}  // namespace a2d

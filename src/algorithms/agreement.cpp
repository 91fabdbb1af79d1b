// Collective validation: before any data moves, every rank checks its own problem and plan, and
// all ranks check that they were given the same ones (a descriptor reduced with max and min; only
// on a mismatch is every rank's descriptor gathered, to name the ranks that differ).
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/error.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/version.hpp"

namespace a2d {
namespace {

struct Field {
  const char* name;
  int64_t value;
  // How a value reads in the message (nullptr: as the number).
  std::string (*text)(int64_t value) = nullptr;
};

std::string dtype_text(int64_t value) {
  return dtype_name(static_cast<DType>(value));
}

std::string mask_kind_text(int64_t value) {
  return mask_kind_name(static_cast<MaskKind>(value));
}

std::vector<Field> descriptor(const Problem& p, const Plan& plan) {
  int32_t scale_bits = 0;
  const float scale = p.scale > 0 ? p.scale : 0.0f;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  int32_t softcap_bits = 0;
  std::memcpy(&softcap_bits, &p.softcap, sizeof softcap_bits);
  return {
      {"library version", A2D_VERSION_MAJOR * 10000 + A2D_VERSION_MINOR * 100 + A2D_VERSION_PATCH},
      {"dtype", static_cast<int64_t>(p.dtype), dtype_text},
      {"batch", p.batch},
      {"heads", p.heads},
      {"kv_heads", p.kv_heads},
      {"seq", p.seq},
      {"head_dim", p.head_dim},
      {"mask", static_cast<int64_t>(p.mask.kind), mask_kind_text},
      {"window (left)", p.mask.window_left()},
      {"window (right)", p.mask.window_right()},
      {"documents", p.mask.documents()},
      {"mask slices", p.mask.slices()},
      // Mask::digest: the document boundaries and the slices, which the fields above do not show.
      {"document boundaries and slices (hash)", p.mask.digest()},
      {"scale", scale_bits},
      {"sinks", p.sinks ? 1 : 0},
      {"softcap (bits)", softcap_bits},
      {"algorithm", static_cast<int64_t>(plan.algorithm)},
      {"grid rows", plan.grid.rows},
      {"grid cols", plan.grid.cols},
      {"layout", static_cast<int64_t>(plan.layout)},
      {"stripe", plan.stripe},
      {"kv_transpose", plan.kv_transpose ? 1 : 0},
      {"heads_parallel", plan.heads_parallel}};
}

std::string layout_text(int64_t value) {
  return layout_name(static_cast<LayoutKind>(value));
}

// FNV-1a of one value per part of a layout.
template <class Value>
int64_t parts_hash(const TokenLayout& layout, Value value_of) {
  uint64_t hash = 14695981039346656037ull;
  for (int64_t p = 0; p < layout.parts(); ++p)
    hash = (hash ^ static_cast<uint64_t>(value_of(p))) * 1099511628211ull;
  return static_cast<int64_t>(hash >> 1);
}

// The layout's counts (0 unless uneven), and its part order (0 unless permuted): ranks given
// different cuts or orders differ.
int64_t counts_hash(const TokenLayout& layout) {
  return layout.uneven() ? parts_hash(layout, [&](int64_t p) { return layout.count(p); }) : 0;
}
int64_t order_hash(const TokenLayout& layout) {
  return layout.is_permuted() ? parts_hash(layout, [&](int64_t p) { return layout.slot(p); }) : 0;
}

// "8 on ranks 0-2, 4-15; 12 on rank 3"
std::string describe_values(const std::vector<int64_t>& by_rank,
                            std::string (*text)(int64_t value)) {
  std::map<int64_t, std::vector<int>> ranks_of;
  for (int rank = 0; rank < static_cast<int>(by_rank.size()); ++rank) {
    ranks_of[by_rank[static_cast<size_t>(rank)]].push_back(rank);
  }
  std::ostringstream out;
  bool first_value = true;
  for (const auto& [value, ranks] : ranks_of) {
    out << (first_value ? "" : "; ") << (text ? text(value) : std::to_string(value)) << " on rank"
        << (ranks.size() > 1 ? "s " : " ");
    first_value = false;
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
        ++j;
      out << (i ? ", " : "") << ranks[i];
      if (j > i) out << "-" << ranks[j];
      i = j + 1;
    }
  }
  return out.str();
}

void check_fields(Communicator& world, const std::vector<Field>& mine);

}  // namespace

void check_agreement(Communicator& world, const Problem& problem, const Plan& plan) {
  check_fields(world, descriptor(problem, plan));
}

void check_agreement(Communicator& world, const Problem& problem, const Plan& plan,
                     const TokenLayout& shards) {
  std::vector<Field> fields = descriptor(problem, plan);
  fields.push_back({"shards' layout", static_cast<int64_t>(shards.kind()), layout_text});
  fields.push_back({"shards' tokens", shards.tokens()});
  fields.push_back({"shards' stripe", shards.stripe()});
  fields.push_back({"shards' counts (hash)", counts_hash(shards)});
  fields.push_back({"shards' order (hash)", order_hash(shards)});
  check_fields(world, fields);
}

namespace {

void check_fields(Communicator& world, const std::vector<Field>& mine) {
  const int64_t fields = static_cast<int64_t>(mine.size());
  std::vector<int64_t> high(static_cast<size_t>(fields)), low(static_cast<size_t>(fields));
  for (int64_t i = 0; i < fields; ++i) {
    high[i] = mine[i].value;
    low[i] = -mine[i].value;
  }
  world.all_reduce(high.data(), fields, Reduction::max);
  world.all_reduce(low.data(), fields, Reduction::max);
  bool agree = true;
  for (int64_t i = 0; i < fields; ++i)
    agree = agree && high[i] == -low[i];
  if (agree) return;

  // Name the ranks: every rank's descriptor.
  std::vector<int64_t> values(static_cast<size_t>(fields));
  for (int64_t i = 0; i < fields; ++i)
    values[static_cast<size_t>(i)] = mine[i].value;
  std::vector<int64_t> all(values.size() * static_cast<size_t>(world.size()));
  world.all_gather(Place::at_host(values.data()), Place::at_host(all.data()),
                   std::vector<int64_t>(static_cast<size_t>(world.size()),
                                        fields * static_cast<int64_t>(sizeof(int64_t))));
  std::ostringstream differences;
  for (int64_t i = 0; i < fields; ++i) {
    if (high[i] == -low[i]) continue;
    std::vector<int64_t> by_rank(static_cast<size_t>(world.size()));
    for (int rank = 0; rank < world.size(); ++rank)
      by_rank[static_cast<size_t>(rank)] = all[static_cast<size_t>(rank * fields + i)];
    differences << "\n  " << mine[i].name << ": " << describe_values(by_rank, mine[i].text);
  }
  // Every rank reaches this point with the same text: the error is collective by construction.
  const std::string brief =
      "the ranks were given different problems or plans; every rank must pass the same ones:" +
      differences.str();
  throw CollectiveError("attention2d error: " + brief, brief, __FILE__, __LINE__);
}

}  // namespace
}  // namespace a2d

// Attention on the caller's shards over MPI (relayout.hpp), at the process count this program was
// started with and in the dtype and on the device it was given (mpi_checks.hpp):
//   * every algorithm (ATTENTION2D both variants, Ring, all-gather K/V, Ulysses where P divides
//     the K/V heads, the hybrid) on contiguous (even), contiguous uneven (a rank without tokens)
//     and zigzag shards, N odd and divisible by neither P nor 2P, GQA 12:4, causal with packed
//     documents and unmasked with attention sinks: O, LSE, dQ, dK, dV (and dsink) against the
//     fp64 reference within the dtype's bounds, and every rank's counted traffic, the exchanges'
//     phases included, equal to the cost model phase by phase and in total;
//   * LayoutExchange on its own: A -> B -> A is the identity bit for bit (strided tensors of two
//     dtypes' worth of fields and LSE rows, host-wrapped memory on the CPU backend), counted
//     bytes equal to traffic(); layouts that move nothing send nothing;
//   * disagreeing shards, or shards of the wrong size, are a CollectiveError on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "attention2d/collective.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/tools/check.hpp"
#include "attention2d/tools/data.hpp"
#include "attention2d/tools/harness.hpp"
#include "mpi_checks.hpp"
#include "unit/make_problem.hpp"

namespace a2d {
namespace {

constexpr uint64_t kSeed = 4321;
const char* const kOutputNames[6] = {"O", "LSE", "dQ", "dK", "dV", "dsink"};

struct NamedLayout {
  std::string name;
  TokenLayout layout;
};

// The shards users bring: an even contiguous slice per rank, an uneven cut with rank 1 empty (and
// rank 0 holding about half), and zigzag.
std::vector<NamedLayout> user_layouts(int64_t seq, int ranks) {
  std::vector<NamedLayout> list = {{"contiguous", TokenLayout(LayoutKind::contiguous, seq, ranks)},
                                   {"zigzag", TokenLayout(LayoutKind::zigzag, seq, ranks)}};
  std::vector<int64_t> counts(static_cast<size_t>(ranks), 0);
  counts[0] = ranks == 1 ? seq : seq / 2;
  int64_t left = seq - counts[0];
  for (int r = 2; r < ranks; ++r) {
    counts[static_cast<size_t>(r)] = r + 1 == ranks ? left : left / 3;
    left -= counts[static_cast<size_t>(r)];
  }
  if (ranks == 2) counts[1] = left;  // two ranks: the second holds the rest
  list.push_back({"uneven", TokenLayout::contiguous_counts(counts)});
  return list;
}

// Every algorithm this problem allows on `ranks` ranks, in its default plan.
std::vector<Plan> every_algorithm(const Problem& problem, int ranks) {
  std::vector<Plan> plans;
  for (const Algorithm algorithm :
       {Algorithm::attention2d, Algorithm::attention2d_overlap, Algorithm::ring,
        Algorithm::allgather_kv, Algorithm::ulysses, Algorithm::hybrid}) {
    const Plan plan = default_plan(algorithm, problem, ranks);
    try {
      check_plan(plan, problem, ranks);
      plans.push_back(plan);
    } catch (const Error&) {
      // Ulysses where P does not divide the K/V heads
    }
  }
  return plans;
}

// Rank 0's errors, shared so that every rank reports the same verdict.
void expect_within(Communicator& world, double (&errors)[6], const OutputBounds& bounds,
                   const std::string& what) {
  world.broadcast(errors, sizeof errors, 0);
  for (int i = 0; i < 6; ++i)
    EXPECT_LE(errors[i], bounds.of(i)) << what << ": " << kOutputNames[i];
}

TEST(RelayoutMpi, EveryAlgorithmOnTheCallersShardsMatchesTheReferenceAndTheModel) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_mpi_communicator(MPI_COMM_WORLD), log);
  const std::unique_ptr<Backend> backend = test_backend();
  const int ranks = world.size();
  const int64_t p = ranks;
  // N odd and a multiple of neither P nor 2P (for P = 3, 4); GQA 12:4, so that Ulysses runs at
  // P = 1 and 4 and the hybrid splits the heads at P = 4.
  Problem causal_docs = in_test_dtype(test::make_problem(1, 12, 4, 14 * p + 5, 16, Mask::causal()));
  causal_docs.mask = causal_docs.mask.with_documents({3, causal_docs.seq - 10, 1, 6});
  Problem sinks = in_test_dtype(test::make_problem(2, 12, 4, 10 * p + 7, 24, Mask::none()));
  sinks.sinks = true;
  int runs = 0;
  for (const auto& [name, problem] : std::vector<std::pair<std::string, Problem>>{
           {"causal_documents", causal_docs}, {"none_sinks_batch2", sinks}}) {
    ReferenceOutputs reference;
    if (world.rank() == 0) {
      reference = reference_outputs(problem, generate_global(problem, kSeed, true), true, 1);
    }
    for (const NamedLayout& user : user_layouts(problem.seq, ranks)) {
      const UserShards shards{user.layout, RelayoutBackward::stateless};
      for (const Plan& plan : every_algorithm(problem, ranks)) {
        const std::string what = name + " on " + user.name + " shards, " + plan.describe();
        auto attention = make_attention(problem, plan, world, *backend, user.layout);
        ASSERT_TRUE(same_assignment(attention->layout(), user.layout)) << what;
        ShardSet set =
            make_shards(problem, attention->layout(), world.rank(), kSeed, true, true, *backend);
        log->clear();
        attention->forward(set.forward(problem));
        attention->backward(set.backward(problem));

        expect_traffic_equals_model(world, *log, problem, plan, what, &shards);

        world.set_phase("io");
        const GlobalOutputs outputs =
            gather_outputs(world, 0, problem, attention->layout(), set, true);
        double errors[6] = {0, 0, 0, 0, 0, -1};
        if (world.rank() == 0) {
          const OutputErrors e = compare_outputs(outputs, reference, true);
          errors[0] = e.out, errors[1] = e.lse, errors[2] = e.dq, errors[3] = e.dk;
          errors[4] = e.dv, errors[5] = e.dsink;
        }
        expect_within(world, errors, output_bounds(problem.dtype), what);
        if (problem.sinks) {
          EXPECT_GE(errors[5], 0.0) << what << ": no dsink";
        }
        ++runs;
      }
    }
  }
  if (world.rank() == 0) {
    std::cout << "checked " << runs << " runs on the caller's shards on " << ranks << " ranks ("
              << test_settings().describe() << ")\n";
  }
}

// Token rows of one tensor: a strided view (two heads of padding per token) in a buffer of the
// test's backend, its bytes generated from (seed, rank) so that any rank can rebuild them.
struct Strided {
  std::vector<std::byte> host;  // the whole buffer's bytes
  BufferPtr buffer;
  TokenTensor tensor;
};

Strided strided_tokens(Backend& backend, DType dtype, int64_t batch, int64_t tokens, int64_t heads,
                       int64_t width, uint64_t salt, bool wrap) {
  const int64_t e = dtype_bytes(dtype), padded = heads + 2;
  Strided s;
  s.host.resize(static_cast<size_t>(std::max<int64_t>(batch * tokens * padded * width * e, 1)));
  // Any bytes will do, bit patterns of NaN included: the exchange must move them unchanged.
  uint64_t state = salt * 0x9e3779b97f4a7c15ull + 1;
  for (std::byte& b : s.host) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::byte>(state >> 56);
  }
  const auto bytes = static_cast<int64_t>(s.host.size());
  if (wrap) {
    s.buffer = backend.wrap_host(s.host.data(), bytes);
  } else {
    s.buffer = backend.allocate(bytes);
    backend.upload(s.host.data(), Place::in(*s.buffer), bytes);
  }
  // [batch, tokens, heads, width] from head 1 of [batch, tokens, heads + 2, width].
  s.tensor =
      TokenTensor{s.buffer.get(), width * e, dtype, tokens * padded * width, padded * width, width};
  return s;
}

std::vector<std::byte> downloaded(Backend& backend, const Strided& s) {
  std::vector<std::byte> bytes(s.host.size());
  backend.download(Place::in(*s.buffer), bytes.data(), static_cast<int64_t>(bytes.size()));
  return bytes;
}

TEST(RelayoutMpi, ExchangeThereAndBackIsTheIdentityAndSendsWhatItSays) {
  auto log = std::make_shared<TrafficLog>();
  CountingCommunicator world(make_mpi_communicator(MPI_COMM_WORLD), log);
  const std::unique_ptr<Backend> backend = test_backend();
  const bool wrap = backend->host_accessible();  // the caller's own memory, where possible
  const int ranks = world.size(), rank = world.rank();
  const int64_t seq = 9 * ranks + 5, batch = 2, width = 5;
  const DType dtype = test_settings().dtype;
  std::vector<NamedLayout> layouts = user_layouts(seq, ranks);
  layouts.push_back({"cyclic", TokenLayout(LayoutKind::cyclic, seq, ranks)});
  layouts.push_back({"striped(2)", TokenLayout(LayoutKind::striped, seq, ranks, 2)});
  int pairs = 0;
  for (const NamedLayout& a : layouts) {
    for (const NamedLayout& b : layouts) {
      const std::string what = a.name + " -> " + b.name + " -> " + a.name;
      const LayoutExchange there(a.layout, b.layout, rank, *backend);
      const LayoutExchange back(b.layout, a.layout, rank, *backend);
      const int64_t own = a.layout.count(rank), moved = b.layout.count(rank);
      // Two token tensors (3 and 1 heads, the test's dtype) and LSE-like rows of 3 heads.
      Strided q = strided_tokens(*backend, dtype, batch, own, 3, width, 11 + rank, wrap);
      Strided kv = strided_tokens(*backend, dtype, batch, own, 1, width, 23 + rank, wrap);
      const std::vector<std::byte> q_before = q.host, kv_before = kv.host;
      std::vector<float> rows(static_cast<size_t>(std::max<int64_t>(batch * 3 * own, 1)));
      for (size_t i = 0; i < rows.size(); ++i)
        rows[i] = static_cast<float>(rank * 1000 + static_cast<int64_t>(i)) * 0.5f;
      const auto row_bytes = static_cast<int64_t>(rows.size() * sizeof(float));
      const BufferPtr lse = backend->allocate(row_bytes);
      backend->upload(rows.data(), Place::in(*lse), row_bytes);
      // Plain destinations of the other layout.
      const auto dense = [&](int64_t heads, DType t) {
        return backend->allocate(
            std::max<int64_t>(batch * moved * heads * width * dtype_bytes(t), 1));
      };
      const BufferPtr q_mid = dense(3, dtype), kv_mid = dense(1, dtype);
      const BufferPtr lse_mid = backend->allocate(std::max<int64_t>(batch * 3 * moved * 4, 1));
      const LayoutExchange::TokenMove forth[2] = {
          {q.tensor, dense_token_tensor(*q_mid, dtype, moved, 3, width), batch, 3, width},
          {kv.tensor, dense_token_tensor(*kv_mid, dtype, moved, 1, width), batch, 1, width}};
      const LayoutExchange::RowMove forth_rows[1] = {
          {dense_row_tensor(*lse, 3, own), dense_row_tensor(*lse_mid, 3, moved), batch, 3}};
      log->clear();
      there.exchange(world, forth, forth_rows, "relayout.there");
      // Back into fresh strided tensors and rows, whose padding must stay as it was.
      Strided q_back = strided_tokens(*backend, dtype, batch, own, 3, width, 99, wrap);
      Strided kv_back = strided_tokens(*backend, dtype, batch, own, 1, width, 98, wrap);
      const std::vector<std::byte> q_pad = q_back.host, kv_pad = kv_back.host;
      const BufferPtr lse_back = backend->allocate(row_bytes);
      const LayoutExchange::TokenMove home[2] = {{forth[0].to, q_back.tensor, batch, 3, width},
                                                 {forth[1].to, kv_back.tensor, batch, 1, width}};
      const LayoutExchange::RowMove home_rows[1] = {
          {forth_rows[0].to, dense_row_tensor(*lse_back, 3, own), batch, 3}};
      back.exchange(world, home, home_rows, "relayout.back");

      // The bits: every row as it was, the padding of the destination untouched.
      std::vector<std::byte> q_got = downloaded(*backend, q_back),
                             kv_got = downloaded(*backend, kv_back);
      const auto expected = [&](const std::vector<std::byte>& data,
                                const std::vector<std::byte>& pad, int64_t heads) {
        std::vector<std::byte> out = pad;
        const int64_t e = dtype_bytes(dtype), padded = heads + 2;
        for (int64_t bt = 0; bt < batch * own; ++bt) {
          const int64_t at = (bt * padded + 1) * width * e;
          std::memcpy(out.data() + at, data.data() + at, static_cast<size_t>(heads * width * e));
        }
        return out;
      };
      EXPECT_TRUE(q_got == expected(q_before, q_pad, 3)) << what << ": Q-like rows";
      EXPECT_TRUE(kv_got == expected(kv_before, kv_pad, 1)) << what << ": K-like rows";
      std::vector<float> rows_got(rows.size());
      backend->download(Place::in(*lse_back), rows_got.data(), row_bytes);
      EXPECT_EQ(std::memcmp(rows_got.data(), rows.data(), static_cast<size_t>(batch * 3 * own * 4)),
                0)
          << what << ": rows";

      // Counted bytes are traffic() of the bundle's record, each way; nothing where nothing moves.
      const int64_t record = LayoutExchange::record_bytes(forth, forth_rows);
      const auto counted = [&](const char* phase) {
        const auto it = log->phases().find(phase);
        return it == log->phases().end() ? Traffic{} : it->second;
      };
      const Traffic sent_there = counted("relayout.there"), sent_back = counted("relayout.back");
      EXPECT_EQ(sent_there.bytes, there.traffic(record).bytes) << what;
      EXPECT_EQ(sent_there.messages, there.traffic(record).messages) << what;
      EXPECT_EQ(sent_back.bytes, back.traffic(record).bytes) << what;
      EXPECT_EQ(sent_back.messages, back.traffic(record).messages) << what;
      EXPECT_EQ(there.moves_nothing(), same_assignment(a.layout, b.layout)) << what;
      if (there.moves_nothing()) {
        EXPECT_EQ(sent_there.bytes + sent_back.bytes, 0) << what;
        EXPECT_EQ(sent_there.messages + sent_back.messages, 0) << what;
      }
      world.set_phase("control");
      ++pairs;
    }
  }
  // Layouts that differ in name only move nothing: the even cut and the contiguous layout, and
  // any two layouts over one rank.
  const LayoutExchange same(TokenLayout::contiguous_counts([&] {
                              std::vector<int64_t> counts;
                              const TokenLayout even(LayoutKind::contiguous, seq, ranks);
                              for (int r = 0; r < ranks; ++r)
                                counts.push_back(even.count(r));
                              return counts;
                            }()),
                            TokenLayout(LayoutKind::contiguous, seq, ranks), rank, *backend);
  EXPECT_TRUE(same.moves_nothing());
  EXPECT_EQ(same.traffic(100).bytes, 0);
  const LayoutExchange cyclic_zigzag(TokenLayout(LayoutKind::cyclic, seq, ranks),
                                     TokenLayout(LayoutKind::zigzag, seq, ranks), rank, *backend);
  EXPECT_EQ(cyclic_zigzag.moves_nothing(), ranks == 1);
  if (rank == 0) std::cout << "exchanged " << pairs << " layout pairs there and back\n";
}

TEST(RelayoutMpi, ShardsMustAgreeAndFitOnEveryRank) {
  auto world = make_mpi_communicator(MPI_COMM_WORLD);
  const std::unique_ptr<Backend> backend = test_backend();
  const int ranks = world->size();
  const Problem problem =
      in_test_dtype(test::make_problem(1, 4, 2, 6 * ranks + 1, 16, Mask::causal()));
  const Plan plan = default_plan(Algorithm::attention2d, problem, ranks);
  // Too few tokens: refused on every rank, naming the sizes.
  int64_t refused = 0;
  try {
    make_attention(problem, plan, *world, *backend,
                   TokenLayout(LayoutKind::contiguous, problem.seq - 1, ranks));
  } catch (const CollectiveError& e) {
    refused = std::string(e.what()).find("must split the problem's") != std::string::npos;
  }
  world->all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, ranks);
  if (ranks == 1) return;
  // Rank 0 brings zigzag shards, the others contiguous ones.
  refused = 0;
  try {
    make_attention(problem, plan, *world, *backend,
                   TokenLayout(world->rank() == 0 ? LayoutKind::zigzag : LayoutKind::contiguous,
                               problem.seq, ranks));
  } catch (const CollectiveError& e) {
    refused = std::string(e.what()).find("shards' layout: contiguous on rank") != std::string::npos;
  }
  world->all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, ranks);
  // Different uneven cuts.
  std::vector<int64_t> counts(static_cast<size_t>(ranks), 6);
  counts[0] = problem.seq - 6 * (ranks - 1);
  if (world->rank() == 1) std::swap(counts[0], counts[1]);
  refused = 0;
  try {
    make_attention(problem, plan, *world, *backend, TokenLayout::contiguous_counts(counts));
  } catch (const CollectiveError& e) {
    refused = std::string(e.what()).find("shards' counts") != std::string::npos;
  }
  world->all_reduce(&refused, 1, Reduction::sum);
  EXPECT_EQ(refused, ranks);
}

}  // namespace
}  // namespace a2d

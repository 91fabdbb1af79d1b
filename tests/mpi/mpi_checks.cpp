#include "mpi_checks.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>

#include <gtest/gtest.h>

#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/model.hpp"
#include "attention2d/mpi_comm.hpp"

namespace a2d {

TestSettings& test_settings() {
  static TestSettings settings;
  return settings;
}

std::string TestSettings::describe() const {
  return std::string(dtype_name(dtype)) + " on " + device +
         (mask_kinds ? " with mask kinds"
          : masks    ? " with masks"
                     : "") +
         " over " + comm_kind_name(comm);
}

namespace {
std::unique_ptr<Communicator>& gloo_world() {
  static std::unique_ptr<Communicator> world;
  return world;
}
}  // namespace

std::unique_ptr<Communicator> make_test_world() {
  if (test_settings().comm == CommKind::mpi) return make_mpi_communicator(MPI_COMM_WORLD);
  std::unique_ptr<Communicator>& world = gloo_world();
  if (!world) world = make_gloo_communicator(MPI_COMM_WORLD);
  return world->split(0, world->rank());
}

void end_test_worlds() {
  gloo_world().reset();
}

void parse_test_settings(int argc, char** argv) {
  TestSettings& s = test_settings();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    A2D_REQUIRE(i + 1 < argc, "test option ", arg, " needs a value");
    if (arg == "--dtype") {
      s.dtype = parse_dtype(argv[++i]);
    } else if (arg == "--device") {
      s.device = argv[++i];
      make_backend(s.device);  // refuses unknown devices here, before any test runs
    } else if (arg == "--comm") {
      s.comm = parse_comm_kind(argv[++i]);
      A2D_REQUIRE(s.comm != CommKind::nccl, "the MPI tests run over --comm mpi or gloo");
      A2D_REQUIRE(s.comm != CommKind::gloo || gloo_built(), "--comm gloo: this build has no Gloo");
    } else if (arg == "--masks") {
      const std::string value = argv[++i];
      A2D_REQUIRE(value == "on" || value == "off" || value == "kinds",
                  "--masks takes on, kinds or off, got '", value, "'");
      s.masks = value != "off";
      s.mask_kinds = value == "kinds";
    } else {
      A2D_FAIL("unknown test option '", arg,
               "'; the MPI tests take --dtype, --device, --masks and --comm");
    }
  }
}

std::unique_ptr<Backend> test_backend() {
  return make_backend(test_settings().device);
}

Problem in_test_dtype(Problem problem) {
  problem.dtype = test_settings().dtype;
  return problem;
}

namespace {
std::vector<NamedProblem> mask_kind_problems(int ranks, int64_t heads, int64_t kv_heads) {
  const int64_t p = ranks;
  std::vector<NamedProblem> list;
  const auto add = [&](std::string name, int64_t batch, int64_t seq, int64_t dim, Mask mask,
                       bool sinks, float softcap) {
    Problem problem;
    problem.batch = batch;
    problem.heads = heads;
    problem.kv_heads = kv_heads;
    problem.seq = seq;
    problem.head_dim = dim;
    problem.mask = mask;
    problem.sinks = sinks;
    problem.softcap = softcap;
    list.push_back({std::move(name), in_test_dtype(problem)});
  };
  // Bidirectional local attention, wider than a rank's share of the sequence.
  add("window_two_sided", 1, 23 * p + 5, 48, Mask::window_size(p + 2, 3), false, 0.0f);
  // Unbounded to the left, 4 keys to the right, within documents; sinks.
  const int64_t seq_docs = 19 * p + 7;
  add("window_left_unbounded_docs_sinks", 1, seq_docs, 32,
      Mask::window_size(-1, 4).with_documents({1, 2 * p + 1, seq_docs - 4 * p - 6, 1, 2 * p + 3}),
      true, 0.0f);
  // A prefix-LM (the first quarter bidirectional) with softcap.
  const int64_t seq_prefix = 21 * p + 3;
  add("prefix_lm_softcap", 1, seq_prefix, 64,
      Mask::from_ranges(parse_mask_ranges("prefix-lm:25%", seq_prefix)), false, 2.0f);
  // Block-causal (video), blocks of P + 3 tokens, batch 2.
  const int64_t seq_blocks = 17 * p + 6;
  add("block_causal_batch2", 2, seq_blocks, 32,
      Mask::from_ranges(parse_mask_ranges("block-causal:" + std::to_string(p + 3), seq_blocks)),
      false, 0.0f);
  // Slices of every type, leaving rows with no key (rows [0, 3), a bi-causal slice of more
  // queries than keys, the rows of a causal slice before its diagonal) and rows that meet three
  // slices; sinks (a row with no key then gets O = 0, LSE = the sink).
  const int64_t n = 25 * p + 9;
  add("ranges_every_type_uncovered_sinks", 1, n, 32,
      Mask::from_ranges({{3, n / 2, 0, n / 4, RangeType::full},
                         {3, n / 2, n / 4, n / 4 + 2, RangeType::bi_causal},
                         {3, n / 2, n / 2, n, RangeType::inv_causal},
                         {n / 2, n, n / 3, n / 3 + 3, RangeType::causal},
                         {n / 2, n, n / 2, n, RangeType::causal}}),
      true, 0.0f);
  // Random slices of every type.
  const int64_t seq_random = 27 * p + 4;
  add("random_slices", 1, seq_random, 32,
      Mask::from_ranges(parse_mask_ranges("random:10:" + std::to_string(ranks), seq_random)), false,
      0.0f);
  return list;
}
}  // namespace

std::vector<NamedProblem> masked_problems(int ranks, int64_t heads, int64_t kv_heads) {
  if (test_settings().mask_kinds) return mask_kind_problems(ranks, heads, kv_heads);
  const int64_t p = ranks;
  std::vector<NamedProblem> list;
  const auto add = [&](std::string name, int64_t batch, int64_t seq, int64_t dim, Mask mask,
                       const std::vector<int64_t>& lengths, bool sinks, float softcap) {
    Problem problem;
    problem.batch = batch;
    problem.heads = heads;
    problem.kv_heads = kv_heads;
    problem.seq = seq;
    problem.head_dim = dim;
    problem.mask = lengths.empty() ? mask : mask.with_documents(lengths);
    problem.sinks = sinks;
    problem.softcap = softcap;
    list.push_back({std::move(name), in_test_dtype(problem)});
  };
  // One document of all but 11 tokens between one-token documents: 1, 1, N - 11, 1, 4, 1, 3.
  const int64_t seq_long = 23 * p + 5;
  add("docs_long_causal_sinks", 1, seq_long, 64, Mask::causal(), {1, 1, seq_long - 11, 1, 4, 1, 3},
      true, 0.0f);
  // Many short documents of awkward lengths (1 to 13), unmasked within each.
  const int64_t seq_short = 19 * p + 7;
  std::vector<int64_t> short_lengths;
  for (int64_t left = seq_short, i = 0; left > 0; ++i) {
    const int64_t length = std::min(left, int64_t{1} + (i * 7 + 3) % 13);
    short_lengths.push_back(length);
    left -= length;
  }
  add("docs_short_none_batch2_d80_softcap", 2, seq_short, 80, Mask::none(), short_lengths, false,
      2.0f);
  // The skewed mix (one document of N/2, short ones around it) under a window.
  const int64_t seq_skewed = 29 * p + 3;
  add("docs_skewed_window_sinks_softcap", 1, seq_skewed, 48, Mask::causal_window(p + 6),
      generated_document_lengths("skewed", seq_skewed, 7), true, 3.0f);
  // Sinks and softcap without documents.
  add("causal_sinks_softcap", 1, 17 * p + 2, 32, Mask::causal(), {}, true, 1.5f);
  return list;
}

std::string traffic_mismatches(const TrafficLog& log, const Problem& problem, const Plan& plan,
                               int rank, const UserShards* shards) {
  std::ostringstream out;
  const auto predicted = predict_traffic(problem, plan, rank, shards);
  for (const auto& [phase, expected] : predicted) {
    const auto it = log.phases().find(phase);
    const Traffic got = it == log.phases().end() ? Traffic{} : it->second;
    if (got.bytes != expected.bytes || got.messages != expected.messages) {
      out << " " << phase << ": counted " << got.bytes << " B/" << got.messages
          << " msgs, predicted " << expected.bytes << " B/" << expected.messages << " msgs;";
    }
  }
  for (const auto& [phase, got] : log.phases()) {
    if (!predicted.count(phase) && (got.bytes || got.messages)) {
      out << " unpredicted phase " << phase << ": " << got.bytes << " B;";
    }
  }
  return out.str();
}

}  // namespace a2d

namespace a2d {

void expect_traffic_equals_model(Communicator& world, const TrafficLog& log,
                                 const Problem& problem, const Plan& plan, const std::string& what,
                                 const UserShards* shards) {
  const std::string mismatch = traffic_mismatches(log, problem, plan, world.rank(), shards);
  if (!mismatch.empty())
    std::cerr << "rank " << world.rank() << " " << what << ":" << mismatch << "\n";
  world.set_phase("control");  // the checks' own messages are not the algorithm's
  int64_t bad = mismatch.empty() ? 0 : 1;
  world.all_reduce(&bad, 1, Reduction::sum);
  EXPECT_EQ(bad, 0) << what << ": counted traffic differs from the model on " << bad
                    << " ranks (details on stderr)";
  expect_model_totals(world, log, problem, plan, what, shards);
}

void expect_model_totals(Communicator& world, const TrafficLog& log, const Problem& problem,
                         const Plan& plan, const std::string& what, const UserShards* shards) {
  int64_t counted[8] = {
      log.total("forward").bytes,           log.total("forward").messages,
      log.total("backward").bytes,          log.total("backward").messages,
      log.total("forward.relayout").bytes,  log.total("forward.relayout").messages,
      log.total("backward.relayout").bytes, log.total("backward.relayout").messages};
  world.all_reduce(counted, 8, Reduction::max);
  // The machine only affects times.
  const Prediction model =
      predict(problem, plan, preset_machine("h100-ndr", problem.dtype), world.size(), shards);
  EXPECT_EQ(model.relayout_forward.bytes, counted[4]) << what << ": forward relayout bytes";
  EXPECT_EQ(model.relayout_forward.messages, counted[5]) << what << ": forward relayout messages";
  EXPECT_EQ(model.relayout_backward.bytes, counted[6]) << what << ": backward relayout bytes";
  EXPECT_EQ(model.relayout_backward.messages, counted[7]) << what << ": backward relayout messages";
  const double element_bytes = static_cast<double>(dtype_bytes(problem.dtype));
  EXPECT_EQ(model.forward.bytes, counted[0]) << what << ": forward bytes per rank";
  EXPECT_EQ(model.forward.messages, counted[1]) << what << ": forward messages per rank";
  EXPECT_EQ(model.backward.bytes, counted[2]) << what << ": backward bytes per rank";
  EXPECT_EQ(model.backward.messages, counted[3]) << what << ": backward messages per rank";
  EXPECT_DOUBLE_EQ(element_bytes * model.words_forward, static_cast<double>(counted[0])) << what;
  EXPECT_DOUBLE_EQ(element_bytes * model.words_backward, static_cast<double>(counted[2])) << what;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const CollectiveError& e) {
    return e.what();
  } catch (const Error& e) {
    return std::string("raised on this rank alone: ") + e.what();
  }
  return "accepted";
}

}  // namespace a2d

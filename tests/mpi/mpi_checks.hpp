// Checks shared by the MPI test programs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {

// What the test program was started with (mpi_main.cpp reads them off the command line, after
// GoogleTest's own flags): --dtype fp32|bf16|fp16 (default fp32) and --device cpu|fenced (default
// cpu). The programs run their whole matrix with them, so CTest registers each program at every
// process count once per setting it needs.
// --masks on replaces each program's problems by masked_problems() (documents, sinks, softcap);
// --masks kinds by the mask kinds of mask.hpp instead (two-sided windows, range masks).
// --comm mpi|gloo (default mpi) chooses the communicator the tests run over (make_test_world).
struct TestSettings {
  DType dtype = DType::f32;
  std::string device = "cpu";
  bool masks = false;
  bool mask_kinds = false;  // --masks kinds (masks is true as well)
  CommKind comm = CommKind::mpi;
  std::string describe() const;  // "bf16 on fenced over gloo"
};
TestSettings& test_settings();
void parse_test_settings(int argc, char** argv);  // throws a2d::Error on anything it does not know
std::unique_ptr<Backend> test_backend();

// A communicator over every rank of the job, of the settings' kind: an MPI duplicate of
// MPI_COMM_WORLD, or a view (split) of one Gloo mesh made once per program (its connections are
// made once; every test gets a private view of them). Collective.
std::unique_ptr<Communicator> make_test_world();
// Ends the program's Gloo mesh, if any (before MPI is finalised).
void end_test_worlds();
// The problem in the settings' dtype.
Problem in_test_dtype(Problem problem);

// The problems of the --masks matrix, in the settings' dtype: packed documents (one-token
// documents, one spanning most of N, a skewed generated mix; no length divisible by P) with each
// mask kind, with attention sinks and softcap on some, and sinks with softcap on a causal
// problem. `heads` query heads on `kv_heads` K/V heads. With --masks kinds: flash-attn's two-sided
// windows (with documents and sinks on one) and MagiAttention's range masks (a prefix-LM, a
// block-causal mask, random slices, and slices of every type that leave rows with no key), with
// softcap, sinks and batch 2 on some; no length a multiple of P.
struct NamedProblem {
  std::string name;
  Problem problem;
};
std::vector<NamedProblem> masked_problems(int ranks, int64_t heads, int64_t kv_heads);

// Every phase where this rank's counted traffic differs from predict_traffic(problem, plan, rank),
// and every counted phase the model does not know; "" when they agree exactly. With `shards`,
// the prediction includes the exchanges from and to the caller's layout.
std::string traffic_mismatches(const TrafficLog& log, const Problem& problem, const Plan& plan,
                               int rank, const UserShards* shards = nullptr);

// The cost model's words and messages per rank (predict(), which the planner and a2d model use)
// equal the largest counted totals over the ranks, forward and backward (with `shards`: the
// exchanges' own part too, Prediction::relayout_*). Collective.
void expect_model_totals(Communicator& world, const TrafficLog& log, const Problem& problem,
                         const Plan& plan, const std::string& what,
                         const UserShards* shards = nullptr);

// Both of the above: every rank's counted traffic against the model phase by phase (a mismatch
// printed on stderr by its rank fails the test on every rank), then the model's totals. The
// checks' own messages are counted under the phase "control". Collective.
void expect_traffic_equals_model(Communicator& world, const TrafficLog& log,
                                 const Problem& problem, const Plan& plan, const std::string& what,
                                 const UserShards* shards = nullptr);

// What `call` raised: a CollectiveError's what(), "raised on this rank alone: ..." for any other
// a2d::Error, "accepted" when it returned.
std::string error_of(const std::function<void()>& call);

}  // namespace a2d

// attention2d: distributed attention, the entry points a training framework calls.
//
//   Problem  the global attention problem (batch, heads, K/V heads, sequence, head dim, mask,
//            scale): identical on every rank.
//   Plan     how to distribute it (algorithm, grid R x C, token layout, kernel threads).
//   DistributedAttention
//            built collectively from both; its layout() says which global tokens each rank's
//            shards hold. forward() takes this rank's Q, K, V shards and returns its O and LSE
//            shards; backward() takes Q, K, V, O, LSE and dO shards and returns dQ, dK, dV.
//            Between the two only these N/P-sized shards are kept (by the caller).
//
// Shards are tensors in buffers of the backend the attention was made with:
// [batch, local tokens, heads, head_dim] (TokenTensor, in the problem's dtype, any strides) and
// LSE [batch, heads, local tokens] (RowTensor, fp32), with the local tokens in the order layout()
// lists them. The algorithms touch them only through the backend's operations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm.hpp"
#include "attention2d/grid.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/layout.hpp"

namespace a2d {

struct UserShards;  // relayout.hpp

enum class Algorithm { attention2d, attention2d_overlap, ring, allgather_kv, ulysses, hybrid };

Algorithm parse_algorithm(const std::string& name);  // throws a2d::Error naming the choices
std::string algorithm_name(Algorithm algorithm);

struct Problem {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t kv_heads = 1;
  int64_t seq = 0;
  int64_t head_dim = 0;
  Mask mask;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim)
  // Element type of Q, K, V, O, dO, dQ, dK, dV (the shards and what is sent of them); row
  // statistics and partial sums are fp32 whatever it is (dtype.hpp).
  DType dtype = DType::f32;
  // Attention sinks (kernel.hpp's add_sinks): the forward then needs ForwardShards::sinks and
  // the backward BackwardShards::sinks and ::dsink.
  bool sinks = false;
  // Logit softcapping: scaled scores s -> softcap * tanh(s / softcap); 0 = off.
  float softcap = 0.0f;

  float softmax_scale() const;
  void validate() const;  // throws a2d::Error saying what to change
  std::string describe() const;
  // Shape of a local kernel call on q_tokens x kv_tokens rows of this problem.
  AttentionShape local_shape(int64_t q_tokens, int64_t kv_tokens) const;
};

struct Plan {
  Algorithm algorithm = Algorithm::attention2d;
  GridShape grid;                          // ATTENTION2D: R x C; hybrid: R x C of each heads
                                           // group; other algorithms: 1 x P
  LayoutKind layout = LayoutKind::cyclic;  // the shard layout of Q, K, V, O (and gradients)
  int64_t stripe = 1;                      // stripe width of the striped layout
  // ATTENTION2D: exchange K/V into the paper's row-major cyclic layout before the column
  // gathers (true), or gather K/V where they already are (false, one exchange less; see
  // docs/attention2d.md).
  bool kv_transpose = true;
  int threads = 1;  // kernel threads per rank
  // Hybrid: U, the ranks of each heads all-to-all (P = U x R x C; docs/attention2d.md,
  // "Heads x ATTENTION2D"); 1 for every other algorithm.
  int heads_parallel = 1;

  // The ranks the plan runs on: U x R x C for the hybrid, R x C (1 x P for the baselines) else.
  int ranks() const { return heads_parallel * grid.size(); }
  std::string describe() const;
};

// The table of algorithms (src/table/, one file per algorithm): what a plan of each chooses.
struct AlgorithmTraits {
  Algorithm algorithm = Algorithm::attention2d;
  const char* name = "";  // as --algo spells it
  // The plan's grid is R x C of its choosing, and the K/V transpose applies (else: 1 x P).
  bool grid = false;
  // The plan's heads_parallel U applies (P = U x R x C; else 1).
  bool heads_parallel = false;
  // The shards are cyclic whatever Plan::layout says (else: the plan's layout, any of them).
  bool cyclic_only = false;
};
const AlgorithmTraits& algorithm_traits(Algorithm algorithm);
// Every algorithm, in the table's order (the order of the enum).
std::vector<Algorithm> all_algorithms();
// Their names, as --algo spells them, in the same order.
std::vector<std::string> algorithm_names();
// Those names as one line of text, joined by `separator` and the last two by `last_separator`:
// algorithm_list(",") = "attention2d,attention2d-overlap,...", algorithm_list(", ", " or ") =
// "attention2d, attention2d-overlap, ... or hybrid".
std::string algorithm_list(const std::string& separator, const std::string& last_separator = "");

// The plan's shape as the programs' tables print it: "U2 1x2", "2x2" (each followed by
// `no_transpose` without the K/V transpose) or the layout's name, per what the algorithm uses.
std::string plan_shape(const Plan& plan, const std::string& no_transpose);
// The options of a2d run that give the plan's shape: " --grid 2x2 --no-kv-transpose",
// " --layout striped --stripe 4", " --heads-parallel 2 --grid 1x2".
std::string plan_options(const Plan& plan);

// Which plans of an algorithm a search, a benchmark or a balance report tries.
struct PlanChoices {
  // Grid algorithms: this grid only (else every grid of P), and each grid also without the K/V
  // transpose.
  const GridShape* grid = nullptr;
  bool both_kv_transposes = false;
  // 1 x P algorithms: one plan per layout (none: the default layout), and with `shards` (an even
  // cut) also the caller's layout.
  std::vector<LayoutKind> layouts;
  const UserShards* shards = nullptr;
  // Heads-parallel algorithms: this U only (0: every U > 1 dividing P; 1: U = 1 on `grid` or the
  // default grid).
  int heads_parallel = 0;
};
// Default plans of `algorithm` varied as `choices` say, in a fixed order; check_plan is not
// applied (a plan may still be one the problem does not allow).
std::vector<Plan> algorithm_plans(Algorithm algorithm, const Problem& problem, int ranks,
                                  const PlanChoices& choices);

// The plan an algorithm uses when only the algorithm is chosen: ATTENTION2D on the most square
// grid with the cyclic layout; Ring with zigzag (causal) or contiguous; and so on.
Plan default_plan(Algorithm algorithm, const Problem& problem, int ranks);
// Throws unless the plan can run `problem` on `ranks` ranks (grid size, layout allowed for the
// algorithm, Ulysses head divisibility), with a message saying what to change.
void check_plan(const Plan& plan, const Problem& problem, int ranks);

// With Problem::sinks, `sinks` is a host array of the sinks' logits [heads] (fp32, the same on
// every rank), and the backward writes the sinks' gradient [heads] to the host array `dsink`:
// the sum over all ranks' rows, the same on every rank.
struct ForwardShards {
  TokenTensor q, k, v;  // read
  TokenTensor out;      // written
  RowTensor lse;        // written
  const float* sinks = nullptr;
};

struct BackwardShards {
  TokenTensor q, k, v, out, d_out;  // read
  RowTensor lse;                    // read
  TokenTensor dq, dk, dv;           // written
  const float* sinks = nullptr;
  float* dsink = nullptr;  // written
};

// Throws unless every shard tensor has the problem's dtype and lies in a buffer of `backend`.
void check_shards(const Problem& problem, const Backend& backend, const ForwardShards& shards);
void check_shards(const Problem& problem, const Backend& backend, const BackwardShards& shards);

class DistributedAttention {
 public:
  virtual ~DistributedAttention() = default;
  DistributedAttention() = default;
  DistributedAttention(const DistributedAttention&) = delete;
  DistributedAttention& operator=(const DistributedAttention&) = delete;

  virtual const Problem& problem() const = 0;
  virtual const Plan& plan() const = 0;
  // Which global tokens each world rank's shards hold (parts = world ranks).
  virtual const TokenLayout& layout() const = 0;
  virtual Backend& backend() const = 0;
  virtual void forward(const ForwardShards& shards) = 0;
  virtual void backward(const BackwardShards& shards) = 0;
};

// Collective over `world`. Before any data moves, every rank validates its problem and plan and
// all ranks check that they agree (check_agreement); any failure raises the same CollectiveError
// on every rank. The attention computes with `backend` (which must outlive it); where the
// backend's memory is not host-accessible, its communicators stage transfers through host memory
// (make_staged_communicator).
std::unique_ptr<DistributedAttention> make_attention(const Problem& problem, const Plan& plan,
                                                     Communicator& world, Backend& backend);

// Collective: throws CollectiveError on every rank, naming each field and the ranks that hold
// each value, unless all ranks pass the same problem and plan (kernel threads may differ).
void check_agreement(Communicator& world, const Problem& problem, const Plan& plan);

}  // namespace a2d

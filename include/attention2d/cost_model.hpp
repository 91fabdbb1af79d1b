// attention2d: the alpha-beta-gamma cost model. Pure functions of (problem, plan, machine): FLOPs,
// words and messages per rank and phase, peak memory per rank, and time with separate intra-node
// and inter-node links, counting overlap where the algorithm overlaps. docs/cost-model.md derives
// every formula; tests check the counts against the counting communicator and the exact
// decomposition functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/model.hpp"
#include "attention2d/relayout.hpp"

namespace a2d {

// A link: each message costs `latency_s` plus bytes / `bytes_per_s` (per direction, per rank).
struct Link {
  double latency_s = 0;
  double bytes_per_s = 1;
};

struct Machine {
  std::string name;
  std::string description;
  // Attention kernel throughput per rank (FLOP/s, unmasked FLOPs), forward and backward.
  double kernel_forward_flops = 1;
  double kernel_backward_flops = 1;
  // Under a causal mask (unmasked FLOPs per second of a diagonal block, whose partly masked tiles
  // are computed whole); 0: the rates above.
  double kernel_forward_causal_flops = 0;
  double kernel_backward_causal_flops = 0;
  // CPUs: > 0 charges the backward by the tiles the CPU backward kernel computes (a tile the mask
  // hides in part is computed whole), relative to a non-causal square block of this many rows,
  // the block the rates were calibrated on. 0: by unmasked FLOPs (accelerators' published
  // efficiencies already include their masking).
  int64_t tile_block = 0;
  // CPUs: what the forward kernel spends, on top of the score entries, per 24-row panel of one
  // head in each call (loading the queries, keeping and storing the running state) and per key of
  // one head in each call (copying it into the kernel's tiles); with tile_block. Calls with few
  // keys per query, or few queries per key, pay them over less work. 0: not charged.
  double kernel_forward_panel_s = 0;
  double kernel_forward_key_s = 0;
  // CPUs: bytes per second per rank of the in-place reordering that sorts gathered rows by
  // position under a causal mask (and puts results back). 0: not charged (accelerators: a
  // strided copy at memory bandwidth, negligible next to the kernel).
  double permute_bytes_per_s = 0;
  // CPUs: bytes per second per rank of the reductions in reduce-scatters and reduction rings (the
  // gamma term of a reduction collective): each received word is added to (sum) or merged with
  // (merge: partial attention records, rescaled by exp of their max difference) this rank's own,
  // as the MPI communicator's ring and the algorithms' rings do between their transfers. Charged
  // per word the phase's busiest rank receives (what it sends). 0: not charged (accelerators:
  // NCCL reduces inside the copy kernels of its pipelined ring, under the transfer).
  double sum_bytes_per_s = 0;
  double merge_bytes_per_s = 0;
  Link intra;  // between ranks of one node
  Link inter;  // between nodes
  // CPUs: ranks share the cores, so communication and computation do not overlap once every core
  // is busy. 0: one accelerator per rank.
  int shared_cores = 0;
  // Ranks sharing cores: waiting for other ranks right after computing costs more than the
  // messages (the last rank to finish its kernel holds its core until its time slice ends; ranks
  // that leave first take the cores from those still in the exchange). Charged once per blocking
  // operation (a collective, or an exchange with nothing computed meanwhile) in which some rank
  // sends, and once per ring step that waits for a transfer. Measured by `a2d calibrate`; 0 for
  // one accelerator per rank.
  double sync_s = 0;
  double step_sync_s = 0;
  // Whether the ranks of a node share one network link (one NIC per node) rather than having
  // one each (one NIC per GPU): a shared link carries the traffic of every rank of its node that
  // sends off the node in a phase, so such a phase costs that many times the busiest rank's bytes
  // over `inter` (docs/cost-model.md, "Links").
  bool shared_link = false;
  // Ranks per node of the machine a machine file describes (consecutive world ranks share a
  // node); 0: not part of the machine (the caller says, as --gpus-per-node).
  int ranks_per_node = 0;
  // How the launcher placed the world ranks on nodes: consecutive ranks share a node (false:
  // block placement, ATTENTION2D's columns inside nodes) or rank q sits on node q mod nodes
  // (true: round-robin placement, mpirun --map-by node; for R = nodes, a grid's rows inside
  // nodes).
  bool cyclic_placement = false;
  // The memory a rank may fill (bytes): a GPU's device memory (the presets' datasheet figure, a
  // machine file's memory_gib), or this node's physical memory over the ranks that share it
  // (local). The planner excludes the plans whose memory_per_rank exceeds it. 0: unknown.
  int64_t memory_bytes = 0;
  // The ranks are GPUs that a2d's CUDA backend computes on (the presets; a machine file's
  // `device = gpu`): the planner then refuses problems its kernels do not take (dtype, head
  // dimension, mask), and bf16 is the default dtype. False: CPU processes (local, device = cpu).
  bool gpu = false;
};

// A size in bytes as the programs print it: "80 GiB", "812.5 MiB", "96 KiB", "512 B".
std::string format_bytes(double bytes);

// `a100-hdr`, `h100-ndr` (datasheet numbers, docs/cost-model.md cites each one), with the kernel
// rates of `dtype` (bf16 and fp16: the tensor-core rate) and 80 GiB of device memory per GPU.
Machine preset_machine(const std::string& name, DType dtype);
std::vector<std::string> preset_names();

// This machine, as measured by `a2d calibrate` at `ranks` ranks (the calibration file holds one
// section per rank count it was run at), with this node's physical memory shared by the ranks.
// Throws, saying which command to run, when the file or the section is missing.
// For `dtype` bf16, the section's bf16 kernel rates where it has them (a CPU whose bf16 kernels
// run on other instructions: the amx and avx512bf16 paths), else the fp32 ones.
Machine local_machine(const std::string& calibration_file, int ranks, DType dtype = DType::f32);
// Whether the calibration file has a section for `ranks` ranks (false when there is no file).
bool has_calibration(const std::string& calibration_file, int ranks);
// Where `a2d calibrate` writes and the model reads by default: $A2D_CALIBRATION if set, else
// a2d-calibration.txt in the working directory.
std::string default_calibration_file();

// A machine described by a file (`--machine-file` of a2d model, plan, bench and run; written by
// scripts/cluster/cluster.sh for an emulated cluster; docs/cost-model.md, "Machine files", has an
// example), with the kernel rates of `dtype`: one `key = value` per line, `#` comments, each key
// once. Required: device (gpu or cpu), ranks_per_node (a whole number >= 1), shared_link (0 or
// 1), intra_latency_us, intra_bandwidth_gbs, inter_latency_us, inter_bandwidth_gbs (GB/s per
// direction per link), memory_gib (per rank), and the forward and backward kernel rates of
// `dtype`: kernel_forward_gflops_<dtype> and kernel_backward_gflops_<dtype> (<dtype> fp32, bf16
// or fp16), or, on a CPU machine, kernel_forward_gflops and kernel_backward_gflops for every
// dtype without its own (a GPU's rates differ by dtype, so a gpu file gives them per dtype).
// Optional (0 or absent: not charged, as in a calibration file): name, the causal kernel rates
// (kernel_forward_causal_gflops[_<dtype>], ...), cyclic_placement (0 or 1), sync_us,
// step_sync_us, and the CPU kernels' terms (cpu only): block, kernel_forward_panel_us,
// kernel_forward_key_us, permute_gbs, sum_gbs, merge_gbs, cores (shared_cores). Throws naming
// the file, the line and the key on a missing, repeated, out-of-range or malformed entry, and on
// a key it does not know.
Machine load_machine_file(const std::string& file, DType dtype);
// The `device` a machine file gives (true: gpu), read before its dtype is known (the default
// dtype follows it). Throws as load_machine_file does on a missing or unknown device.
bool machine_file_is_gpu(const std::string& file);
// `links` with the kernel rates, reordering, reduction and synchronisation costs of `kernel`
// (a fresh calibration of the same rank count): the links and placement stay the file's.
Machine with_kernel_rates(const Machine& links, const Machine& kernel);

struct Calibration {
  int ranks = 1;
  int cores = 1;
  int64_t head_dim = 64;
  int64_t block = 1024;             // query and key rows of the timed kernel calls
  double kernel_forward_flops = 0;  // per rank, all ranks computing at once
  double kernel_backward_flops = 0;
  double kernel_forward_causal_flops = 0;  // the same on a causal diagonal block (unmasked FLOPs)
  double kernel_backward_causal_flops = 0;
  // The four rates with bf16 inputs, where the bf16 kernels run on other instructions than the fp32
  // ones (the amx and avx512bf16 paths); 0: not measured (bf16 runs at the fp32 rates).
  double kernel_forward_flops_bf16 = 0;
  double kernel_backward_flops_bf16 = 0;
  double kernel_forward_causal_flops_bf16 = 0;
  double kernel_backward_causal_flops_bf16 = 0;
  double kernel_forward_panel_s = 0;  // per 24-row panel of a head per call (Machine)
  double kernel_forward_key_s = 0;    // per key of a head per call (Machine)
  double permute_bytes_per_s = 0;     // sorting gathered rows in place (Machine)
  double sum_bytes_per_s = 0;         // reductions: sums of received words (Machine)
  double merge_bytes_per_s = 0;       // reductions: merges of partial attention records (Machine)
  // CPU share a rank waiting in MPI takes from computing ranks, relative to a computing rank's
  // (0: none, 1: as much), when ranks outnumber cores; informational.
  double wait_share = 0;
  double latency_s = 0;  // point-to-point, all ranks exchanging at once
  double bytes_per_s = 0;
  double sync_s = 0;       // per blocking collective after a kernel call (Machine)
  double step_sync_s = 0;  // per ring step waited for after a kernel call (Machine)
};
// Adds or replaces the section of `c.ranks` in the file.
void save_calibration(const std::string& file, const Calibration& c);
// The machine over the span of two measurements of the same rank count, block and head dim (a2d
// bench --calibrate measures before and after its rows): every time is averaged, so rates take
// their harmonic mean and per-operation seconds their mean; a rate one of them left unset (0)
// takes the other's value.
Calibration average_calibrations(const Calibration& a, const Calibration& b);

struct PhaseCost {
  std::string name;
  Traffic traffic;  // of the busiest rank
  bool inter_node = false;
  double seconds = 0;
};

struct Prediction {
  double forward_s = 0;
  double backward_s = 0;
  double forward_compute_s = 0;
  double backward_compute_s = 0;
  double forward_flops = 0;  // busiest rank, unmasked
  double backward_flops = 0;
  // Bytes and messages of the rank that sends the most (each record in its own element types,
  // wire_records); words = those bytes in units of the problem's dtype element (the paper's unit).
  Traffic forward;
  Traffic backward;
  double words_forward = 0;
  double words_backward = 0;
  int64_t memory_bytes = 0;       // peak per rank: memory_per_rank(problem, plan, shards)
  std::vector<PhaseCost> phases;  // each with the most any rank sends in it
  // The exchanges between the caller's shards and the plan's layout (predict's UserShards; all 0
  // without them or when every rank holds the same tokens in both): bytes and messages of the rank
  // that sends the most in the two exchanges of a direction, and their time, which forward_s and
  // backward_s include (as do forward, backward, the words and `phases`).
  Traffic relayout_forward;
  Traffic relayout_backward;
  double relayout_forward_s = 0;
  double relayout_backward_s = 0;
};

// ranks_per_node: consecutive world ranks share a node (so ATTENTION2D's columns, which hold
// consecutive ranks, lie inside a node when R divides ranks_per_node). Bytes follow
// problem.dtype; the machine's kernel rates are taken as given (preset_machine picks them by
// dtype).
// With `shards` (the caller's layout of the N tokens over the plan's ranks) the prediction also
// charges the all-to-alls that move the shards into the plan's layout and back (relayout.hpp;
// docs/cost-model.md, "Relayout"): phases forward.relayout_in/out_all_to_all and
// backward.relayout_in/out_all_to_all, over the world's links as Ulysses' all-to-all is.
Prediction predict(const Problem& problem, const Plan& plan, const Machine& machine,
                   int ranks_per_node, const UserShards* shards = nullptr);

// The peak memory per rank (bytes) of running `plan` on `problem`: the shards a rank keeps (Q, O,
// K, V in the dtype, LSE in fp32, and with the backward dO, dQ, dK, dV) plus the larger of the
// forward's and the backward's transient buffers as the algorithm allocates them (the forward's
// alone without the backward); with `shards`, also the caller's shards beside the plan's and the
// largest record of the exchanges between them. Prediction::memory_bytes is this (with the
// backward). Pure arithmetic: what the planner compares with Machine::memory_bytes and what a
// front end compares with the memory it may use before it allocates.
int64_t memory_per_rank(const Problem& problem, const Plan& plan,
                        const UserShards* shards = nullptr, bool with_backward = true);
// memory_per_rank in its two parts, for messages: the shards a rank keeps (in the plan's layout)
// and the rest, the buffers the algorithm allocates in a call (with `shards`, also the caller's
// shards and the exchanges' records).
struct RankMemory {
  int64_t shards = 0;
  int64_t buffers = 0;
};
RankMemory memory_parts(const Problem& problem, const Plan& plan,
                        const UserShards* shards = nullptr, bool with_backward = true);

// Every algorithm and every grid of P that can run the problem, fastest (forward + backward)
// first; skipped ones are listed with the reason.
struct RankedPlan {
  Plan plan;
  Prediction prediction;
  bool cyclic_placement = false;  // the placement of ranks on nodes it was predicted with
};
struct PlanSearch {
  std::vector<RankedPlan> ranked;
  std::vector<std::pair<std::string, std::string>> skipped;  // (algorithm, reason)
  // Plans that can run but need more memory per rank than the search's cap, in the same order.
  std::vector<RankedPlan> excluded;
  int64_t memory_cap = 0;  // the cap they exceed (0: none)
};
// Predicted times that differ by less than this fraction are a tie: the model cannot tell them
// apart (it is within +-35 % at best, docs/benchmarks.md), so the plan needing less memory per
// rank ranks first, then the one sending fewer bytes per rank, then the machine's own placement.
inline constexpr double kPlanTieTolerance = 0.01;
// A runner-up within this fraction of the chosen plan's time is a close call that a2d plan points
// out: the model is within ±35 % of measurement at best, so the order is not evidence.
inline constexpr double kPlanCloseCall = 0.05;
// With choose_placement, and nodes of several ranks, every plan is also predicted with the other
// placement of ranks on nodes (Machine::cyclic_placement), each ranked on its own. With `shards`
// every plan is charged the exchanges from and to the caller's layout, and the baselines are also
// tried in that layout (Ring Attention on zigzag shards exchanges nothing). Plans needing more
// than `memory_cap` bytes per rank (> 0) go to `excluded`. Ranked fastest first, ties
// (kPlanTieTolerance of the fastest of those left) broken by memory, then bytes.
PlanSearch search_plans(const Problem& problem, int ranks, const Machine& machine,
                        int ranks_per_node, bool include_backward = true,
                        bool choose_placement = false, const UserShards* shards = nullptr,
                        int64_t memory_cap = 0);

// How many times the busiest rank's bytes of `phase` the busiest link of a node carries when
// the ranks of a node share one link (Machine::shared_link): the most ranks of one node whose
// ring successor in the phase's communicator (or transpose partner) lies on another node; for
// an all-to-all, the node's ranks times the share of their peers that lie off the node.
double shared_link_load(const Plan& plan, const std::string& phase, int ranks_per_node,
                        bool cyclic_placement = false);

// Unmasked forward FLOPs (4 * pairs * D per batch and head) of one rank, in closed form: no token
// lists, so instant for N up to 2^40 and P up to 2^20. The backward is 2.5 times this.
double rank_forward_flops(const Problem& problem, const Plan& plan, int rank);
// The largest over the ranks (evaluated on a sample of ranks that contains the busiest one for
// every layout: the first, middle and last rows and columns of the grid, or of the ring), or, for
// Ring Attention on the contiguous layout, its step-synchronous critical path.
double busiest_forward_flops(const Problem& problem, const Plan& plan);

// Bytes the busiest rank reorders in place (sorting gathered rows by position under a causal
// mask, and putting results back), in the forward or the backward, per the algorithm's code.
double permuted_bytes(const Problem& problem, const Plan& plan, bool forward);

// Score entries (per batch, summed over the rank's heads) that the CPU kernels compute on the
// busiest rank: the backward's every (kCpuBackwardTileQ x kCpuBackwardTileK) tile pair the mask
// does not hide whole, the forward's (panel, key tile) pairs trimmed to visible 4-key blocks,
// over the kernel calls the plan's algorithm makes with the rows in the order it passes them
// (ranks sampled at the corners and middles of the grid). Needs the positions: both are negative
// when that would take more than about 5 x 10^6 tile pairs (the model then uses unmasked FLOPs).
struct TileEntries {
  double forward = 0;
  double backward = 0;
  double forward_panels = 0;  // 24-row query panels over the calls and heads
  double forward_keys = 0;    // keys over the calls and heads
};
TileEntries busiest_tile_entries(const Problem& problem, const Plan& plan);
// The replay of every rank's calls: the busiest and the mean rank's tile entries, forward and
// backward (the balance report of a2d model and a2d bench); all -1 when the replay would take too
// long (about 5e7 tile pairs over the ranks).
struct TileBalance {
  double busiest_forward = -1, mean_forward = 0;
  double busiest_backward = -1, mean_backward = 0;
  double forward_ratio() const { return busiest_forward < 0 ? -1 : busiest_forward / mean_forward; }
  double backward_ratio() const {
    return busiest_backward < 0 ? -1 : busiest_backward / mean_backward;
  }
};
TileBalance tile_balance(const Problem& problem, const Plan& plan);
// The busiest rank's forward FLOPs over the mean rank's (the total over P).
double flops_balance(const Problem& problem, const Plan& plan);
// The same for one call: `q` and `k` positions in the order the kernel sees them.
double forward_tile_entries(const Mask& mask, const std::vector<int64_t>& q,
                            const std::vector<int64_t>& k);
double backward_tile_entries(const Mask& mask, const std::vector<int64_t>& q,
                             const std::vector<int64_t>& k);

// The forward kernel's cost per call and head, t = entry_s * E + panel_s * panels + key_s * keys
// (E the call's forward tile entries, panels its 24-row query panels), fitted by least squares on
// relative errors to the seconds per head of unmasked calls of the given (rows, keys) shapes. A
// per-call cost the fit makes negative is set to 0 and the others are fitted again; everything is
// 0 when the entry cost does not come out positive.
struct ForwardCallCosts {
  double entry_s = 0;
  double panel_s = 0;
  double key_s = 0;
};
ForwardCallCosts fit_forward_call_costs(const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                        const std::vector<double>& seconds);
// The same costs as a machine calibrated on CPUs (Machine::tile_block > 0) gives them, for heads
// of `head_dim`: its per-panel and per-key costs, and per tile entry the calibration block's time
// at the forward rate less their share, over the block's entries (the per-call costs are dropped
// when they would take the whole block). All 0 without tile_block. The one formula of predict()
// and the decode model.
ForwardCallCosts forward_call_costs(const Machine& machine, int64_t head_dim);

// Positions first, first + step, ..., `count` of them (step may be negative or 0).
struct PositionRun {
  int64_t first = 0;
  int64_t step = 1;
  int64_t count = 0;
};
// `positions` as maximal runs, in order (a sorted gather of cyclic parts is one run, a zigzag
// shard two): what the simulated device keeps of uploaded positions.
std::vector<PositionRun> position_runs(std::span<const int64_t> positions);
// Visible (query, key) pairs between positions given as runs: closed forms per pair of runs
// (floor sums) without documents, else counted position by position. count_visible_pairs
// (kernel.hpp) of the expanded positions.
int64_t count_visible_pairs(const Mask& mask, std::span<const PositionRun> q,
                            std::span<const PositionRun> k);

// One kernel call of the engine, as the simulated device (docs/simulation.md) sees it: `heads`
// query heads of `batch` sequences, q_tokens x kv_tokens rows with their global positions in the
// order the kernel receives them: the positions, or else the runs, or else 0, 1, 2, ...
struct KernelCall {
  Mask mask;
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t head_dim = 0;
  int64_t q_tokens = 0;
  int64_t kv_tokens = 0;
  std::span<const int64_t> q_positions;
  std::span<const int64_t> kv_positions;
  std::span<const PositionRun> q_runs;
  std::span<const PositionRun> kv_runs;
  bool backward = false;
};
// Its seconds on `machine`, by the rules predict() charges a rank's compute with: on accelerators
// (tile_block = 0) 4 D FLOPs per visible (query, key) pair and head (2.5 times that backward) over
// the kernel's rate; on CPUs (tile_block > 0) the tiles the CPU kernels compute and the forward's
// per-panel and per-key costs. Summed over a rank's calls it is that rank's C_f or C_b.
double kernel_call_seconds(const Machine& machine, const KernelCall& call);

}  // namespace a2d

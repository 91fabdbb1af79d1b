// What the a2d subcommands allocate, for the memory check before they allocate it
// (attention2d/memory_check.hpp): the cost model's shards and buffers, and each command's own
// arrays, as functions of what a suggestion may change (ranks, sequence, dtype).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/relayout.hpp"

namespace a2d::commands {

// The --no-memory-check help, shared by the subcommands.
extern const char* const kNoMemoryCheckHelp;

// `problem` with another sequence length and dtype (a suggestion's): documents, whose lengths no
// longer add up, are dropped (memory does not depend on the mask).
Problem varied_problem(const Problem& problem, const MemoryRequest& request);

// Bytes of the fp32 host copies a2d's harness keeps of a rank's shards of `tokens` tokens
// (harness.hpp's ShardSet: Q, K, V, O, LSE, and with the backward dO, dQ, dK, dV), besides the
// backend's buffers when they are not the same memory (any dtype but fp32, or a backend the host
// cannot touch).
int64_t harness_copy_bytes(const Problem& problem, int64_t tokens, bool backward);

// What a2d run adds on rank 0 (global arrays in fp32 and the fp64 reference).
struct RunArrays {
  bool backward = false;
  bool check = false;       // --check: the inputs generated (or read), the outputs gathered, fp64
  bool out = false;         // --out: the outputs gathered
  bool half_out = false;    // --out-dtype float16: binary16 copies of the outputs
  bool from_files = false;  // --q ...: the inputs read from files (fp32) on rank 0
  int64_t largest_file_bytes = 0;  // the largest input file's data, held while it is converted
};
std::vector<MemoryPart> run_rank0_parts(const Problem& problem, const RunArrays& arrays);

// What a2d bench adds on rank 0 with --check: the fp64 reference of every output, computed before
// the rows are set up (from the inputs generated in fp32 and widened), and one row's outputs
// gathered; `rows_bytes` is what the rows take on every rank (their parts' sum).
std::vector<MemoryPart> bench_rank0_parts(const Problem& problem, bool backward,
                                          int64_t rows_bytes);

// The shards and buffers of one plan of a2d run on every rank: shards, the algorithm's buffers
// (with the caller's shards: the exchanges'), and the harness's fp32 copies where they are extra.
// `shards` may be null.
std::vector<MemoryPart> plan_parts(const Problem& problem, const Plan& plan,
                                   const UserShards* shards, bool backward, bool harness_copies);

// The plan a suggestion's request runs: `plan` itself at its own ranks, else the same algorithm's
// default plan at the request's ranks (a grid of `plan` may not fit them).
Plan varied_plan(const Plan& plan, const Problem& problem, int ranks);

}  // namespace a2d::commands

#include "memory_needs.hpp"

#include <algorithm>

#include "attention2d/cost_model.hpp"

namespace a2d::commands {

const char* const kNoMemoryCheckHelp =
    "run even if the memory it needs exceeds what a host has (also A2D_NO_MEMORY_CHECK=1;\n"
    "docs/reliability.md, \"Too big for memory\")";

namespace {
int64_t elements(const Problem& p, int64_t tokens, int64_t heads) {
  return p.batch * tokens * heads * p.head_dim;
}
}  // namespace

Problem varied_problem(const Problem& problem, const MemoryRequest& request) {
  Problem p = problem;
  p.dtype = request.dtype;
  if (request.seq != p.seq) {
    p.seq = request.seq;
    if (p.mask.has_documents()) {
      Mask mask = p.mask;
      mask.doc_offsets = nullptr;
      p.mask = mask;
    }
  }
  return p;
}

int64_t harness_copy_bytes(const Problem& p, int64_t tokens, bool backward) {
  const int64_t copies = backward ? 4 : 2;
  return 4 * (copies * (elements(p, tokens, p.heads) + elements(p, tokens, p.kv_heads)) +
              p.batch * p.heads * tokens);
}

std::vector<MemoryPart> run_rank0_parts(const Problem& p, const RunArrays& a) {
  const int64_t q = elements(p, p.seq, p.heads), kv = elements(p, p.seq, p.kv_heads);
  const int64_t lse = p.batch * p.heads * p.seq;
  const int64_t inputs = q + 2 * kv + (a.backward ? q : 0);
  const int64_t outputs = q + lse + (a.backward ? q + 2 * kv : 0);
  std::vector<MemoryPart> parts;
  if (a.from_files) {
    parts.push_back({"the input files, read", 4 * inputs + a.largest_file_bytes});
  } else if (a.check) {
    parts.push_back({"the inputs, generated (--check)", 4 * inputs});
  }
  if (a.check || a.out) parts.push_back({"the outputs, gathered", 4 * outputs});
  if (a.check) {
    // reference_outputs: the inputs widened, the outputs, and in 16 bits O rounded for delta.
    const int64_t stored_out = a.backward && p.dtype != DType::f32 ? q : 0;
    parts.push_back({"the fp64 reference (--check)", 8 * (inputs + outputs + stored_out)});
  }
  if (a.out && a.half_out) {
    parts.push_back({"float16 copies of the outputs (--out-dtype float16)",
                     2 * (q + (a.backward ? q + 2 * kv : 0))});
  }
  return parts;
}

std::vector<MemoryPart> bench_rank0_parts(const Problem& p, bool backward, int64_t rows_bytes) {
  const int64_t q = elements(p, p.seq, p.heads), kv = elements(p, p.seq, p.kv_heads);
  const int64_t lse = p.batch * p.heads * p.seq;
  const int64_t inputs = q + 2 * kv + (backward ? q : 0);
  const int64_t outputs = q + lse + (backward ? q + 2 * kv : 0);
  const int64_t stored_out = backward && p.dtype != DType::f32 ? q : 0;
  // While the reference is computed: the inputs in fp32 and fp64 and its outputs; while the rows
  // run: its outputs and one row's gathered outputs, beside the rows' own memory.
  const int64_t reference_phase = 4 * inputs + 8 * (inputs + outputs + stored_out);
  const int64_t rows_phase = 8 * outputs + 4 * outputs;
  return {{"the fp64 reference and the gathered outputs (--check)",
           std::max(rows_phase, reference_phase - rows_bytes)}};
}

std::vector<MemoryPart> plan_parts(const Problem& problem, const Plan& plan,
                                   const UserShards* shards, bool backward, bool harness_copies) {
  const RankMemory memory = memory_parts(problem, plan, shards, backward);
  std::vector<MemoryPart> parts = {{"shards", memory.shards},
                                   {"the algorithm's buffers", memory.buffers}};
  if (harness_copies) {
    const int64_t tokens =
        shards ? shards->layout.max_count() : plan_layout(problem, plan).max_count();
    parts.push_back(
        {"fp32 host copies of the shards", harness_copy_bytes(problem, tokens, backward)});
  }
  return parts;
}

Plan varied_plan(const Plan& plan, const Problem& problem, int ranks) {
  if (ranks == plan.ranks()) return plan;
  Plan varied = default_plan(plan.algorithm, problem, ranks);
  varied.threads = plan.threads;
  return varied;
}

}  // namespace a2d::commands

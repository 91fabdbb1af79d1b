#include "sim_options.hpp"

#include "attention2d/plan.hpp"

namespace a2d::commands {

void declare_sim_options(cli::Options& options, SimOptions& o) {
  o.problem.dtype = "bf16";
  o.problem.dtype_default = "bf16, as the simulated device is a GPU";
  o.plans = algorithm_list(",");
  o.problem.declare(options);
  options.add_string("--machine", &o.machine,
                     "the device's kernel rates: a100-hdr or h100-ndr (cost model presets)");
  options.add_string("--machine-file", &o.machine_file,
                     "the kernel rates (and the model's links) from a machine file instead");
  options.add_int("--gpus-per-node", &o.gpus_per_node,
                  "ranks per node of the platform, for the model's prediction (default: the "
                  "platform's own, its property gpus_per_node; one that contradicts it is "
                  "refused; not with --machine-file, whose ranks_per_node says it)");
  options.add_string("--plans", &o.plans,
                     "comma-separated ALGO[:RxC][:uU][:LAYOUT][:nt]; a grid algorithm without "
                     "a grid takes the model's fastest plan of it");
  options.add_int("--top", &o.top, "also the planner's K fastest plans");
  options.add_flag("--backward", &o.backward, "also the backward pass");
  options.add_int("--warmup", &o.warmup,
                  "untimed calls per plan (0: the simulation is deterministic, and the first "
                  "call is timed as the others)");
  options.add_int("--iters", &o.iters, "timed calls per plan (the simulation is deterministic)");
  options.add_double("--memory-gbs", &o.memory_gbs,
                     "device memory bandwidth for data operations, GB/s (default: the preset "
                     "GPU's HBM; 0: free, and with --machine-file)");
  options.add_double("--host-reduction-gbs", &o.host_reduction_gbs,
                     "the MPI communicator's ring reduce-scatter sums, GB/s (0: free, as NCCL's)");
  options.add_flag("--cuda-rules", &o.cuda_rules,
                   "refuse what the CUDA kernels refuse (always with --machine; with "
                   "--machine-file when the file describes GPUs)");
  options.add_int("--pool-gib", &o.pool_gib, "address space per rank for device buffers, GiB");
  options.add_flag("--json", &o.json, "one JSON object per plan");
}

}  // namespace a2d::commands

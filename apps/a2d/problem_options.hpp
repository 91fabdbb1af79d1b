// Options shared by the distributed subcommands (run, bench, model, plan): the problem and the
// plan, declared once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "cli.hpp"

namespace a2d::cli {

struct ProblemOptions {
  int64_t batch = 1;
  int64_t heads = 8;
  int64_t kv_heads = 0;  // 0: same as heads
  int64_t seq = 4096;
  int64_t head_dim = 64;
  int64_t window = 0;
  double scale = 0.0;
  bool causal = false;
  std::string doc_lens;   // "" = one document
  bool sinks = false;     // --sinks: sink logits from the seed
  std::string sink_file;  // --sink FILE.npy: sink logits [heads]
  double softcap = 0.0;
  std::string dtype = "fp32";  // the command's default; --dtype changes it

  void declare(Options& options);
  Problem problem() const;  // validated
  // The sink logits [heads] of --sink (rank 0 reads the file: call it collectively; every rank
  // gets them) or, with --sinks, generated from `seed`. Empty without sinks.
  std::vector<float> sink_values(Communicator& world, int64_t head_count, uint64_t seed) const;
};

// --device: the backend the algorithms compute with.
struct DeviceOptions {
  std::string device;  // "" = default_device(dtype): cuda for bf16/fp16 when built with it and a
                       // GPU is visible

  std::string comm;  // "" = default_comm_kind(backend): nccl on cuda, else mpi

  void declare(Options& options);
  // --comm, for the commands that run distributed algorithms.
  void declare_comm(Options& options);
  std::string name(DType dtype) const;  // the chosen device for inputs of dtype
  // Throws a2d::Error for an unknown device, or cuda where there is none.
  std::unique_ptr<Backend> backend(DType dtype) const;
  // The chosen communicator for `backend`; throws a2d::Error for an unknown name.
  CommKind comm_kind(const Backend& backend) const;
};

struct PlanOptions {
  std::string algo;    // "" = the fastest by the cost model (a2d plan)
  std::string grid;    // "" = the fastest grid by the cost model
  std::string layout;  // "" = the algorithm's default
  int64_t stripe = 1;
  int64_t threads = 1;
  bool no_kv_transpose = false;
  int64_t heads_parallel = 0;  // hybrid's U; 0 = from --grid, else the fastest by the model
  std::string calibration;     // "" = default_calibration_file()
  std::string machine_file;  // "" = the calibration (one node)

  void declare(Options& options);
  // Checked against the problem and ranks. Without --algo or --grid the cost model chooses
  // (this machine's calibration if there is one); `chosen` then says so.
  Plan plan(const Problem& problem, int ranks, std::string* chosen = nullptr) const;
};

}  // namespace a2d::cli

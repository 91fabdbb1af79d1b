// attention2d: refusing a run too big for its hosts' memory, before anything is allocated.
//
// A front end (a2d run, kernel, bench, decode, the Python package) knows what each rank is about
// to allocate: the cost model's shards and the algorithm's buffers (memory_per_rank), and its own
// arrays (rank 0's --check arrays and fp64 reference, the KV cache, ...). check_memory compares
// that with what each host has left, the ranks on one host summed, and refuses on every rank with
// one message: what the run needs and of what it is made, what the host has, and what would fit
// (more ranks on more hosts, a shorter sequence, bf16). docs/reliability.md, "Too big for memory".
//
// What a host has (read_host_memory): /proc/meminfo's MemAvailable, or, where lower, the memory
// cgroup's limit less its usage (cgroup v2 memory.max / memory.current, v1 memory.limit_in_bytes /
// memory.usage_in_bytes, at the process's cgroup and every level above it; usage counts without
// its inactive file pages, which the kernel reclaims before it fails an allocation). Ranks share a
// host when they share a kernel (its boot id); ranks that share a cgroup share its limit.
//
// Overrides: A2D_NO_MEMORY_CHECK=1 (any value but "" and "0") on any rank, or the front end's
// option (a2d's --no-memory-check), skip the refusal. Test-only (never set in production):
// A2D_FAULT_MEMORY_AVAILABLE=BYTES stands for what every host has.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/dtype.hpp"

namespace a2d {

class Communicator;

// ---- What a host has ---------------------------------------------------------------------------

struct HostMemory {
  int64_t available = -1;      // what a job may fill: the smaller of the two below (-1: unknown)
  int64_t mem_available = -1;  // /proc/meminfo's MemAvailable (-1: unreadable)
  // The tightest memory cgroup level above this process: its limit and its usage (without
  // inactive file pages); -1 where no level sets a limit.
  int64_t cgroup_limit = -1;
  int64_t cgroup_usage = -1;
  std::string cgroup;  // that level's directory, "" without a limit
  // "18.2 GiB (MemAvailable)", or "3.1 GiB (the cgroup's limit 4 GiB less 0.9 GiB in use:
  // /sys/fs/cgroup/job; MemAvailable 18.2 GiB)".
  std::string describe() const;
};

// Reads this host's memory from /proc and /sys under `root` ("" = this machine; tests give a
// folder holding proc/meminfo, proc/self/cgroup, proc/self/mountinfo and the cgroup files).
HostMemory read_host_memory(const std::string& root = "");
// The parsing pieces, exposed for tests. MemAvailable in bytes, or MemFree + Buffers + Cached
// where a kernel older than 3.14 has no MemAvailable; -1 if neither is there.
int64_t parse_meminfo_available(const std::string& meminfo);
// A cgroup limit file's value: bytes, or -1 for none ("max", or v1's page-rounded 2^63 - 1).
int64_t parse_cgroup_limit(const std::string& text);

// A kernel's identity (its boot id, else the host name): ranks with the same share MemAvailable.
std::string host_memory_key(const std::string& root = "");
std::string host_name();

// ---- What a run needs --------------------------------------------------------------------------

struct MemoryPart {
  std::string what;  // "shards", "the algorithm's buffers", "the fp64 reference (--check)", ...
  int64_t bytes = 0;
};

struct MemoryNeed {
  std::vector<MemoryPart> every_rank;  // what each rank allocates
  std::vector<MemoryPart> rank0;       // what rank 0 allocates besides (--check, --out, files)
  int64_t rank_bytes(int rank) const;  // every_rank, and rank0 on rank 0
  int64_t every_rank_bytes() const;
  int64_t rank0_bytes() const;  // rank0's parts alone
};

// The quantities a suggestion may change; a MemoryModel gives the need of any of them.
struct MemoryRequest {
  int ranks = 1;
  int64_t seq = 1;
  DType dtype = DType::f32;
};
// Deterministic (every rank computes the same need for the same request); throws a2d::Error for a
// request that cannot run (then it counts as not fitting).
using MemoryModel = std::function<MemoryNeed(const MemoryRequest&)>;

struct MemoryCheck {
  // The subject of the message's first line: "this run" (a2d's), "this attention" (Python's).
  std::string command = "this run";
  MemoryRequest request;
  MemoryModel model;
  // What the suggestions may change, and the options that change it.
  bool ranks_may_change = true;  // false for one process (a2d kernel)
  bool seq_may_change = true;    // false for sizes read from files
  bool dtype_may_change = true;  // false when the dtype is fixed (bf16 already, files of a dtype)
  std::string seq_option = "--seq";
  // Other options that change the need (a2d bench's --sequential): each is tried at the request.
  struct Alternative {
    std::string option;  // "--sequential (one row at a time)"
    MemoryModel model;
  };
  std::vector<Alternative> alternatives;
  // How to run it anyway: "--no-memory-check or A2D_NO_MEMORY_CHECK=1".
  std::string override_hint = "--no-memory-check or A2D_NO_MEMORY_CHECK=1";
  // false: this rank skips the refusal (the front end's override); the environment variable
  // counts too. Any rank skipping skips it for every rank (no rank waits for the others).
  bool enabled = true;
};

// Collective over `world` (every rank, with the same request and model): every rank reads its
// host's memory; the needs of the ranks on one host (one kernel) are summed and compared with
// MemAvailable, those of the ranks in one cgroup with its limit less its usage. If any falls short,
// every rank throws the same CollectiveError (collective.hpp), whose brief is the message: the
// need per rank and its parts, the host and what it has, and what would fit. One all-gather of a
// small record per rank; nothing else moves.
void check_memory(Communicator& world, const MemoryCheck& check);
// One process (no communicator): the same check; throws a2d::Error.
void check_memory(const MemoryCheck& check);

// The check of a library caller whose inputs already exist (the Python package): what a call of
// make_attention's DistributedAttention allocates besides them, on every rank: the algorithm's
// buffers (memory_per_rank less the shards) and the outputs the caller allocates for it (O and
// LSE; with the backward dQ, dK and dV). Suggestions: more ranks (the algorithm's default plan at
// that count), a shorter sequence, bf16. The message names A2D_NO_MEMORY_CHECK=1 as the override.
MemoryCheck attention_memory_check(const Problem& problem, const Plan& plan, bool with_backward);
// The check of a library caller's Decoder (inference.hpp) before it exists: the prefill's (as
// attention_memory_check's forward) and the KV cache it reserves, max(capacity, the prompt's
// shard) tokens per rank. The cache's growth by doubling during the steps is not checked (the
// steps to come are not known here): reserve them with `capacity`.
MemoryCheck decoder_memory_check(const Problem& problem, const Plan& plan, int64_t capacity);

// Whether A2D_NO_MEMORY_CHECK asks to skip the check.
bool memory_check_disabled_by_environment();

}  // namespace a2d

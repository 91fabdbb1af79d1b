// The memory check (attention2d/memory_check.hpp): reading /proc/meminfo and the memory cgroup
// (v1 and v2) from sample files, the refusal's message and its suggestions, the overrides, and
// memory_parts adding up to memory_per_rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "attention2d/attention.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/memory_check.hpp"

namespace a2d {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// A folder standing for a machine's / (proc/..., sys/fs/cgroup/...), removed at the end.
class FakeRoot {
 public:
  FakeRoot() {
    char name[] = "/tmp/a2d_memory_XXXXXX";
    root_ = ::mkdtemp(name);
  }
  ~FakeRoot() { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) const {
    const fs::path file = fs::path(root_) / path;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  const std::string& path() const { return root_; }

 private:
  std::string root_;
};

const char* const kMeminfo =
    "MemTotal:       24576000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   20000000 kB\n"
    "Buffers:          100000 kB\n"
    "Cached:          2000000 kB\n";

TEST(HostMemory, MeminfoAvailable) {
  EXPECT_EQ(parse_meminfo_available(kMeminfo), int64_t{20000000} * 1024);
  // A kernel without MemAvailable (before 3.14): free, buffers and page cache.
  EXPECT_EQ(parse_meminfo_available("MemTotal: 100 kB\nMemFree: 10 kB\nBuffers: 2 kB\n"
                                    "Cached: 5 kB\n"),
            int64_t{17} * 1024);
  EXPECT_EQ(parse_meminfo_available(""), -1);
  EXPECT_EQ(parse_meminfo_available("garbage\n"), -1);
}

TEST(HostMemory, CgroupLimitFiles) {
  EXPECT_EQ(parse_cgroup_limit("max\n"), -1);
  EXPECT_EQ(parse_cgroup_limit("9223372036854771712\n"), -1);  // v1's "no limit"
  EXPECT_EQ(parse_cgroup_limit("4294967296\n"), 4 * kGiB);
  EXPECT_EQ(parse_cgroup_limit(""), -1);
  EXPECT_EQ(parse_cgroup_limit("nonsense"), -1);
}

TEST(HostMemory, NoCgroupLimitIsMemAvailable) {
  FakeRoot root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/\n");
  root.write("proc/self/mountinfo",
             "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  root.write("sys/fs/cgroup/memory.stat", "inactive_file 0\n");  // the root has no memory.max
  const HostMemory m = read_host_memory(root.path());
  EXPECT_EQ(m.mem_available, int64_t{20000000} * 1024);
  EXPECT_EQ(m.available, m.mem_available);
  EXPECT_EQ(m.cgroup_limit, -1);
  EXPECT_NE(m.describe().find("(MemAvailable)"), std::string::npos) << m.describe();
}

TEST(HostMemory, CgroupV2LimitLessUsageWithoutInactiveFiles) {
  FakeRoot root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/user.slice/job\n");
  root.write("proc/self/mountinfo",
             "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  root.write("sys/fs/cgroup/user.slice/job/memory.max", std::to_string(4 * kGiB) + "\n");
  root.write("sys/fs/cgroup/user.slice/job/memory.current", std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/user.slice/job/memory.stat",
             "anon 1000\nfile 2000\ninactive_file " + std::to_string(256 * kMiB) + "\n");
  root.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  const HostMemory m = read_host_memory(root.path());
  EXPECT_EQ(m.cgroup_limit, 4 * kGiB);
  EXPECT_EQ(m.cgroup_usage, kGiB - 256 * kMiB);
  EXPECT_EQ(m.available, 4 * kGiB - (kGiB - 256 * kMiB));  // below MemAvailable (19 GiB)
  EXPECT_EQ(m.cgroup, root.path() + "/sys/fs/cgroup/user.slice/job");
  EXPECT_NE(m.describe().find("cgroup's limit 4 GiB"), std::string::npos) << m.describe();
}

TEST(HostMemory, CgroupV2ATighterParentBinds) {
  FakeRoot root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/a/b\n");
  root.write("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  root.write("sys/fs/cgroup/a/b/memory.max", std::to_string(8 * kGiB));
  root.write("sys/fs/cgroup/a/b/memory.current", std::to_string(kGiB));
  root.write("sys/fs/cgroup/a/memory.max", std::to_string(2 * kGiB));
  root.write("sys/fs/cgroup/a/memory.current", std::to_string(kGiB + 512 * kMiB));
  const HostMemory m = read_host_memory(root.path());
  EXPECT_EQ(m.available, 512 * kMiB);
  EXPECT_EQ(m.cgroup_limit, 2 * kGiB);
  EXPECT_EQ(m.cgroup, root.path() + "/sys/fs/cgroup/a");
}

TEST(HostMemory, CgroupV1MemoryController) {
  FakeRoot root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n");
  root.write("proc/self/mountinfo",
             "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "36 31 0:33 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
             std::to_string(3 * kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes",
             std::to_string(kGiB) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/abc/memory.stat",
             "cache 100\ninactive_file 7\ntotal_inactive_file " + std::to_string(kGiB / 2) + "\n");
  root.write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
  root.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  const HostMemory m = read_host_memory(root.path());
  EXPECT_EQ(m.cgroup_limit, 3 * kGiB);
  EXPECT_EQ(m.cgroup_usage, kGiB / 2);
  EXPECT_EQ(m.available, 3 * kGiB - kGiB / 2);
}

TEST(HostMemory, CgroupNamespaceSeesItsOwnRoot) {
  // In a container the process's path and the mount's root are both "/": the mount point is its
  // cgroup. A path outside the mount's root (another namespace's view) also falls back to it.
  FakeRoot root;
  root.write("proc/meminfo", kMeminfo);
  root.write("proc/self/cgroup", "0::/../../elsewhere\n");
  root.write("proc/self/mountinfo",
             "30 23 0:26 /docker/xyz /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  root.write("sys/fs/cgroup/memory.max", std::to_string(kGiB));
  root.write("sys/fs/cgroup/memory.current", "0\n");
  const HostMemory m = read_host_memory(root.path());
  EXPECT_EQ(m.available, kGiB);
}

TEST(HostMemory, ThisMachineIsReadable) {
  const HostMemory m = read_host_memory();
  EXPECT_GT(m.available, 0);
  EXPECT_FALSE(host_memory_key().empty());
}

// A model where every rank needs `per_token` bytes per token it holds (N / P of them), rank 0
// `rank0` more, and bf16 half as much.
MemoryCheck toy_check(int ranks, int64_t seq, int64_t per_token, int64_t rank0) {
  MemoryCheck check;
  check.request = {ranks, seq, DType::f32};
  check.ranks_may_change = ranks > 0;
  check.model = [per_token, rank0](const MemoryRequest& r) {
    MemoryNeed need;
    const int64_t bytes = (r.dtype == DType::f32 ? 4 : 2) * per_token / 4;
    need.every_rank.push_back({"shards", bytes * ((r.seq + r.ranks - 1) / r.ranks)});
    if (rank0 > 0) need.rank0.push_back({"the fp64 reference (--check)", rank0});
    return need;
  };
  return check;
}

// Runs the one-process check with the host's memory set to `available` (the test-only override).
std::string refusal(const MemoryCheck& check, int64_t available) {
  ::setenv("A2D_FAULT_MEMORY_AVAILABLE", std::to_string(available).c_str(), 1);
  std::string message;
  try {
    check_memory(check);
  } catch (const Error& e) {
    message = e.message();
  }
  ::unsetenv("A2D_FAULT_MEMORY_AVAILABLE");
  return message;
}

TEST(MemoryCheck, FitsOrRefusesWithWhatWouldFit) {
  // 1 rank, N = 1000 tokens of 1 MiB each: 1000 MiB against 300 MiB.
  const MemoryCheck check = toy_check(1, 1000, kMiB, 0);
  EXPECT_EQ(refusal(check, 1000 * kMiB), "");
  const std::string m = refusal(check, 300 * kMiB);
  EXPECT_NE(m.find("this run needs more memory than host "), std::string::npos) << m;
  EXPECT_NE(m.find("it needs 1000 MiB, it has 300 MiB available"), std::string::npos) << m;
  EXPECT_NE(m.find("made of: shards 1000 MiB"), std::string::npos) << m;
  // The smallest rank count: ceil(1000 / P) MiB <= 300 MiB first at P = 4.
  EXPECT_NE(m.find("more ranks on more hosts: 4 ranks at 1 per host (4 hosts"), std::string::npos)
      << m;
  EXPECT_NE(m.find("a shorter sequence: --seq 300 or less on 1 rank"), std::string::npos) << m;
  EXPECT_NE(m.find("--dtype bf16: does not fit either (500 MiB on this host)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("(--no-memory-check or A2D_NO_MEMORY_CHECK=1 runs it anyway)"),
            std::string::npos)
      << m;
  EXPECT_NE(refusal(check, 600 * kMiB).find("--dtype bf16: fits"), std::string::npos);
}

TEST(MemoryCheck, RankZerosOwnArraysDoNotShrinkWithRanks) {
  const MemoryCheck check = toy_check(1, 100, kMiB, 500 * kMiB);
  const std::string m = refusal(check, 400 * kMiB);
  EXPECT_NE(m.find("rank 0 also: the fp64 reference (--check) 500 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("more ranks: none fit while rank 0 holds the fp64 reference (--check)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("a shorter sequence: none fits"), std::string::npos) << m;
}

TEST(MemoryCheck, OverridesSkipIt) {
  MemoryCheck check = toy_check(1, 1000, kMiB, 0);
  check.enabled = false;
  EXPECT_EQ(refusal(check, kMiB), "");
  check.enabled = true;
  ::setenv("A2D_NO_MEMORY_CHECK", "1", 1);
  EXPECT_EQ(refusal(check, kMiB), "");
  ::setenv("A2D_NO_MEMORY_CHECK", "0", 1);  // "0" does not skip it
  EXPECT_NE(refusal(check, kMiB), "");
  ::unsetenv("A2D_NO_MEMORY_CHECK");
}

TEST(MemoryCheck, OneProcessSuggestsNoRanks) {
  MemoryCheck check = toy_check(1, 1000, kMiB, 0);
  check.ranks_may_change = false;
  check.dtype_may_change = false;
  check.seq_option = "--prompt";
  const std::string m = refusal(check, 300 * kMiB);
  EXPECT_EQ(m.find("more ranks"), std::string::npos) << m;
  EXPECT_EQ(m.find("bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("a shorter sequence: --prompt 300 or less\n"), std::string::npos) << m;
}

TEST(MemoryCheck, PartsAddUpToMemoryPerRank) {
  Problem p;
  p.heads = 8;
  p.kv_heads = 2;
  p.seq = 1000;
  p.head_dim = 80;
  for (const char* name : {"attention2d", "ring", "allgather-kv", "ulysses", "hybrid"}) {
    for (const bool backward : {false, true}) {
      for (const int ranks : {1, 4, 6}) {
        const Plan plan = default_plan(parse_algorithm(name), p, ranks);
        try {
          check_plan(plan, p, ranks);
        } catch (const Error&) {
          continue;
        }
        const RankMemory parts = memory_parts(p, plan, nullptr, backward);
        EXPECT_EQ(parts.shards + parts.buffers, memory_per_rank(p, plan, nullptr, backward))
            << name << " P=" << ranks;
        EXPECT_GT(parts.shards, 0);
        EXPECT_GE(parts.buffers, 0);
      }
    }
  }
}

TEST(MemoryCheck, AttentionCheckCountsWhatTheCallerDoesNotHold) {
  Problem p;
  p.heads = 4;
  p.kv_heads = 4;
  p.seq = 4096;
  p.head_dim = 64;
  const Plan plan = default_plan(Algorithm::ring, p, 2);
  const MemoryNeed forward = attention_memory_check(p, plan, false).model({2, p.seq, p.dtype});
  const MemoryNeed backward = attention_memory_check(p, plan, true).model({2, p.seq, p.dtype});
  const RankMemory f = memory_parts(p, plan, nullptr, false);
  // O and LSE of 2048 tokens: 2048 x 4 x 64 x 4 + 2048 x 4 x 4 bytes.
  EXPECT_EQ(forward.every_rank_bytes(), f.buffers + 2048 * 4 * 64 * 4 + 2048 * 4 * 4);
  EXPECT_EQ(forward.rank0_bytes(), 0);
  // dQ, dK, dV and LSE.
  const RankMemory b = memory_parts(p, plan, nullptr, true);
  EXPECT_EQ(backward.every_rank_bytes(), b.buffers + 3 * 2048 * 4 * 64 * 4 + 2048 * 4 * 4);
}

// A library caller's Decoder: the prefill's need and the KV cache it reserves, the larger of its
// capacity and the prompt's shard, per rank (a cached token: K and V of every K/V head, and its
// position); at a suggestion's rank count the shard follows it.
TEST(MemoryCheck, DecoderCountsTheCacheItReserves) {
  Problem p;
  p.heads = 8;
  p.kv_heads = 2;
  p.seq = 4096;
  p.head_dim = 64;
  p.mask = Mask::causal();
  const Plan plan = default_plan(Algorithm::ring, p, 2);
  const int64_t prefill =
      attention_memory_check(p, plan, false).model({2, p.seq, p.dtype}).every_rank_bytes();
  const int64_t record = 2 * 2 * 64 * 4 + 8;
  const auto need = [&](int64_t capacity, int ranks) {
    return decoder_memory_check(p, plan, capacity).model({ranks, p.seq, p.dtype});
  };
  EXPECT_EQ(need(0, 2).every_rank_bytes(), prefill + 2048 * record);
  EXPECT_EQ(need(100, 2).every_rank_bytes(), prefill + 2048 * record);
  EXPECT_EQ(need(10000, 2).every_rank_bytes(), prefill + 10000 * record);
  EXPECT_EQ(need(0, 2).every_rank.back().what, "the KV cache (capacity, or the prompt's shard)");
  const int64_t prefill4 =
      attention_memory_check(p, plan, false).model({4, p.seq, p.dtype}).every_rank_bytes();
  EXPECT_EQ(need(0, 4).every_rank_bytes(), prefill4 + 1024 * record);
  EXPECT_EQ(decoder_memory_check(p, plan, 0).command, "this attention");
}

}  // namespace
}  // namespace a2d

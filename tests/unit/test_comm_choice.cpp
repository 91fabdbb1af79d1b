// The rules behind --comm (src/comm/comm_choice.hpp): which communicator may carry which
// backend's messages, and when NCCL refuses ranks that share a GPU.
#include <gtest/gtest.h>

#include "attention2d/backend.hpp"
#include "attention2d/comm_kind.hpp"
#include "attention2d/error.hpp"
#include "comm/comm_choice.hpp"

namespace a2d {
namespace {

using comm_choice::kind_refusal;
using comm_choice::nccl_version_text;
using comm_choice::sharing_refusal;

// A device's native communicator, from the registry (BackendCapabilities::native_comm).
std::string native(const std::string& device) {
  return find_backend(device)->capabilities.native_comm;
}

constexpr int kNccl228 = 22809;  // the toolkit's NCCL here
constexpr int kNccl230 = 23000;

TEST(CommChoice, NamesParseBackAndUnknownNamesAreRefused) {
  for (const CommKind kind : {CommKind::mpi, CommKind::nccl, CommKind::gloo})
    EXPECT_EQ(parse_comm_kind(comm_kind_name(kind)), kind);
  EXPECT_EQ(comm_kind_name(CommKind::gloo), "gloo");
  try {
    parse_comm_kind("ucx");
    FAIL() << "ucx was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("choose mpi, nccl or gloo"), std::string::npos)
        << e.what();
  }
}

TEST(CommChoice, MpiIsTheDefaultForHostBackends) {
  for (const char* device : {"cpu", "fenced", "fenced-cuda"})
    EXPECT_EQ(default_comm_kind(*make_backend(device)), CommKind::mpi) << device;
}

TEST(CommChoice, NcclVersionsPrintAsNcclDoes) {
  EXPECT_EQ(nccl_version_text(kNccl228), "2.28.9");
  EXPECT_EQ(nccl_version_text(kNccl230), "2.30.0");
  EXPECT_EQ(nccl_version_text(2803), "2.8.3");  // codes before 2.9: X*1000 + Y*100 + Z
}

TEST(CommChoice, NcclNeedsTheCudaBackendAndABuildWithIt) {
  for (const bool gloo : {false, true}) {
    EXPECT_EQ(kind_refusal(CommKind::mpi, "cpu", native("cpu"), false, gloo), "");
    EXPECT_EQ(kind_refusal(CommKind::mpi, "cuda", native("cuda"), true, gloo), "");
    EXPECT_EQ(kind_refusal(CommKind::nccl, "cuda", native("cuda"), true, gloo), "");
    for (const char* device : {"cpu", "fenced", "fenced-cuda"}) {
      const std::string why = kind_refusal(CommKind::nccl, device, native(device), true, gloo);
      EXPECT_NE(why.find("needs --device cuda"), std::string::npos) << why;
      EXPECT_NE(why.find("use --comm mpi"), std::string::npos) << why;
    }
    const std::string unbuilt = kind_refusal(CommKind::nccl, "cuda", native("cuda"), false, gloo);
    EXPECT_NE(unbuilt.find("this build has no NCCL"), std::string::npos) << unbuilt;
    EXPECT_NE(unbuilt.find("use --comm mpi"), std::string::npos) << unbuilt;
  }
}

// Gloo carries every backend's messages (host memory; the others staged through it, as MPI), and
// a build without it refuses it naming the package and --comm mpi.
TEST(CommChoice, GlooCarriesEveryBackendInABuildWithIt) {
  for (const char* device : {"cpu", "fenced", "fenced-cuda", "cuda"}) {
    EXPECT_EQ(kind_refusal(CommKind::gloo, device, native(device), false, true), "") << device;
    const std::string unbuilt = kind_refusal(CommKind::gloo, device, native(device), true, false);
    EXPECT_NE(unbuilt.find("this build has no Gloo (install libgloo-dev and rebuild)"),
              std::string::npos)
        << unbuilt;
    EXPECT_NE(unbuilt.find("use --comm mpi"), std::string::npos) << unbuilt;
  }
}

TEST(CommChoice, OneGpuPerRankRunsUnderEveryNccl) {
  const std::vector<std::string> gpus = {"a/0000:19:00.0", "a/0000:3b:00.0", "b/0000:19:00.0"};
  for (const int version : {kNccl228, kNccl230})
    for (const bool flag : {false, true})
      EXPECT_EQ(sharing_refusal(gpus, version, flag), "") << version << flag;
  EXPECT_EQ(sharing_refusal({"a/0"}, kNccl228, false), "");
  EXPECT_EQ(sharing_refusal({}, kNccl228, false), "");
}

TEST(CommChoice, SharedGpusAreRefusedNamingTheRanksTheGpuAndTheWayOut) {
  const std::vector<std::string> four_on_one(4, "h200/0000:19:00.0");
  const std::string before = sharing_refusal(four_on_one, kNccl228, false);
  for (const char* part : {"ranks 0, 1, 2, 3", "h200/0000:19:00.0", "NCCL 2.28.9",
                           "refuses two ranks", "use --comm mpi"})
    EXPECT_NE(before.find(part), std::string::npos) << part << " in: " << before;
  // 2.28 refuses even with the flag; 2.30 without the flag asks for it.
  EXPECT_NE(sharing_refusal(four_on_one, kNccl228, true), "");
  const std::string unflagged = sharing_refusal({"g/1", "g/1"}, kNccl230, false);
  EXPECT_NE(unflagged.find("NCCL_MULTI_RANK_GPU_ENABLE=1"), std::string::npos) << unflagged;
  // 2.30 with the flag: two per GPU run, more are refused.
  EXPECT_EQ(sharing_refusal({"g/1", "g/1"}, kNccl230, true), "");
  EXPECT_EQ(sharing_refusal({"g/1", "g/1", "g/2", "g/2"}, kNccl230, true), "");
  const std::string three = sharing_refusal({"g/1", "g/1", "g/1"}, kNccl230, true);
  EXPECT_NE(three.find("at most 2 ranks per GPU (3 here)"), std::string::npos) << three;
  // Ranks on different hosts with the same bus id are different GPUs.
  EXPECT_EQ(sharing_refusal({"a/0000:19:00.0", "b/0000:19:00.0"}, kNccl228, false), "");
  // The most crowded GPU is named; long lists are cut.
  const std::string crowded =
      sharing_refusal({"x/1", "y/2", "y/2", "y/2", "y/2", "y/2", "y/2"}, kNccl228, false);
  EXPECT_NE(crowded.find("ranks 1, 2, 3, 4, ... share the GPU y/2"), std::string::npos) << crowded;
}

}  // namespace
}  // namespace a2d

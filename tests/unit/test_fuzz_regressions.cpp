// Replays every input saved for the fuzz targets: the seed corpus (fuzz/corpus/<target>) and the
// inputs that once crashed a target (fuzz/regressions/<target>, one file per fixed crash). Each
// must run to completion; a target aborts on any violated invariant.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "targets.hpp"

namespace a2d {
namespace {

namespace fs = std::filesystem;

int replay(const std::string& target, void (*run)(const uint8_t*, size_t)) {
  int files = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(A2D_SOURCE_DIR) / "fuzz" / kind / target;
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream in(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
      SCOPED_TRACE(entry.path().string());
      run(bytes.data(), bytes.size());
      ++files;
    }
  }
  return files;
}

TEST(FuzzRegressions, NpyReader) {
  EXPECT_GT(replay("npy", fuzz::npy_reader), 0);
}
TEST(FuzzRegressions, LayoutOwnership) {
  EXPECT_GT(replay("layout", fuzz::layout_ownership), 0);
}
TEST(FuzzRegressions, MaskRanges) {
  EXPECT_GT(replay("mask_ranges", fuzz::mask_ranges), 0);
}

}  // namespace
}  // namespace a2d

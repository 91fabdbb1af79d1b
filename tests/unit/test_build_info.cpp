// `a2d info`'s description: printable lines, each a "name: value" with no trailing blanks, and
// no NUL (Open MPI 4.1.6 counts the version string's terminating NUL in its length).
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "attention2d/tools/build_info.hpp"

TEST(BuildInfo, LinesArePrintableWithoutTrailingBlanks) {
  const std::string info = a2d::build_info();
  ASSERT_FALSE(info.empty());
  EXPECT_EQ(info.find('\0'), std::string::npos);
  std::istringstream lines(info);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    ASSERT_FALSE(line.empty()) << "line " << count;
    EXPECT_NE(line.back(), ' ') << line;
    EXPECT_NE(line.back(), '\t') << line;
    for (const char c : line)
      EXPECT_TRUE(c == '\t' || (c >= 0x20 && c != 0x7f) || static_cast<unsigned char>(c) >= 0x80)
          << "control character " << static_cast<int>(c) << " in: " << line;
  }
  EXPECT_GE(count, 3);  // version, compiler, MPI (or why not)
}

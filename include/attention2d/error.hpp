// attention2d: the one error type of the library.
//
// Library code never exits: it throws a2d::Error, which carries the MPI rank that raised it
// (-1 outside MPI), the source location and a message saying what to change. Programs catch it,
// print it and return non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace a2d {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);

  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }

 private:
  std::string message_;
  std::string file_;
  int line_;
  int rank_;
};

// The rank this process reports in errors; set once by the communicator layer.
void set_error_rank(int rank);
int error_rank();

namespace detail {
[[noreturn]] void throw_error(const std::string& message, const char* file, int line);

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace a2d

// A2D_FAIL("what", value, "more") throws a2d::Error with the concatenated message.
#define A2D_FAIL(...) \
  ::a2d::detail::throw_error(::a2d::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// A2D_REQUIRE(condition, message parts...) throws when the condition does not hold.
#define A2D_REQUIRE(condition, ...)          \
  do {                                       \
    if (!(condition)) A2D_FAIL(__VA_ARGS__); \
  } while (false)

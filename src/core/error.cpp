#include "attention2d/error.hpp"

#include <atomic>

namespace a2d {
namespace {
std::atomic<int> g_error_rank{-1};

std::string format(const std::string& message, const char* file, int line, int rank) {
  std::ostringstream out;
  out << "attention2d error";
  if (rank >= 0) out << " [rank " << rank << "]";
  out << " (" << file << ":" << line << "): " << message;
  return out.str();
}
}  // namespace

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(format(message, file, line, g_error_rank.load())),
      message_(std::move(message)),
      file_(file),
      line_(line),
      rank_(g_error_rank.load()) {}

void set_error_rank(int rank) {
  g_error_rank.store(rank);
}
int error_rank() {
  return g_error_rank.load();
}

namespace detail {
void throw_error(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}
}  // namespace detail

}  // namespace a2d

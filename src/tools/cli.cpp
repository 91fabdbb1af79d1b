#include "attention2d/tools/cli.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "attention2d/error.hpp"

namespace a2d::cli {
namespace {

int64_t parse_int(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  A2D_REQUIRE(used == text.size() && !text.empty(), option, " expects an integer, got '", text,
              "'");
  return value;
}

double parse_double(const std::string& option, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  A2D_REQUIRE(used == text.size() && !text.empty(), option, " expects a number, got '", text, "'");
  return value;
}

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

Options::Options(std::string usage, std::string summary)
    : usage_(std::move(usage)), summary_(std::move(summary)) {}

void Options::add_int(const std::string& name, int64_t* target, const std::string& help) {
  options_.push_back({name, help, std::to_string(*target), true,
                      [name, target](const std::string& v) { *target = parse_int(name, v); }});
}

void Options::add_double(const std::string& name, double* target, const std::string& help) {
  options_.push_back({name, help, format_double(*target, 6), true,
                      [name, target](const std::string& v) { *target = parse_double(name, v); }});
}

void Options::add_string(const std::string& name, std::string* target, const std::string& help) {
  options_.push_back({name, help, *target, true, [target](const std::string& v) { *target = v; }});
}

void Options::add_flag(const std::string& name, bool* target, const std::string& help) {
  options_.push_back({name, help, "", false, [target](const std::string&) { *target = true; }});
}

const Options::Option* Options::find(const std::string& name) const {
  for (const Option& option : options_) {
    if (option.name == name) return &option;
  }
  return nullptr;
}

bool Options::parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << help();
      return false;
    }
    std::string value;
    bool inline_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    const Option* option = find(arg);
    A2D_REQUIRE(option, "unknown option '", arg, "'; run '", usage_.substr(0, usage_.find(" [")),
                " --help' for the list");
    if (option->takes_value) {
      if (!inline_value) {
        A2D_REQUIRE(i + 1 < argc, arg, " needs a value");
        value = argv[++i];
      }
    } else {
      A2D_REQUIRE(!inline_value, arg, " takes no value");
    }
    option->set(value);
    given_.push_back(arg);
  }
  return true;
}

bool Options::given(const std::string& name) const {
  for (const auto& g : given_) {
    if (g == name) return true;
  }
  return false;
}

std::string wrap(const std::string& text, size_t first_width, size_t width, size_t indent) {
  std::istringstream words(text);
  std::string out, line, word;
  size_t limit = first_width;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > limit) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
      limit = width - indent;
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

std::string Options::help() const {
  constexpr size_t kWidth = 100, kColumn = 24;
  std::ostringstream out;
  out << "usage: " << usage_ << "\n\n" << wrap(summary_, kWidth, kWidth, 0) << "\n\noptions:\n";
  for (const Option& option : options_) {
    std::string left = "  " + option.name + (option.takes_value ? " VALUE" : "");
    if (left.size() < kColumn)
      left.resize(kColumn, ' ');
    else
      left += "\n" + std::string(kColumn, ' ');
    std::string text = option.help;
    // The default where the help does not state it (one that means "chosen for you" is stated
    // by the help itself, in words).
    if (option.takes_value && !option.default_text.empty() &&
        text.find("default") == std::string::npos && text.find("Default") == std::string::npos) {
      text += " (default " + option.default_text + ")";
    }
    out << left << wrap(text, kWidth - kColumn, kWidth, kColumn) << "\n";
  }
  out << "  --help                this text\n";
  return out.str();
}

JsonLine& JsonLine::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, "\"" + escape(value) + "\"");
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, const char* value) {
  return add(key, std::string(value));
}

JsonLine& JsonLine::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, double value) {
  fields_.emplace_back(key, std::isfinite(value) ? format_double(value, 6) : "null");
  return *this;
}

JsonLine& JsonLine::add(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
  return *this;
}

std::string JsonLine::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out.append(", ");
    out.append(1, '"').append(escape(fields_[i].first)).append("\": ").append(fields_[i].second);
  }
  return out.append(1, '}');
}

std::string count_of(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

std::string format_double(double value, int precision) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
  return buffer;
}

namespace {

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// mkdir -p, naming the component that failed and why.
void make_directories(const std::string& option, const std::string& path) {
  std::string prefix;
  size_t at = 0;
  while (at <= path.size()) {
    const size_t slash = std::min(path.find('/', at), path.size());
    prefix = path.substr(0, slash);
    at = slash + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      A2D_REQUIRE(S_ISDIR(st.st_mode), option, " ", path, ": ", prefix,
                  " is a file, not a directory");
      continue;
    }
    const int missing = errno;
    A2D_REQUIRE(missing == ENOENT, option, " ", path, ": cannot reach ", prefix, ": ",
                std::strerror(missing));
    if (::mkdir(prefix.c_str(), 0755) != 0) {
      const int error = errno;
      A2D_REQUIRE(error == EEXIST, option, " ", path, ": cannot create the directory ", prefix,
                  ": ", std::strerror(error));
    }
  }
}

// Whether a file can be created in `directory`: one is created and removed (root passes every
// permission check, but not a read-only mount).
void require_writable_directory(const std::string& option, const std::string& path,
                                const std::string& directory) {
  std::string probe = directory + "/.a2d-write-test-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  const int error = errno;
  A2D_REQUIRE(fd >= 0, option, " ", path, ": cannot write in the directory ", directory, ": ",
              std::strerror(error));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

void check_output_file(const std::string& option, const std::string& path, bool create_parents) {
  A2D_REQUIRE(!path.empty(), option, " needs a file name");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    A2D_REQUIRE(!S_ISDIR(st.st_mode), option, " ", path, " is a directory; give a file name");
    A2D_REQUIRE(S_ISREG(st.st_mode), option, " ", path, " exists and is not a regular file");
    const int fd = ::open(path.c_str(), O_WRONLY);  // no O_TRUNC: changes nothing
    const int error = errno;
    A2D_REQUIRE(fd >= 0, option, " ", path, " cannot be written: ", std::strerror(error));
    ::close(fd);
  } else {
    const int error = errno;
    A2D_REQUIRE(error == ENOENT || error == ENOTDIR, option, " ", path, ": ", std::strerror(error));
  }
  const std::string directory = parent_of(path);
  struct stat dir {};
  if (::stat(directory.c_str(), &dir) != 0) {
    A2D_REQUIRE(create_parents, option, " ", path, ": the directory ", directory,
                " does not exist");
    make_directories(option, directory);
  } else {
    A2D_REQUIRE(S_ISDIR(dir.st_mode), option, " ", path, ": ", directory,
                " is a file, not a directory");
  }
  require_writable_directory(option, path, directory);
}

void prepare_output_directory(const std::string& option, const std::string& path) {
  A2D_REQUIRE(!path.empty(), option, " needs a directory");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    A2D_REQUIRE(S_ISDIR(st.st_mode), option, " ", path,
                S_ISREG(st.st_mode) ? " is a regular file, not a directory"
                                    : " exists and is not a directory");
  } else {
    make_directories(option, path);
  }
  require_writable_directory(option, path, path);
}

std::string absolute_path(const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  char buffer[PATH_MAX];
  if (!::getcwd(buffer, sizeof buffer)) return path;
  return std::string(buffer) + "/" + path;
}

}  // namespace a2d::cli

// .npy reading and writing. Format reference: numpy/lib/format.py ("NEP 1"): magic "\x93NUMPY",
// major and minor version bytes, a little-endian header length (2 bytes in 1.0, 4 bytes in 2.0
// and 3.0), then a Python dict literal with 'descr', 'fortran_order' and 'shape', padded with
// spaces and a newline so the data starts on a 64-byte boundary.
#include "attention2d/tools/npy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <variant>

#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"

namespace a2d::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

// The header dict holds strings, booleans and tuples of non-negative integers; nothing else is
// accepted.
using Value = std::variant<std::string, bool, std::vector<int64_t>>;

class HeaderParser {
 public:
  HeaderParser(std::string text, std::string name)
      : text_(std::move(text)), name_(std::move(name)) {}

  std::map<std::string, Value> parse_dict() {
    std::map<std::string, Value> dict;
    expect('{');
    skip_space();
    while (peek() != '}') {
      std::string key = parse_string();
      expect(':');
      dict[key] = parse_value();
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}' in the header dict");
      }
    }
    ++pos_;
    return dict;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    A2D_FAIL("malformed .npy header in ", name_, ": ", what, " at offset ", pos_);
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t'))
      ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end of the header");
    return text_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    ++pos_;
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) fail("unterminated string");
    std::string value = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return value;
  }
  int64_t parse_integer() {
    skip_space();
    const std::size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension too large");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) fail("expected a non-negative integer");
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
    return value;
  }
  Value parse_value() {
    const char c = peek();
    if (c == '\'' || c == '"') return parse_string();
    if (c == '(') {
      ++pos_;
      std::vector<int64_t> dims;
      while (peek() != ')') {
        dims.push_back(parse_integer());
        if (peek() == ',') {
          ++pos_;
        } else if (peek() != ')') {
          fail("expected ',' or ')' in the shape");
        }
      }
      ++pos_;
      return dims;
    }
    if (text_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (text_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    fail("unsupported value in the header dict");
  }

  std::string text_;
  std::string name_;
  std::size_t pos_ = 0;
};

uint32_t read_le(const std::byte* p, int bytes) {
  uint32_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= static_cast<uint32_t>(p[i]) << (8 * i);
  return value;
}

int64_t checked_count(const std::vector<int64_t>& shape, const std::string& name) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    if (dim != 0 && count > std::numeric_limits<int64_t>::max() / 16 / dim) {
      A2D_FAIL(name, ": the shape ", shape_string(shape), " is too large");
    }
    count *= dim;
  }
  return count;
}

// numpy's 'descr' of each dtype (little endian).
const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "<f4";
    case DType::float64:
      return "<f8";
    case DType::float16:
      return "<f2";
  }
  return "?";
}

std::string header_text(const std::vector<int64_t>& shape, DType dtype) {
  std::ostringstream dict;
  dict << "{'descr': '" << descr_of(dtype) << "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    if (i + 1 < shape.size()) dict << ' ';
  }
  dict << "), }";
  std::string text = dict.str();
  // magic (6) + version (2) + length (2) + text + '\n' must be a multiple of 64.
  const std::size_t unpadded = kMagicSize + 2 + 2 + text.size() + 1;
  text.append((64 - unpadded % 64) % 64, ' ');
  text.push_back('\n');
  return text;
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::float16:
      return "float16";
  }
  return "?";
}

std::size_t item_size(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return 4;
    case DType::float64:
      return 8;
    case DType::float16:
      return 2;
  }
  return 0;
}

int64_t Array::element_count() const {
  return checked_count(shape, "array");
}

namespace {

// Element i of a float16 array, widened exactly (every binary16 value is a binary32 value).
float f16_at(const std::vector<std::byte>& bytes, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, bytes.data() + 2 * i, 2);
  return f16_to_float(bits);
}

}  // namespace

std::vector<float> Array::to_float() const {
  const int64_t n = element_count();
  std::vector<float> out(static_cast<std::size_t>(n));
  if (dtype == DType::float32) {
    // n == 0: both pointers may be null, which memcpy does not allow (found by fuzz_npy).
    if (n > 0) std::memcpy(out.data(), bytes.data(), static_cast<std::size_t>(n) * 4);
  } else if (dtype == DType::float16) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = f16_at(bytes, i);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      double value;
      std::memcpy(&value, bytes.data() + 8 * i, 8);
      out[i] = static_cast<float>(value);
    }
  }
  return out;
}

std::vector<double> Array::to_double() const {
  const int64_t n = element_count();
  std::vector<double> out(static_cast<std::size_t>(n));
  if (dtype == DType::float64) {
    if (n > 0) std::memcpy(out.data(), bytes.data(), static_cast<std::size_t>(n) * 8);
  } else if (dtype == DType::float16) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = f16_at(bytes, i);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float value;
      std::memcpy(&value, bytes.data() + 4 * i, 4);
      out[i] = value;
    }
  }
  return out;
}

namespace {

// The preamble and header of a .npy image: the array's dtype and shape (no data), and where the
// data begins (`data_offset`). `size` may end after the header.
Array parse_header(const std::byte* data, std::size_t size, const std::string& name,
                   std::size_t* data_offset) {
  if (size < kMagicSize + 2 || std::memcmp(data, kMagic, kMagicSize) != 0) {
    A2D_FAIL(name, " is not a .npy file (bad magic: expected \\x93NUMPY)");
  }
  const int major = static_cast<int>(data[6]);
  const int minor = static_cast<int>(data[7]);
  if (major < 1 || major > 3 || minor != 0) {
    A2D_FAIL(name, ": unsupported .npy format version ", major, ".", minor,
             " (supported: 1.0, 2.0, 3.0)");
  }
  const int length_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = kMagicSize + 2 + static_cast<std::size_t>(length_bytes);
  if (size < prefix) A2D_FAIL(name, " is truncated inside the .npy preamble");
  const std::size_t header_length = read_le(data + kMagicSize + 2, length_bytes);
  if (size - prefix < header_length) {
    A2D_FAIL(name, " is truncated: the header claims ", header_length, " bytes but only ",
             size - prefix, " follow");
  }
  const std::string header(reinterpret_cast<const char*>(data + prefix), header_length);
  const auto dict = HeaderParser(header, name).parse_dict();

  auto field = [&](const char* key) -> const Value& {
    const auto it = dict.find(key);
    if (it == dict.end()) A2D_FAIL("malformed .npy header in ", name, ": no '", key, "' key");
    return it->second;
  };
  const auto* descr = std::get_if<std::string>(&field("descr"));
  const auto* fortran = std::get_if<bool>(&field("fortran_order"));
  const auto* shape = std::get_if<std::vector<int64_t>>(&field("shape"));
  if (!descr || !fortran || !shape) {
    A2D_FAIL("malformed .npy header in ", name, ": 'descr' must be a string, 'fortran_order' a",
             " boolean and 'shape' a tuple");
  }
  Array array;
  if (*descr == "<f2") {
    array.dtype = DType::float16;
  } else if (*descr == "<f4") {
    array.dtype = DType::float32;
  } else if (*descr == "<f8") {
    array.dtype = DType::float64;
  } else if (*descr == ">f2" || *descr == ">f4" || *descr == ">f8") {
    A2D_FAIL(name, " is big-endian ('", *descr, "'); convert it with array.astype('<f",
             descr->back(), "')");
  } else {
    A2D_FAIL(name, " has unsupported dtype '", *descr,
             "'; attention2d reads float16 ('<f2'), float32 ('<f4') or float64 ('<f8')");
  }
  if (*fortran) {
    A2D_FAIL(name, " is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  }
  array.shape = *shape;
  checked_count(array.shape, name);
  *data_offset = prefix + header_length;
  return array;
}

}  // namespace

Array parse(const std::byte* data, std::size_t size, const std::string& name) {
  std::size_t offset = 0;
  Array array = parse_header(data, size, name, &offset);
  const int64_t count = checked_count(array.shape, name);
  const std::size_t body = static_cast<std::size_t>(count) * item_size(array.dtype);
  const std::size_t available = size - offset;
  if (available < body) {
    A2D_FAIL(name, " is truncated: shape ", shape_string(array.shape), " of ",
             dtype_name(array.dtype), " needs ", body, " data bytes but the file has ", available);
  }
  if (available > body) {
    A2D_FAIL(name, " has ", available - body, " unexpected bytes after the data of shape ",
             shape_string(array.shape));
  }
  array.bytes.assign(data + offset, data + offset + body);
  return array;
}

Array read(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) A2D_FAIL("cannot open ", path, " for reading: ", errno_text());
  const std::streamsize size = in.tellg();
  in.seekg(0);
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    A2D_FAIL("cannot read ", path, ": ", errno_text());
  }
  return parse(bytes.data(), bytes.size(), path);
}

Header read_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) A2D_FAIL("cannot open ", path, " for reading: ", errno_text());
  // The preamble (magic, version, header length), then the header it announces.
  std::vector<std::byte> bytes(kMagicSize + 6);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  if (bytes.size() >= kMagicSize + 4 && std::memcmp(bytes.data(), kMagic, kMagicSize) == 0) {
    const int major = static_cast<int>(bytes[6]);
    const int length_bytes = major == 1 ? 2 : 4;
    if (bytes.size() >= kMagicSize + 2 + static_cast<std::size_t>(length_bytes)) {
      const std::size_t prefix = kMagicSize + 2 + static_cast<std::size_t>(length_bytes);
      const std::size_t header_length = read_le(bytes.data() + kMagicSize + 2, length_bytes);
      // A header of more than 16 MiB is refused as truncated (parse_header) rather than read.
      bytes.resize(prefix + std::min<std::size_t>(header_length, std::size_t{1} << 24));
      in.clear();
      in.seekg(0);
      in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      bytes.resize(static_cast<std::size_t>(in.gcount()));
    }
  }
  std::size_t offset = 0;
  const Array array = parse_header(bytes.data(), bytes.size(), path, &offset);
  return {array.dtype, array.shape};
}

int64_t Header::data_bytes() const {
  int64_t count = 1;
  for (const int64_t n : shape)
    count *= n;
  return count * static_cast<int64_t>(item_size(dtype));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i)
    out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

void require_shape(const Array& array, const std::vector<int64_t>& expected,
                   const std::string& what) {
  if (array.shape != expected) {
    A2D_FAIL(what, " has shape ", shape_string(array.shape), " but ", shape_string(expected),
             " is required");
  }
}

std::vector<std::byte> encode(const std::vector<int64_t>& shape, DType dtype, const void* data) {
  const std::string header = header_text(shape, dtype);
  const std::size_t body =
      static_cast<std::size_t>(checked_count(shape, "array")) * item_size(dtype);
  std::vector<std::byte> bytes(kMagicSize + 4 + header.size() + body);
  std::memcpy(bytes.data(), kMagic, kMagicSize);
  bytes[6] = std::byte{1};
  bytes[7] = std::byte{0};
  bytes[8] = static_cast<std::byte>(header.size() & 0xff);
  bytes[9] = static_cast<std::byte>(header.size() >> 8);
  std::memcpy(bytes.data() + 10, header.data(), header.size());
  if (body) std::memcpy(bytes.data() + 10 + header.size(), data, body);
  return bytes;
}

namespace {

std::string temporary_path(const std::string& path) {
  return path + ".tmp." + std::to_string(getpid());
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A complete file not yet in place. Where the file system can (O_TMPFILE: ext4, xfs, btrfs,
// tmpfs), it has no name until it is committed, so a writer killed at any moment (SIGKILL, an
// MPI_Abort from another rank) leaves nothing behind; elsewhere it is named path.tmp.PID until
// then, and removed on every failure this process sees.
struct Temporary {
  std::string path;   // the target
  std::string named;  // the temporary's name, empty while it has none
  int fd = -1;

  void discard() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    if (!named.empty()) unlink(named.c_str());
  }
};

// Writes every byte (retrying short writes and EINTR) and flushes them to the device.
bool write_fully(int fd, const std::vector<std::byte>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return ::fsync(fd) == 0;
}

Temporary write_temporary(const std::string& path, const std::vector<std::byte>& bytes) {
  Temporary t;
  t.path = path;
  // An unnamed file is committed by linking /proc/self/fd/N: only where /proc is there.
  if (::access("/proc/self/fd", X_OK) == 0) {
    t.fd = ::open(directory_of(path).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  }
  if (t.fd < 0) {
    t.named = temporary_path(path);
    t.fd = ::open(t.named.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (t.fd < 0) {
      t.named.clear();  // nothing was created
      A2D_FAIL("cannot write ", path, ": ", errno_text());
    }
  }
  if (!write_fully(t.fd, bytes)) {
    const std::string reason = errno_text();
    t.discard();
    A2D_FAIL("cannot write ", path, ": ", reason);
  }
  return t;
}

// Moves a complete temporary into place. Refusing to overwrite uses link(), which fails if the
// target appeared meanwhile: a file we were not asked to replace is never clobbered. Replacing
// one is a rename(), so the target is at every moment either the old file or the new one.
void commit_temporary(Temporary& t, Overwrite overwrite) {
  if (t.named.empty()) {
    const std::string self = "/proc/self/fd/" + std::to_string(t.fd);
    if (overwrite == Overwrite::refuse) {
      if (linkat(AT_FDCWD, self.c_str(), AT_FDCWD, t.path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
        const std::string reason =
            errno == EEXIST ? "it already exists; pass --force to overwrite it" : errno_text();
        A2D_FAIL("cannot create ", t.path, ": ", reason);
      }
      t.discard();
      return;
    }
    // rename() needs a name: the temporary has one only for the instant before the rename.
    const std::string named = temporary_path(t.path);
    unlink(named.c_str());
    if (linkat(AT_FDCWD, self.c_str(), AT_FDCWD, named.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      A2D_FAIL("cannot write ", t.path, ": ", errno_text());
    }
    t.named = named;
  }
  if (overwrite == Overwrite::refuse) {
    if (link(t.named.c_str(), t.path.c_str()) != 0) {
      const std::string reason =
          errno == EEXIST ? "it already exists; pass --force to overwrite it" : errno_text();
      A2D_FAIL("cannot create ", t.path, ": ", reason);
    }
  } else if (std::rename(t.named.c_str(), t.path.c_str()) != 0) {
    A2D_FAIL("cannot move the output into ", t.path, ": ", errno_text());
  } else {
    t.named.clear();  // it is the target now
  }
  t.discard();
}

// The directory entries made by the commits, to the device too (best effort: a directory that
// cannot be opened for reading changes nothing about the files themselves).
void sync_directory(const std::string& path) {
  const int fd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

namespace {
// Held while files are linked into place; hold_commits() takes it for good.
std::mutex g_commit_mutex;
}  // namespace

void hold_commits() {
  g_commit_mutex.lock();  // never released: the process ends
}

void write_all(const std::vector<File>& files, Overwrite overwrite) {
  for (const File& f : files) {
    if (overwrite == Overwrite::refuse && access(f.path.c_str(), F_OK) == 0) {
      A2D_FAIL(f.path, " already exists; pass --force to overwrite it");
    }
  }
  std::vector<Temporary> temporaries;
  temporaries.reserve(files.size());
  size_t committed = 0;
  try {
    for (const File& f : files)
      temporaries.push_back(write_temporary(f.path, encode(f.shape, f.dtype, f.data)));
    std::lock_guard<std::mutex> commits(g_commit_mutex);
    for (; committed < files.size(); ++committed)
      commit_temporary(temporaries[committed], overwrite);
  } catch (const Error&) {
    for (size_t i = committed; i < temporaries.size(); ++i)
      temporaries[i].discard();
    if (overwrite == Overwrite::refuse) {
      for (size_t i = 0; i < committed; ++i)
        unlink(files[i].path.c_str());
    }
    throw;
  }
  for (const File& f : files)
    sync_directory(f.path);
}

namespace {
void write_bytes(const std::string& path, const std::vector<std::byte>& bytes,
                 Overwrite overwrite) {
  if (overwrite == Overwrite::refuse && access(path.c_str(), F_OK) == 0) {
    A2D_FAIL(path, " already exists; pass --force to overwrite it");
  }
  Temporary t = write_temporary(path, bytes);
  try {
    std::lock_guard<std::mutex> commits(g_commit_mutex);
    commit_temporary(t, overwrite);
  } catch (const Error&) {
    t.discard();
    throw;
  }
  sync_directory(path);
}
}  // namespace

void write(const std::string& path, const std::vector<int64_t>& shape, DType dtype,
           const void* data, Overwrite overwrite) {
  write_bytes(path, encode(shape, dtype, data), overwrite);
}

void write(const std::string& path, const std::vector<int64_t>& shape, const float* data,
           Overwrite overwrite) {
  write(path, shape, DType::float32, data, overwrite);
}

void write(const std::string& path, const std::vector<int64_t>& shape, const double* data,
           Overwrite overwrite) {
  write(path, shape, DType::float64, data, overwrite);
}

}  // namespace a2d::npy

// .npy reading and writing: round trips, and a clear error for every malformed input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "attention2d/dtype.hpp"
#include "attention2d/error.hpp"
#include "attention2d/tools/npy.hpp"

namespace a2d {
namespace {

namespace fs = std::filesystem;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("a2d_npy_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

// A hand-made file: magic, version, header length, header text (unpadded), body.
std::vector<std::byte> handmade(const std::string& header, std::size_t body_bytes, int major = 1) {
  std::string text = "\x93NUMPY";
  text.push_back(static_cast<char>(major));
  text.push_back(0);
  const std::size_t n = header.size();
  text.push_back(static_cast<char>(n & 0xff));
  text.push_back(static_cast<char>(n >> 8));
  if (major > 1) text.append(2, '\0');
  text += header;
  text.append(body_bytes, '\0');
  return bytes_of(text);
}

// A hand-made float16 file: the header dict with 'descr' '<f2' and `shape` (a Python tuple
// literal), then `bits` as little-endian binary16.
std::vector<std::byte> handmade_f16(const std::string& shape, const std::vector<uint16_t>& bits) {
  std::vector<std::byte> bytes =
      handmade("{'descr': '<f2', 'fortran_order': False, 'shape': " + shape + ", }", 0);
  for (const uint16_t b : bits) {
    bytes.push_back(static_cast<std::byte>(b & 0xff));
    bytes.push_back(static_cast<std::byte>(b >> 8));
  }
  return bytes;
}

std::string error_of(const std::vector<std::byte>& bytes) {
  try {
    npy::parse(bytes.data(), bytes.size(), "x.npy");
  } catch (const Error& e) {
    return e.message();
  }
  return "accepted";
}

TEST_F(NpyTest, Float32AndFloat64RoundTrip) {
  const std::vector<float> f = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
  npy::write(path("f.npy"), {2, 3}, f.data(), npy::Overwrite::refuse);
  const npy::Array a = npy::read(path("f.npy"));
  EXPECT_EQ(a.dtype, npy::DType::float32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.to_float(), f);

  const std::vector<double> d = {1.0 / 3.0, 2.0, -4.5};
  npy::write(path("d.npy"), {3}, d.data(), npy::Overwrite::refuse);
  const npy::Array b = npy::read(path("d.npy"));
  EXPECT_EQ(b.dtype, npy::DType::float64);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(b.to_double(), d);
  EXPECT_FLOAT_EQ(b.to_float()[0], static_cast<float>(1.0 / 3.0));

  // Data starts on a 64-byte boundary, as numpy writes it.
  const auto encoded = npy::encode({2, 3}, npy::DType::float32, f.data());
  EXPECT_EQ((encoded.size() - f.size() * 4) % 64, 0u);
}

TEST_F(NpyTest, FourDimensionalAndEmptyShapes) {
  std::vector<float> x(2 * 3 * 4 * 5);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i);
  npy::write(path("x.npy"), {2, 3, 4, 5}, x.data(), npy::Overwrite::refuse);
  EXPECT_EQ(npy::read(path("x.npy")).to_float(), x);
  npy::write(path("e.npy"), {0, 4}, x.data(), npy::Overwrite::refuse);
  EXPECT_EQ(npy::read(path("e.npy")).element_count(), 0);
}

TEST_F(NpyTest, ReadsVersion2HeadersAndNumpyStyleDicts) {
  const auto v2 =
      handmade("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2,), }\n", 16, 2);
  const npy::Array a = npy::parse(v2.data(), v2.size(), "v2.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.dtype, npy::DType::float64);
  const auto scalar = handmade("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4);
  EXPECT_EQ(npy::parse(scalar.data(), scalar.size(), "s.npy").element_count(), 1);
}

TEST_F(NpyTest, MalformedInputsAreRefusedWithTheReason) {
  EXPECT_NE(error_of(bytes_of("PK\x03\x04 not numpy")).find("bad magic"), std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8))
                .find("unsupported dtype '<i4'"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8))
                .find("big-endian"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16))
                .find("Fortran order"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 12))
                .find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 12))
                .find("unexpected bytes"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'shape': (1,), }", 4)).find("'fortran_order'"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (1,", 4))
                .find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, "
                              "99999999999, 99999999999), }",
                              4))
                .find("too large"),
            std::string::npos);
  auto truncated_header = handmade("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  truncated_header.resize(20);
  EXPECT_NE(error_of(truncated_header).find("truncated"), std::string::npos);
  auto bad_version = handmade("{}", 0);
  bad_version[6] = std::byte{9};
  EXPECT_NE(error_of(bad_version).find("version"), std::string::npos);
}

// Zero, -0, normal, the largest finite (65504), the smallest and largest subnormals, the smallest
// normal, both infinities, a quiet and a signalling NaN, and 1/3 rounded to binary16.
const std::vector<uint16_t> kF16Bits = {0x0000, 0x8000, 0x3c00, 0xc100, 0x7bff, 0x0001, 0x03ff,
                                        0x0400, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0x3555};
const std::vector<float> kF16Values = {
    0.0f,     -0.0f,    1.0f,      -2.5f, 65504.0f, 0x1p-24f,   1023 * 0x1p-24f,
    0x1p-14f, INFINITY, -INFINITY, NAN,   NAN,      0x1.554p-2f};

// to_float() and to_double() give exactly `expected` (NaN for NaN, the sign of zero kept).
void expect_values(const npy::Array& a, const std::vector<float>& expected) {
  const std::vector<float> f = a.to_float();
  const std::vector<double> d = a.to_double();
  ASSERT_EQ(f.size(), expected.size());
  ASSERT_EQ(d.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(f[i]));
      EXPECT_TRUE(std::isnan(d[i]));
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(f[i]), std::bit_cast<uint32_t>(expected[i]));
      EXPECT_EQ(std::bit_cast<uint64_t>(d[i]),
                std::bit_cast<uint64_t>(static_cast<double>(expected[i])));
    }
  }
}

TEST_F(NpyTest, Float16ReadsExactly) {
  const auto bytes = handmade_f16("(13,)", kF16Bits);
  const npy::Array a = npy::parse(bytes.data(), bytes.size(), "h.npy");
  EXPECT_EQ(a.dtype, npy::DType::float16);
  EXPECT_STREQ(npy::dtype_name(a.dtype), "float16");
  EXPECT_EQ(npy::item_size(a.dtype), 2u);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{13}));
  EXPECT_EQ(a.bytes.size(), 26u);
  expect_values(a, kF16Values);
}

TEST_F(NpyTest, Float16Shapes) {
  const std::vector<uint16_t> six = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};  // 1 to 6
  const auto matrix = handmade_f16("(2, 3)", six);
  const npy::Array a = npy::parse(matrix.data(), matrix.size(), "m.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.to_float(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  npy::require_shape(a, {2, 3}, "--q");
  try {
    npy::require_shape(a, {3, 2}, "--q");
    FAIL() << "accepted a wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("--q has shape [2, 3] but [3, 2] is required"), std::string::npos);
  }
  const auto scalar = handmade_f16("()", {0xc000});
  const npy::Array s = npy::parse(scalar.data(), scalar.size(), "s.npy");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.to_double(), (std::vector<double>{-2.0}));
  const auto empty = handmade_f16("(0, 4)", {});
  const npy::Array e = npy::parse(empty.data(), empty.size(), "e.npy");
  EXPECT_EQ(e.element_count(), 0);
  EXPECT_TRUE(e.to_float().empty());
  EXPECT_TRUE(e.to_double().empty());
}

TEST_F(NpyTest, OtherTwoByteTypesAndBadFloat16BodiesAreRefused) {
  auto file = [](const std::string& descr, std::size_t body) {
    return handmade("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (3,), }", body);
  };
  for (const char* descr : {"<i2", "<u2", "|f2", "<e", "|V2"}) {
    SCOPED_TRACE(descr);
    EXPECT_NE(error_of(file(descr, 6))
                  .find(std::string("x.npy has unsupported dtype '") + descr +
                        "'; attention2d reads float16 ('<f2'), float32 ('<f4') or float64 ('<f8')"),
              std::string::npos);
  }
  EXPECT_NE(error_of(file(">f2", 6))
                .find("x.npy is big-endian ('>f2'); convert it with array.astype('<f2')"),
            std::string::npos);
  EXPECT_NE(error_of(handmade("{'descr': '<f2', 'fortran_order': True, 'shape': (2, 2), }", 8))
                .find("Fortran order"),
            std::string::npos);
  // A body one element short, half an element short, and with a trailing odd byte.
  EXPECT_NE(error_of(file("<f2", 4))
                .find("x.npy is truncated: shape [3] of float16 needs 6 data bytes but the file "
                      "has 4"),
            std::string::npos);
  EXPECT_NE(error_of(file("<f2", 5)).find("needs 6 data bytes but the file has 5"),
            std::string::npos);
  EXPECT_NE(error_of(file("<f2", 7)).find("x.npy has 1 unexpected bytes after the data"),
            std::string::npos);
}

TEST_F(NpyTest, Float16WriteReadRoundTrip) {
  // The bits go to the file unchanged, a signalling NaN's included.
  npy::write(path("h.npy"), {13}, npy::DType::float16, kF16Bits.data(), npy::Overwrite::refuse);
  const npy::Array a = npy::read(path("h.npy"));
  EXPECT_EQ(a.dtype, npy::DType::float16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{13}));
  ASSERT_EQ(a.bytes.size(), 2 * kF16Bits.size());
  EXPECT_EQ(std::memcmp(a.bytes.data(), kF16Bits.data(), a.bytes.size()), 0);
  expect_values(a, kF16Values);

  std::vector<uint16_t> x(2 * 3 * 4 * 5);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float_to_f16(static_cast<float>(i) / 8);
  npy::write(path("x.npy"), {2, 3, 4, 5}, npy::DType::float16, x.data(), npy::Overwrite::refuse);
  const npy::Array b = npy::read(path("x.npy"));
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3, 4, 5}));
  const std::vector<float> values = b.to_float();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(values[i], static_cast<float>(i) / 8);
  npy::write(path("e.npy"), {0, 4}, npy::DType::float16, x.data(), npy::Overwrite::refuse);
  EXPECT_EQ(npy::read(path("e.npy")).element_count(), 0);
  EXPECT_THROW(
      npy::write(path("h.npy"), {1}, npy::DType::float16, x.data(), npy::Overwrite::refuse), Error);
}

// The exact bytes of a float16 file: the header numpy.save writes (numpy 1.24 gives these same
// bytes for these shapes), padded with spaces and a newline so the data starts at byte 128.
TEST_F(NpyTest, Float16HeaderBytesAreNumpys) {
  const std::vector<uint16_t> six = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
  const std::pair<std::vector<int64_t>, std::string> cases[] = {
      {{2, 3}, "(2, 3)"}, {{6}, "(6,)"}, {{1, 2, 1, 3}, "(1, 2, 1, 3)"}};
  for (const auto& [shape, tuple] : cases) {
    SCOPED_TRACE(tuple);
    std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': " + tuple + ", }";
    header.append(128 - 10 - 1 - header.size(), ' ');
    header.push_back('\n');
    std::string expected("\x93NUMPY\x01\x00", 8);          // magic, version 1.0
    expected.push_back(static_cast<char>(header.size()));  // 118: the length, little endian
    expected.push_back('\0');
    expected += header;
    expected.append("\x00\x3c\x00\x40\x00\x42\x00\x44\x00\x45\x00\x46", 12);
    const std::vector<std::byte> encoded = npy::encode(shape, npy::DType::float16, six.data());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(encoded.data()), encoded.size()), expected);
  }
}

std::vector<char> file_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// A file numpy wrote (also a seed of the fuzz corpus), made by
//   python3 -c "import numpy as np; np.save('fuzz/corpus/npy/f2_special_13.npy', np.array([0x0000,
//     0x8000, 0x3c00, 0xc100, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00, 0x7d01,
//     0x3555], dtype='<u2').view('<f2'))"
// i.e. kF16Bits. It reads exactly, and writing the array again gives the same bytes.
TEST_F(NpyTest, ReadsAndRewritesAFloat16FileWrittenByNumpy) {
  const std::string numpy_file = std::string(A2D_SOURCE_DIR) + "/fuzz/corpus/npy/f2_special_13.npy";
  const npy::Array a = npy::read(numpy_file);
  EXPECT_EQ(a.dtype, npy::DType::float16);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{13}));
  ASSERT_EQ(a.bytes.size(), 2 * kF16Bits.size());
  EXPECT_EQ(std::memcmp(a.bytes.data(), kF16Bits.data(), a.bytes.size()), 0);
  expect_values(a, kF16Values);
  npy::write(path("again.npy"), a.shape, a.dtype, a.bytes.data(), npy::Overwrite::refuse);
  const std::vector<char> original = file_bytes(numpy_file);
  EXPECT_FALSE(original.empty());
  EXPECT_EQ(file_bytes(path("again.npy")), original);
}

TEST_F(NpyTest, WriteAllCarriesEachFilesDType) {
  const std::vector<float> f = {1.5f, -2.0f};
  const std::vector<uint16_t> h = {0x3e00, 0xc000};  // 1.5, -2
  const std::vector<double> d = {1.5, -2.0};
  npy::write_all({{path("f.npy"), {2}, f.data()},
                  {path("h.npy"), {2}, npy::DType::float16, h.data()},
                  {path("d.npy"), {2}, npy::DType::float64, d.data()}},
                 npy::Overwrite::refuse);
  const npy::Array a = npy::read(path("f.npy")), b = npy::read(path("h.npy")),
                   c = npy::read(path("d.npy"));
  EXPECT_EQ(a.dtype, npy::DType::float32);
  EXPECT_EQ(b.dtype, npy::DType::float16);
  EXPECT_EQ(c.dtype, npy::DType::float64);
  EXPECT_EQ(a.to_float(), f);
  EXPECT_EQ(b.to_float(), f);
  EXPECT_EQ(c.to_double(), d);
}

TEST_F(NpyTest, RequireShapeNamesTheTensor) {
  const std::vector<float> x(6);
  npy::write(path("q.npy"), {1, 2, 3}, x.data(), npy::Overwrite::refuse);
  const npy::Array a = npy::read(path("q.npy"));
  try {
    npy::require_shape(a, {1, 2, 4}, "--q");
    FAIL() << "accepted a wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("--q has shape [1, 2, 3] but [1, 2, 4] is required"),
              std::string::npos);
  }
}

TEST_F(NpyTest, NeverOverwritesWithoutBeingAsked) {
  const std::vector<float> first = {1, 2}, second = {3, 4};
  npy::write(path("o.npy"), {2}, first.data(), npy::Overwrite::refuse);
  EXPECT_THROW(npy::write(path("o.npy"), {2}, second.data(), npy::Overwrite::refuse), Error);
  EXPECT_EQ(npy::read(path("o.npy")).to_float(), first);
  npy::write(path("o.npy"), {2}, second.data(), npy::Overwrite::allow);
  EXPECT_EQ(npy::read(path("o.npy")).to_float(), second);
  // No temporary files are left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_))
    ++files;
  EXPECT_EQ(files, 1);
}

// A writer killed at any moment (SIGKILL: an MPI_Abort, a killed rank) leaves each file either
// as it was or complete and new, and no temporary. Where the file system cannot make unnamed
// files (O_TMPFILE), a named temporary may remain after SIGKILL: skipped there.
TEST_F(NpyTest, AKilledWriterLeavesNothingPartial) {
  const int probe = ::open(dir_.c_str(), O_TMPFILE | O_WRONLY, 0600);
  if (probe < 0) GTEST_SKIP() << "no O_TMPFILE on " << dir_ << ": " << std::strerror(errno);
  ::close(probe);
  const int64_t count = 4 << 20;  // 16 MB a file: long enough to be killed in the middle
  const std::vector<float> old_values(count, 1.0f), new_values(count, 2.0f);
  for (const auto overwrite : {npy::Overwrite::refuse, npy::Overwrite::allow}) {
    for (const int delay_us : {0, 2000, 10000, 40000, 160000}) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      if (overwrite == npy::Overwrite::allow) {
        npy::write_all({{path("a.npy"), {count}, old_values.data()},
                        {path("b.npy"), {count}, old_values.data()}},
                       npy::Overwrite::refuse);
      }
      const pid_t child = fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        npy::write_all({{path("a.npy"), {count}, new_values.data()},
                        {path("b.npy"), {count}, new_values.data()}},
                       overwrite);
        _exit(0);
      }
      usleep(delay_us);
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      for (const auto& entry : fs::directory_iterator(dir_)) {
        const std::string name = entry.path().filename().string();
        ASSERT_TRUE(name == "a.npy" || name == "b.npy")
            << name << " left after " << delay_us << " us";
        const std::vector<float> values = npy::read(entry.path().string()).to_float();
        EXPECT_TRUE(values == new_values ||
                    (overwrite == npy::Overwrite::allow && values == old_values))
            << name << " is neither the old file nor the new one";
      }
      if (overwrite == npy::Overwrite::allow) {
        EXPECT_TRUE(fs::exists(path("a.npy")) && fs::exists(path("b.npy")));
      }
    }
  }
}

// A process ending for a signal (Watchdog::stop_on_signals) holds the commits: a write_all that
// reaches its commit afterwards links nothing, however long the process lives on.
TEST_F(NpyTest, HeldCommitsLinkNothing) {
  const std::vector<float> x = {1, 2, 3};
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    npy::hold_commits();
    npy::write_all({{path("a.npy"), {3}, x.data()}, {path("b.npy"), {3}, x.data()}},
                   npy::Overwrite::refuse);
    _exit(0);  // not reached: the commit waits for good
  }
  usleep(300000);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, WNOHANG), 0) << "the write returned";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(fs::exists(path("a.npy")));
  EXPECT_FALSE(fs::exists(path("b.npy")));
}

TEST_F(NpyTest, WriteAllLeavesNoPartialSetBehind) {
  const std::vector<float> x = {1, 2, 3};
  // The third file cannot be written: none of the set may remain.
  EXPECT_THROW(npy::write_all({{path("a.npy"), {3}, x.data()},
                               {path("b.npy"), {3}, x.data()},
                               {path("missing/c.npy"), {3}, x.data()}},
                              npy::Overwrite::refuse),
               Error);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_))
    ++files;
  EXPECT_EQ(files, 0);
  // An existing member is refused before anything is written.
  npy::write(path("b.npy"), {3}, x.data(), npy::Overwrite::refuse);
  EXPECT_THROW(npy::write_all({{path("a.npy"), {3}, x.data()}, {path("b.npy"), {3}, x.data()}},
                              npy::Overwrite::refuse),
               Error);
  EXPECT_FALSE(fs::exists(path("a.npy")));
  npy::write_all({{path("a.npy"), {3}, x.data()}, {path("b.npy"), {3}, x.data()}},
                 npy::Overwrite::allow);
  EXPECT_EQ(npy::read(path("a.npy")).to_float(), x);
}

TEST_F(NpyTest, UnwritableDirectoryAndMissingFileAreClearErrors) {
  const std::vector<float> x = {1};
  EXPECT_THROW(npy::write(path("missing/dir/o.npy"), {1}, x.data(), npy::Overwrite::refuse), Error);
  try {
    npy::read(path("absent.npy"));
    FAIL() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot open"), std::string::npos);
  }
}

}  // namespace
}  // namespace a2d

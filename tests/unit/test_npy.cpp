// .npy reading and writing: round trips, and a clear error for every malformed input.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/npy.hpp"

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

// attention2d: NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Read: float16 ('<f2', IEEE binary16), float32 ('<f4') or float64 ('<f8'), C order, little
// endian. Anything else (bad magic, another dtype such as '<i2' or a big-endian '>f2', Fortran
// order, a truncated body, a malformed header) is refused with an a2d::Error that names the file
// and what is wrong. to_float() and to_double() widen float16 exactly.
// Write: float16, float32 or float64, version 1.0, C order, little endian, data on a 64-byte
// boundary, through a temporary file linked or renamed into place (unnamed until then where the
// file system allows, O_TMPFILE, so that a writer killed at any moment leaves nothing behind;
// flushed to the device first); an existing file is refused unless overwrite is asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace a2d::npy {

// float16 elements are binary16 bit patterns (uint16_t); dtype.hpp's float_to_f16 and f16_to_float
// convert them.
enum class DType { float32, float64, float16 };
const char* dtype_name(DType dtype);  // "float32", "float64", "float16" (numpy's names)
std::size_t item_size(DType dtype);   // bytes per element: 4, 8, 2

struct Array {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;  // little-endian element data, C order

  int64_t element_count() const;
  std::vector<float> to_float() const;
  std::vector<double> to_double() const;
};

// Parses an in-memory .npy image; `name` is used in error messages.
Array parse(const std::byte* data, std::size_t size, const std::string& name);
Array read(const std::string& path);
// The dtype and shape of a .npy file from its header alone (its data is neither read nor checked:
// read() does that), refused as read() refuses a bad header.
struct Header {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  int64_t data_bytes() const;  // what its data holds, by the header
};
Header read_header(const std::string& path);

// Throws unless `array.shape` equals `expected`; `what` names the tensor, e.g. "--q".
void require_shape(const Array& array, const std::vector<int64_t>& expected,
                   const std::string& what);
std::string shape_string(const std::vector<int64_t>& shape);

enum class Overwrite { refuse, allow };
void write(const std::string& path, const std::vector<int64_t>& shape, const float* data,
           Overwrite overwrite);
void write(const std::string& path, const std::vector<int64_t>& shape, const double* data,
           Overwrite overwrite);
// `data` holds the shape's element count of `dtype`: float, double, or for float16 the binary16
// bits as uint16_t (a2d::from_float(a2d::DType::f16, ...) in dtype.hpp makes them from fp32).
void write(const std::string& path, const std::vector<int64_t>& shape, DType dtype,
           const void* data, Overwrite overwrite);

// Writes several files as one unit: every file is first written to a temporary beside its target;
// only when all are complete are they moved into place. On any failure the temporaries (and, when
// not overwriting, the files already moved) are removed, so a failed write leaves no partial set.
// A File is float32 unless given a dtype; `data` is as for write().
struct File {
  File(std::string file_path, std::vector<int64_t> file_shape, const float* values)
      : File(std::move(file_path), std::move(file_shape), DType::float32, values) {}
  File(std::string file_path, std::vector<int64_t> file_shape, DType element_type,
       const void* values)
      : path(std::move(file_path)),
        shape(std::move(file_shape)),
        dtype(element_type),
        data(values) {}

  std::string path;
  std::vector<int64_t> shape;
  DType dtype;
  const void* data;
};
void write_all(const std::vector<File>& files, Overwrite overwrite);

// For a process about to end (a signal: watchdog.hpp, Watchdog::stop_on_signals): waits until no
// write_all or write is linking its files into place, and keeps every later one from starting
// (it then blocks until the process ends, and its temporaries, unnamed where the file system
// allows, go with it). A set of outputs is thus complete or absent, never a part of it. Never
// returns to a caller that is itself inside a commit (the lock is not recursive).
void hold_commits();

// The bytes write() would put in a file, for tests and fuzzing.
std::vector<std::byte> encode(const std::vector<int64_t>& shape, DType dtype, const void* data);

}  // namespace a2d::npy

// a2d kernel, the host tensors (kernel_command.hpp): the inputs as generated and rounded, the
// outputs, on transparent huge pages with --huge-pages.
#include <cstdlib>
#include <new>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "kernel_command.hpp"

namespace a2d::commands::kernel_cmd {
namespace {

bool g_huge_pages = false;

}  // namespace

void use_huge_pages(bool on) {
  g_huge_pages = on;
}

template <typename T>
T* TensorAllocator<T>::allocate(std::size_t count) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t bytes = (count * sizeof(T) + kHuge - 1) / kHuge * kHuge;
  void* memory = g_huge_pages ? std::aligned_alloc(kHuge, bytes) : std::malloc(count * sizeof(T));
  if (!memory) throw std::bad_alloc();
#ifdef __linux__
  if (g_huge_pages) madvise(memory, bytes, MADV_HUGEPAGE);
#endif
  return static_cast<T*>(memory);
}

template <typename T>
void TensorAllocator<T>::deallocate(T* memory, std::size_t) {
  std::free(memory);
}

template struct TensorAllocator<float>;
template struct TensorAllocator<uint16_t>;

TypedTensor::TypedTensor(DType dtype_, const std::vector<float>& values)
    : dtype(dtype_), wide(values.begin(), values.end()) {
  if (dtype == DType::f32) return;
  stored.resize(wide.size());
  from_float(dtype, wide.data(), stored.data(), static_cast<int64_t>(wide.size()));
  to_float(dtype, stored.data(), wide.data(), static_cast<int64_t>(wide.size()));
}

TypedTensor::TypedTensor(DType dtype_, size_t count) : dtype(dtype_) {
  if (dtype == DType::f32) {
    wide.resize(count);
  } else {
    stored.resize(count);
  }
}

void* TypedTensor::data() {
  return dtype == DType::f32 ? static_cast<void*>(wide.data()) : static_cast<void*>(stored.data());
}

const void* TypedTensor::data() const {
  return dtype == DType::f32 ? static_cast<const void*>(wide.data())
                             : static_cast<const void*>(stored.data());
}

std::vector<float> TypedTensor::floats() const {
  std::vector<float> x(size());
  to_float(dtype, data(), x.data(), static_cast<int64_t>(x.size()));
  return x;
}

}  // namespace a2d::commands::kernel_cmd

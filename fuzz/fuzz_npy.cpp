// libFuzzer entry for the .npy reader.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  a2d::fuzz::npy_reader(data, size);
  return 0;
}

// libFuzzer entry for the range mask parser and the mask's index (mask.hpp).
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  a2d::fuzz::mask_ranges(data, size);
  return 0;
}

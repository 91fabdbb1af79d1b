// libFuzzer entry for the layout and ownership functions.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  a2d::fuzz::layout_ownership(data, size);
  return 0;
}

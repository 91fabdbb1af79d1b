// The AMX forward kernel: bf16/forward.inc with its products on AMX tiles (bf16/tiles.hpp).
#define A2D_BF16_NAMESPACE amx
#define A2D_BF16_ON_AMX 1
#include "backends/cpu/kernels/bf16/forward.inc"

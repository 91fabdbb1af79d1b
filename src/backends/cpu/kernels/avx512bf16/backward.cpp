// The AVX512-BF16 backward kernel: bf16/backward.inc with its products on VDPBF16PS (bf16/tiles.hpp).
#define A2D_BF16_NAMESPACE avx512bf16
#define A2D_BF16_ON_AMX 0
#include "backends/cpu/kernels/bf16/backward.inc"

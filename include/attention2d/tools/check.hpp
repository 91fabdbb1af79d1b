// attention2d: how results are compared with the fp64 reference.
#pragma once

#include <cstdint>
#include <string>

namespace a2d {

// Relative Frobenius error ||got - expected|| / ||expected|| over the entries where `expected` is
// finite. The other entries must match in kind, or the error is infinite:
//   expected -inf (LSE of a row that sees no key)  ->  got must be -inf
//   expected NaN or +-inf (poisoned by a non-finite input)  ->  got must be NaN or +-inf
//   expected finite  ->  got must be finite
// When ||expected|| = 0 the absolute norm is returned.
double relative_error(const float* got, const double* expected, int64_t count);

// The bound every fp32 kernel output (O, LSE, dQ, dK, dV) must meet against the fp64 reference,
// as a relative Frobenius error. Derivation (docs/kernels.md): every output is a sum of at most
// a few thousand fp32 products accumulated tile by tile, whose rounding error grows like
// sqrt(terms) * 2^-24 ~ 1e-6 in the typical case. The largest error seen across the kernel test
// matrix is 2.4e-6 (dQ, dK, dV with peaky softmax); the bound leaves about 4x headroom.
constexpr double kFp32RelativeBound = 1e-5;

// Bounds for bf16 and fp16 inputs (docs/kernels.md, "Element types"), against the fp64 reference
// computed on the rounded inputs. The kernels widen 16-bit inputs exactly and compute in fp32, so
// LSE, the partial state and dQ, dK, dV (fp32 outputs) are the fp32 kernel's results on inputs
// it represents exactly: they meet kFp32RelativeBound (measured at most 8.5e-7 across
// tests/unit/test_kernel_dtypes.cpp).
//
// O stored in 16 bits is the fp32 O rounded once to nearest: each element moves by at most the
// unit roundoff u times its magnitude (u = 2^-8 for bf16, 8 significant bits; 2^-11 for fp16, 11
// bits), so ||O16 - ref|| <= u ||O32|| + ||O32 - ref|| <= (u + kFp32RelativeBound) ||ref|| to
// first order. (fp16 elements below its normal range, |x| < 2^-14, move by at most 2^-25
// instead, which no Frobenius norm of attention outputs notices.) Measured at most 1.65e-3 (bf16)
// and 2.07e-4 (fp16): uniform rounding errors average about u / 2.4.
constexpr double kBf16OutputBound = 0x1p-8 + kFp32RelativeBound;  // 3.92e-3
constexpr double kF16OutputBound = 0x1p-11 + kFp32RelativeBound;  // 4.98e-4

// dQ and dK when the backward computes delta = rowsum(dO * O) from a 16-bit O (as a caller that
// keeps only the 16-bit O does): delta_i moves by up to u sum_d |dO_id O_id|, and that shift
// enters dS_ij = P_ij (dP_ij - delta_i) for every key of the row, so dQ and dK inherit O's
// rounding at a gain that depends on the problem (largest where the exact dS nearly cancels, e.g.
// rows that see one key, whose dS is 0). There is no a priori bound relative to ||dQ||; these are
// empirical, for inputs like the tests' (standard normal, scale 1/sqrt(D)): measured at most
// 1.39e-3 (bf16) and 1.51e-4 (fp16), i.e. 0.1-0.9 of O's own error, with about 3.5x headroom.
// dV = P^T dO does not use delta and meets kFp32RelativeBound.
constexpr double kBf16DeltaGradientBound = 5e-3;
constexpr double kF16DeltaGradientBound = 5e-4;

// Bounds for the CUDA backend's tensor-core kernels (docs/gpu.md), which differ from the CPU's in
// one way: the operands of the second product of each pair are rounded to the inputs' dtype, as
// in FlashAttention-2 (P before O = P V and dV = P^T dO; dS before dQ = dS K and dK = dS^T Q),
// with fp32 sums. Each such rounding moves an element by at most u relative (u as above), so:
//   O       its own rounding plus P's: 2u + kFp32RelativeBound
//   dV      P's rounding: u + kFp32RelativeBound
//   dQ, dK  dS's rounding on top of the delta-gradient bound: u + the delta-gradient bound
//   LSE     fp32 statistics of fp32 scores (exact products, fp32 sums): kFp32RelativeBound
// These are stated before any measurement (the kernels have not yet run on a GPU);
// scripts/gpu/gpu_check.sh prints the measured errors beside them.
constexpr double kTensorCoreBf16OutputBound = 2 * 0x1p-8 + kFp32RelativeBound;          // 7.82e-3
constexpr double kTensorCoreF16OutputBound = 2 * 0x1p-11 + kFp32RelativeBound;          // 9.87e-4
constexpr double kTensorCoreBf16ValueGradientBound = 0x1p-8 + kFp32RelativeBound;       // 3.92e-3
constexpr double kTensorCoreF16ValueGradientBound = 0x1p-11 + kFp32RelativeBound;       // 4.98e-4
constexpr double kTensorCoreBf16DeltaGradientBound = 0x1p-8 + kBf16DeltaGradientBound;  // 8.9e-3
constexpr double kTensorCoreF16DeltaGradientBound = 0x1p-11 + kF16DeltaGradientBound;   // 9.9e-4

}  // namespace a2d

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

}  // namespace a2d

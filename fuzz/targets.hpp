// Fuzz targets: each takes arbitrary bytes and must either succeed or throw a2d::Error, never
// crash, hang or trip a sanitizer. libFuzzer drives them (fuzz/fuzz_main.cpp, scripts/dev/fuzz.sh);
// tests/unit/test_fuzz_regressions.cpp replays every saved input under fuzz/regressions/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace a2d::fuzz {

// Parses the bytes as a .npy file and, if it parses, converts it and re-encodes it.
void npy_reader(const uint8_t* data, size_t size);

// Reads a layout (kind, tokens, parts, stripe) and grid shape from the bytes and checks the
// ownership functions against each other: owner(token_at(p, i)) == (p, i), counts, the K/V
// transpose permutation.
void layout_ownership(const uint8_t* data, size_t size);

// Reads a sequence length and a mask specification (slice lines, or a generator) from the bytes,
// builds the range mask and checks it against MagiAttention's definitions by brute force on the
// first positions: visibility, rows, the tile classifier and the pair counts.
void mask_ranges(const uint8_t* data, size_t size);

}  // namespace a2d::fuzz

// Internal: the one way the library names the values of its enums and parses them back. Each
// enum has one table of (value, name) pairs; a value may appear again with an alias that parses
// but is never printed:
//
//   constexpr EnumName<DType> kDTypeNames[] = {
//       {DType::f32, "fp32"}, {DType::bf16, "bf16"}, {DType::f16, "fp16"},
//       {DType::f32, "float32"}, ...};
//   parse_enum(kDTypeNames, "bf16", "dtype")   -> DType::bf16
//   parse_enum(kDTypeNames, "int8", "dtype")   throws "unknown dtype 'int8'; choose fp32, bf16 or
//                                              fp16"
//   enum_name(kDTypeNames, DType::f16)         -> "fp16"
#pragma once

#include <cstddef>
#include <string>

#include "attention2d/error.hpp"

namespace a2d {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The first name of `value` in `names`; `unknown` for a value the table lacks.
template <typename E, size_t N>
const char* enum_name(const EnumName<E> (&names)[N], E value, const char* unknown = "?") {
  for (const EnumName<E>& entry : names)
    if (entry.value == value) return entry.name;
  return unknown;
}

// Whether entry i is the first of its value (not an alias).
template <typename E, size_t N>
bool first_name(const EnumName<E> (&names)[N], size_t i) {
  for (size_t j = 0; j < i; ++j)
    if (names[j].value == names[i].value) return false;
  return true;
}

// "a, b or c": the first name of each value, in the table's order.
template <typename E, size_t N>
std::string enum_choices(const EnumName<E> (&names)[N]) {
  size_t values = 0;
  for (size_t i = 0; i < N; ++i)
    values += first_name(names, i) ? 1 : 0;
  std::string out;
  size_t listed = 0;
  for (size_t i = 0; i < N; ++i) {
    if (!first_name(names, i)) continue;
    out += listed == 0 ? "" : listed + 1 == values ? " or " : ", ";
    out += names[i].name;
    ++listed;
  }
  return out;
}

// The value `text` names; throws "unknown WHAT 'text'; choose A, B or C" otherwise.
template <typename E, size_t N>
E parse_enum(const EnumName<E> (&names)[N], const std::string& text, const char* what) {
  for (const EnumName<E>& entry : names)
    if (text == entry.name) return entry.value;
  A2D_FAIL("unknown ", what, " '", text, "'; choose ", enum_choices(names));
}

}  // namespace a2d

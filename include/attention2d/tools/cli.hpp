// The tools' small option parser and output helpers (the a2d program and bench/ use them).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention2d/mask.hpp"

namespace a2d::cli {

// Help of --doc-lens (run, bench, model, kernel).
inline constexpr const char* kDocLensHelp =
    "packed documents: lengths summing to --seq (100,3000,17,...), @FILE of lengths,\n"
    "or a generated mix skewed[:SEED] (one of N/2, many of 1-64) or heavy[:SEED] (Pareto);\n"
    "a query sees only keys of its own document (with --causal, --window, --window-size)";
// Help of --window-size and --mask-ranges.
inline constexpr const char* kWindowSizeHelp =
    "flash-attn's window_size LEFT,RIGHT: q - LEFT <= k <= q + RIGHT, -1 = unbounded on\n"
    "that side (128,128: bidirectional local attention; W-1,0 is --window W; with --causal\n"
    "RIGHT must be 0)";
inline constexpr const char* kMaskRangesHelp =
    "a range mask (MagiAttention's): FILE with one slice a line, 'q0 q1 k0 k1 type'\n"
    "([q0, q1) x [k0, k1), type full, causal, inv-causal or bi-causal; # comments), or\n"
    "prefix-lm:P (the first P tokens, or P%, bidirectional, causal after), block-causal:B\n"
    "(full within blocks of B tokens or B%, causal across them), chunked-causal:C (causal\n"
    "within chunks of C tokens or C%, none across) or random:S[:SEED] (S slices of every\n"
    "type); not with --causal, a window or --doc-lens";

// The mask of the options --causal, --window, --window-size, --doc-lens and --mask-ranges
// (empty strings: not given) for a sequence of `seq` tokens, through the library's make_mask
// (which refuses contradictions) and checked against `seq`.
Mask mask_from_options(bool causal, int64_t window, const std::string& window_size,
                       const std::string& doc_lens, const std::string& mask_ranges, int64_t seq);
// Those options as a command line gives them (" --causal --window-size 4,4 ...").
std::string mask_options_text(bool causal, int64_t window, const std::string& window_size,
                              const std::string& doc_lens, const std::string& mask_ranges);

// Declarative options of one subcommand: each option writes straight into a variable.
class Options {
 public:
  Options(std::string usage, std::string summary);

  void add_int(const std::string& name, int64_t* target, const std::string& help);
  void add_double(const std::string& name, double* target, const std::string& help);
  void add_string(const std::string& name, std::string* target, const std::string& help);
  void add_flag(const std::string& name, bool* target, const std::string& help);

  // Parses argv[first..argc). Returns false when --help was asked for (and printed). Unknown
  // options and malformed values throw a2d::Error naming the option.
  bool parse(int argc, char** argv, int first);
  bool given(const std::string& name) const;
  std::string help() const;

 private:
  struct Option {
    std::string name;
    std::string help;
    std::string default_text;
    bool takes_value = true;
    std::function<void(const std::string&)> set;
  };
  const Option* find(const std::string& name) const;

  std::string usage_;
  std::string summary_;
  std::vector<Option> options_;
  std::vector<std::string> given_;
};

// One JSON object on one line, keys in insertion order. Non-finite numbers become null.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, const char* value);
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonLine& add(const std::string& key, double value);
  JsonLine& add(const std::string& key, bool value);
  std::string str() const;
  // (key, JSON-rendered value) in insertion order, for other output formats such as CSV.
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

std::string format_double(double value, int precision);

// "1 rank", "4 ranks": a count and its noun (plural with an s, as every noun it is used for).
std::string count_of(int64_t count, const std::string& noun);

// `text` as lines of at most `first_width` (the first) and `width` characters, words kept whole,
// each line after the first indented by `indent` spaces; a line break in `text` is a space.
std::string wrap(const std::string& text, size_t first_width = 100, size_t width = 100,
                 size_t indent = 0);

// Output paths, checked before any work with the true reason of a refusal. `option` names the
// option in the messages.
// A file the program will write (replacing it if it exists, in place or by renaming a file of the
// same directory over it): refused when it is a directory or not a regular file, or when its
// directory is missing (created with its parents where `create_parents`), not a directory, or
// not writable (a file is created and removed there to find out: the test root and read-only
// mounts answer truly).
void check_output_file(const std::string& option, const std::string& path, bool create_parents);
// A directory the program will write files into: created with its parents when missing; refused
// when it is a file, or not writable (tested as above).
void prepare_output_directory(const std::string& option, const std::string& path);
// `path` made absolute (against the working directory) for "wrote ..." lines.
std::string absolute_path(const std::string& path);

}  // namespace a2d::cli

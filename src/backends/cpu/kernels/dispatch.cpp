// The public kernel functions: argument checks shared by every path, the choice of path (portable,
// AVX2/FMA or AVX-512, see KernelPath in kernel.hpp) and the hand-over to it.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "backends/cpu/kernels/cpu_kernels.hpp"
#include "core/enum_names.hpp"
#include "paths.hpp"
#include "tiles.hpp"

#if A2D_HAVE_AVX2_PATH
#include <cpuid.h>
#endif
#if A2D_HAVE_AMX_PATH
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace a2d {
namespace {

// AVX2 and FMA for the products, F16C for the fp16 conversions of the tile copies. (Clang's
// __builtin_cpu_supports knows no "f16c": CPUID leaf 1, ECX bit 29, is read directly.)
bool cpu_has_avx2_fma_f16c() {
#if A2D_HAVE_AVX2_PATH
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

// AVX-512 F, BW, DQ and VL (the kernels' flags), besides what the AVX2 path needs (FMA, F16C).
// __builtin_cpu_supports also checks that the operating system saves the zmm registers.
bool cpu_has_avx512() {
#if A2D_HAVE_AVX512_PATH
  __builtin_cpu_init();
  return cpu_has_avx2_fma_f16c() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22) for the products, AVX512-BF16 (leaf 7
// subleaf 1: EAX bit 5) for the rounding of P, besides AVX-512; and the tile state, which Linux
// gives a process only when asked (ARCH_REQ_XCOMP_PERM = 0x1023 for XFEATURE_XTILEDATA = 18).
bool cpu_has_amx_bf16() {
#if A2D_HAVE_AMX_PATH
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!cpu_has_avx512() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tiles = (edx & (1u << 24)) != 0 && (edx & (1u << 22)) != 0;
  if (!tiles || !__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || (eax & (1u << 5)) == 0)
    return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
  return false;
#endif
}

// AVX512-BF16 (CPUID leaf 7 subleaf 1: EAX bit 5) for VDPBF16PS and the rounding of P, besides
// AVX-512.
bool cpu_has_avx512_bf16() {
#if A2D_HAVE_AVX512BF16_PATH
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return cpu_has_avx512() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) &&
         (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

// Paths whose kernels for every input but all-bf16 ones are the AVX-512 kernels.
[[maybe_unused]] bool runs_avx512_kernels(KernelPath path) {
  return path == KernelPath::avx512 || path == KernelPath::avx512bf16 || path == KernelPath::amx;
}

// -1: not chosen yet (the first kernel call reads A2D_KERNEL_PATH); else a KernelPath value.
std::atomic<int> g_path{-1};

void check_forward(const ForwardArgs& args) {
  cpu::check_common(args.shape, args.mask, args.scale, args.threads);
  cpu::check_softcap(args.softcap);
  if (args.shape.q_tokens > 0 && args.shape.kv_tokens > 0) {
    A2D_REQUIRE(args.q.data && args.k.data && args.v.data,
                "forward kernel: Q, K and V must be set");
  }
}

void zero_tokens(TokenView<float> view, int64_t batch, int64_t tokens, int64_t heads, int64_t dim) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        std::fill(view.at(b, t, h), view.at(b, t, h) + dim, 0.0f);
}

// True when no 16-bit value of the row is NaN or infinite: those are the values whose exponent
// bits (`exponent`: 0x7f80 for bf16, 0x7c00 for fp16) are all set.
bool finite_bits(const std::byte* row, int64_t dim, uint16_t exponent) {
  unsigned poison = 0;
#pragma omp simd reduction(| : poison)
  for (int64_t d = 0; d < dim; ++d) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * d, sizeof bits);
    poison |= (bits & exponent) == exponent ? 1u : 0u;
  }
  return poison == 0;
}

// The AVX2 kernels run dense products over partial (diagonal) tiles, where a masked pair's
// probability 0 times a NaN or Inf key or value would poison a row the mask hides (0 x NaN = NaN);
// the portable path skips masked pairs exactly. Inputs holding NaN or Inf therefore take the
// portable path: one pass over the inputs, against a pass over every (query, key) pair.
bool finite_tokens(InTokens x, int64_t batch, int64_t tokens, int64_t heads, int64_t dim) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        if (x.dtype == DType::bf16) {
          if (!finite_bits(x.at(b, t, h), dim, 0x7f80u)) return false;
          continue;
        }
        if (x.dtype == DType::f16) {
          if (!finite_bits(x.at(b, t, h), dim, 0x7c00u)) return false;
          continue;
        }
        const float* row = x.floats().at(b, t, h);
        float poison = 0.0f;  // x * 0 is NaN exactly when x is NaN or infinite
#pragma omp simd reduction(+ : poison)
        for (int64_t d = 0; d < dim; ++d)
          poison += row[d] * 0.0f;
        if (poison != 0.0f) return false;
      }
    }
  }
  return true;
}

// No NaN and no +inf (LSE is -inf for rows that see no key, which every path handles).
// (Used by the AVX2 path only; a build without it, such as the SMPI one, leaves it unused.)
[[maybe_unused]] bool usable_rows(RowView<const float> x, int64_t batch, int64_t heads,
                                  int64_t tokens) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t) {
        const float value = x.at(b, h, t);
        if (value != value || value == std::numeric_limits<float>::infinity()) return false;
      }
  return true;
}

bool finite_forward_inputs(const ForwardArgs& a) {
  const AttentionShape& s = a.shape;
  return finite_tokens(a.q, s.batch, s.q_tokens, s.heads, s.head_dim) &&
         finite_tokens(a.k, s.batch, s.kv_tokens, s.kv_heads, s.head_dim) &&
         finite_tokens(a.v, s.batch, s.kv_tokens, s.kv_heads, s.head_dim);
}

void run_forward(const ForwardArgs& args, const cpu::ForwardResult& result) {
  check_forward(args);
  const KernelPath path = kernel_path();
  if (path != KernelPath::portable && finite_forward_inputs(args)) {
#if A2D_HAVE_AMX_PATH
    if (path == KernelPath::amx && args.q.dtype == DType::bf16 && args.k.dtype == DType::bf16 &&
        args.v.dtype == DType::bf16) {
      return cpu::amx::forward(args, result);
    }
#endif
#if A2D_HAVE_AVX512BF16_PATH
    if (path == KernelPath::avx512bf16 && args.q.dtype == DType::bf16 &&
        args.k.dtype == DType::bf16 && args.v.dtype == DType::bf16) {
      return cpu::avx512bf16::forward(args, result);
    }
#endif
#if A2D_HAVE_AVX512_PATH
    if (runs_avx512_kernels(path)) return cpu::avx512::forward(args, result);
#endif
#if A2D_HAVE_AVX2_PATH
    if (path == KernelPath::avx2) return cpu::avx2::forward(args, result);
#endif
  }
  cpu::portable::forward(args, result);
}

}  // namespace

bool kernel_path_supported(KernelPath path) {
  switch (path) {
    case KernelPath::portable:
      return true;
    case KernelPath::avx2: {
      static const bool supported = cpu_has_avx2_fma_f16c();
      return supported;
    }
    case KernelPath::avx512: {
      static const bool supported = cpu_has_avx512();
      return supported;
    }
    case KernelPath::avx512bf16: {
      static const bool supported = cpu_has_avx512_bf16();
      return supported;
    }
    case KernelPath::amx: {
      static const bool supported = cpu_has_amx_bf16();
      return supported;
    }
  }
  return false;
}

KernelPath best_kernel_path() {
  for (const KernelPath path :
       {KernelPath::amx, KernelPath::avx512bf16, KernelPath::avx512, KernelPath::avx2}) {
    if (kernel_path_supported(path)) return path;
  }
  return KernelPath::portable;
}

constexpr EnumName<KernelPath> kKernelPathNames[] = {
    {KernelPath::portable, "portable"},
    {KernelPath::avx2, "avx2"},
    {KernelPath::avx512, "avx512"},
    {KernelPath::avx512bf16, "avx512bf16"},
    {KernelPath::amx, "amx"}};

const char* kernel_path_name(KernelPath path) {
  return enum_name(kKernelPathNames, path);
}

KernelPath parse_kernel_path(const std::string& name) {
  if (name == "auto") return best_kernel_path();
  for (const EnumName<KernelPath>& entry : kKernelPathNames)
    if (name == entry.name) return entry.value;
  A2D_FAIL("unknown kernel path '", name, "'; use auto, ", enum_choices(kKernelPathNames));
}

bool bf16_kernels_round_like_tensor_cores() {
  return kernel_path() == KernelPath::amx || kernel_path() == KernelPath::avx512bf16;
}

void set_kernel_path(KernelPath path) {
  const bool built = path == KernelPath::amx          ? A2D_HAVE_AMX_PATH
                     : path == KernelPath::avx512bf16 ? A2D_HAVE_AVX512BF16_PATH
                     : path == KernelPath::avx512     ? A2D_HAVE_AVX512_PATH
                                                      : A2D_HAVE_AVX2_PATH;
  const char* reason =
      !built ? "this build has no code for it (it needs an x86-64 GCC or Clang build)"
      : path == KernelPath::amx
          ? "this CPU lacks AMX-TILE, AMX-BF16 or AVX512-BF16 (or AVX-512), or Linux refused the "
            "process the tile state"
      : path == KernelPath::avx512bf16
          ? "this CPU lacks AVX512-BF16 (or AVX-512 F/BW/DQ/VL, FMA or F16C)"
      : path == KernelPath::avx512 ? "this CPU lacks AVX-512 F/BW/DQ/VL, FMA or F16C"
                                   : "this CPU lacks AVX2, FMA or F16C";
  A2D_REQUIRE(kernel_path_supported(path), "the ", kernel_path_name(path),
              " kernel path is not available: ", reason, "; use auto or portable");
  g_path.store(static_cast<int>(path));
}

KernelPath kernel_path() {
  int path = g_path.load();
  if (path < 0) {
    const char* name = std::getenv("A2D_KERNEL_PATH");
    const KernelPath chosen = name && *name ? parse_kernel_path(name) : best_kernel_path();
    A2D_REQUIRE(kernel_path_supported(chosen), "A2D_KERNEL_PATH=", name, " is not available on ",
                "this CPU or build; use auto or portable");
    int expected = -1;
    g_path.compare_exchange_strong(expected, static_cast<int>(chosen));
    path = g_path.load();
  }
  return static_cast<KernelPath>(path);
}

int64_t forward_workspace_bytes(const AttentionShape& shape, int threads) {
#if A2D_HAVE_AMX_PATH
  if (kernel_path() == KernelPath::amx) {
    return std::max(cpu::amx::forward_workspace_bytes(shape, threads),
                    cpu::avx512::forward_workspace_bytes(shape, threads));
  }
#endif
#if A2D_HAVE_AVX512BF16_PATH
  if (kernel_path() == KernelPath::avx512bf16) {
    return std::max(cpu::avx512bf16::forward_workspace_bytes(shape, threads),
                    cpu::avx512::forward_workspace_bytes(shape, threads));
  }
#endif
#if A2D_HAVE_AVX512_PATH
  if (kernel_path() == KernelPath::avx512) {
    return cpu::avx512::forward_workspace_bytes(shape, threads);
  }
#endif
#if A2D_HAVE_AVX2_PATH
  if (kernel_path() == KernelPath::avx2) return cpu::avx2::forward_workspace_bytes(shape, threads);
#endif
  return cpu::portable::forward_workspace_bytes(shape, threads);
}

int64_t backward_workspace_bytes(const AttentionShape& shape, int threads, bool delta_from_out) {
  const int64_t delta_bytes = delta_from_out ? shape.batch * shape.heads * shape.q_tokens *
                                                   static_cast<int64_t>(sizeof(float))
                                             : 0;
#if A2D_HAVE_AMX_PATH
  if (kernel_path() == KernelPath::amx) {
    return delta_bytes + std::max(cpu::amx::backward_workspace_bytes(shape, threads),
                                  cpu::avx512::backward_workspace_bytes(shape, threads));
  }
#endif
#if A2D_HAVE_AVX512BF16_PATH
  if (kernel_path() == KernelPath::avx512bf16) {
    return delta_bytes + std::max(cpu::avx512bf16::backward_workspace_bytes(shape, threads),
                                  cpu::avx512::backward_workspace_bytes(shape, threads));
  }
#endif
#if A2D_HAVE_AVX512_PATH
  if (kernel_path() == KernelPath::avx512) {
    return delta_bytes + cpu::avx512::backward_workspace_bytes(shape, threads);
  }
#endif
#if A2D_HAVE_AVX2_PATH
  if (kernel_path() == KernelPath::avx2) {
    return delta_bytes + cpu::avx2::backward_workspace_bytes(shape, threads);
  }
#endif
  return delta_bytes + cpu::portable::backward_workspace_bytes(shape, threads);
}

void attention_forward(const ForwardArgs& args, OutTokens out, RowView<float> lse) {
  run_forward(args, {out, lse, nullptr, false});
}

void attention_forward_partial(const ForwardArgs& args, const PartialView& partial,
                               bool accumulate) {
  run_forward(args, {{}, {}, &partial, accumulate});
}

void attention_backward(const BackwardArgs& args, TokenView<float> dq, TokenView<float> dk,
                        TokenView<float> dv) {
  const AttentionShape& shape = args.shape;
  cpu::check_common(shape, args.mask, args.scale, args.threads);
  cpu::check_softcap(args.softcap);
  const int64_t dim = shape.head_dim;
  const RowsShape q_rows{shape.batch, shape.q_tokens, shape.heads, dim};
  const bool has_work = shape.q_tokens > 0 && shape.kv_tokens > 0;
  if (has_work) {
    A2D_REQUIRE(args.q.data && args.k.data && args.v.data && args.d_out.data && args.lse.data,
                "backward kernel: Q, K, V, dO and LSE must be set");
    A2D_REQUIRE(args.delta.data || args.out.data,
                "backward kernel: pass either delta = rowsum(dO * O) or O itself");
  }

  // delta, unless the caller supplied it.
  std::vector<float> own_delta;
  RowView<const float> delta = args.delta;
  if (!delta.data && has_work) {
    own_delta.resize(static_cast<size_t>(shape.batch * shape.heads * shape.q_tokens));
    const auto view = dense_rows(own_delta.data(), shape.heads, shape.q_tokens);
    compute_delta(q_rows, args.out, args.d_out, view);
    delta = view;
  }

  // Both paths add into dq; dk and dv are written (or added to) once per key row.
  if (!args.accumulate) zero_tokens(dq, shape.batch, shape.q_tokens, shape.heads, dim);
  const cpu::BackwardInputs in{&args, delta};
#if A2D_HAVE_AVX2_PATH
  // As in the forward: inputs holding NaN or Inf take the portable path.
  const KernelPath path = kernel_path();
  if (path != KernelPath::portable &&
      (!has_work || (finite_tokens(args.q, shape.batch, shape.q_tokens, shape.heads, dim) &&
                     finite_tokens(args.k, shape.batch, shape.kv_tokens, shape.kv_heads, dim) &&
                     finite_tokens(args.v, shape.batch, shape.kv_tokens, shape.kv_heads, dim) &&
                     finite_tokens(args.d_out, shape.batch, shape.q_tokens, shape.heads, dim) &&
                     usable_rows(args.lse, shape.batch, shape.heads, shape.q_tokens) &&
                     usable_rows(delta, shape.batch, shape.heads, shape.q_tokens)))) {
#if A2D_HAVE_AMX_PATH
    if (path == KernelPath::amx && args.q.dtype == DType::bf16 && args.k.dtype == DType::bf16 &&
        args.v.dtype == DType::bf16 && args.d_out.dtype == DType::bf16) {
      return cpu::amx::backward(in, dq, dk, dv);
    }
#endif
#if A2D_HAVE_AVX512BF16_PATH
    if (path == KernelPath::avx512bf16 && args.q.dtype == DType::bf16 &&
        args.k.dtype == DType::bf16 && args.v.dtype == DType::bf16 &&
        args.d_out.dtype == DType::bf16) {
      return cpu::avx512bf16::backward(in, dq, dk, dv);
    }
#endif
#if A2D_HAVE_AVX512_PATH
    if (runs_avx512_kernels(path)) return cpu::avx512::backward(in, dq, dk, dv);
#endif
    return cpu::avx2::backward(in, dq, dk, dv);
  }
#endif
  cpu::portable::backward(in, dq, dk, dv);
}

}  // namespace a2d

// a2d kernel, the run (kernel_command.hpp): generates the inputs, puts them in the backend's
// buffers and times the backend's kernel calls, as the distributed algorithms make them.
#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>

#include "attention2d/tools/data.hpp"
#include "attention2d/watchdog.hpp"
#include "kernel_command.hpp"

namespace a2d::commands::kernel_cmd {
namespace {

// Resident memory of this process from /proc/self/status (Linux). The peak (VmHWM) can be reset
// to the current size by writing 5 to /proc/self/clear_refs, which lets the command report how
// much memory one kernel call added on top of its inputs and outputs.
class RssProbe {
 public:
  // Resets the peak; false where /proc does not allow it (then no growth is reported).
  bool start() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    started_ = static_cast<bool>(clear) && read_kib("VmRSS:").has_value();
    if (started_) before_kib_ = *read_kib("VmRSS:");
    return started_;
  }
  // Peak minus the size at start(), in bytes.
  std::optional<int64_t> growth_bytes() const {
    if (!started_) return std::nullopt;
    const std::optional<int64_t> peak = read_kib("VmHWM:");
    if (!peak) return std::nullopt;
    return (*peak - before_kib_) * 1024;
  }

 private:
  static std::optional<int64_t> read_kib(const std::string& key) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(key, 0) != 0) continue;
      std::istringstream fields(line.substr(key.size()));
      int64_t kib = 0;
      if (fields >> kib) return kib;
    }
    return std::nullopt;
  }
  bool started_ = false;
  int64_t before_kib_ = 0;
};

// Times `body` (warm-up runs, then the median of the timed ones). `rss` measures the growth of
// the peak resident set over the first call only: the memory one call needs. (Later calls can
// only look larger, by what the allocator keeps from earlier calls without returning it.)
// `cpu_ms` receives the same summary of the process's CPU time per run (all threads together).
template <typename F>
Summary time_repeats(const KernelOptions& o, std::optional<int64_t>* rss_growth, Summary* cpu_ms,
                     const std::function<void(int64_t)>& before_each, F&& body) {
  RssProbe probe;
  probe.start();
  std::vector<double> ms, cpu;
  for (int64_t i = 0; i < o.warmup + o.repeats; ++i) {
    before_each(i);
    const double start = seconds_now();
    const double cpu_start = cpu_seconds_now();
    body();
    if (i >= o.warmup) {
      ms.push_back(1e3 * (seconds_now() - start));
      cpu.push_back(1e3 * (cpu_seconds_now() - cpu_start));
    }
    if (i == 0) *rss_growth = probe.growth_bytes();
  }
  *cpu_ms = summarize(cpu);
  return summarize(ms);
}

// Host arrays in the backend's buffers: the arrays themselves where the backend wraps host memory
// (the CPU's: no copy), else buffers the inputs are uploaded to and the outputs downloaded from.
class Buffers {
 public:
  explicit Buffers(Backend& backend) : backend_(backend) {}
  Buffer& input(const void* host, int64_t bytes) {
    if (backend_.capabilities().wraps_host)
      return keep(backend_.wrap_host(const_cast<void*>(host), bytes));
    Buffer& buffer = keep(backend_.allocate(bytes));
    backend_.upload(host, Place::in(buffer), bytes);
    return buffer;
  }
  Buffer& output(void* host, int64_t bytes) {
    if (backend_.capabilities().wraps_host) return keep(backend_.wrap_host(host, bytes));
    Buffer& buffer = keep(backend_.allocate(bytes));
    outputs_.push_back({&buffer, host, bytes});
    return buffer;
  }
  // The backend's own scratch.
  Buffer& scratch(int64_t bytes) { return keep(backend_.allocate(bytes)); }
  // The outputs into their host arrays (nothing to do where they are the arrays).
  void download() {
    for (const Output& out : outputs_)
      backend_.download(Place::in(*out.buffer), out.host, out.bytes);
    outputs_.clear();
  }

 private:
  Buffer& keep(BufferPtr buffer) {
    buffers_.push_back(std::move(buffer));
    return *buffers_.back();
  }
  struct Output {
    Buffer* buffer;
    void* host;
    int64_t bytes;
  };
  Backend& backend_;
  std::vector<BufferPtr> buffers_;
  std::vector<Output> outputs_;
};

// --parts: the keys [first, first + tokens) of each part.
struct KeyPart {
  int64_t first = 0;
  int64_t tokens = 0;
};

TokenTensor keys_of(const KeyPart& part, TokenTensor t) {
  t.offset += part.first * t.token_stride * dtype_bytes(t.dtype);
  return t;
}

Place positions_of(const KeyPart& part, const Place& positions) {
  return positions + part.first * static_cast<int64_t>(sizeof(int64_t));
}

}  // namespace

KernelRun run_kernels(const KernelOptions& o, const KernelSetup& setup,
                      const KernelEstimate& estimate, Backend& backend, Progress& progress) {
  const DType dtype = setup.dtype;
  const int64_t calls = o.warmup + o.repeats;
  const auto kernel_stage = [&](const char* name, int64_t i, double seconds) {
    const int64_t start = backend.kernel_work();
    const double entries = estimate.call_entries;
    progress.stage(name, i + 1, calls, seconds, [&backend, start, entries] {
      return static_cast<double>(backend.kernel_work() - start) / std::max(1.0, entries);
    });
    Watchdog::note_phase(name);
  };
  progress.stage("generating the inputs", 0, 0, 0);
  Watchdog::note_phase("generating the inputs");

  KernelRun run;
  const uint64_t seed = static_cast<uint64_t>(o.seed);
  const GlobalTokens q_global{o.batch, o.seq, o.heads, o.head_dim};
  const GlobalTokens kv_global{o.batch, o.kv_seq, o.kv_heads, o.head_dim};
  use_huge_pages(o.huge_pages);
  // The inputs' generation (all cores, data.hpp) is timed for the GPU runs' time budget.
  const double generate_start = seconds_now();
  run.q = TypedTensor(dtype, generate_tokens(seed, TensorTag::q, q_global));
  run.k = TypedTensor(dtype, generate_tokens(seed, TensorTag::k, kv_global));
  run.v = TypedTensor(dtype, generate_tokens(seed, TensorTag::v, kv_global));
  run.generate_seconds = seconds_now() - generate_start;
  run.out = TypedTensor(dtype, run.q.size());
  run.lse.resize(static_cast<size_t>(o.batch * o.heads * o.seq));

  // Shuffled positions: each query and key row's global position, a permutation (the mask
  // follows the positions, so the kernel must classify its tiles by their position bounds).
  const bool in_parts = o.parts > 1;
  if (o.shuffle != 0) {
    std::mt19937_64 random(static_cast<uint64_t>(o.shuffle));
    run.q_positions.resize(static_cast<size_t>(o.seq));
    run.kv_positions.resize(static_cast<size_t>(o.kv_seq));
    std::iota(run.q_positions.begin(), run.q_positions.end(), int64_t{0});
    std::iota(run.kv_positions.begin(), run.kv_positions.end(), int64_t{0});
    std::shuffle(run.q_positions.begin(), run.q_positions.end(), random);
    std::shuffle(run.kv_positions.begin(), run.kv_positions.end(), random);
  }
  const int64_t* q_positions = run.q_positions.empty() ? nullptr : run.q_positions.data();
  const int64_t* kv_positions = run.kv_positions.empty() ? nullptr : run.kv_positions.data();
  const double pairs = static_cast<double>(
      count_visible_pairs(setup.mask, q_positions, o.seq, kv_positions, o.kv_seq));
  run.forward_flops = 4.0 * pairs * static_cast<double>(o.head_dim * o.heads * o.batch);
  run.forward_workspace = forward_workspace_bytes(setup.shape, static_cast<int>(o.threads));
  if (o.sinks) run.sinks = generate_sinks(seed, o.heads);
  const RowsShape q_rows{o.batch, o.seq, o.heads, o.head_dim};

  // The tensors in the backend's buffers.
  Buffers buffers(backend);
  const int64_t q_bytes = run.q.bytes(), kv_bytes = run.k.bytes();
  const int64_t lse_bytes = static_cast<int64_t>(run.lse.size() * sizeof(float));
  ForwardCall call;
  call.shape = setup.shape;
  call.mask = setup.mask;
  call.scale = setup.scale;
  call.softcap = static_cast<float>(o.softcap);
  call.q =
      dense_token_tensor(buffers.input(run.q.data(), q_bytes), dtype, o.seq, o.heads, o.head_dim);
  call.k = dense_token_tensor(buffers.input(run.k.data(), kv_bytes), dtype, o.kv_seq, o.kv_heads,
                              o.head_dim);
  call.v = dense_token_tensor(buffers.input(run.v.data(), kv_bytes), dtype, o.kv_seq, o.kv_heads,
                              o.head_dim);
  call.threads = static_cast<int>(o.threads);
  std::vector<int64_t> in_order;
  if (o.shuffle != 0) {
    call.q_positions = Place::in(buffers.input(q_positions, 8 * o.seq));
    call.kv_positions = Place::in(buffers.input(kv_positions, 8 * o.kv_seq));
  } else if (in_parts) {
    // Each part's keys carry their global positions (a part's own 0, 1, 2, ... would be wrong).
    in_order.resize(static_cast<size_t>(o.kv_seq));
    std::iota(in_order.begin(), in_order.end(), int64_t{0});
    call.kv_positions = Place::in(buffers.input(in_order.data(), 8 * o.kv_seq));
  }
  const TokenTensor out_tensor = dense_token_tensor(buffers.output(run.out.data(), q_bytes), dtype,
                                                    o.seq, o.heads, o.head_dim);
  const RowTensor lse_tensor =
      dense_row_tensor(buffers.output(run.lse.data(), lse_bytes), o.heads, o.seq);

  // --parts: the keys of each part, and a call on them alone.
  std::vector<KeyPart> key_parts;
  for (int64_t p = 0; p < o.parts; ++p) {
    const int64_t first_key = p * o.kv_seq / o.parts;
    key_parts.push_back({first_key, (p + 1) * o.kv_seq / o.parts - first_key});
  }
  auto part_call = [&](const KeyPart& part) {
    ForwardCall c = call;
    c.shape.kv_tokens = part.tokens;
    c.k = keys_of(part, call.k);
    c.v = keys_of(part, call.v);
    c.kv_positions = positions_of(part, call.kv_positions);
    return c;
  };
  // The partial state: dense (accumulated across parts), and as the algorithms hold it, flat
  // fp32 records [row max, row sum, acc[D]] per (batch, token, head) (merged across parts).
  const int64_t record = o.head_dim + 2;
  const int64_t records = o.batch * o.seq * o.heads;
  auto record_state = [&](Buffer& buffer) {
    PartialTensor state;
    const int64_t token = o.heads * record;
    state.acc = {&buffer, 2 * static_cast<int64_t>(sizeof(float)), DType::f32, o.seq * token, token,
                 record};
    state.row_max = {&buffer, 0, o.seq * token, record, token};
    state.row_sum = state.row_max;
    state.row_sum.offset = static_cast<int64_t>(sizeof(float));
    return state;
  };
  PartialTensor dense_state;
  Buffer *merged_buf = nullptr, *part_buf = nullptr, *out2_buf = nullptr, *lse2_buf = nullptr;
  if (in_parts) {
    const int64_t acc_bytes = static_cast<int64_t>(run.q.size() * sizeof(float));
    dense_state = {
        dense_token_tensor(buffers.scratch(acc_bytes), DType::f32, o.seq, o.heads, o.head_dim),
        dense_row_tensor(buffers.scratch(lse_bytes), o.heads, o.seq),
        dense_row_tensor(buffers.scratch(lse_bytes), o.heads, o.seq)};
    const int64_t record_bytes = records * record * static_cast<int64_t>(sizeof(float));
    merged_buf = &buffers.scratch(record_bytes);
    part_buf = &buffers.scratch(record_bytes);
    run.out_merged = TypedTensor(dtype, run.q.size());
    run.lse_merged.resize(run.lse.size());
    out2_buf = &buffers.output(run.out_merged.data(), q_bytes);
    lse2_buf = &buffers.output(run.lse_merged.data(), lse_bytes);
  }
  const float* sinks = run.sinks.data();
  run.forward_ms = time_repeats(
      o, &run.forward_rss_growth, &run.forward_cpu_ms,
      [&](int64_t i) { kernel_stage("forward", i, estimate.forward_s); },
      [&] {
        if (in_parts) {
          for (size_t p = 0; p < key_parts.size(); ++p)
            backend.attention_forward_partial(part_call(key_parts[p]), dense_state, p > 0);
          backend.finalize(q_rows, dense_state, out_tensor, lse_tensor);
        } else {
          backend.attention_forward(call, out_tensor, lse_tensor);
        }
        if (o.sinks) backend.add_sinks(q_rows, sinks, 0, out_tensor, lse_tensor);
        backend.synchronize();
      });
  // --parts, untimed: each part's partial state in records, merged into part 0's, finalized.
  if (in_parts) {
    progress.stage("forward through merged records (--parts)", 0, 0, estimate.forward_s);
    const PartialTensor merged = record_state(*merged_buf), single = record_state(*part_buf);
    for (size_t p = 0; p < key_parts.size(); ++p) {
      backend.attention_forward_partial(part_call(key_parts[p]), p == 0 ? merged : single, false);
      if (p > 0)
        backend.merge_partials(Place::in(*merged_buf), Place::in(*part_buf), records, record);
    }
    const TokenTensor out2 = dense_token_tensor(*out2_buf, dtype, o.seq, o.heads, o.head_dim);
    const RowTensor lse2 = dense_row_tensor(*lse2_buf, o.heads, o.seq);
    backend.finalize(q_rows, merged, out2, lse2);
    if (o.sinks) backend.add_sinks(q_rows, sinks, 0, out2, lse2);
  }
  buffers.download();
  if (!o.backward) return run;

  progress.stage("generating dO", 0, 0, 0);
  Watchdog::note_phase("generating dO");
  const double d_out_start = seconds_now();
  run.d_out.emplace(dtype, generate_tokens(seed, TensorTag::d_out, q_global));
  run.generate_seconds += seconds_now() - d_out_start;
  run.dq.resize(run.q.size());
  run.dk.resize(run.k.size());
  run.dv.resize(run.v.size());
  run.backward_workspace = backward_workspace_bytes(setup.shape, static_cast<int>(o.threads),
                                                    /*delta_from_out=*/true);
  const int64_t dq_bytes = static_cast<int64_t>(run.dq.size() * sizeof(float));
  const int64_t dkv_bytes = static_cast<int64_t>(run.dk.size() * sizeof(float));
  BackwardCall bcall;
  bcall.shape = setup.shape;
  bcall.mask = setup.mask;
  bcall.scale = setup.scale;
  bcall.softcap = call.softcap;
  bcall.q = call.q;
  bcall.k = call.k;
  bcall.v = call.v;
  bcall.d_out = dense_token_tensor(buffers.input(run.d_out->data(), q_bytes), dtype, o.seq, o.heads,
                                   o.head_dim);
  bcall.lse = lse_tensor;
  bcall.out = out_tensor;  // delta from O as the forward wrote it
  bcall.threads = call.threads;
  bcall.q_positions = call.q_positions;
  bcall.kv_positions = call.kv_positions;
  Buffer& dk_buf = buffers.output(run.dk.data(), dkv_bytes);
  Buffer& dv_buf = buffers.output(run.dv.data(), dkv_bytes);
  const TokenTensor dq_t = dense_token_tensor(buffers.output(run.dq.data(), dq_bytes), DType::f32,
                                              o.seq, o.heads, o.head_dim);
  const TokenTensor dk_t = dense_token_tensor(dk_buf, DType::f32, o.kv_seq, o.kv_heads, o.head_dim);
  const TokenTensor dv_t = dense_token_tensor(dv_buf, DType::f32, o.kv_seq, o.kv_heads, o.head_dim);
  const RowTensor delta_t = o.sinks && !in_parts
                                ? dense_row_tensor(buffers.scratch(lse_bytes), o.heads, o.seq)
                                : RowTensor{};
  // --parts: records [lse, delta, q[D], dO[D]] per (batch, token, head), as ATTENTION2D's
  // backward packs them: the fp32 fields first put the 16-bit rows 8 and 8 + 2D bytes in, not
  // on the 16 bytes cp.async reads (the CUDA backend copies such inputs to dense scratch).
  BackwardCall packed = bcall;
  if (in_parts) {
    const int64_t pack_record = 8 + 2 * o.head_dim * dtype_bytes(dtype);  // bytes
    Buffer& pack_buf = buffers.scratch(records * pack_record);
    const int64_t floats = pack_record / static_cast<int64_t>(sizeof(float));
    const int64_t elements = pack_record / dtype_bytes(dtype);
    const RowTensor lse_field{&pack_buf, 0, o.seq * o.heads * floats, floats, o.heads * floats};
    RowTensor delta_field = lse_field;
    delta_field.offset = static_cast<int64_t>(sizeof(float));
    const TokenTensor q_field{&pack_buf,          8,       dtype, o.seq * o.heads * elements,
                              o.heads * elements, elements};
    TokenTensor do_field = q_field;
    do_field.offset += o.head_dim * dtype_bytes(dtype);
    packed.q = q_field;
    packed.d_out = do_field;
    packed.lse = lse_field;
    packed.delta = delta_field;
    packed.out = {};
  }
  const TokenBlock q_block{o.batch, o.seq, o.heads, o.head_dim};
  const auto sink_gradient = [&](const RowTensor& delta) {
    std::vector<double> sums(static_cast<size_t>(o.heads), 0.0);
    backend.add_sink_gradient(q_rows, sinks, 0, lse_tensor, delta, sums.data());
    run.dsink.assign(sums.begin(), sums.end());
  };
  run.backward_ms = time_repeats(
      o, &run.backward_rss_growth, &run.backward_cpu_ms,
      [&](int64_t i) { kernel_stage("backward", i, estimate.backward_s); },
      [&] {
        if (in_parts) {
          backend.copy_tokens(bcall.q, packed.q, q_block);
          backend.copy_tokens(bcall.d_out, packed.d_out, q_block);
          backend.copy_rows(lse_tensor, packed.lse, o.batch, o.heads, o.seq);
          backend.delta(q_rows, out_tensor, packed.d_out, packed.delta);
          // The parts after the first add into their dK, dV rows: zero first.
          backend.fill_zero(Place::in(dk_buf), dkv_bytes);
          backend.fill_zero(Place::in(dv_buf), dkv_bytes);
          for (size_t p = 0; p < key_parts.size(); ++p) {
            const KeyPart& part = key_parts[p];
            BackwardCall c = packed;
            c.shape.kv_tokens = part.tokens;
            c.k = keys_of(part, bcall.k);
            c.v = keys_of(part, bcall.v);
            c.kv_positions = positions_of(part, bcall.kv_positions);
            c.accumulate = p > 0;
            backend.attention_backward(c, dq_t, keys_of(part, dk_t), keys_of(part, dv_t));
          }
          if (o.sinks) sink_gradient(packed.delta);
        } else {
          backend.attention_backward(bcall, dq_t, dk_t, dv_t);
          if (o.sinks) {
            backend.delta(q_rows, out_tensor, bcall.d_out, delta_t);
            sink_gradient(delta_t);
          }
        }
        backend.synchronize();
      });
  buffers.download();
  return run;
}

}  // namespace a2d::commands::kernel_cmd

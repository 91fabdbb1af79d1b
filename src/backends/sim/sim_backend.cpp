// The simulated device (include/attention2d/sim.hpp): every operation advances the rank's clock
// by what it would take on the device and touches no data. Buffers are address ranges of a
// placeholder region, handed out first-fit per backend (so that one rank's buffers never overlap,
// as the communicators' in-place checks expect), while every rank may share the region itself.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <span>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/sim.hpp"
#include "backends/backends.hpp"
#include "backends/cuda/cuda_plan.hpp"

namespace a2d {
namespace {

constexpr int64_t kAlignment = 256;  // as cudaMalloc's

class SimBackendImpl;

// Host addresses (placeholders) that the simulator moves without copying them, and no data: no
// memory of this host's to count, no kernels of its CPU. With the CUDA rules, the CUDA kernels'
// dtypes and head dimensions.
BackendCapabilities sim_capabilities(bool cuda_rules) {
  BackendCapabilities c;
  c.host_memory = false;
  c.cpu_kernels = false;
  if (cuda_rules) {
    c.dtypes = cuda_plan::kernel_dtypes();
    c.head_dims = cuda_plan::kernel_head_dims();
  }
  return c;
}

// What upload() wrote into a buffer: an int64 array (positions, orders) kept as runs of
// arithmetic progressions where that is at least four times smaller (a sorted gather of cyclic
// parts is one run, a zigzag shard two: P ranks' O(N) positions then take next to nothing), else
// as bytes.
class Uploaded {
 public:
  void write(const void* host, int64_t offset, int64_t bytes, int64_t buffer_bytes) {
    if (offset == 0 && bytes == buffer_bytes && bytes % 8 == 0) {
      const std::span<const int64_t> values(static_cast<const int64_t*>(host),
                                            static_cast<size_t>(bytes / 8));
      std::vector<PositionRun> runs = position_runs(values);
      if (static_cast<int64_t>(runs.size()) * 4 * 24 <= bytes) {
        runs_ = std::move(runs);
        starts_.assign(1, 0);
        for (const PositionRun& r : runs_)
          starts_.push_back(starts_.back() + r.count);
        raw_.clear();
        return;
      }
    }
    if (raw_.empty()) {
      raw_.resize(static_cast<size_t>(buffer_bytes));
      if (!runs_.empty()) {  // a partial write over runs: expand them first
        std::vector<int64_t> values = expand(0, starts_.back());
        std::memcpy(raw_.data(), values.data(), values.size() * 8);
        runs_.clear();
      }
    }
    std::memcpy(raw_.data() + offset, host, static_cast<size_t>(bytes));
  }
  bool empty() const { return raw_.empty() && runs_.empty(); }
  bool holds(int64_t offset, int64_t bytes) const {
    if (!raw_.empty()) return offset >= 0 && offset + bytes <= static_cast<int64_t>(raw_.size());
    return !runs_.empty() && offset >= 0 && offset % 8 == 0 && bytes % 8 == 0 &&
           offset / 8 + bytes / 8 <= starts_.back();
  }
  void read(int64_t offset, void* host, int64_t bytes) const {
    if (!raw_.empty()) {
      std::memcpy(host, raw_.data() + offset, static_cast<size_t>(bytes));
      return;
    }
    const std::vector<int64_t> values = expand(offset / 8, bytes / 8);
    std::memcpy(host, values.data(), static_cast<size_t>(bytes));
  }
  // `count` int64 values from `offset`: a span of the bytes, or the runs that hold them.
  std::span<const int64_t> raw(int64_t offset, int64_t count) const {
    if (raw_.empty()) return {};
    return {reinterpret_cast<const int64_t*>(raw_.data() + offset), static_cast<size_t>(count)};
  }
  std::vector<PositionRun> runs(int64_t offset, int64_t count) const {
    std::vector<PositionRun> out;
    int64_t begin = offset / 8;
    const int64_t end = begin + count;
    auto it = std::upper_bound(starts_.begin(), starts_.end(), begin) - 1;
    for (size_t r = static_cast<size_t>(it - starts_.begin()); begin < end; ++r) {
      const PositionRun& run = runs_[r];
      const int64_t skip = begin - starts_[r];
      const int64_t take = std::min(end, starts_[r + 1]) - begin;
      out.push_back({run.first + skip * run.step, run.step, take});
      begin += take;
    }
    return out;
  }

 private:
  std::vector<int64_t> expand(int64_t begin, int64_t count) const {
    std::vector<int64_t> values;
    values.reserve(static_cast<size_t>(count));
    for (const PositionRun& r : runs(8 * begin, count))
      for (int64_t i = 0; i < r.count; ++i)
        values.push_back(r.first + i * r.step);
    return values;
  }

  std::vector<std::byte> raw_;
  std::vector<PositionRun> runs_;
  std::vector<int64_t> starts_;  // element index of each run, and the total last
};

class SimBuffer final : public Buffer {
 public:
  SimBuffer(SimBackendImpl& backend, int64_t bytes, std::byte* memory, int64_t offset,
            int64_t reserved);
  ~SimBuffer() override;

  // What upload() wrote (positions, orders): the only values a sim buffer holds.
  Uploaded& uploaded() { return uploaded_; }

 private:
  SimBackendImpl& owner_;
  int64_t offset_, reserved_;
  Uploaded uploaded_;
};

class SimBackendImpl final : public SimBackend {
 public:
  SimBackendImpl(const SimDevice& device, SimRuntime& runtime)
      : device_(device),
        runtime_(runtime),
        region_(runtime.placeholder_region(device.pool_bytes)),
        capabilities_(sim_capabilities(device.cuda_rules)) {
    A2D_REQUIRE(device.machine.kernel_forward_flops > 0 && device.machine.kernel_backward_flops > 0,
                "the simulated device needs the kernel's forward and backward rates (machine '",
                device.machine.name, "')");
    A2D_REQUIRE(device.memory_bytes_per_s >= 0, "the simulated device's memory bandwidth must be ",
                ">= 0 (0: data operations take no time)");
    A2D_REQUIRE(device.pool_bytes > 0 && region_, "the simulated device has no address space");
  }

  std::string name() const override { return "sim"; }
  const BackendCapabilities& capabilities() const override { return capabilities_; }
  void check_supported(DType dtype, int64_t head_dim, const Mask& mask,
                       float softcap) const override {
    if (device_.cuda_rules) cuda_plan::check_supported(dtype, head_dim, mask, softcap);
  }

  const SimCharges& charges() const override { return charges_; }
  void attribute_to(std::shared_ptr<const std::string> phase) override {
    phase_ = std::move(phase);
  }
  void reset_charges() override {
    const int64_t live = charges_.live_bytes;
    charges_ = SimCharges{};
    charges_.live_bytes = live;
    charges_.peak_bytes = live;
  }

  // ---- memory ----
  BufferPtr allocate(int64_t bytes) override {
    A2D_REQUIRE(bytes >= 0, "cannot allocate ", bytes, " bytes");
    const int64_t reserved =
        std::max<int64_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    const int64_t offset = take(reserved);
    charges_.live_bytes += reserved;
    charges_.peak_bytes = std::max(charges_.peak_bytes, charges_.live_bytes);
    return std::make_unique<SimBuffer>(*this, bytes, region_ + offset, offset, reserved);
  }
  BufferPtr allocate_staging(int64_t bytes) override { return allocate(bytes); }
  void release(int64_t offset, int64_t reserved) {
    give_back(offset, reserved);
    charges_.live_bytes -= reserved;
  }

  // Host <-> device copies happen when an attention is built (positions, orders), not inside
  // its calls: they are kept, and not charged.
  void upload(const void* host, Place to, int64_t bytes) override {
    if (bytes == 0) return;
    A2D_REQUIRE(to.buffer && to.offset >= 0 && to.offset + bytes <= to.buffer->bytes(),
                "sim upload: ", bytes, " bytes at ", to.offset, " do not fit the buffer");
    sim_buffer(*to.buffer).uploaded().write(host, to.offset, bytes, to.buffer->bytes());
  }
  void download(Place from, void* host, int64_t bytes) override {
    if (bytes == 0) return;
    A2D_REQUIRE(from.buffer && from.offset >= 0 && from.offset + bytes <= from.buffer->bytes(),
                "sim download: ", bytes, " bytes at ", from.offset, " do not fit the buffer");
    const Uploaded& kept = sim_buffer(*from.buffer).uploaded();
    A2D_REQUIRE(kept.holds(from.offset, bytes),
                "sim download: the simulated device holds no values (docs/simulation.md): only "
                "what was uploaded can be read back");
    kept.read(from.offset, host, bytes);
  }
  void fill_zero(Place /*at*/, int64_t bytes) override { data(bytes); }

  // ---- data operations ----
  void copy_tokens(const TokenTensor& from, const TokenTensor& to,
                   const TokenBlock& block) override {
    const int64_t elements = block.batch * block.tokens * block.heads * block.width;
    data(elements * (dtype_bytes(from.dtype) + dtype_bytes(to.dtype)));
  }
  void copy_rows(const RowTensor& /*from*/, const RowTensor& /*to*/, int64_t batch, int64_t heads,
                 int64_t tokens) override {
    data(2 * 4 * batch * heads * tokens);
  }
  void permute_tokens(Place /*rows*/, int64_t tokens, int64_t token_bytes,
                      Place /*order*/) override {
    const int64_t bytes = tokens * token_bytes;
    if (device_.machine.permute_bytes_per_s > 0) {
      charge_data(static_cast<double>(bytes) / device_.machine.permute_bytes_per_s);
    } else {
      data(2 * bytes);
    }
  }
  void attention_forward(const ForwardCall& call, const TokenTensor& out,
                         const RowTensor& /*lse*/) override {
    if (device_.cuda_rules) {
      cuda_plan::check_forward(call);
      cuda_plan::check_forward_output(call, out);
    }
    kernel(call.shape, call.mask, call.q_positions, call.kv_positions, false);
  }
  void attention_forward_partial(const ForwardCall& call, const PartialTensor& state,
                                 bool /*accumulate*/) override {
    if (device_.cuda_rules) {
      cuda_plan::check_forward(call);
      cuda_plan::check_partial_output(state);
    }
    kernel(call.shape, call.mask, call.q_positions, call.kv_positions, false);
  }
  void attention_backward(const BackwardCall& call, const TokenTensor& dq, const TokenTensor& dk,
                          const TokenTensor& dv) override {
    if (device_.cuda_rules) {
      cuda_plan::check_backward(call);
      cuda_plan::check_backward_outputs(dq, dk, dv);
    }
    kernel(call.shape, call.mask, call.q_positions, call.kv_positions, true);
  }
  void merge_partials(Place /*into*/, Place /*from*/, int64_t count, int64_t record) override {
    const int64_t bytes = 4 * count * record;
    if (device_.machine.merge_bytes_per_s > 0) {
      charge_data(static_cast<double>(bytes) / device_.machine.merge_bytes_per_s);
    } else {
      data(3 * bytes);  // both records read, one written
    }
  }
  void copy_bytes(Place /*from*/, Place /*to*/, int64_t bytes) override { data(2 * bytes); }
  void finalize(const RowsShape& rows, const PartialTensor& state, const TokenTensor& out,
                const RowTensor& /*lse*/) override {
    const int64_t count = rows.batch * rows.tokens * rows.heads;
    data(count * (4 * (2 + rows.head_dim) + rows.head_dim * dtype_bytes(out.dtype) + 4));
    (void)state;
  }
  void delta(const RowsShape& rows, const TokenTensor& out, const TokenTensor& d_out,
             const RowTensor& /*delta*/) override {
    const int64_t count = rows.batch * rows.tokens * rows.heads;
    data(count * (rows.head_dim * (dtype_bytes(out.dtype) + dtype_bytes(d_out.dtype)) + 4));
  }
  void add(Place /*into*/, Place /*from*/, int64_t count) override {
    const int64_t bytes = 4 * count;
    if (device_.machine.sum_bytes_per_s > 0) {
      charge_data(static_cast<double>(bytes) / device_.machine.sum_bytes_per_s);
    } else {
      data(3 * bytes);
    }
  }
  void add_sinks(const RowsShape& rows, const float* /*sinks*/, int64_t /*first_head*/,
                 const TokenTensor& out, const RowTensor& /*lse*/) override {
    const int64_t count = rows.batch * rows.tokens * rows.heads;
    data(count * (2 * rows.head_dim * dtype_bytes(out.dtype) + 8));
  }
  void add_sink_gradient(const RowsShape& rows, const float* /*sinks*/, int64_t /*first_head*/,
                         const RowTensor& /*lse*/, const RowTensor& /*delta*/,
                         double* /*dsink*/) override {
    data(rows.batch * rows.tokens * rows.heads * 8);
  }

 private:
  static SimBuffer& sim_buffer(Buffer& buffer) {
    auto* sim = dynamic_cast<SimBuffer*>(&buffer);
    A2D_REQUIRE(sim, "a ", buffer.backend().name(), " buffer given to the sim backend");
    return *sim;
  }

  // The positions of a kernel call's rows, as uploaded: a span of them, or their runs (both
  // empty: 0, 1, 2, ...).
  struct Positions {
    std::span<const int64_t> values;
    std::vector<PositionRun> runs;
  };
  Positions positions(const Place& place, int64_t count) {
    if (place.empty() || count == 0) return {};
    const int64_t bytes = count * static_cast<int64_t>(sizeof(int64_t));
    if (place.host) {
      return {
          {reinterpret_cast<const int64_t*>(place.host + place.offset), static_cast<size_t>(count)},
          {}};
    }
    const Uploaded& kept = sim_buffer(*place.buffer).uploaded();
    A2D_REQUIRE(kept.holds(place.offset, bytes),
                "sim kernel: the positions of a call must have been uploaded (the simulated "
                "device holds no other values)");
    Positions out;
    out.values = kept.raw(place.offset, count);
    if (out.values.empty()) out.runs = kept.runs(place.offset, count);
    return out;
  }

  void kernel(const AttentionShape& shape, const Mask& mask, const Place& q_positions,
              const Place& kv_positions, bool backward) {
    KernelCall call;
    call.mask = mask;
    call.batch = shape.batch;
    call.heads = shape.heads;
    call.head_dim = shape.head_dim;
    call.q_tokens = shape.q_tokens;
    call.kv_tokens = shape.kv_tokens;
    const Positions q = positions(q_positions, shape.q_tokens);
    const Positions k = positions(kv_positions, shape.kv_tokens);
    call.q_positions = q.values;
    call.q_runs = q.runs;
    call.kv_positions = k.values;
    call.kv_runs = k.runs;
    call.backward = backward;
    const double seconds = kernel_call_seconds(device_.machine, call);
    charges_.kernel_s += seconds;
    by_phase().kernel_s += seconds;
    ++charges_.kernel_calls;
    runtime_.compute(seconds);
  }

  // An operation that reads and writes `bytes` in all at the memory bandwidth.
  void data(int64_t bytes) {
    if (device_.memory_bytes_per_s > 0)
      charge_data(static_cast<double>(bytes) / device_.memory_bytes_per_s);
  }
  void charge_data(double seconds) {
    if (seconds <= 0) return;
    charges_.data_s += seconds;
    by_phase().data_s += seconds;
    runtime_.compute(seconds);
  }

  SimPhaseCharge& by_phase() { return charges_.by_phase[phase_ ? *phase_ : std::string()]; }

  // First fit among the free blocks below the high-water mark, else above it.
  int64_t take(int64_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const int64_t offset = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left > 0) free_.emplace(offset + bytes, left);
      return offset;
    }
    A2D_REQUIRE(device_.pool_bytes - high_water_ >= bytes, "the simulated device's ",
                device_.pool_bytes >> 30, " GiB of address space per rank are used up (",
                charges_.live_bytes, " bytes live, ", bytes,
                " asked): give the simulation a larger pool (a2d sim --pool-gib)");
    high_water_ += bytes;
    return high_water_ - bytes;
  }
  void give_back(int64_t offset, int64_t bytes) {
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + bytes) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        previous->second += bytes;
        return;
      }
    }
    free_.emplace(offset, bytes);
  }

  SimDevice device_;
  SimRuntime& runtime_;
  std::byte* region_;
  BackendCapabilities capabilities_;
  int64_t high_water_ = 0;
  std::map<int64_t, int64_t> free_;  // offset -> bytes
  SimCharges charges_;
  std::shared_ptr<const std::string> phase_;
};

SimBuffer::SimBuffer(SimBackendImpl& backend, int64_t bytes, std::byte* memory, int64_t offset,
                     int64_t reserved)
    : Buffer(backend, bytes, memory), owner_(backend), offset_(offset), reserved_(reserved) {}

SimBuffer::~SimBuffer() {
  owner_.release(offset_, reserved_);
}

}  // namespace

std::unique_ptr<SimBackend> make_sim_backend(const SimDevice& device, SimRuntime& runtime) {
  return std::make_unique<SimBackendImpl>(device, runtime);
}

// Made by make_sim_backend inside SimGrid (a2d sim), not by name.
BackendEntry backends::sim_backend_entry() {
  BackendEntry e;
  e.name = "sim";
  e.summary = "the simulated device inside SimGrid (a2d sim)";
  e.capabilities = sim_capabilities(false);
  return e;
}

}  // namespace a2d

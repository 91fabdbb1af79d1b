// The communicator interface over MPI: collectives map to MPI's blocking or non-blocking
// collectives, shifts to Isend/Irecv (the attention merge is the backend's: merge_scatter.cpp).
#include "attention2d/mpi_comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string_view>
#include <thread>
#include <vector>

#include "attention2d/backend.hpp"
#include "attention2d/comm_wrappers.hpp"
#include "attention2d/error.hpp"
#include "attention2d/watchdog.hpp"
#include "comm/startup_guard.hpp"
#ifdef A2D_SMPI
#include "comm/smpi_hooks.hpp"
#endif

namespace a2d {
namespace {

void check_mpi(int code, const char* what, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  detail::throw_error(detail::concat("MPI ", what, " failed: ", std::string(text, length)), file,
                      line);
}
#define A2D_MPI(call) check_mpi((call), #call, __FILE__, __LINE__)

// The tag of the ring collectives' messages, apart from the algorithms' own tags (small numbers).
constexpr int kRingTag = 30000;

int mpi_count(int64_t count) {
  A2D_REQUIRE(count >= 0 && count <= INT_MAX, "a message of ", count,
              " elements exceeds MPI's int count; use more ranks or a smaller batch");
  return static_cast<int>(count);
}

// The host address of a place; MPI here moves host memory only (Debian's Open MPI is not
// CUDA-aware), so a buffer the host must not touch needs a staged communicator around this one.
std::byte* host_address(const Place& place) {
  if (!place.buffer) return place.host ? place.host + place.offset : nullptr;
  auto* memory = static_cast<std::byte*>(place.buffer->host_data());
  A2D_REQUIRE(memory, "the MPI communicator moves host memory only, and a ",
              place.buffer->backend().name(),
              " buffer is not host-accessible: wrap the communicator with "
              "make_staged_communicator");
  return memory + place.offset;
}

// Byte counts move as MPI elements of the largest size (8, 4, 2 or 1 bytes) that divides every
// count and address involved, so that one message can hold up to 2^31 - 1 such elements.
struct Words {
  MPI_Datatype type = MPI_BYTE;
  int64_t size = 1;
};
Words words_for(std::initializer_list<int64_t> values, std::span<const int64_t> counts = {}) {
  int64_t common = 8;
  auto fit = [&](int64_t v) {
    while (common > 1 && v % common != 0)
      common /= 2;
  };
  for (int64_t v : values)
    fit(v);
  for (int64_t v : counts)
    fit(v);
  switch (common) {
    case 8:
      return {MPI_UINT64_T, 8};
    case 4:
      return {MPI_UINT32_T, 4};
    case 2:
      return {MPI_UINT16_T, 2};
    default:
      return {MPI_BYTE, 1};
  }
}
int64_t address_bits(const void* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) & 0x7);
}

// How a rank waits for MPI (A2D_MPI_WAIT): spin, inside MPI's blocking calls (Open MPI polls,
// yielding the core between polls when ranks outnumber cores), or sleep, testing between sleeps
// that double from 10 us to a cap (8 ms, or sleep:MICROSECONDS), and the blocking collectives run
// as rings of Isend/Irecv steps so that they sleep too. Where ranks outnumber cores many times
// over (an emulated cluster: 64 ranks on 2 cores), polling ranks take the cores from the ones with
// work or data to move: at 64 ranks on 100 Mbit/s links, Ring Attention took 11.4 s spinning,
// 11.1 s sleeping at most 0.5 ms, 7.8 s at 2 ms, 6.6 s at 8 ms and 6.9 s at 32 ms
// (docs/benchmarks.md, "Why P = 64 did not run, and what changed").
WaitSetting read_wait_setting() {
  const char* text = std::getenv("A2D_MPI_WAIT");
  const std::string_view value = text ? text : "";
  if (value.empty() || value == "spin") return {WaitPolicy::spin, 0};
  if (value == "sleep") return {WaitPolicy::sleep, 8000};
  if (value.starts_with("sleep:")) {
    const std::string digits(value.substr(6));
    char* end = nullptr;
    const long cap = std::strtol(digits.c_str(), &end, 10);
    if (!digits.empty() && *end == '\0' && cap >= 10 && cap <= 1000000) {
      return {WaitPolicy::sleep, static_cast<int>(cap)};
    }
  }
  A2D_FAIL("A2D_MPI_WAIT='", value,
           "': choose spin (the default), sleep, or sleep:MICROSECONDS (the longest sleep between "
           "tests, 10 to 1000000)");
}

// Tests the requests until all are done, sleeping between tests 10 us doubling to `cap`.
void test_until_done(int count, MPI_Request* requests, std::chrono::microseconds cap) {
#ifdef A2D_SMPI
  // Inside SimGrid waiting takes no host time: the policy keeps its schedules (rings of sends),
  // and the simulator does the waiting.
  (void)cap;
  A2D_MPI(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE));
  return;
#endif
  auto pause = std::min(std::chrono::microseconds(10), cap);
  for (;;) {
    int done = 0;
    A2D_MPI(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, cap);
  }
}

// Waits for every request: MPI_Waitall, or tests with growing sleeps between them.
void wait_requests(int count, MPI_Request* requests) {
  if (count == 0) return;
  const WaitSetting setting = mpi_wait_setting();
  if (setting.policy == WaitPolicy::spin) {
    A2D_MPI(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE));
    return;
  }
  test_until_done(count, requests, std::chrono::microseconds(setting.max_sleep_us));
}

class MpiRequest;

// The posted operations of this process that may still move data (the kernel's progress calls
// look at these only; see MpiCommunicator::progress).
std::vector<MpiRequest*>& in_flight() {
  static std::vector<MpiRequest*> requests;
  return requests;
}

class MpiRequest final : public Request {
 public:
  std::vector<MPI_Request> requests;
  std::vector<int> counts, displacements, counts2, displacements2;  // alive until completion
  std::function<void()> on_complete;

  MpiRequest() { in_flight().push_back(this); }

  void wait() override {
    if (done_) return;
    done_ = true;
    untrack();
    if (!requests.empty()) {
      wait_requests(static_cast<int>(requests.size()), requests.data());
    }
    if (on_complete) on_complete();
  }
  // Lets MPI move this operation's data; true once it has all arrived (wait() then only finishes).
  // Called from inside kernels, so it does not throw: an error is reported by wait().
  bool test() noexcept {
    if (requests.empty()) return true;
    int flag = 0;
    const int status =
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
    return status != MPI_SUCCESS || flag != 0;
  }
  void untrack() { std::erase(in_flight(), this); }
  ~MpiRequest() override {
    untrack();
    if (done_) return;
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the error was already reported by the owner's wait() or is
      // lost with the job.
    }
  }

 private:
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    A2D_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    A2D_MPI(MPI_Comm_rank(comm_, &rank_));
    A2D_MPI(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm part;
    A2D_MPI(MPI_Comm_split(comm_, color, key, &part));
    return std::make_unique<MpiCommunicator>(part);
  }

  RequestPtr all_gather_async(Place send, Place recv, std::span<const int64_t> bytes) override {
    return post_all_gather(send, recv, bytes, false);
  }
  void all_gather(Place send, Place recv, std::span<const int64_t> bytes) override {
    post_all_gather(send, recv, bytes, true);
  }

  RequestPtr reduce_scatter_async(Place send, Place recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    return post_reduce_scatter(send, recv, counts, record, reduction, false);
  }
  void reduce_scatter(Place send, Place recv, std::span<const int64_t> counts, int64_t record,
                      Reduction reduction) override {
    post_reduce_scatter(send, recv, counts, record, reduction, true);
  }

  RequestPtr send_recv_async(Place send_at, int64_t send_bytes, int dest, Place recv_at,
                             int64_t recv_bytes, int source, int tag) override {
    A2D_REQUIRE(dest >= 0 && dest < size_ && source >= 0 && source < size_, "send_recv peers ",
                dest, " and ", source, " must be ranks of a communicator of ", size_);
    A2D_REQUIRE(send_bytes >= 0 && recv_bytes >= 0, "send_recv sizes must not be negative");
    const std::byte* send = send_bytes > 0 ? host_address(send_at) : nullptr;
    std::byte* recv = recv_bytes > 0 ? host_address(recv_at) : nullptr;
    auto request = std::make_unique<MpiRequest>();
    if (dest == rank_ && source == rank_) {
      A2D_REQUIRE(send_bytes == recv_bytes, "a send to oneself must match its receive");
#ifdef A2D_SMPI
      // Placeholders (sim.hpp): nothing to move, and the copy would touch the shared region's
      // pages; ATTENTION2D places each rank's K/V part into its slot of the gathered buffer so
      // (a send to itself on an R x 1 grid), and the ranks together touched all of it: 21.5 GB
      // at P = 256, N = 2^20, 40 heads x 128 bf16, on a 256 x 1 grid.
      if (is_placeholder(send, send_bytes) && is_placeholder(recv, recv_bytes)) return request;
#endif
      if (send_bytes > 0 && send != recv) std::memmove(recv, send, static_cast<size_t>(send_bytes));
      return request;
    }
    if (recv_bytes > 0) {
      const Words words = words_for({recv_bytes, address_bits(recv)});
      request->requests.emplace_back();
      A2D_MPI(MPI_Irecv(recv, mpi_count(recv_bytes / words.size), words.type, source, tag, comm_,
                        &request->requests.back()));
    }
    if (send_bytes > 0) {
      const Words words = words_for({send_bytes, address_bits(send)});
      request->requests.emplace_back();
#ifdef A2D_SMPI
      // SimGrid 3.32 compares a send's size, cast to int, with smpi/send-is-detached-thresh: from
      // 2^31 bytes on the cast wraps, the send is taken for a small one and detached, and SMPI
      // copies the whole message into a buffer of its own. Ring Attention's 2 GiB dK/dV messages
      // at P = 8, N = 2^18, 64 heads x 128 bf16 took 20.5 GB of host memory and 167 s so. A
      // synchronous send is never detached, and a message this size goes by rendezvous anyway.
      if (send_bytes > INT_MAX) {
        A2D_MPI(MPI_Issend(send, mpi_count(send_bytes / words.size), words.type, dest, tag, comm_,
                           &request->requests.back()));
        return request;
      }
#endif
      A2D_MPI(MPI_Isend(send, mpi_count(send_bytes / words.size), words.type, dest, tag, comm_,
                        &request->requests.back()));
    }
    return request;
  }

  RequestPtr all_to_all_async(Place send, std::span<const int64_t> send_bytes, Place recv,
                              std::span<const int64_t> recv_bytes) override {
    return post_all_to_all(send, send_bytes, recv, recv_bytes, false);
  }
  void all_to_all(Place send, std::span<const int64_t> send_bytes, Place recv,
                  std::span<const int64_t> recv_bytes) override {
    post_all_to_all(send, send_bytes, recv, recv_bytes, true);
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    // In chunks that fit MPI's int count.
    auto* bytes_at = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes;) {
      const int64_t chunk = std::min<int64_t>(bytes - done, INT_MAX / 2);
      const int n = static_cast<int>(chunk);
      complete(
          "MPI_Bcast / MPI_Ibcast",
          [&] { return MPI_Bcast(bytes_at + done, n, MPI_BYTE, root, comm_); },
          [&](MPI_Request* r) { return MPI_Ibcast(bytes_at + done, n, MPI_BYTE, root, comm_, r); });
      done += chunk;
    }
  }
  void all_reduce(float* data, int64_t count, Reduction reduction) override {
    all_reduce_of(data, count, MPI_FLOAT, reduction);
  }
  void all_reduce(double* data, int64_t count, Reduction reduction) override {
    all_reduce_of(data, count, MPI_DOUBLE, reduction);
  }
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override {
    all_reduce_of(data, count, MPI_INT64_T, reduction);
  }
  void barrier() override {
    complete(
        "MPI_Barrier / MPI_Ibarrier", [&] { return MPI_Barrier(comm_); },
        [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  }
  void set_phase(const std::string& phase) override { Watchdog::note_phase(phase); }
  void progress() override {
    Watchdog::heartbeat();
    // Only operations in flight need MPI. A call into MPI that finds nothing to do yields the
    // core when ranks outnumber cores (Open MPI's yield_when_idle), and a computing rank that
    // yields every few tiles shares its core and caches with ranks that only wait: a kernel
    // with nothing in flight therefore makes no MPI call, and operations whose data has arrived
    // are not tested again.
    std::erase_if(in_flight(), [](MpiRequest* request) { return request->test(); });
  }

 private:
  // The collectives, blocking (complete on return; MPI's blocking algorithms) or posted.
  RequestPtr post_all_gather(Place send_at, Place recv_at, std::span<const int64_t> bytes,
                             bool blocking) {
    check_counts(bytes);
    auto request = std::make_unique<MpiRequest>();
    int64_t total = 0;
    for (int64_t b : bytes)
      total += b;
    const int64_t own_bytes = bytes[static_cast<size_t>(rank_)];
    std::byte* recv = total > 0 ? host_address(recv_at) : nullptr;
    const std::byte* send = own_bytes > 0 ? host_address(send_at) : nullptr;
    const Words words = words_for({address_bits(recv), address_bits(send)}, bytes);
    fill_counts(bytes, words.size, request->counts, request->displacements);
    const int own = request->counts[rank_];
    const std::byte* own_slot = recv ? recv + request->displacements[rank_] * words.size : nullptr;
#ifdef A2D_SMPI
    // Placeholders (sim.hpp): this rank's block need not be copied into its slot, and SMPI would
    // copy it (its Datatype::copy does not skip shared memory), touching every rank's slot of
    // the gathered buffer: pages of the whole gather (21 GB at N = 2^20, 40 heads x 128 bf16).
    const void* source = MPI_IN_PLACE;
    (void)own_slot;
#else
    const void* source = own == 0 || send == own_slot ? MPI_IN_PLACE : send;
#endif
    if (size_ == 1) {
      if (source != MPI_IN_PLACE) std::memcpy(recv, send, static_cast<size_t>(own_bytes));
      return request;
    }
    if (blocking && sleeps()) {
      if (source != MPI_IN_PLACE)
        std::memcpy(recv + request->displacements[rank_] * words.size, send,
                    static_cast<size_t>(own_bytes));
      ring_all_gather(recv, request->counts, request->displacements, words);
      return request;
    }
    if (blocking) {
      A2D_MPI(MPI_Allgatherv(source, own, words.type, recv, request->counts.data(),
                             request->displacements.data(), words.type, comm_));
      return request;
    }
    request->requests.resize(1);
    A2D_MPI(MPI_Iallgatherv(source, own, words.type, recv, request->counts.data(),
                            request->displacements.data(), words.type, comm_,
                            &request->requests[0]));
    return request;
  }

  RequestPtr post_reduce_scatter(Place send_at, Place recv_at, std::span<const int64_t> counts,
                                 int64_t record, Reduction reduction, bool blocking) {
    check_counts(counts);
    A2D_REQUIRE(record >= 1, "reduce_scatter needs a record size of at least 1");
    auto request = std::make_unique<MpiRequest>();
    int64_t total = 0;
    for (int64_t c : counts)
      total += c;
    const auto* send = reinterpret_cast<const float*>(total > 0 ? host_address(send_at) : nullptr);
    auto* recv = reinterpret_cast<float*>(
        counts[static_cast<size_t>(rank_)] > 0 ? host_address(recv_at) : nullptr);
    if (size_ == 1) {
      if (counts[0] > 0 && send != recv)
        std::memmove(recv, send, sizeof(float) * static_cast<size_t>(counts[0] * record));
      return request;
    }
    if (blocking) {
      // One block per message: only a block, not the whole array, must fit MPI's int count.
      for (int64_t c : counts)
        A2D_REQUIRE(c >= 0, "a collective's block size must not be negative");
      ring_reduce_scatter(send, recv, counts, record, reduction);
      return request;
    }
    const MPI_Op op = plain_op(reduction);
    std::vector<int64_t> scaled(counts.begin(), counts.end());
    for (auto& c : scaled)
      c *= record;
    fill_counts(scaled, 1, request->counts, request->displacements);
    request->requests.resize(1);
    A2D_MPI(MPI_Ireduce_scatter(send, recv, request->counts.data(), MPI_FLOAT, op, comm_,
                                &request->requests[0]));
    return request;
  }

  RequestPtr post_all_to_all(Place send_at, std::span<const int64_t> send_bytes, Place recv_at,
                             std::span<const int64_t> recv_bytes, bool blocking) {
    check_counts(send_bytes);
    check_counts(recv_bytes);
    auto request = std::make_unique<MpiRequest>();
    int64_t send_total = 0, recv_total = 0;
    for (int64_t b : send_bytes)
      send_total += b;
    for (int64_t b : recv_bytes)
      recv_total += b;
    const std::byte* send = send_total > 0 ? host_address(send_at) : nullptr;
    std::byte* recv = recv_total > 0 ? host_address(recv_at) : nullptr;
    Words words = words_for({address_bits(send), address_bits(recv)}, send_bytes);
    words = words_for({words.size, address_bits(send), address_bits(recv)}, recv_bytes);
    fill_counts(send_bytes, words.size, request->counts, request->displacements);
    fill_counts(recv_bytes, words.size, request->counts2, request->displacements2);
#ifdef A2D_SMPI
    // Placeholders (sim.hpp): this rank's own block needs no copy, and SMPI's MPI_Alltoallv
    // copies it with memcpy, touching the shared region's pages: Ulysses at P = 8, N = 2^17,
    // 64 heads x 128 bf16 took 3.46 GB of host memory so. The block is left out of the exchange.
    const int64_t own = static_cast<int64_t>(request->counts[rank_]) * words.size;
    const std::byte* own_send = send + int64_t{request->displacements[rank_]} * words.size;
    const std::byte* own_recv = recv + int64_t{request->displacements2[rank_]} * words.size;
    if (own > 0 && is_placeholder(own_send, own) && is_placeholder(own_recv, own)) {
      request->counts[rank_] = 0;
      request->counts2[rank_] = 0;
    }
#endif
    if (blocking && sleeps()) {
      pairwise_all_to_all(send, recv, *request, words);
      return request;
    }
    if (blocking) {
      A2D_MPI(MPI_Alltoallv(send, request->counts.data(), request->displacements.data(), words.type,
                            recv, request->counts2.data(), request->displacements2.data(),
                            words.type, comm_));
      return request;
    }
    request->requests.resize(1);
    A2D_MPI(MPI_Ialltoallv(send, request->counts.data(), request->displacements.data(), words.type,
                           recv, request->counts2.data(), request->displacements2.data(),
                           words.type, comm_, &request->requests[0]));
    return request;
  }

  // Reduce-scatter as a ring of P - 1 MPI_Sendrecv steps (the schedule NCCL uses and the cost
  // model charges): at step k rank r passes the partial sum of block r - k - 1 to rank r + 1 and
  // adds its own contribution to the partial of block r - k - 2 it receives from rank r - 1;
  // after the last step it holds its own block, reduced over every rank. At 16 ranks here,
  // Open MPI 4.1's MPI_Reduce_scatter was 1.3x (1 MiB blocks) to 15x (4 MiB) slower and
  // MPI_Ireduce_scatter about 30x (docs/benchmarks.md), so the blocking form uses this one.
  void ring_reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                           int64_t record, Reduction reduction) {
    std::vector<int64_t> offsets(counts.size() + 1, 0);
    int64_t largest = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      offsets[i + 1] = offsets[i] + counts[i] * record;
      largest = std::max(largest, counts[i] * record);
    }
    const auto block = [&](int b) { return static_cast<size_t>((b % size_ + size_) % size_); };
    const auto combine = [&](float* into, const float* from, int b) {
      const int64_t n = counts[block(b)];
      if (reduction == Reduction::max) {
        for (int64_t i = 0; i < n * record; ++i)
          into[i] = std::max(into[i], from[i]);
      } else {
        for (int64_t i = 0; i < n * record; ++i)
          into[i] += from[i];
      }
    };
#ifdef A2D_SMPI
    // Inside SimGrid the values are placeholders (sim.hpp): the scratch is too, and the sums
    // cost time instead of arithmetic.
    auto* scratch = reinterpret_cast<float*>(simulated_scratch(8 * largest));
    float* outgoing = scratch;
    float* incoming = scratch + largest;
    (void)combine;
#else
    std::vector<float> outgoing_memory(static_cast<size_t>(largest));
    std::vector<float> incoming_memory(outgoing_memory.size());
    float* outgoing = outgoing_memory.data();
    float* incoming = incoming_memory.data();
#endif
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const float* to_send = send + offsets[block(rank_ - 1)];
    for (int step = 0; step < size_ - 1; ++step) {
      const size_t sent = block(rank_ - step - 1), got = block(rank_ - step - 2);
      exchange(to_send, mpi_count(counts[sent] * record), next, incoming,
               mpi_count(counts[got] * record), prev, MPI_FLOAT);
      // The received partial plus this rank's own contribution to that block.
      float* sum = step + 2 == size_ ? recv : outgoing;
#ifdef A2D_SMPI
      simulated_host_reduction(static_cast<int64_t>(sizeof(float)) * counts[got] * record);
#else
      std::copy_n(send + offsets[got], counts[got] * record, sum);
      combine(sum, incoming, static_cast<int>(got));
#endif
      to_send = sum;
    }
  }

  bool sleeps() const {
    return mpi_wait_setting().policy == WaitPolicy::sleep;
  }

  // One step of a ring or pairwise schedule: send `send_count` elements to `dest` while receiving
  // `recv_count` from `source` (MPI_Sendrecv, or posted and waited for under the sleep policy).
  void exchange(const void* send, int send_count, int dest, void* recv, int recv_count, int source,
                MPI_Datatype type) {
    if (!sleeps()) {
      A2D_MPI(MPI_Sendrecv(send, send_count, type, dest, kRingTag, recv, recv_count, type, source,
                           kRingTag, comm_, MPI_STATUS_IGNORE));
      return;
    }
    MPI_Request requests[2];
    A2D_MPI(MPI_Irecv(recv, recv_count, type, source, kRingTag, comm_, &requests[0]));
    A2D_MPI(MPI_Isend(send, send_count, type, dest, kRingTag, comm_, &requests[1]));
    wait_requests(2, requests);
  }

  // The blocking all-gather under the sleep policy: P - 1 ring steps, at step k rank r passing
  // block r - k to rank r + 1 (the schedule of Open MPI's ring algorithm, which the emulated
  // clusters select: scripts/cluster/cluster.sh). This rank's own block is in place.
  void ring_all_gather(std::byte* recv, const std::vector<int>& counts,
                       const std::vector<int>& displacements, const Words& words) {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    for (int step = 0; step < size_ - 1; ++step) {
      const int sent = (rank_ - step + size_) % size_, got = (rank_ - step - 1 + size_) % size_;
      exchange(recv + displacements[sent] * words.size, counts[sent], next,
               recv + displacements[got] * words.size, counts[got], prev, words.type);
    }
  }

  // The blocking all-to-all under the sleep policy: pairwise exchanges, at step k with ranks
  // r + k (send) and r - k (receive).
  void pairwise_all_to_all(const std::byte* send, std::byte* recv, const MpiRequest& layout,
                           const Words& words) {
    const auto at = [&](auto* base, const std::vector<int>& displacements, int peer) {
      return base + static_cast<int64_t>(displacements[peer]) * words.size;
    };
    if (layout.counts[rank_] > 0) {
      std::memmove(at(recv, layout.displacements2, rank_), at(send, layout.displacements, rank_),
                   static_cast<size_t>(layout.counts[rank_] * words.size));
    }
    for (int step = 1; step < size_; ++step) {
      const int dest = (rank_ + step) % size_, source = (rank_ - step + size_) % size_;
      exchange(at(send, layout.displacements, dest), layout.counts[dest], dest,
               at(recv, layout.displacements2, source), layout.counts2[source], source, words.type);
    }
  }

  template <typename T>
  void all_reduce_of(T* data, int64_t count, MPI_Datatype type, Reduction reduction) {
    const int n = mpi_count(count);
    const MPI_Op op = plain_op(reduction);
    complete(
        "MPI_Allreduce / MPI_Iallreduce",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, data, n, type, op, comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, data, n, type, op, comm_, r); });
  }

  // A blocking MPI collective, or under the sleep policy its non-blocking form (`posted`, which
  // fills one request) and a sleeping wait for it. `name` names both in an error.
  template <typename Blocking, typename Posted>
  void complete(const char* name, Blocking blocking, Posted posted) {
    if (!sleeps()) {
      check_mpi(blocking(), name, __FILE__, __LINE__);
      return;
    }
    MPI_Request request;
    check_mpi(posted(&request), name, __FILE__, __LINE__);
    wait_requests(1, &request);
  }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size_, "a collective needs one count per rank (",
                size_, "), got ", counts.size());
  }
  // MPI counts and displacements of `counts` (bytes, or elements with word = 1) in MPI elements
  // of `word` of them.
  static void fill_counts(std::span<const int64_t> counts, int64_t word, std::vector<int>& out,
                          std::vector<int>& displacements) {
    out.resize(counts.size());
    displacements.resize(counts.size());
    int64_t offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      A2D_REQUIRE(counts[i] >= 0, "a collective's block size must not be negative");
      out[i] = mpi_count(counts[i] / word);
      displacements[i] = mpi_count(offset);
      offset += counts[i] / word;
    }
  }
  static MPI_Op plain_op(Reduction reduction) {
    return reduction == Reduction::sum ? MPI_SUM : MPI_MAX;
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

WaitSetting mpi_wait_setting() {
  static const WaitSetting setting = read_wait_setting();
  return setting;
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  // The policy decides the blocking collectives' schedules: every rank must wait the same way.
  // Read (and refused if unknown) on every rank, then compared across them before any data moves.
  int mine = -1;
  std::string refusal;
  try {
    mine = static_cast<int>(mpi_wait_setting().policy);
  } catch (const Error& e) {
    refusal = e.what();
  }
  int seen[3] = {refusal.empty() ? 0 : 1, refusal.empty() ? -mine : -1, mine};  // max of each
  A2D_MPI(MPI_Allreduce(MPI_IN_PLACE, seen, 3, MPI_INT, MPI_MAX, comm));
  A2D_REQUIRE(refusal.empty(), refusal);
  A2D_REQUIRE(seen[0] == 0, "A2D_MPI_WAIT is neither spin nor sleep on another rank");
  A2D_REQUIRE(-seen[1] == seen[2], "A2D_MPI_WAIT differs between ranks (spin on some, sleep on ",
              "others): set it the same on every rank (mpirun -x A2D_MPI_WAIT=...)");
  // An application that started MPI itself (no MpiSession): its errors name the rank too.
  if (error_rank() < 0) {
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    set_error_rank(world_rank);
  }
  MPI_Comm copy;
  A2D_MPI(MPI_Comm_dup(comm, &copy));
  return std::make_unique<MpiCommunicator>(copy);
}

void sleeping_barrier(MPI_Comm comm, std::chrono::microseconds max_sleep) {
  MPI_Request request;
  A2D_MPI(MPI_Ibarrier(comm, &request));
  test_until_done(1, &request, max_sleep);
}

MpiSession::MpiSession(int* argc, char*** argv, double startup_timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (startup_timeout > 0)
      guard_ = std::make_unique<watchdog_detail::StartupGuard>(startup_timeout);
    int provided = 0;
    A2D_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_ = true;
    if (guard_) guard_->mpi_initialized();
    watchdog_detail::wait_for_every_rank_in_mpi();
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  set_error_rank(rank_);
}

MpiSession::~MpiSession() {
  guard_.reset();  // its thread may use PMIx and MPI: stopped before MPI_Finalize
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

}  // namespace a2d

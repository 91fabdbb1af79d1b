// The communicator interface over MPI: collectives map to MPI's blocking or non-blocking
// collectives, shifts to Isend/Irecv, and the attention merge to a user-defined MPI operation on
// records.
#include "attention2d/mpi_comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/kernel.hpp"
#include "attention2d/watchdog.hpp"

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

// inout[i] <- merge(in[i], inout[i]) for records [row max, row sum, acc...].
void merge_records(void* in, void* inout, int* len, MPI_Datatype* type) {
  int bytes = 0;
  MPI_Type_size(*type, &bytes);
  const int64_t record = bytes / static_cast<int>(sizeof(float));
  merge_partial_records(static_cast<float*>(inout), static_cast<const float*>(in), *len, record);
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
      A2D_MPI(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
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
    A2D_MPI(MPI_Op_create(merge_records, /*commute=*/1, &merge_op_));
  }
  ~MpiCommunicator() override {
    for (auto& [record, type] : record_types_)
      MPI_Type_free(&type);
    MPI_Op_free(&merge_op_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm part;
    A2D_MPI(MPI_Comm_split(comm_, color, key, &part));
    return std::make_unique<MpiCommunicator>(part);
  }

  RequestPtr all_gather_async(const float* send, float* recv,
                              std::span<const int64_t> counts) override {
    return post_all_gather(send, recv, counts, false);
  }
  void all_gather(const float* send, float* recv, std::span<const int64_t> counts) override {
    post_all_gather(send, recv, counts, true);
  }

  RequestPtr reduce_scatter_async(const float* send, float* recv, std::span<const int64_t> counts,
                                  int64_t record, Reduction reduction) override {
    return post_reduce_scatter(send, recv, counts, record, reduction, false);
  }
  void reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                      int64_t record, Reduction reduction) override {
    post_reduce_scatter(send, recv, counts, record, reduction, true);
  }

  RequestPtr send_recv_async(const float* send, int64_t send_count, int dest, float* recv,
                             int64_t recv_count, int source, int tag) override {
    A2D_REQUIRE(dest >= 0 && dest < size_ && source >= 0 && source < size_, "send_recv peers ",
                dest, " and ", source, " must be ranks of a communicator of ", size_);
    auto request = std::make_unique<MpiRequest>();
    if (dest == rank_ && source == rank_) {
      A2D_REQUIRE(send_count == recv_count, "a send to oneself must match its receive");
      if (send_count > 0 && send != recv) std::memmove(recv, send, sizeof(float) * send_count);
      return request;
    }
    if (recv_count > 0) {
      request->requests.emplace_back();
      A2D_MPI(MPI_Irecv(recv, mpi_count(recv_count), MPI_FLOAT, source, tag, comm_,
                        &request->requests.back()));
    }
    if (send_count > 0) {
      request->requests.emplace_back();
      A2D_MPI(MPI_Isend(send, mpi_count(send_count), MPI_FLOAT, dest, tag, comm_,
                        &request->requests.back()));
    }
    return request;
  }

  RequestPtr all_to_all_async(const float* send, std::span<const int64_t> send_counts, float* recv,
                              std::span<const int64_t> recv_counts) override {
    return post_all_to_all(send, send_counts, recv, recv_counts, false);
  }
  void all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                  std::span<const int64_t> recv_counts) override {
    post_all_to_all(send, send_counts, recv, recv_counts, true);
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    // In chunks that fit MPI's int count.
    auto* bytes_at = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes;) {
      const int64_t chunk = std::min<int64_t>(bytes - done, INT_MAX / 2);
      A2D_MPI(MPI_Bcast(bytes_at + done, static_cast<int>(chunk), MPI_BYTE, root, comm_));
      done += chunk;
    }
  }
  void all_reduce(float* data, int64_t count, Reduction reduction) override {
    A2D_MPI(
        MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, plain_op(reduction), comm_));
  }
  void all_reduce(double* data, int64_t count, Reduction reduction) override {
    A2D_MPI(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_DOUBLE, plain_op(reduction),
                          comm_));
  }
  void all_reduce(int64_t* data, int64_t count, Reduction reduction) override {
    A2D_MPI(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_INT64_T, plain_op(reduction),
                          comm_));
  }
  void barrier() override { A2D_MPI(MPI_Barrier(comm_)); }
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
  RequestPtr post_all_gather(const float* send, float* recv, std::span<const int64_t> counts,
                             bool blocking) {
    check_counts(counts);
    auto request = std::make_unique<MpiRequest>();
    fill_counts(counts, 1, request->counts, request->displacements);
    const int own = request->counts[rank_];
    const float* own_slot = recv + request->displacements[rank_];
    const void* source = send == own_slot ? MPI_IN_PLACE : send;
    if (size_ == 1) {
      if (source != MPI_IN_PLACE && own > 0) std::memcpy(recv, send, sizeof(float) * own);
      return request;
    }
    if (blocking) {
      A2D_MPI(MPI_Allgatherv(source, own, MPI_FLOAT, recv, request->counts.data(),
                             request->displacements.data(), MPI_FLOAT, comm_));
      return request;
    }
    request->requests.resize(1);
    A2D_MPI(MPI_Iallgatherv(source, own, MPI_FLOAT, recv, request->counts.data(),
                            request->displacements.data(), MPI_FLOAT, comm_,
                            &request->requests[0]));
    return request;
  }

  RequestPtr post_reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                                 int64_t record, Reduction reduction, bool blocking) {
    check_counts(counts);
    A2D_REQUIRE(record >= 1, "reduce_scatter needs a record size of at least 1");
    auto request = std::make_unique<MpiRequest>();
    if (size_ == 1) {
      if (counts[0] > 0 && send != recv)
        std::memmove(recv, send, sizeof(float) * counts[0] * record);
      return request;
    }
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op op = MPI_SUM;
    int64_t unit = record;  // floats per MPI element
    if (reduction == Reduction::attention_merge) {
      A2D_REQUIRE(record >= 3,
                  "attention_merge records hold a row max, a row sum and the "
                  "accumulator: at least 3 floats");
      type = record_type(record);
      op = merge_op_;
      unit = 1;
    } else if (reduction == Reduction::max) {
      op = MPI_MAX;
    }
    std::vector<int64_t> scaled(counts.begin(), counts.end());
    for (auto& c : scaled)
      c *= unit;
    fill_counts(scaled, 1, request->counts, request->displacements);
    if (blocking) {
      ring_reduce_scatter(send, recv, counts, record, reduction);
      return request;
    }
    request->requests.resize(1);
    A2D_MPI(MPI_Ireduce_scatter(send, recv, request->counts.data(), type, op, comm_,
                                &request->requests[0]));
    return request;
  }

  RequestPtr post_all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                             std::span<const int64_t> recv_counts, bool blocking) {
    check_counts(send_counts);
    check_counts(recv_counts);
    auto request = std::make_unique<MpiRequest>();
    fill_counts(send_counts, 1, request->counts, request->displacements);
    fill_counts(recv_counts, 1, request->counts2, request->displacements2);
    if (blocking) {
      A2D_MPI(MPI_Alltoallv(send, request->counts.data(), request->displacements.data(), MPI_FLOAT,
                            recv, request->counts2.data(), request->displacements2.data(),
                            MPI_FLOAT, comm_));
      return request;
    }
    request->requests.resize(1);
    A2D_MPI(MPI_Ialltoallv(send, request->counts.data(), request->displacements.data(), MPI_FLOAT,
                           recv, request->counts2.data(), request->displacements2.data(), MPI_FLOAT,
                           comm_, &request->requests[0]));
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
      if (reduction == Reduction::attention_merge) {
        merge_partial_records(into, from, n, record);
      } else if (reduction == Reduction::max) {
        for (int64_t i = 0; i < n * record; ++i)
          into[i] = std::max(into[i], from[i]);
      } else {
        for (int64_t i = 0; i < n * record; ++i)
          into[i] += from[i];
      }
    };
    std::vector<float> outgoing(static_cast<size_t>(largest)), incoming(outgoing.size());
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const float* to_send = send + offsets[block(rank_ - 1)];
    for (int step = 0; step < size_ - 1; ++step) {
      const size_t sent = block(rank_ - step - 1), got = block(rank_ - step - 2);
      A2D_MPI(MPI_Sendrecv(to_send, mpi_count(counts[sent] * record), MPI_FLOAT, next, kRingTag,
                           incoming.data(), mpi_count(counts[got] * record), MPI_FLOAT, prev,
                           kRingTag, comm_, MPI_STATUS_IGNORE));
      // The received partial plus this rank's own contribution to that block.
      float* sum = step + 2 == size_ ? recv : outgoing.data();
      std::copy_n(send + offsets[got], counts[got] * record, sum);
      combine(sum, incoming.data(), static_cast<int>(got));
      to_send = sum;
    }
  }

  void check_counts(std::span<const int64_t> counts) const {
    A2D_REQUIRE(static_cast<int>(counts.size()) == size_, "a collective needs one count per rank (",
                size_, "), got ", counts.size());
  }
  static void fill_counts(std::span<const int64_t> counts, int64_t unit, std::vector<int>& out,
                          std::vector<int>& displacements) {
    out.resize(counts.size());
    displacements.resize(counts.size());
    int64_t offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      out[i] = mpi_count(counts[i] * unit);
      displacements[i] = mpi_count(offset);
      offset += counts[i] * unit;
    }
  }
  static MPI_Op plain_op(Reduction reduction) {
    A2D_REQUIRE(reduction != Reduction::attention_merge,
                "all_reduce supports sum and max, not attention_merge");
    return reduction == Reduction::sum ? MPI_SUM : MPI_MAX;
  }
  MPI_Datatype record_type(int64_t record) {
    auto it = record_types_.find(record);
    if (it != record_types_.end()) return it->second;
    MPI_Datatype type;
    A2D_MPI(MPI_Type_contiguous(mpi_count(record), MPI_FLOAT, &type));
    A2D_MPI(MPI_Type_commit(&type));
    record_types_[record] = type;
    return type;
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Op merge_op_;
  std::map<int64_t, MPI_Datatype> record_types_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  MPI_Comm copy;
  A2D_MPI(MPI_Comm_dup(comm, &copy));
  return std::make_unique<MpiCommunicator>(copy);
}

void sleeping_barrier(MPI_Comm comm, std::chrono::microseconds poll) {
  MPI_Request request;
  A2D_MPI(MPI_Ibarrier(comm, &request));
  for (int done = 0;;) {
    A2D_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(poll);
  }
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    A2D_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  set_error_rank(rank_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

}  // namespace a2d

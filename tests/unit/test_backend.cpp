// The backends (backend.hpp): conversions between element types in copy_tokens, permutations and
// TokenOrder (the sort of gathered rows by position), bounds and ownership checks, the fenced
// backend's proof that its memory is unreachable outside its operations, and every operation
// giving the same bits on the fenced backend as on the CPU backend (they share their code; the
// fence changes only who may touch the memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "algorithms/records.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/error.hpp"
#include "attention2d/tools/data.hpp"
#include "backends/backends.hpp"

namespace a2d {
namespace {

using algorithms::TokenOrder;

// Positions as a gather of P cyclic parts concatenates them (part p: p, p + P, p + 2P, ...),
// with uneven parts when P does not divide N.
std::vector<int64_t> gathered_cyclic(int64_t n, int64_t parts) {
  std::vector<int64_t> positions;
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t t = p; t < n; t += parts)
      positions.push_back(t);
  return positions;
}

template <typename T>
BufferPtr upload(Backend& backend, const std::vector<T>& values) {
  const auto bytes = static_cast<int64_t>(values.size() * sizeof(T));
  BufferPtr buffer = backend.allocate(bytes);
  backend.upload(values.data(), Place::in(*buffer), bytes);
  return buffer;
}

template <typename T>
std::vector<T> download(Backend& backend, Buffer& buffer, size_t count) {
  std::vector<T> values(count);
  backend.download(Place::in(buffer), values.data(), static_cast<int64_t>(count * sizeof(T)));
  return values;
}

class EveryBackend : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Backend> backend_ = make_backend(GetParam());
};

TEST_P(EveryBackend, SortsRowsByPositionInPlaceAndUnsortsThemBack) {
  for (const int64_t parts : {1, 2, 3, 7}) {
    for (const int64_t n : {1, 10, 97}) {
      const std::vector<int64_t> positions = gathered_cyclic(n, parts);
      TokenOrder order(positions, /*reorder=*/true);
      order.attach(*backend_);
      ASSERT_TRUE(std::is_sorted(order.positions.begin(), order.positions.end()));
      EXPECT_EQ(order.identity(), std::is_sorted(positions.begin(), positions.end()));
      EXPECT_EQ(
          download<int64_t>(*backend_, *order.device_positions().buffer, static_cast<size_t>(n)),
          order.positions);
      const int64_t width = 3;  // floats per token
      std::vector<float> rows(static_cast<size_t>(n * width));
      for (size_t i = 0; i < positions.size(); ++i)
        for (int64_t f = 0; f < width; ++f)
          rows[i * width + static_cast<size_t>(f)] = static_cast<float>(positions[i] * 10 + f);
      BufferPtr buffer = upload(*backend_, rows);
      order.sort(Place::in(*buffer), width * 4);
      const std::vector<float> sorted = download<float>(*backend_, *buffer, rows.size());
      for (int64_t j = 0; j < n; ++j)
        for (int64_t f = 0; f < width; ++f)
          ASSERT_EQ(sorted[static_cast<size_t>(j * width + f)], static_cast<float>(j * 10 + f))
              << "P=" << parts << " N=" << n;
      order.unsort(Place::in(*buffer), width * 4);
      EXPECT_EQ(download<float>(*backend_, *buffer, rows.size()), rows)
          << "P=" << parts << " N=" << n;
    }
  }
}

TEST_P(EveryBackend, KeepsTheGatheredOrderWithoutAMask) {
  const std::vector<int64_t> positions = gathered_cyclic(20, 4);
  TokenOrder order(positions, /*reorder=*/false);
  order.attach(*backend_);
  EXPECT_TRUE(order.identity());
  EXPECT_EQ(order.positions, positions);
  std::vector<float> rows(20, 1.0f);
  rows[3] = 7.0f;
  BufferPtr buffer = upload(*backend_, rows);
  order.sort(Place::in(*buffer), 4);
  EXPECT_EQ(download<float>(*backend_, *buffer, rows.size()), rows);
}

// fp32 -> bf16 and fp16 round to nearest even (dtype.hpp's scalar conversions), 16 -> 32 bits is
// exact, bf16 <-> fp16 goes through fp32; strides of both sides are honoured.
TEST_P(EveryBackend, CopyTokensConvertsBetweenElementTypes) {
  const int64_t batch = 2, tokens = 5, heads = 3, width = 7;
  const int64_t count = batch * tokens * heads * width;
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    values[static_cast<size_t>(i)] =
        generated_value(3, TensorTag::q, static_cast<uint64_t>(i)) * (i % 5 == 0 ? 3e4f : 1.0f);
  BufferPtr source = upload(*backend_, values);
  const TokenTensor from = dense_token_tensor(*source, DType::f32, tokens, heads, width);
  const TokenBlock block{batch, tokens, heads, width};
  for (const DType dtype : {DType::bf16, DType::f16}) {
    BufferPtr narrow = backend_->allocate(count * 2);
    backend_->copy_tokens(from, dense_token_tensor(*narrow, dtype, tokens, heads, width), block);
    const std::vector<uint16_t> bits = download<uint16_t>(*backend_, *narrow, values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t expected =
          dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
      ASSERT_EQ(bits[i], expected) << dtype_name(dtype) << " element " << i;
    }
    // Back to fp32, into every other token of a wider buffer: exact.
    BufferPtr wide = backend_->allocate(2 * count * 4);
    backend_->fill_zero(Place::in(*wide), wide->bytes());
    TokenTensor spread = dense_token_tensor(*wide, DType::f32, 2 * tokens, heads, width);
    spread.token_stride *= 2;
    spread.batch_stride = 2 * tokens * heads * width;
    backend_->copy_tokens(dense_token_tensor(*narrow, dtype, tokens, heads, width), spread, block);
    const std::vector<float> back = download<float>(*backend_, *wide, 2 * values.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t e = 0; e < heads * width; ++e) {
          const float got =
              back[static_cast<size_t>(b * spread.batch_stride + t * spread.token_stride + e)];
          const float original = values[static_cast<size_t>((b * tokens + t) * heads * width + e)];
          ASSERT_EQ(got, round_to(dtype, original));
        }
    // bf16 <-> fp16: as if through fp32.
    const DType other = dtype == DType::bf16 ? DType::f16 : DType::bf16;
    BufferPtr crossed = backend_->allocate(count * 2);
    backend_->copy_tokens(dense_token_tensor(*narrow, dtype, tokens, heads, width),
                          dense_token_tensor(*crossed, other, tokens, heads, width), block);
    const std::vector<uint16_t> crossed_bits =
        download<uint16_t>(*backend_, *crossed, values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float through = round_to(dtype, values[i]);
      ASSERT_EQ(crossed_bits[i],
                other == DType::bf16 ? float_to_bf16(through) : float_to_f16(through));
    }
  }
}

TEST_P(EveryBackend, OperationsRefuseMemoryOutsideTheirBuffersAndOtherBackendsBuffers) {
  BufferPtr small = backend_->allocate(16);
  float four[4] = {1, 2, 3, 4};
  EXPECT_NO_THROW(backend_->upload(four, Place::in(*small), 16));
  try {
    backend_->upload(four, Place::in(*small, 4), 16);
    ADD_FAILURE() << "an upload past the end was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("outside the buffer of 16 bytes"), std::string::npos) << e.message();
  }
  const TokenTensor too_long = dense_token_tensor(*small, DType::f32, 5, 1, 1);
  EXPECT_THROW(backend_->copy_tokens(too_long, too_long, {1, 5, 1, 1}), Error);
  const std::unique_ptr<Backend> other = make_backend(GetParam() == "cpu" ? "fenced" : "cpu");
  BufferPtr foreign = other->allocate(16);
  try {
    backend_->add(Place::in(*small), Place::in(*foreign), 4);
    ADD_FAILURE() << "a buffer of another backend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("was passed to the " + GetParam() + " backend"), std::string::npos)
        << e.message();
  }
}

// Allocations are uninitialised; in the sanitizer build (and always on the fenced backend) their
// bytes are all ones, NaN in every float type, so a read of an element nobody wrote shows.
TEST_P(EveryBackend, FreshBuffersAreNaNWhereThePoisonIsOn) {
  BufferPtr buffer = backend_->allocate(64);
  const std::vector<float> values = download<float>(*backend_, *buffer, 16);
#ifndef A2D_POISON_UNINITIALIZED
  if (GetParam() == "cpu") GTEST_SKIP() << "the CPU backend poisons only in the sanitizer build";
#endif
  EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float x) { return std::isnan(x); }));
  backend_->fill_zero(Place::in(*buffer), 64);
  const std::vector<float> zeros = download<float>(*backend_, *buffer, 16);
  EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.0f; }));
}

// Every backend of this build that can run here (cuda only where a GPU is visible).
std::vector<std::string> runnable_backends() {
  std::vector<std::string> names;
  for (const std::string& name : backend_names()) {
    if (find_backend(name)->devices() > 0) names.push_back(name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Backends, EveryBackend, ::testing::ValuesIn(runnable_backends()));

TEST(FencedBackend, ItsBuffersHaveNoHostAddressAndAStrayReadCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the kernels' OpenMP threads may exist
  const std::unique_ptr<Backend> fenced = make_backend("fenced");
  EXPECT_FALSE(fenced->host_accessible());
  BufferPtr buffer = fenced->allocate(4096);
  EXPECT_EQ(buffer->host_data(), nullptr);
  std::byte* memory = backends::fenced_memory(*buffer);
  // Outside the backend's operations the memory is PROT_NONE: reading it is a segmentation fault.
  EXPECT_DEATH(
      {
        volatile std::byte value = memory[100];
        (void)value;
      },
      "");
  // Inside them it works, and afterwards it is fenced again.
  const float one = 1.0f;
  fenced->upload(&one, Place::in(*buffer, 100), 4);
  float back = 0;
  fenced->download(Place::in(*buffer, 100), &back, 4);
  EXPECT_EQ(back, 1.0f);
  EXPECT_DEATH(
      {
        volatile std::byte value = memory[100];
        (void)value;
      },
      "");
  // Host memory cannot be wrapped as its buffers.
  std::vector<float> host(4);
  EXPECT_THROW(fenced->wrap_host(host.data(), 16), Error);
}

// wrap_device's stand-in (the device path of the Python package on fenced-cuda): the caller's
// memory is copied into fenced memory the host may not touch, the backend's operations work on
// it, and it is written back when the buffer goes. Host backends have no device memory to wrap.
TEST(FencedBackend, WrapDeviceStandsInForACallersDeviceTensor) {
  const std::unique_ptr<Backend> fenced = make_backend("fenced-cuda");
  std::vector<float> caller{1.0f, 2.0f, 3.0f, 4.0f};
  {
    BufferPtr wrapped = fenced->wrap_device(caller.data(), 16);
    EXPECT_EQ(wrapped->host_data(), nullptr);
    EXPECT_EQ(wrapped->bytes(), 16);
    float read = 0;
    fenced->download(Place::in(*wrapped, 8), &read, 4);
    EXPECT_EQ(read, 3.0f);  // the caller's contents
    const float seven = 7.0f;
    fenced->upload(&seven, Place::in(*wrapped, 4), 4);
    fenced->fill_zero(Place::in(*wrapped, 12), 4);
    fenced->follow_stream(nullptr);  // the host backends order nothing: no effect
    fenced->lead_stream(nullptr);
    EXPECT_EQ(caller[1], 2.0f);  // not written back yet
  }
  EXPECT_EQ(caller, (std::vector<float>{1.0f, 7.0f, 3.0f, 0.0f}));
  std::vector<float> host(4);
  EXPECT_THROW(make_backend("cpu")->wrap_device(host.data(), 16), Error);
}

// "cuda:N" names a GPU; a malformed ordinal is refused, and without the CUDA backend (or a GPU)
// every cuda device is.
TEST(BackendNames, CudaTakesAnOrdinal) {
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:0x1", "cuda:1234567"}) {
    try {
      make_backend(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:N takes a GPU's ordinal"), std::string::npos)
          << e.what();
    }
  }
  if (find_backend("cuda")->devices() == 0) {
    EXPECT_THROW(make_backend("cuda:0"), Error);
  }
}

// The registry (backend.hpp): every backend made by name reports its entry's capabilities, and
// what they claim holds of its buffers; the defaults come from capabilities, not names.
TEST(BackendRegistry, MadeBackendsHaveTheirEntrysCapabilities) {
  for (const std::string& name : runnable_backends()) {
    const BackendEntry* entry = find_backend(name);
    ASSERT_NE(entry, nullptr) << name;
    const std::unique_ptr<Backend> backend = make_backend(name);
    EXPECT_EQ(backend->name(), name);
    const BackendCapabilities& c = backend->capabilities();
    const BackendCapabilities& e = entry->capabilities;
    EXPECT_EQ(c.host_accessible, e.host_accessible) << name;
    EXPECT_EQ(c.host_memory, e.host_memory) << name;
    EXPECT_EQ(c.cpu_kernels, e.cpu_kernels) << name;
    EXPECT_EQ(c.tensor_core_rounding, e.tensor_core_rounding) << name;
    EXPECT_EQ(c.native_comm, e.native_comm) << name;
    EXPECT_EQ(c.dtypes, e.dtypes) << name;
    EXPECT_EQ(c.head_dims, e.head_dims) << name;
    EXPECT_EQ(c.wraps_host, e.wraps_host) << name;
    EXPECT_EQ(c.wraps_device, e.wraps_device) << name;
    const BufferPtr buffer = backend->allocate(64);
    EXPECT_EQ(buffer->host_data() != nullptr, c.host_accessible) << name;
    EXPECT_EQ(backend->host_accessible(), c.host_accessible) << name;
    std::vector<float> host(16);
    if (c.wraps_host) {
      EXPECT_EQ(backend->wrap_host(host.data(), 64)->host_data(), host.data()) << name;
    } else {
      EXPECT_THROW(backend->wrap_host(host.data(), 64), Error) << name;
    }
    if (!c.wraps_device) {
      EXPECT_THROW(backend->wrap_device(host.data(), 64), Error) << name;
    }
    // Whatever head dimensions and dtypes the capabilities list, check_supported takes.
    for (const DType dtype : c.dtypes) {
      EXPECT_NO_THROW(
          backend->check_supported(dtype, c.head_dims.empty() ? 64 : c.head_dims[0], Mask{}, 0.0f))
          << name;
    }
  }
}

TEST(BackendRegistry, DefaultsAndLookUpsComeFromTheEntries) {
  EXPECT_EQ(default_dtype("cpu"), DType::f32);
  EXPECT_EQ(default_dtype("fenced"), DType::f32);
  EXPECT_EQ(default_dtype("fenced-cuda"), DType::bf16);
  EXPECT_EQ(default_dtype("cuda"), DType::bf16);
  EXPECT_EQ(default_dtype("cuda:1"), DType::bf16);
  EXPECT_EQ(default_dtype(""), DType::f32);
  EXPECT_EQ(default_dtype("tpu"), DType::f32);  // refused later, by make_backend
  EXPECT_EQ(find_backend("cuda:3"), find_backend("cuda"));
  EXPECT_EQ(find_backend("fenced:1"), nullptr);
  EXPECT_EQ(find_backend("tpu"), nullptr);
  // The CUDA kernels' rules: fenced-cuda refuses what cuda refuses.
  EXPECT_EQ(find_backend("fenced-cuda")->capabilities.dtypes,
            find_backend("cuda")->capabilities.dtypes);
  EXPECT_EQ(find_backend("fenced-cuda")->capabilities.head_dims,
            find_backend("cuda")->capabilities.head_dims);
  EXPECT_TRUE(find_backend("cuda")->capabilities.takes_head_dim(80));
  EXPECT_FALSE(find_backend("cuda")->capabilities.takes_head_dim(72));
  EXPECT_TRUE(find_backend("cpu")->capabilities.takes_head_dim(72));
  EXPECT_FALSE(find_backend("cuda")->capabilities.computes_in(DType::f32));
  // sim is made inside SimGrid only: known, not made by name.
  ASSERT_NE(find_backend("sim"), nullptr);
  EXPECT_EQ(find_backend("sim")->make, nullptr);
  const std::vector<std::string> names = backend_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "sim"), 0);
  try {
    make_backend("tpu");
    ADD_FAILURE() << "tpu was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device 'tpu'; choose cpu, cuda (an NVIDIA GPU), "
                                         "fenced (the test backend"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_backend("sim"), Error);
}

// Random inputs in [batch, tokens, heads, dim] fp32.
std::vector<float> random_values(int64_t count, TensorTag tag) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    v[static_cast<size_t>(i)] = generated_value(11, tag, static_cast<uint64_t>(i));
  return v;
}

// The kernels and data operations on the fenced backend give exactly the CPU backend's results.
TEST(FencedBackend, EveryOperationGivesTheCpuBackendsBits) {
  const std::unique_ptr<Backend> cpu = make_backend("cpu");
  const std::unique_ptr<Backend> fenced = make_backend("fenced");
  const int64_t batch = 2, heads = 4, kv_heads = 2, nq = 37, nk = 53, d = 24;
  const std::vector<float> q = random_values(batch * nq * heads * d, TensorTag::q);
  const std::vector<float> k = random_values(batch * nk * kv_heads * d, TensorTag::k);
  const std::vector<float> v = random_values(batch * nk * kv_heads * d, TensorTag::v);
  const std::vector<float> d_out = random_values(batch * nq * heads * d, TensorTag::d_out);
  std::vector<int64_t> q_pos(static_cast<size_t>(nq)), k_pos(static_cast<size_t>(nk));
  std::iota(q_pos.begin(), q_pos.end(), int64_t{20});
  std::iota(k_pos.begin(), k_pos.end(), int64_t{0});
  std::reverse(k_pos.begin(), k_pos.end());

  struct Results {
    std::vector<float> out, lse, acc, row_max, dq, dk, dv, delta, merged;
  };
  const auto run = [&](Backend& be, DType dtype) {
    const auto in_dtype = [&](const std::vector<float>& x, int64_t tokens, int64_t h) {
      BufferPtr f32 = upload(be, x);
      BufferPtr narrow = be.allocate(static_cast<int64_t>(x.size()) * dtype_bytes(dtype));
      be.copy_tokens(dense_token_tensor(*f32, DType::f32, tokens, h, d),
                     dense_token_tensor(*narrow, dtype, tokens, h, d), {batch, tokens, h, d});
      return narrow;
    };
    BufferPtr qb = in_dtype(q, nq, heads), kb = in_dtype(k, nk, kv_heads);
    BufferPtr vb = in_dtype(v, nk, kv_heads), dob = in_dtype(d_out, nq, heads);
    BufferPtr qp = upload_indices(be, q_pos), kp = upload_indices(be, k_pos);
    ForwardCall call;
    call.shape = {batch, heads, kv_heads, nq, nk, d};
    call.mask = Mask::causal();
    call.scale = default_scale(d);
    call.q = dense_token_tensor(*qb, dtype, nq, heads, d);
    call.k = dense_token_tensor(*kb, dtype, nk, kv_heads, d);
    call.v = dense_token_tensor(*vb, dtype, nk, kv_heads, d);
    call.q_positions = Place::in(*qp);
    call.kv_positions = Place::in(*kp);
    call.threads = 2;
    const int64_t q_elems = batch * nq * heads * d, rows = batch * heads * nq;
    BufferPtr out = be.allocate(q_elems * dtype_bytes(dtype)), lse = be.allocate(rows * 4);
    be.attention_forward(call, dense_token_tensor(*out, dtype, nq, heads, d),
                         dense_row_tensor(*lse, heads, nq));
    BufferPtr acc = be.allocate(q_elems * 4), mx = be.allocate(rows * 4),
              sm = be.allocate(rows * 4);
    const PartialTensor state{dense_token_tensor(*acc, DType::f32, nq, heads, d),
                              dense_row_tensor(*mx, heads, nq), dense_row_tensor(*sm, heads, nq)};
    be.attention_forward_partial(call, state, false);
    BackwardCall back;
    back.shape = call.shape;
    back.mask = call.mask;
    back.scale = call.scale;
    back.q = call.q;
    back.k = call.k;
    back.v = call.v;
    back.d_out = dense_token_tensor(*dob, dtype, nq, heads, d);
    back.lse = dense_row_tensor(*lse, heads, nq);
    back.out = dense_token_tensor(*out, dtype, nq, heads, d);
    back.q_positions = call.q_positions;
    back.kv_positions = call.kv_positions;
    back.threads = 2;
    BufferPtr dq = be.allocate(q_elems * 4), dk = be.allocate(batch * nk * kv_heads * d * 4),
              dv = be.allocate(batch * nk * kv_heads * d * 4);
    be.attention_backward(back, dense_token_tensor(*dq, DType::f32, nq, heads, d),
                          dense_token_tensor(*dk, DType::f32, nk, kv_heads, d),
                          dense_token_tensor(*dv, DType::f32, nk, kv_heads, d));
    BufferPtr delta = be.allocate(rows * 4);
    be.delta({batch, nq, heads, d}, back.out, back.d_out, dense_row_tensor(*delta, heads, nq));
    // Merge the partial state with itself as [max, sum, acc] records of one row each... as flat
    // records: a second state of the same rows, merged in.
    std::vector<float> records(static_cast<size_t>(rows * (d + 2)));
    for (int64_t r = 0; r < rows; ++r) {
      records[static_cast<size_t>(r * (d + 2))] = 0.1f * static_cast<float>(r % 7);
      records[static_cast<size_t>(r * (d + 2) + 1)] = 1.0f + static_cast<float>(r % 3);
      for (int64_t e = 0; e < d; ++e)
        records[static_cast<size_t>(r * (d + 2) + 2 + e)] = q[static_cast<size_t>(r * d + e)];
    }
    BufferPtr into = upload(be, records), from = upload(be, records);
    be.merge_partials(Place::in(*into), Place::in(*from), rows, d + 2);
    be.add(Place::in(*dq), Place::in(*dq), q_elems);
    Results r;
    std::vector<float> o_wide(static_cast<size_t>(q_elems));
    BufferPtr o32 = be.allocate(q_elems * 4);
    be.copy_tokens(back.out, dense_token_tensor(*o32, DType::f32, nq, heads, d),
                   {batch, nq, heads, d});
    r.out = download<float>(be, *o32, o_wide.size());
    r.lse = download<float>(be, *lse, static_cast<size_t>(rows));
    r.acc = download<float>(be, *acc, static_cast<size_t>(q_elems));
    r.row_max = download<float>(be, *mx, static_cast<size_t>(rows));
    r.dq = download<float>(be, *dq, static_cast<size_t>(q_elems));
    r.dk = download<float>(be, *dk, static_cast<size_t>(batch * nk * kv_heads * d));
    r.dv = download<float>(be, *dv, static_cast<size_t>(batch * nk * kv_heads * d));
    r.delta = download<float>(be, *delta, static_cast<size_t>(rows));
    r.merged = download<float>(be, *into, records.size());
    return r;
  };
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Results a = run(*cpu, dtype), b = run(*fenced, dtype);
    const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(a.out, b.out)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.lse, b.lse)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.acc, b.acc)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.row_max, b.row_max)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.dq, b.dq)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.dk, b.dk)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.dv, b.dv)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.delta, b.delta)) << dtype_name(dtype);
    EXPECT_TRUE(same(a.merged, b.merged)) << dtype_name(dtype);
    EXPECT_TRUE(std::all_of(a.lse.begin(), a.lse.end(), [](float x) { return !std::isnan(x); }));
  }
}

}  // namespace
}  // namespace a2d

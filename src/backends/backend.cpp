// What every backend shares: dense tensor descriptors, the factory, index uploads.
#include "attention2d/backend.hpp"

#include "attention2d/error.hpp"
#include "backends.hpp"

namespace a2d {

TokenTensor dense_token_tensor(Buffer& buffer, DType dtype, int64_t tokens, int64_t heads,
                               int64_t width, int64_t offset) {
  return {&buffer, offset, dtype, tokens * heads * width, heads * width, width};
}

RowTensor dense_row_tensor(Buffer& buffer, int64_t heads, int64_t tokens, int64_t offset) {
  return {&buffer, offset, heads * tokens, tokens, 1};
}

namespace {
class ReachedFence final : public Fence {
 public:
  void wait() override {}
};
}  // namespace

void Backend::upload_async(const void* host, Place to, int64_t bytes, const Fence* /*after*/) {
  upload(host, to, bytes);
}

std::unique_ptr<Fence> Backend::fence() {
  return std::make_unique<ReachedFence>();
}

BufferPtr Backend::wrap_host(void* /*memory*/, int64_t /*bytes*/) {
  A2D_FAIL("the ", name(), " backend cannot use host memory as its buffers; upload it instead");
}

BufferPtr Backend::wrap_device(void* /*memory*/, int64_t /*bytes*/) {
  A2D_FAIL("the ", name(), " backend has no device memory to wrap (device tensors need the cuda ",
           "backend)");
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names{"cpu", "fenced", "fenced-cuda"};
  if (cuda_backend_built()) names.push_back("cuda");
  return names;
}

bool cuda_backend_built() {
#ifdef A2D_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef A2D_WITH_CUDA
  return backends::cuda_device_count();
#else
  return 0;
#endif
}

std::string default_device(DType dtype) {
  return dtype != DType::f32 && cuda_device_count() > 0 ? "cuda" : "cpu";
}

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return backends::make_cpu_backend();
  if (device == "fenced") return backends::make_fenced_backend();
  if (device == "fenced-cuda") return backends::make_fenced_backend(/*cuda_rules=*/true);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int ordinal = -1;
    if (device != "cuda") {
      const std::string digits = device.substr(5);
      A2D_REQUIRE(!digits.empty() && digits.size() < 6 &&
                      digits.find_first_not_of("0123456789") == std::string::npos,
                  "unknown device '", device, "': cuda:N takes a GPU's ordinal N");
      ordinal = std::stoi(digits);
    }
#ifdef A2D_WITH_CUDA
    return backends::make_cuda_backend(ordinal);
#else
    (void)ordinal;
    A2D_FAIL(
        "--device cuda: this build has no CUDA backend (configure with -DA2D_WITH_CUDA=ON "
        "where a CUDA toolkit is installed); use --device cpu");
#endif
  }
  A2D_FAIL("unknown device '", device, "'; choose cpu, cuda (an NVIDIA GPU), fenced (the test ",
           "backend whose memory only its own operations may touch) or fenced-cuda (fenced, ",
           "refusing the kernel calls the CUDA backend refuses)");
}

BufferPtr upload_indices(Backend& backend, const std::vector<int64_t>& values) {
  const int64_t bytes = static_cast<int64_t>(values.size() * sizeof(int64_t));
  BufferPtr buffer = backend.allocate(bytes);
  backend.upload(values.data(), Place::in(*buffer), bytes);
  return buffer;
}

}  // namespace a2d

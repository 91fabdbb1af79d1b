// A build without Gloo (-DA2D_WITH_GLOO=OFF, or no libgloo-dev): the entry points of
// gloo_comm.hpp refuse, saying how to get them.
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "watchdog_link.hpp"

namespace a2d {
namespace {
constexpr const char* kNoGloo = "this build has no Gloo (install libgloo-dev and rebuild)";
}

bool gloo_built() {
  return false;
}

std::unique_ptr<Communicator> make_gloo_communicator(int /*rank*/, int /*size*/,
                                                     const AllGatherBytes& /*exchange*/,
                                                     const GlooOptions& /*options*/) {
  A2D_FAIL(kNoGloo);
}

namespace watchdog_detail {
std::unique_ptr<Link> make_gloo_link(Communicator& /*comm*/) {
  A2D_FAIL(kNoGloo);
}
}  // namespace watchdog_detail

}  // namespace a2d

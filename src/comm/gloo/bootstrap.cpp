// The Gloo communicator's bootstrap (gloo_comm.hpp, make_gloo_communicator): every rank opens
// its TCP device, the caller's exchange all-gathers each rank's card (the addresses of its
// connections, or why it could not open its device), and every rank connects the mesh.
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "comm/io_threads.hpp"
#include "communicator.hpp"
#include "mesh.hpp"

namespace a2d {
namespace {

using gloo_detail::GlooCommunicator;
using gloo_detail::kNoLimit;
using gloo_detail::kWorldId;
using gloo_detail::Mesh;
using gloo_detail::Milliseconds;

void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
}

std::string from_options(const std::string& given, std::initializer_list<const char*> variables) {
  if (!given.empty()) return given;
  for (const char* variable : variables) {
    const char* value = std::getenv(variable);
    if (value && *value) return value;
  }
  return "";
}

// What each rank contributes to the bootstrap all-gather: its rank, the size it was given, why it
// could not open its device ("" if it could), and the address of its connection to every rank.
struct Card {
  int32_t rank = -1;
  int32_t size = 0;
  std::string failure;
  std::vector<std::string> addresses;  // by rank; its own empty
};

constexpr char kCardMagic[] = "a2d-gloo-card-1";

void put(std::string& out, const std::string& field) {
  const auto n = static_cast<uint32_t>(field.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += field;
}

std::string encode(const Card& card) {
  std::string out(kCardMagic);
  out.append(reinterpret_cast<const char*>(&card.rank), sizeof card.rank);
  out.append(reinterpret_cast<const char*>(&card.size), sizeof card.size);
  put(out, card.failure);
  for (const std::string& address : card.addresses)
    put(out, address);
  return out;
}

// false if `text` is not a card of `size` ranks.
bool decode(const std::string& text, int size, Card& card) {
  size_t at = std::strlen(kCardMagic);
  if (text.compare(0, at, kCardMagic) != 0) return false;
  const auto take = [&](void* into, size_t n) {
    if (at + n > text.size()) return false;
    std::memcpy(into, text.data() + at, n);
    at += n;
    return true;
  };
  const auto field = [&](std::string& into) {
    uint32_t n = 0;
    if (!take(&n, sizeof n) || at + n > text.size()) return false;
    into.assign(text, at, n);
    at += n;
    return true;
  };
  if (!take(&card.rank, sizeof card.rank) || !take(&card.size, sizeof card.size)) return false;
  if (card.size != size || !field(card.failure)) return false;
  card.addresses.assign(static_cast<size_t>(size), "");
  for (std::string& address : card.addresses) {
    if (!field(address)) return false;
  }
  return at == text.size();
}

std::shared_ptr<Mesh> connect_mesh(int rank, int size, const AllGatherBytes& exchange,
                                   const GlooOptions& options) {
  ignore_sigpipe();
  Card mine;
  mine.rank = rank;
  mine.size = size;
  mine.addresses.assign(static_cast<size_t>(size), "");
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::transport::Context> context;
  std::vector<int> io_threads;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = from_options(options.hostname, {"A2D_GLOO_HOSTNAME"});
    attr.iface = from_options(options.interface, {"A2D_GLOO_INTERFACE", "GLOO_SOCKET_IFNAME"});
    {
      // The device's I/O thread, made here, starts under SCHED_BATCH (so it is told apart from
      // others); the mesh then switches it around posts and waits (comm/io_threads.hpp).
      const comm_detail::BatchThreadsCreatedHere batch(
          comm_detail::batch_io_threads(options.batch_io_thread));
      device = gloo::transport::tcp::CreateDevice(attr);
      io_threads = batch.created();
    }
    context = device->createContext(rank, size);
    // Gloo waits five times its context's timeout for a connection.
    context->setTimeout(Milliseconds(
        std::max<int64_t>(1, static_cast<int64_t>(options.connect_timeout_seconds * 1000 / 5))));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::vector<char> address = context->createPair(peer)->address().bytes();
      mine.addresses[static_cast<size_t>(peer)].assign(address.begin(), address.end());
    }
  } catch (const std::exception& e) {
    mine.failure = e.what();
    if (mine.failure.empty()) mine.failure = "unknown error";
  }
  const std::vector<std::string> cards = exchange(encode(mine));
  A2D_REQUIRE(static_cast<int>(cards.size()) == size, "the Gloo bootstrap's exchange returned ",
              cards.size(), " entries for ", size, " ranks");
  std::vector<Card> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    A2D_REQUIRE(decode(cards[static_cast<size_t>(r)], size, all[static_cast<size_t>(r)]) &&
                    all[static_cast<size_t>(r)].rank == r,
                "the Gloo bootstrap's exchange returned a bad entry at rank ", r,
                " (every rank must pass the same size, its own rank and its own bytes)");
  }
  for (int r = 0; r < size; ++r) {
    const Card& card = all[static_cast<size_t>(r)];
    A2D_REQUIRE(card.failure.empty(), "rank ", r, " could not open its Gloo device: ", card.failure,
                " (choose the address with GlooOptions::hostname or ::interface, or "
                "A2D_GLOO_HOSTNAME or A2D_GLOO_INTERFACE)");
  }
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string& address =
        all[static_cast<size_t>(peer)].addresses[static_cast<size_t>(rank)];
    try {
      context->getPair(peer)->connect(std::vector<char>(address.begin(), address.end()));
    } catch (const std::exception& e) {
      A2D_FAIL("could not connect to rank ", peer, " over Gloo: ", e.what());
    }
  }
  const Milliseconds wait_limit =
      options.timeout_seconds > 0
          ? Milliseconds(std::max<int64_t>(1, static_cast<int64_t>(options.timeout_seconds * 1000)))
          : kNoLimit;
  auto mesh = std::make_shared<Mesh>(rank, size, std::move(device), std::move(context), wait_limit,
                                     std::move(io_threads));
  mesh->post_notices();
  mesh->start_monitor();
  return mesh;
}

std::vector<int> everyone(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

}  // namespace

bool gloo_built() {
  return true;
}

std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size,
                                                     const AllGatherBytes& exchange,
                                                     const GlooOptions& options) {
  A2D_REQUIRE(size >= 1 && rank >= 0 && rank < size, "make_gloo_communicator: rank ", rank,
              " is not a rank of a group of ", size);
  A2D_REQUIRE(static_cast<bool>(exchange), "make_gloo_communicator needs an exchange function");
  A2D_REQUIRE(options.timeout_seconds >= 0 && options.connect_timeout_seconds > 0,
              "GlooOptions: timeout_seconds must be >= 0 and connect_timeout_seconds > 0");
  std::shared_ptr<Mesh> mesh = connect_mesh(rank, size, exchange, options);
  if (error_rank() < 0) set_error_rank(rank);
  auto world = std::make_unique<GlooCommunicator>(std::move(mesh), everyone(size), kWorldId);
  world->barrier();  // every rank has connected (and posted its notices)
  return world;
}

}  // namespace a2d

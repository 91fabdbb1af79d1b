// attention2d._core: the compiled part of the Python package (pybind11).
//
// Thin on purpose: the problem and plan as plain values, the planner and the cost model, the
// shard layout, and an Engine that holds one DistributedAttention (built once per problem, plan
// and communicator) through a Session (attention2d/session.hpp) on the CPU backend. Its
// transports: the caller's torch process group (a table of the group's operations from
// attention2d._c10d: group_comm.hpp), a Gloo mesh of its own (where the build has Gloo), an MPI
// communicator (where the build has MPI; mpi4py's handle), or this process alone. Tensors cross
// as (address, dtype, shape, strides) tuples read from numpy arrays or torch tensors by the
// pure-Python layer (python/attention2d), which also checks them collectively before any call;
// the engine wraps their memory without copying.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#ifdef A2D_WITH_MPI
#include <mpi.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention2d/attention.hpp"
#include "attention2d/backend.hpp"
#include "attention2d/collective.hpp"
#include "attention2d/cost_model.hpp"
#include "attention2d/error.hpp"
#include "attention2d/gloo_comm.hpp"
#include "attention2d/group_comm.hpp"
#include "attention2d/inference.hpp"
#include "attention2d/memory_check.hpp"
#include "attention2d/tools/harness.hpp"
#ifdef A2D_WITH_MPI
#include "attention2d/mpi_comm.hpp"
#endif
#include "attention2d/planner.hpp"
#include "attention2d/relayout.hpp"
#include "attention2d/session.hpp"
#include "attention2d/version.hpp"
#include "attention2d/watchdog.hpp"

namespace py = pybind11;
#include "engines.hpp"

namespace py = pybind11;
using namespace a2d::pymodule;  // the module binds the engines and transports of engines.hpp

PYBIND11_MODULE(_core, m) {
  m.doc() = "attention2d's compiled core (see the attention2d package)";
  m.attr("version") = A2D_VERSION_STRING;

  static py::exception<a2d::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const a2d::CollectiveError& e) {
      PyErr_SetString(error.ptr(), e.brief().c_str());
    } catch (const a2d::Error& e) {
      PyErr_SetString(error.ptr(), e.message().c_str());
    }
  });

  py::class_<a2d::Problem>(m, "Problem")
      .def(py::init<>())
      .def_readwrite("batch", &a2d::Problem::batch)
      .def_readwrite("heads", &a2d::Problem::heads)
      .def_readwrite("kv_heads", &a2d::Problem::kv_heads)
      .def_readwrite("seq", &a2d::Problem::seq)
      .def_readwrite("head_dim", &a2d::Problem::head_dim)
      .def_readwrite("scale", &a2d::Problem::scale)
      .def_property(
          "causal",
          [](const a2d::Problem& p) { return p.mask.is_causal(); },
          [](a2d::Problem& p, bool causal) {
            const auto documents = p.mask.doc_offsets;
            p.mask = causal ? (p.mask.window > 0 ? a2d::Mask::causal_window(p.mask.window)
                                                 : a2d::Mask::causal())
                            : a2d::Mask::none();
            p.mask.doc_offsets = documents;
          })
      .def_property(
          "window", [](const a2d::Problem& p) { return p.mask.window; },
          [](a2d::Problem& p, int64_t window) {
            A2D_REQUIRE(window >= 0, "window must be >= 0 (0: no window), got ", window);
            const bool causal = p.mask.is_causal();
            A2D_REQUIRE(window == 0 || causal,
                        "a window needs causal=True (the window is q - window < k <= q)");
            const auto documents = p.mask.doc_offsets;
            p.mask = window > 0 ? a2d::Mask::causal_window(window)
                                : (causal ? a2d::Mask::causal() : a2d::Mask::none());
            p.mask.doc_offsets = documents;
          })
      // Lengths of the packed documents ([] = one document, no document mask).
      .def_property(
          "documents",
          [](const a2d::Problem& p) {
            std::vector<int64_t> lengths;
            if (p.mask.doc_offsets) {
              const auto& offsets = *p.mask.doc_offsets;
              for (size_t d = 0; d + 1 < offsets.size(); ++d)
                lengths.push_back(offsets[d + 1] - offsets[d]);
            }
            return lengths;
          },
          [](a2d::Problem& p, const std::vector<int64_t>& lengths) {
            p.mask.doc_offsets.reset();
            if (!lengths.empty()) p.mask = p.mask.with_documents(lengths);
          })
      // The whole mask at once, through the library's one check of contradictions (make_mask),
      // in Python's words: window_size (left, right) or None, documents' lengths ([]: one),
      // ranges as (q0, q1, k0, k1, type) tuples or None.
      .def(
          "set_mask",
          [](a2d::Problem& p, bool causal, int64_t window,
             std::optional<std::pair<int64_t, int64_t>> window_size,
             const std::vector<int64_t>& documents,
             std::optional<std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>>>
                 ranges) {
            a2d::MaskOptions o;
            o.causal = causal;
            o.window = window;
            o.window_size_given = window_size.has_value();
            if (window_size) {
              o.window_left = window_size->first;
              o.window_right = window_size->second;
            }
            o.causal_sets_right = true;  // flash-attn: causal makes the right side 0
            o.doc_lengths = documents;
            o.ranges_given = ranges.has_value();
            if (ranges) {
              for (const auto& [q0, q1, k0, k1, type] : *ranges)
                o.ranges.push_back({q0, q1, k0, k1, static_cast<a2d::RangeType>(type)});
            }
            o.causal_name = "causal=True";
            o.window_name = "window";
            o.window_size_name = "window_size";
            o.documents_name = "cu_seqlens";
            o.ranges_name = "mask";
            p.mask = a2d::make_mask(o);
          },
          py::arg("causal"), py::arg("window"), py::arg("window_size"), py::arg("documents"),
          py::arg("ranges"))
      .def_property_readonly("window_size",
                             [](const a2d::Problem& p) {
                               return py::make_tuple(p.mask.window_left(), p.mask.window_right());
                             })
      .def_property_readonly("mask", [](const a2d::Problem& p) { return p.mask.describe(); })
      // The document boundaries' and slices' hash (Mask::digest): with mask, a cache key.
      .def_property_readonly("mask_digest", [](const a2d::Problem& p) { return p.mask.digest(); })
      .def_readwrite("sinks", &a2d::Problem::sinks)
      .def_readwrite("softcap", &a2d::Problem::softcap)
      .def_property(
          "dtype", [](const a2d::Problem& p) { return std::string(a2d::dtype_name(p.dtype)); },
          [](a2d::Problem& p, const std::string& name) { p.dtype = a2d::parse_dtype(name); })
      .def("validate", &a2d::Problem::validate)
      .def("describe", &a2d::Problem::describe)
      .def("__repr__", &a2d::Problem::describe);

  py::class_<a2d::Plan>(m, "Plan")
      .def(py::init<>())
      .def_property(
          "algorithm", [](const a2d::Plan& p) { return a2d::algorithm_name(p.algorithm); },
          [](a2d::Plan& p, const std::string& name) { p.algorithm = a2d::parse_algorithm(name); })
      .def_property(
          "grid", [](const a2d::Plan& p) { return py::make_tuple(p.grid.rows, p.grid.cols); },
          [](a2d::Plan& p, std::pair<int, int> g) {
            p.grid = {g.first, g.second};
          })
      .def_property(
          "layout", [](const a2d::Plan& p) { return a2d::layout_name(p.layout); },
          [](a2d::Plan& p, const std::string& name) { p.layout = a2d::parse_layout(name); })
      .def_readwrite("stripe", &a2d::Plan::stripe)
      .def_readwrite("kv_transpose", &a2d::Plan::kv_transpose)
      .def_readwrite("heads_parallel", &a2d::Plan::heads_parallel)
      .def_readwrite("threads", &a2d::Plan::threads)
      .def("describe", &a2d::Plan::describe)
      .def("__repr__", &a2d::Plan::describe);

  m.def("default_plan", [](const std::string& algo, const a2d::Problem& problem, int ranks) {
    return a2d::default_plan(a2d::parse_algorithm(algo), problem, ranks);
  });
  m.def("check_plan", &a2d::check_plan);
  // Every algorithm's name, in the table's order (src/table/): the tests' lists read it.
  m.def("algorithm_names", &a2d::algorithm_names);
  // The mask specification parser the command line uses (--mask-ranges): slices as (q0, q1, k0,
  // k1, type) tuples from a generator (prefix-lm:P, block-causal:B, random:S[:SEED]) or a file.
  m.def("parse_mask_ranges", [](const std::string& text, int64_t seq) {
    std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int>> out;
    for (const a2d::MaskSlice& s : a2d::parse_mask_ranges(text, seq))
      out.emplace_back(s.q0, s.q1, s.k0, s.k1, static_cast<int>(s.type));
    return out;
  });
  m.def("parse_range_type",
        [](const std::string& name) { return static_cast<int>(a2d::parse_range_type(name)); });
  m.def("check_grid",
        [](const std::string& grid, int ranks) { a2d::check_grid(a2d::parse_grid(grid), ranks); });
  m.def("default_calibration_file", &a2d::default_calibration_file);
  // The planner of `a2d plan` / `a2d run`: (plan, prediction, machine description).
  // shards_kind / shard_counts / shard_slots: the caller's layout ("" = the plan's own; slots as
  // the Engine takes them), which the model charges the exchanges to and from.
  m.def("choose_plan",
        [](const a2d::Problem& problem, int ranks, int ranks_per_node, const std::string& machine,
           const std::string& calibration, const std::string& machine_file, const std::string& algo,
           const std::string& grid, int heads_parallel, const std::string& shards_kind,
           const std::vector<int64_t>& shard_counts, const std::vector<int64_t>& shard_slots) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const auto shards =
              user_shards(shards_kind, shard_counts, problem.seq, ranks, shard_slots);
          const auto planned = a2d::choose_plan(problem, ranks, ranks_per_node, choice, algo, grid,
                                                heads_parallel, shards ? &*shards : nullptr);
          return py::make_tuple(planned.plan, prediction_dict(planned.prediction),
                                planned.machine_description);
        });
  // The plan of a request (planner.hpp's resolve_plan, as a2d run resolves its options): algo ""
  // and grid "" leave them to the cost model, heads_parallel 0 to the grid or the model.
  m.def("resolve_plan",
        [](const a2d::Problem& problem, int ranks, const std::string& algo,
           const std::string& grid, int heads_parallel, int threads, const std::string& machine,
           const std::string& calibration, const std::string& machine_file,
           const std::string& shards_kind, const std::vector<int64_t>& shard_counts,
           const std::vector<int64_t>& shard_slots) {
          a2d::PlanRequest request;
          request.algo = algo;
          request.grid = grid;
          request.heads_parallel = heads_parallel;
          request.threads = threads;
          request.machine = a2d::MachineChoice{machine, calibration, machine_file};
          const auto shards =
              user_shards(shards_kind, shard_counts, problem.seq, ranks, shard_slots);
          return a2d::resolve_plan(request, problem, ranks, nullptr, shards ? &*shards : nullptr);
        });
  // Every plan the model ranks, fastest first: [(plan, prediction)], and the skipped ones.
  m.def("search_plans",
        [](const a2d::Problem& problem, int ranks, int ranks_per_node, const std::string& machine,
           const std::string& calibration, const std::string& machine_file,
           const std::string& shards_kind, const std::vector<int64_t>& shard_counts) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const a2d::Machine chosen = choice.machine(ranks, problem.dtype);
          const auto shards = user_shards(shards_kind, shard_counts, problem.seq, ranks);
          const a2d::PlanSearch search = a2d::search_plans(
              problem, ranks, chosen, ranks_per_node, true, false, shards ? &*shards : nullptr);
          py::list ranked;
          for (const a2d::RankedPlan& r : search.ranked) {
            ranked.append(py::make_tuple(r.plan, prediction_dict(r.prediction)));
          }
          return py::make_tuple(ranked, search.skipped, chosen.name + ": " + chosen.description);
        });
  m.def("predict", [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks_per_node,
                      const std::string& machine, const std::string& calibration,
                      const std::string& machine_file) {
    const a2d::MachineChoice choice{machine, calibration, machine_file};
    const a2d::Machine chosen = choice.machine(plan.ranks(), problem.dtype);
    return prediction_dict(a2d::predict(problem, plan, chosen, ranks_per_node));
  });
  m.def("layout_tokens", [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks) {
    const a2d::TokenLayout layout(plan.layout, problem.seq, ranks, plan.stripe);
    std::vector<std::vector<int64_t>> parts;
    for (int part = 0; part < ranks; ++part)
      parts.push_back(layout.tokens_of(part));
    return parts;
  });
  // The bounds every distributed output meets against the fp64 reference on the rounded inputs
  // (relative Frobenius errors; harness.hpp): the tests use them.
  m.def("output_bounds", [](const std::string& dtype) {
    const a2d::OutputBounds b = a2d::output_bounds(a2d::parse_dtype(dtype));
    py::dict d;
    d["out"] = b.out;
    d["lse"] = b.lse;
    d["dq"] = b.dq;
    d["dk"] = b.dk;
    d["dv"] = b.dv;
    return d;
  });
  m.def("stop_watchdog", [] { g_watchdog.reset(); });

  // Decode (inference.hpp): the bytes rank `rank` sends in a step whose new tokens are owned
  // `counts` per rank, and the cost model's prediction of a step at a cache length.
  m.def("decode_step_traffic",
        [](const a2d::Problem& problem, const std::vector<int64_t>& counts, int rank) {
          const a2d::DecodeTraffic t = a2d::decode_step_traffic(problem, counts, rank);
          py::dict d;
          d["q_allgather_bytes"] = t.q_allgather.bytes;
          d["merge_bytes"] = t.merge.bytes;
          d["bytes"] = t.total().bytes;
          d["messages"] = t.total().messages;
          return d;
        });
  m.def("predict_decode_step",
        [](const a2d::Problem& problem, const a2d::Plan& plan, int ranks_per_node,
           const std::string& machine, const std::string& calibration,
           const std::string& machine_file, int64_t cached_tokens, int64_t tokens_per_step) {
          const a2d::MachineChoice choice{machine, calibration, machine_file};
          const a2d::Machine chosen = choice.machine(plan.grid.size(), problem.dtype);
          const a2d::DecodePrediction p = a2d::predict_decode_step(
              problem, plan, chosen, ranks_per_node, cached_tokens, tokens_per_step);
          py::dict d;
          d["step_s"] = p.step_s;
          d["kernel_s"] = p.kernel_s;
          d["comm_s"] = p.comm_s;
          d["bytes"] = p.traffic.bytes;
          d["messages"] = p.traffic.messages;
          d["cache_tokens"] = p.cache_tokens;
          d["cache_bytes"] = p.cache_bytes;
          return d;
        });
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def_static("mpi", &Transport::mpi,
                  "over an MPI communicator (a duplicate of it), from mpi4py's MPI._handleof(comm)")
      .def_static("group", &Transport::group,
                  "over the caller's process group: the capsule of attention2d._c10d.group_ops")
      .def_static("gloo", &Transport::gloo,
                  "collective: a full mesh of Gloo TCP connections among `size` ranks; "
                  "exchange(bytes) -> [every rank's bytes] carries the addresses once")
      .def_static("local", &Transport::local, "this process alone")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("kind", &Transport::kind)
      .def("allgather", &Transport::allgather)
      .def("start_watchdog", &Transport::start_watchdog, py::arg("timeout"),
           py::arg("idle_limit") = a2d::Watchdog::kDefaultIdleLimit,
           "collective: a watchdog over these ranks that aborts the job when a rank inside the "
           "library waited `timeout` seconds with no rank progressing (a rank alive outside the "
           "library is waited for up to `idle_limit` seconds)");
  m.def("gloo_built", &a2d::gloo_built);
  m.def("mpi_built", [] {
#ifdef A2D_WITH_MPI
    return true;
#else
    return false;
#endif
  });
  m.attr("group_ops_abi") = A2D_GROUP_OPS_ABI;
  // Every rank's global token indices (increasing) in a layout the caller brings.
  m.def("user_layout_tokens", [](const std::string& kind, int64_t seq, int ranks) {
    const a2d::TokenLayout layout(a2d::parse_layout(kind), seq, ranks);
    std::vector<std::vector<int64_t>> parts;
    for (int part = 0; part < ranks; ++part)
      parts.push_back(layout.tokens_of(part));
    return parts;
  });

  // One rank's global tokens in the caller's layout (contiguous with every rank's counts,
  // zigzag, cyclic), as the Engine reads it (caller_layout): runs (first token, stride, count)
  // in shard order, at most two (cyclic: one of stride P).
  m.def("caller_runs", [](const std::string& kind, const std::vector<int64_t>& counts,
                          int64_t seq, int ranks, int part) {
    const a2d::TokenLayout layout = caller_layout(kind, counts, seq, ranks);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
    if (layout.periodic()) {  // caller layouts are cyclic: stripes of one token
      if (layout.count(part) > 0) runs.emplace_back(part, ranks, layout.count(part));
      return runs;
    }
    for (const a2d::TokenLayout::Interval& run : layout.intervals(part))
      if (run.end > run.begin) runs.emplace_back(run.begin, 1, run.end - run.begin);
    return runs;
  });

  py::class_<DecoderEngine>(m, "DecoderEngine")
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, int64_t>())
      .def_property_readonly("rank", &DecoderEngine::rank)
      .def_property_readonly("size", &DecoderEngine::size)
      .def_property_readonly("sequence", &DecoderEngine::sequence)
      .def_property_readonly("capacity", &DecoderEngine::capacity)
      .def_property_readonly("reallocations", &DecoderEngine::reallocations)
      .def("counts", &DecoderEngine::counts)
      .def("positions", &DecoderEngine::positions)
      .def("prompt_tokens", &DecoderEngine::prompt_tokens)
      .def("next_step", &DecoderEngine::next_step)
      .def("prefill", &DecoderEngine::prefill)
      .def("step", &DecoderEngine::step);

  py::class_<Engine>(m, "Engine")
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, const std::string&, bool>(),
           py::arg("problem"), py::arg("plan"), py::arg("transport"), py::arg("device") = "cpu",
           py::arg("nccl") = false)
      .def(py::init<const a2d::Problem&, const a2d::Plan&, Transport&, const std::string&,
                    const std::vector<int64_t>&, const std::string&, bool,
                    const std::vector<int64_t>&>(),
           py::arg("problem"), py::arg("plan"), py::arg("transport"), py::arg("kind"),
           py::arg("counts"), py::arg("device") = "cpu", py::arg("nccl") = false,
           py::arg("slots") = std::vector<int64_t>{})
      .def_property_readonly("exchanges", &Engine::exchanges)
      .def_property_readonly("plan_tokens", &Engine::plan_tokens)
      .def_property_readonly("device", &Engine::device)
      .def("exchange_in", &Engine::exchange_in, py::arg("tokens"), py::arg("rows"),
           py::arg("backward"), py::arg("stream") = 0)
      .def("exchange_out", &Engine::exchange_out, py::arg("tokens"), py::arg("rows"),
           py::arg("backward"), py::arg("stream") = 0)
      .def_property_readonly("problem", &Engine::problem)
      .def_property_readonly("plan", &Engine::plan)
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("size", &Engine::size)
      .def("tokens", &Engine::tokens)
      .def("forward", &Engine::forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("lse"), py::arg("sinks"), py::arg("stream") = 0)
      .def("backward", &Engine::backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
           py::arg("d_out"), py::arg("lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
           py::arg("sinks"), py::arg("dsink"), py::arg("stream") = 0);
}

#include "attention2d/node_layout.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "attention2d/error.hpp"

namespace a2d {

namespace {

constexpr int64_t kMaxNames = 1000000;

// A whole decimal number of `text` at `pos` (digits only), advancing `pos`; nullopt if none.
std::optional<int64_t> read_number(const std::string& text, size_t& pos) {
  const size_t start = pos;
  int64_t value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    value = value * 10 + (text[pos] - '0');
    if (value > kMaxNames) return std::nullopt;
    ++pos;
  }
  if (pos == start) return std::nullopt;
  return value;
}

// Splits at the commas outside brackets.
std::vector<std::string> split_top_level(const std::string& text, const std::string& what) {
  std::vector<std::string> items;
  std::string item;
  int depth = 0;
  for (const char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    A2D_REQUIRE(depth >= 0 && depth <= 1, "cannot read the node list ", what,
                ": unbalanced or nested brackets");
    if (c == ',' && depth == 0) {
      items.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  A2D_REQUIRE(depth == 0, "cannot read the node list ", what, ": a '[' without its ']'");
  items.push_back(item);
  return items;
}

void expand_item(const std::string& item, const std::string& what, std::vector<std::string>& out) {
  const size_t open = item.find('[');
  if (open == std::string::npos) {
    out.push_back(item);
    return;
  }
  const size_t close = item.find(']', open);
  const std::string prefix = item.substr(0, open), ranges = item.substr(open + 1, close - open - 1);
  const std::string rest = item.substr(close + 1);
  std::vector<std::string> heads;
  std::stringstream list(ranges);
  std::string range;
  while (std::getline(list, range, ',')) {
    size_t pos = 0;
    const auto low = read_number(range, pos);
    const size_t width = pos;
    A2D_REQUIRE(low, "cannot read the node list ", what, ": '[", ranges,
                "]' needs numbers or ranges like 0-3");
    int64_t high = *low;
    if (pos < range.size() && range[pos] == '-') {
      ++pos;
      const auto upper = read_number(range, pos);
      A2D_REQUIRE(upper, "cannot read the node list ", what, ": '", range,
                  "' needs a number after '-'");
      high = *upper;
    }
    A2D_REQUIRE(pos == range.size(), "cannot read the node list ", what, ": '", range,
                "' is not a number or a range like 0-3");
    A2D_REQUIRE(high >= *low, "cannot read the node list ", what, ": the range '", range,
                "' descends");
    for (int64_t n = *low; n <= high; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      heads.push_back(prefix + digits);
      A2D_REQUIRE(static_cast<int64_t>(out.size() + heads.size()) <= kMaxNames, "the node list ",
                  what, " names more than ", kMaxNames, " nodes");
    }
  }
  A2D_REQUIRE(!ranges.empty() && !heads.empty(), "cannot read the node list ", what,
              ": empty brackets");
  for (const std::string& head : heads) {
    std::vector<std::string> tails;
    expand_item(rest, what, tails);
    for (const std::string& tail : tails)
      out.push_back(head + tail);
    A2D_REQUIRE(static_cast<int64_t>(out.size()) <= kMaxNames, "the node list ", what,
                " names more than ", kMaxNames, " nodes");
  }
}

// A positive whole number of a variable, or throws naming it.
int positive_variable(const char* name, const char* value) {
  const std::string text = value;
  size_t pos = 0;
  const auto number = read_number(text, pos);
  A2D_REQUIRE(number && pos == text.size() && *number >= 1, name,
              " must be a whole number of at least 1, got '", text, "'");
  return static_cast<int>(*number);
}

int optional_index(const char* name, const char* value) {
  if (!value) return -1;
  const std::string text = value;
  size_t pos = 0;
  const auto number = read_number(text, pos);
  A2D_REQUIRE(number && pos == text.size(), name, " must be a whole number, got '", text, "'");
  return static_cast<int>(*number);
}

}  // namespace

int NodeLayout::ranks() const {
  return std::accumulate(tasks_per_node.begin(), tasks_per_node.end(), 0);
}

int NodeLayout::uniform_tasks_per_node() const {
  if (tasks_per_node.empty()) return 0;
  for (const int tasks : tasks_per_node)
    if (tasks != tasks_per_node.front()) return 0;
  return tasks_per_node.front();
}

std::string NodeLayout::describe() const {
  std::ostringstream text;
  text << nodes() << (nodes() == 1 ? " node" : " nodes");
  if (const int per_node = uniform_tasks_per_node()) {
    text << " x " << per_node << (per_node == 1 ? " task" : " tasks");
  } else {
    text << " of ";
    for (size_t i = 0; i < tasks_per_node.size(); ++i)
      text << (i ? "," : "") << tasks_per_node[i];
    text << " tasks";
  }
  text << " (" << source;
  if (!node_names.empty()) {
    text << ": " << node_names.front();
    if (node_names.size() > 1) text << " .. " << node_names.back();
  }
  text << "), " << (cyclic ? "cyclic" : "block") << " placement";
  return text.str();
}

std::vector<int> parse_slurm_tasks_per_node(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    A2D_FAIL("cannot read SLURM_TASKS_PER_NODE '", text, "': ", why,
             " (expected counts like 2(x4) or 3,2(x2))");
  };
  if (text.empty()) bad("it is empty");
  std::vector<int> tasks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    size_t pos = 0;
    const auto count = read_number(item, pos);
    if (!count || *count < 1) bad("'" + item + "' needs a count of at least 1");
    int64_t repeat = 1;
    if (pos < item.size()) {
      if (item.compare(pos, 2, "(x") != 0) bad("'" + item + "' is not N or N(xM)");
      pos += 2;
      const auto times = read_number(item, pos);
      if (!times || *times < 1) bad("'" + item + "' needs a repeat of at least 1 after 'x'");
      if (pos + 1 != item.size() || item[pos] != ')') bad("'" + item + "' is not N or N(xM)");
      repeat = *times;
    }
    if (static_cast<int64_t>(tasks.size()) + repeat > kMaxNames) bad("too many nodes");
    tasks.insert(tasks.end(), static_cast<size_t>(repeat), static_cast<int>(*count));
  }
  if (text.back() == ',') bad("it ends with a comma");
  return tasks;
}

std::vector<std::string> expand_slurm_node_list(const std::string& text) {
  const std::string what = "'" + text + "'";
  A2D_REQUIRE(!text.empty(), "the node list is empty");
  std::vector<std::string> names;
  for (const std::string& item : split_top_level(text, what)) {
    A2D_REQUIRE(!item.empty(), "cannot read the node list ", what, ": an empty name");
    A2D_REQUIRE(item.front() != '[', "cannot read the node list ", what,
                ": a name must start before its '['");
    expand_item(item, what, names);
  }
  return names;
}

std::optional<NodeLayout> read_node_layout(const EnvironmentLookup& lookup) {
  const auto get = [&](const char* name) -> const char* {
    const char* value = lookup(name);
    return value && *value ? value : nullptr;
  };
  // mpirun: it placed the ranks, whatever Slurm allocated around it.
  const char* world = get("OMPI_COMM_WORLD_SIZE");
  const char* local = get("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (world && local) {
    const int ranks = positive_variable("OMPI_COMM_WORLD_SIZE", world);
    const int per_node = positive_variable("OMPI_COMM_WORLD_LOCAL_SIZE", local);
    NodeLayout layout;
    layout.source = "open mpi";
    // Open MPI tells each rank only its own node's count: nodes of per_node ranks, block, the
    // last node holding what is left.
    for (int left = ranks; left > 0; left -= per_node)
      layout.tasks_per_node.push_back(std::min(left, per_node));
    layout.local_id =
        optional_index("OMPI_COMM_WORLD_LOCAL_RANK", get("OMPI_COMM_WORLD_LOCAL_RANK"));
    const char* rank = get("OMPI_COMM_WORLD_RANK");
    if (rank) layout.node_id = optional_index("OMPI_COMM_WORLD_RANK", rank) / per_node;
    return layout;
  }
  // Slurm: the step's (srun) where there is one, else the job's (an sbatch script).
  const bool step = get("SLURM_STEP_TASKS_PER_NODE") != nullptr;
  const char* tasks_name = step ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const char* nodes_name = step ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  const char* list_name = step ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  const char* tasks = get(tasks_name);
  if (!tasks) return std::nullopt;
  NodeLayout layout;
  layout.source = "slurm";
  try {
    layout.tasks_per_node = parse_slurm_tasks_per_node(tasks);
  } catch (const Error& e) {
    A2D_FAIL(e.message(), step ? " (in SLURM_STEP_TASKS_PER_NODE)" : "");
  }
  if (const char* nodes = get(nodes_name)) {
    const int count = positive_variable(nodes_name, nodes);
    A2D_REQUIRE(count == layout.nodes(), tasks_name, "='", tasks, "' lists ", layout.nodes(),
                " nodes but ", nodes_name, "=", count);
  }
  if (const char* list = get(list_name)) {
    std::vector<std::string> names;
    try {
      names = expand_slurm_node_list(list);
    } catch (const Error& e) {
      A2D_FAIL(list_name, ": ", e.message());
    }
    A2D_REQUIRE(static_cast<int>(names.size()) == layout.nodes(), list_name, "='", list, "' names ",
                names.size(), " nodes but ", tasks_name, "='", tasks, "' lists ", layout.nodes());
    layout.node_names = std::move(names);
  }
  if (const char* distribution = get("SLURM_DISTRIBUTION")) {
    const std::string text = distribution;
    layout.cyclic = text.substr(0, text.find(':')) == "cyclic";
  }
  layout.node_id = optional_index("SLURM_NODEID", get("SLURM_NODEID"));
  layout.local_id = optional_index("SLURM_LOCALID", get("SLURM_LOCALID"));
  return layout;
}

std::optional<NodeLayout> read_node_layout() {
  return read_node_layout([](const char* name) { return std::getenv(name); });
}

}  // namespace a2d

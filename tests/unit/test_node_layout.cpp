// The launcher's node layout read from Slurm's and Open MPI's environment variables, without a
// launcher: the forms srun writes, and malformed values failing with the variable's name.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "attention2d/error.hpp"
#include "attention2d/node_layout.hpp"

namespace a2d {
namespace {

using Names = std::vector<std::string>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

TEST(SlurmTasksPerNode, Forms) {
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x4)"), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(parse_slurm_tasks_per_node("3,2(x2)"), (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(parse_slurm_tasks_per_node("1"), (std::vector<int>{1}));
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x1),1,4(x2)"), (std::vector<int>{2, 1, 4, 4}));
  EXPECT_EQ(parse_slurm_tasks_per_node("16"), (std::vector<int>{16}));
}

TEST(SlurmTasksPerNode, InvalidValuesSayWhatIsWrong) {
  for (const char* text : {"", "0", "2(x0)", "2(4)", "2(x4", "x4", "2,", ",2", "2,,2", "-1",
                           "2(x4)5", "two", "2 (x4)"}) {
    const std::string message = error_of([&] { parse_slurm_tasks_per_node(text); });
    EXPECT_NE(message.find("cannot read SLURM_TASKS_PER_NODE '" + std::string(text) + "'"),
              std::string::npos)
        << text << ": " << message;
  }
  EXPECT_NE(error_of([] { parse_slurm_tasks_per_node("2(x0)"); }).find("at least 1"),
            std::string::npos);
}

TEST(SlurmNodeList, Forms) {
  EXPECT_EQ(expand_slurm_node_list("h0"), (Names{"h0"}));
  EXPECT_EQ(expand_slurm_node_list("a2ds-h[0-3]"),
            (Names{"a2ds-h0", "a2ds-h1", "a2ds-h2", "a2ds-h3"}));
  EXPECT_EQ(expand_slurm_node_list("h[0-1,5],login"), (Names{"h0", "h1", "h5", "login"}));
  EXPECT_EQ(expand_slurm_node_list("n[08-10]"), (Names{"n08", "n09", "n10"}));
  EXPECT_EQ(expand_slurm_node_list("r[1-2]n[1-2]"), (Names{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_slurm_node_list("gpu[3]-ib"), (Names{"gpu3-ib"}));
  EXPECT_EQ(expand_slurm_node_list("a,b[1-2],c"), (Names{"a", "b1", "b2", "c"}));
}

TEST(SlurmNodeList, InvalidValuesSayWhatIsWrong) {
  for (const char* text : {"", "h[0-3", "h0-3]", "h[]", "h[3-1]", "h[a-b]", "h[1-]", "h[[1]]",
                           "a,,b", "[1-2]", "h[1-2000000]"}) {
    const std::string message = error_of([&] { expand_slurm_node_list(text); });
    EXPECT_NE(message.find("node list"), std::string::npos) << text << ": " << message;
  }
  EXPECT_NE(error_of([] { expand_slurm_node_list("h[3-1]"); }).find("descends"), std::string::npos);
}

struct FakeEnvironment {
  std::map<std::string, std::string> values;
  EnvironmentLookup lookup() const {
    return [this](const char* name) -> const char* {
      const auto it = values.find(name);
      return it == values.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(NodeLayout, SlurmStep) {
  FakeEnvironment env{{{"SLURM_STEP_NUM_NODES", "4"},
                       {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"},
                       {"SLURM_STEP_NODELIST", "a2ds-h[0-3]"},
                       {"SLURM_NNODES", "5"},  // the job's: the step's win
                       {"SLURM_TASKS_PER_NODE", "2(x5)"},
                       {"SLURM_NODEID", "1"},
                       {"SLURM_LOCALID", "0"}}};
  const auto layout = read_node_layout(env.lookup());
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->source, "slurm");
  EXPECT_EQ(layout->nodes(), 4);
  EXPECT_EQ(layout->ranks(), 8);
  EXPECT_EQ(layout->uniform_tasks_per_node(), 2);
  EXPECT_EQ(layout->node_names, (Names{"a2ds-h0", "a2ds-h1", "a2ds-h2", "a2ds-h3"}));
  EXPECT_FALSE(layout->cyclic);
  EXPECT_EQ(layout->node_id, 1);
  EXPECT_EQ(layout->local_id, 0);
  EXPECT_EQ(layout->describe(), "4 nodes x 2 tasks (slurm: a2ds-h0 .. a2ds-h3), block placement");
}

TEST(NodeLayout, SlurmJobUnevenAndCyclic) {
  FakeEnvironment env{{{"SLURM_NNODES", "3"},
                       {"SLURM_TASKS_PER_NODE", "3,2(x2)"},
                       {"SLURM_JOB_NODELIST", "n[1-3]"},
                       {"SLURM_DISTRIBUTION", "cyclic:block"}}};
  const auto layout = read_node_layout(env.lookup());
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->tasks_per_node, (std::vector<int>{3, 2, 2}));
  EXPECT_EQ(layout->uniform_tasks_per_node(), 0);
  EXPECT_TRUE(layout->cyclic);
  EXPECT_EQ(layout->describe(), "3 nodes of 3,2,2 tasks (slurm: n1 .. n3), cyclic placement");
}

TEST(NodeLayout, OpenMpiWinsOverSlurm) {
  FakeEnvironment env{{{"OMPI_COMM_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"OMPI_COMM_WORLD_RANK", "5"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"SLURM_TASKS_PER_NODE", "1"}}};
  const auto layout = read_node_layout(env.lookup());
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->source, "open mpi");
  EXPECT_EQ(layout->tasks_per_node, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(layout->node_id, 2);
  EXPECT_EQ(layout->local_id, 1);
}

TEST(NodeLayout, NoneOutsideALauncher) {
  FakeEnvironment env;
  EXPECT_FALSE(read_node_layout(env.lookup()));
}

TEST(NodeLayout, DisagreeingVariablesNameThem) {
  FakeEnvironment nodes{{{"SLURM_NNODES", "3"}, {"SLURM_TASKS_PER_NODE", "2(x4)"}}};
  EXPECT_NE(error_of([&] {
              read_node_layout(nodes.lookup());
            }).find("SLURM_TASKS_PER_NODE='2(x4)' lists 4 nodes but SLURM_NNODES=3"),
            std::string::npos);
  FakeEnvironment list{{{"SLURM_TASKS_PER_NODE", "2(x4)"}, {"SLURM_JOB_NODELIST", "h[0-2]"}}};
  EXPECT_NE(error_of([&] { read_node_layout(list.lookup()); }).find("names 3 nodes"),
            std::string::npos);
  FakeEnvironment malformed{{{"SLURM_STEP_TASKS_PER_NODE", "2(x"}}};
  EXPECT_NE(error_of([&] {
              read_node_layout(malformed.lookup());
            }).find("(in SLURM_STEP_TASKS_PER_NODE)"),
            std::string::npos);
  FakeEnvironment ompi{{{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}}};
  EXPECT_NE(error_of([&] {
              read_node_layout(ompi.lookup());
            }).find("OMPI_COMM_WORLD_LOCAL_SIZE must be a whole number of at least 1"),
            std::string::npos);
}

}  // namespace
}  // namespace a2d

// main() of the MPI test programs: MPI around GoogleTest, with only rank 0 printing the
// progress (every rank runs every test; verdicts are agreed collectively inside the tests).
#include <gtest/gtest.h>

#include "attention2d/mpi_comm.hpp"

int main(int argc, char** argv) {
  a2d::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  return failed;
}

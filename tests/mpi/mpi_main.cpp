// main() of the MPI test programs: MPI around GoogleTest, with only rank 0 printing the
// progress (every rank runs every test; verdicts are agreed collectively inside the tests).
#include <gtest/gtest.h>

#include <iostream>

#include "attention2d/error.hpp"
#include "attention2d/mpi_comm.hpp"
#include "mpi_checks.hpp"

int main(int argc, char** argv) {
  a2d::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  try {
    a2d::parse_test_settings(argc, argv);
  } catch (const a2d::Error& e) {
    if (mpi.rank() == 0) std::cerr << e.message() << "\n";
    return 2;
  }
  if (mpi.rank() == 0) std::cout << "settings: " << a2d::test_settings().describe() << "\n";
  if (mpi.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  a2d::end_test_worlds();
  return failed;
}

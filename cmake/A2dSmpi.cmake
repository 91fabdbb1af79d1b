# SimGrid's SMPI (Debian: libsimgrid-dev): the engine run inside a simulated cluster
# (docs/simulation.md).
#
# A2D_WITH_SMPI=ON configures a build *for* SMPI: the library and a2d compile against SMPI's
# mpi.h and link libsimgrid, a2d gains `a2d sim` and is linked as the shared object smpirun loads
# (what smpicxx does; smpicxx itself is not used, because its forced include redefines malloc,
# free and exit as macros, which C++ headers do not survive). Gloo, CUDA, Python, the AVX2 and
# AVX-512 kernel paths (no kernel runs), the tests and the benchmarks are off there.
#
# In an ordinary build, A2D_BUILD_SMPI (on where SimGrid is installed; off in the sanitizer and
# fuzzing builds) builds that variant beside it, as the external project <build>/smpi, so that
# `scripts/build.sh build` gives build/smpi/a2d and CTest runs a simulation (sim/CMakeLists.txt).
option(A2D_WITH_SMPI "This build runs inside SimGrid (SMPI): the library and a2d against SMPI, with a2d sim (docs/simulation.md)" OFF)

find_path(A2D_SMPI_INCLUDE_DIR smpi/mpi.h)
find_library(A2D_SIMGRID_LIBRARY simgrid)
find_program(A2D_SMPIRUN smpirun)
set(A2D_HAVE_SIMGRID OFF)
if(A2D_SMPI_INCLUDE_DIR AND A2D_SIMGRID_LIBRARY AND A2D_SMPIRUN)
  set(A2D_HAVE_SIMGRID ON)
endif()

if(A2D_WITH_SMPI)
  if(NOT A2D_HAVE_SIMGRID)
    message(FATAL_ERROR "A2D_WITH_SMPI needs SimGrid (apt-get install libsimgrid-dev: smpi/mpi.h, "
                        "libsimgrid, smpirun)")
  endif()
  foreach(off A2D_WITH_GLOO A2D_WITH_CUDA A2D_WITH_PYTHON A2D_WITH_AVX2 A2D_BUILD_TESTS
              A2D_BUILD_BENCH A2D_SANITIZE A2D_FUZZ)
    set(${off} OFF CACHE BOOL "off in an SMPI build" FORCE)
  endforeach()
  set(A2D_WITH_MPI ON CACHE BOOL "MPI is SMPI's here" FORCE)
  # smpirun dlopens the program: everything position-independent, a2d a shared object.
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  add_compile_definitions(A2D_SMPI=1)
  # SMPI's MPI in place of find_package(MPI): its headers (smpi/mpi.h as <mpi.h>) and libsimgrid.
  add_library(MPI::MPI_CXX INTERFACE IMPORTED)
  set_target_properties(MPI::MPI_CXX PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${A2D_SMPI_INCLUDE_DIR}/smpi;${A2D_SMPI_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${A2D_SIMGRID_LIBRARY}")
endif()

# After the targets exist: what the SMPI build adds to them.
function(a2d_smpi_targets)
  if(NOT A2D_WITH_SMPI)
    return()
  endif()
  target_sources(attention2d PRIVATE src/backends/sim/smpi_runtime.cpp)
  target_sources(a2d PRIVATE apps/a2d/sim_command.cpp apps/a2d/smpi_entry.cpp)
  target_compile_definitions(a2d PRIVATE A2D_WITH_SIM_COMMAND=1)
  # A shared object (-fPIC rather than the executables' -fPIE), as smpicxx links it.
  target_compile_options(a2d PRIVATE -fPIC)
  # Started by itself (not by smpirun), it says how to run it rather than crash: an entry point
  # and the dynamic loader's path (apps/a2d/smpi_entry.cpp).
  target_link_options(a2d PRIVATE -shared -Wl,-e,a2d_smpi_entry)
endfunction()

option(A2D_BUILD_SMPI "Also build the SMPI variant of a2d in <build>/smpi (needs libsimgrid-dev)"
       ${A2D_HAVE_SIMGRID})
set(A2D_SMPI_VARIANT OFF)
if(A2D_BUILD_SMPI AND NOT A2D_WITH_SMPI AND NOT A2D_SANITIZE AND NOT A2D_FUZZ)
  if(NOT A2D_HAVE_SIMGRID)
    message(FATAL_ERROR "A2D_BUILD_SMPI is on but SimGrid was not found (apt-get install "
                        "libsimgrid-dev, or configure with -DA2D_BUILD_SMPI=OFF)")
  endif()
  set(A2D_SMPI_VARIANT ON)
  include(ExternalProject)
  # The same sources, configured for SMPI (all of that build: the library, its tools and a2d).
  ExternalProject_Add(a2d_smpi
    SOURCE_DIR ${PROJECT_SOURCE_DIR}
    BINARY_DIR ${PROJECT_BINARY_DIR}/smpi
    CMAKE_ARGS -DA2D_WITH_SMPI=ON -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
               -DA2D_WERROR=${A2D_WERROR} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    INSTALL_COMMAND ""
    BUILD_ALWAYS ON)
endif()

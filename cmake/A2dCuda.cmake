# CUDA and NCCL are optional. A2D_WITH_CUDA=ON without a toolkit turns itself off with a message
# instead of failing the configure step.
if(A2D_WITH_CUDA)
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(WARNING "A2D_WITH_CUDA=ON but no CUDA compiler was found: building without CUDA")
    set(A2D_WITH_CUDA OFF)
  else()
    # The .cu files include the library's C++20 headers (backend.hpp, kernel.hpp). nvcc 12 and
    # later take -std=c++20, but CMake 3.25 (Debian 12) knows no CUDA20 dialect flag for nvcc:
    # the language is enabled as C++17 and the C++20 flag named after enable_language.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    find_library(A2D_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    find_path(A2D_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
    if(NOT A2D_NCCL_LIBRARY OR NOT A2D_NCCL_INCLUDE)
      message(WARNING "A2D_WITH_CUDA=ON but NCCL was not found: building without CUDA")
      set(A2D_WITH_CUDA OFF)
    endif()
  endif()
endif()

# sm_80 (A100) and sm_90 (H100/H200) by default; scripts/gpu/gpu_check.sh builds only what its GPU is.
set(A2D_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of the CUDA backend")

# The .cu sources are an object library of their own (a2d_cuda), so that they can be compiled,
# and checked, without building the rest of the library (scripts/test.sh does).
function(a2d_add_cuda_sources target)
  if(NOT A2D_WITH_CUDA)
    return()
  endif()
  # The CUDA backend (docs/gpu.md): 2 dtypes x 4 head dimensions of each attention kernel, for
  # sm_80 and sm_90. A2D_CUDA_PTXAS_VERBOSE=ON adds -Xptxas -v (registers and spills per kernel;
  # scripts/test.sh checks that the attention kernels spill nothing).
  add_library(a2d_cuda OBJECT
    ${PROJECT_SOURCE_DIR}/src/backends/cuda/device_info.cu
    ${PROJECT_SOURCE_DIR}/src/backends/cuda/backward.cu
    ${PROJECT_SOURCE_DIR}/src/backends/cuda/cuda_backend.cu
    ${PROJECT_SOURCE_DIR}/src/backends/cuda/data_ops.cu
    ${PROJECT_SOURCE_DIR}/src/backends/cuda/forward.cu)
  if(A2D_CUDA_PTXAS_VERBOSE)
    target_compile_options(a2d_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
  # nvcc's front end warns (#554) that the const-to-const conversion operators of kernel.hpp's
  # views are never called, which is true and intended (they exist for the non-const views).
  target_compile_options(a2d_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--diag-suppress=554>)
  # Host-side warnings of the .cu files are errors too, when the build asks for that.
  if(A2D_WERROR)
    target_compile_options(a2d_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
  set_target_properties(a2d_cuda PROPERTIES CUDA_ARCHITECTURES "${A2D_CUDA_ARCHITECTURES}"
                                            POSITION_INDEPENDENT_CODE ON)
  target_include_directories(a2d_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include
                                              ${PROJECT_SOURCE_DIR}/src
                                              ${PROJECT_BINARY_DIR}/generated
                                              ${A2D_NCCL_INCLUDE})
  target_link_libraries(a2d_cuda PRIVATE CUDA::cudart)
  target_compile_definitions(a2d_cuda PRIVATE A2D_WITH_CUDA=1)
  # The NCCL communicator (--comm nccl; plain C++ on the CUDA runtime and NCCL, built here so
  # that the CUDA step of scripts/test.sh compiles it too).
  if(A2D_WITH_MPI)
    target_sources(a2d_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src/comm/nccl_comm.cpp)
    target_link_libraries(a2d_cuda PRIVATE MPI::MPI_CXX a2d_warnings)
    target_compile_definitions(a2d_cuda PRIVATE A2D_WITH_MPI=1)
  endif()
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:a2d_cuda>)
  target_link_libraries(${target} PUBLIC CUDA::cudart ${A2D_NCCL_LIBRARY})
  target_compile_definitions(${target} PUBLIC A2D_WITH_CUDA=1)
endfunction()

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
    # nvcc compiles the .cu files as C++17: CMake 3.25 (Debian 12) knows no C++20 flag for nvcc.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_library(A2D_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    find_path(A2D_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
    if(NOT A2D_NCCL_LIBRARY OR NOT A2D_NCCL_INCLUDE)
      message(WARNING "A2D_WITH_CUDA=ON but NCCL was not found: building without CUDA")
      set(A2D_WITH_CUDA OFF)
    endif()
  endif()
endif()

# The .cu sources are an object library of their own (a2d_cuda), so that they can be compiled,
# and checked, without building the rest of the library (scripts/test.sh does).
function(a2d_add_cuda_sources target)
  if(NOT A2D_WITH_CUDA)
    return()
  endif()
  add_library(a2d_cuda OBJECT ${PROJECT_SOURCE_DIR}/src/kernels/cuda/device_info.cu)
  set_target_properties(a2d_cuda PROPERTIES CUDA_ARCHITECTURES "80;90"
                                            POSITION_INDEPENDENT_CODE ON)
  target_include_directories(a2d_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include
                                              ${A2D_NCCL_INCLUDE})
  target_link_libraries(a2d_cuda PRIVATE CUDA::cudart)
  target_compile_definitions(a2d_cuda PRIVATE A2D_WITH_CUDA=1)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:a2d_cuda>)
  target_link_libraries(${target} PUBLIC CUDA::cudart ${A2D_NCCL_LIBRARY})
  target_compile_definitions(${target} PUBLIC A2D_WITH_CUDA=1)
endfunction()

# The AVX2/FMA kernel path: its sources are compiled with -mavx2 -mfma -mf16c (and only they; F16C
# converts fp16 inputs and outputs, and the run-time check requires it with AVX2 and FMA) into the
# object library attention2d_avx2, and the library picks the path at run time
# (src/backends/cpu/kernels/dispatch.cpp), so one binary runs on CPUs with and without AVX2. Only for
# x86-64 with GCC or Clang; elsewhere the portable path is all there is.
set(A2D_HAVE_AVX2_PATH OFF)
if(A2D_WITH_AVX2 AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$"
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(A2D_HAVE_AVX2_PATH ON)
endif()

# a2d_add_avx2_sources(target files...): builds the files with the AVX2 flags into
# attention2d_avx2 and links its objects into `target`; without the AVX2 path, does nothing but
# tell `target` so.
function(a2d_add_avx2_sources target)
  if(NOT A2D_HAVE_AVX2_PATH)
    target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX2_PATH=0)
    return()
  endif()
  add_library(attention2d_avx2 OBJECT ${ARGN})
  target_compile_options(attention2d_avx2 PRIVATE -mavx2 -mfma -mf16c)
  target_compile_definitions(attention2d_avx2 PRIVATE A2D_HAVE_AVX2_PATH=1
                                                      A2D_HAVE_AVX512_PATH=$<BOOL:${A2D_HAVE_AVX512_PATH}>)
  target_include_directories(attention2d_avx2 PRIVATE
    $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
  target_link_libraries(attention2d_avx2 PRIVATE OpenMP::OpenMP_CXX a2d_warnings)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:attention2d_avx2>)
  target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX2_PATH=1)
endfunction()

# The AVX-512 kernel path (Zen 4/5, Intel since Skylake-SP): the same kernels on 16-lane vectors,
# compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c into the object library
# attention2d_avx512 wherever the AVX2 path is built (and the compiler takes the flags), and chosen
# at run time on CPUs that have those features (dispatch.cpp).
include(CheckCXXCompilerFlag)
set(A2D_AVX512_FLAGS -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c)
set(A2D_HAVE_AVX512_PATH OFF)
if(A2D_HAVE_AVX2_PATH)
  check_cxx_compiler_flag("-mavx512f -mavx512bw -mavx512dq -mavx512vl" A2D_COMPILER_TAKES_AVX512)
  if(A2D_COMPILER_TAKES_AVX512)
    set(A2D_HAVE_AVX512_PATH ON)
  endif()
endif()

# a2d_add_avx512_sources(target files...): as a2d_add_avx2_sources, for the AVX-512 files.
function(a2d_add_avx512_sources target)
  if(NOT A2D_HAVE_AVX512_PATH)
    target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX512_PATH=0)
    return()
  endif()
  add_library(attention2d_avx512 OBJECT ${ARGN})
  target_compile_options(attention2d_avx512 PRIVATE ${A2D_AVX512_FLAGS})
  target_compile_definitions(attention2d_avx512 PRIVATE A2D_HAVE_AVX2_PATH=1
                                                        A2D_HAVE_AVX512_PATH=1)
  target_include_directories(attention2d_avx512 PRIVATE
    $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
  target_link_libraries(attention2d_avx512 PRIVATE OpenMP::OpenMP_CXX a2d_warnings)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:attention2d_avx512>)
  target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX512_PATH=1)
endfunction()

# The AMX kernel path (Intel Sapphire Rapids and later): the AVX-512 kernels, and for bf16 inputs a
# forward on AMX tiles (src/backends/cpu/kernels/amx/), compiled with the AVX-512 flags and
# -mamx-tile -mamx-bf16 -mavx512bf16 into attention2d_amx wherever the AVX-512 path is built and the
# compiler takes the flags, and chosen at run time on CPUs that have AMX-TILE, AMX-BF16 and
# AVX512-BF16 once Linux grants the process the tile state (dispatch.cpp).
set(A2D_AMX_FLAGS ${A2D_AVX512_FLAGS} -mamx-tile -mamx-bf16 -mavx512bf16)
set(A2D_HAVE_AMX_PATH OFF)
if(A2D_HAVE_AVX512_PATH)
  check_cxx_compiler_flag("-mamx-tile -mamx-bf16 -mavx512bf16" A2D_COMPILER_TAKES_AMX)
  if(A2D_COMPILER_TAKES_AMX)
    set(A2D_HAVE_AMX_PATH ON)
  endif()
endif()

# a2d_add_amx_sources(target files...): as a2d_add_avx512_sources, for the AMX files.
function(a2d_add_amx_sources target)
  if(NOT A2D_HAVE_AMX_PATH)
    target_compile_definitions(${target} PRIVATE A2D_HAVE_AMX_PATH=0)
    return()
  endif()
  add_library(attention2d_amx OBJECT ${ARGN})
  target_compile_options(attention2d_amx PRIVATE ${A2D_AMX_FLAGS})
  target_compile_definitions(attention2d_amx PRIVATE A2D_HAVE_AVX2_PATH=1 A2D_HAVE_AVX512_PATH=1
                                                     A2D_HAVE_AMX_PATH=1)
  target_include_directories(attention2d_amx PRIVATE
    $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
  target_link_libraries(attention2d_amx PRIVATE OpenMP::OpenMP_CXX a2d_warnings)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:attention2d_amx>)
  target_compile_definitions(${target} PRIVATE A2D_HAVE_AMX_PATH=1)
endfunction()

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

# _a2d_add_path_objects(target path have flags files...): builds the files with `flags` (a list)
# into the object library attention2d_<path>, with every path macro this one implies defined to 1
# (the paths nest: amx and avx512bf16 need avx512, avx512 needs avx2), links its objects into `target` and
# defines A2D_HAVE_<PATH>_PATH=1 there; without the path (`have` false), only defines it to 0.
function(_a2d_add_path_objects target path have flags)
  string(TOUPPER "${path}" upper)
  if(NOT have)
    target_compile_definitions(${target} PRIVATE A2D_HAVE_${upper}_PATH=0)
    return()
  endif()
  set(implied A2D_HAVE_AVX2_PATH=1)
  if(path STREQUAL "avx2")
    list(APPEND implied A2D_HAVE_AVX512_PATH=$<BOOL:${A2D_HAVE_AVX512_PATH}>)
  else()
    list(APPEND implied A2D_HAVE_AVX512_PATH=1)
  endif()
  if(path STREQUAL "amx" OR path STREQUAL "avx512bf16")
    list(APPEND implied A2D_HAVE_${upper}_PATH=1)
  endif()
  add_library(attention2d_${path} OBJECT ${ARGN})
  target_compile_options(attention2d_${path} PRIVATE ${flags})
  target_compile_definitions(attention2d_${path} PRIVATE ${implied})
  target_include_directories(attention2d_${path} PRIVATE
    $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
  target_link_libraries(attention2d_${path} PRIVATE OpenMP::OpenMP_CXX a2d_warnings)
  target_sources(${target} PRIVATE $<TARGET_OBJECTS:attention2d_${path}>)
  target_compile_definitions(${target} PRIVATE A2D_HAVE_${upper}_PATH=1)
endfunction()

# a2d_add_avx2_sources(target files...): builds the files with the AVX2 flags into
# attention2d_avx2 and links its objects into `target`; without the AVX2 path, does nothing but
# tell `target` so.
function(a2d_add_avx2_sources target)
  _a2d_add_path_objects(${target} avx2 "${A2D_HAVE_AVX2_PATH}" "-mavx2;-mfma;-mf16c" ${ARGN})
endfunction()

# The AVX-512 kernel path (Zen 4/5, Intel since Skylake-SP): the same kernels on 16-lane vectors,
# compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c into the object library
# attention2d_avx512 wherever the AVX2 path is built (and the compiler takes the flags), and chosen
# at run time on CPUs that have those features (dispatch.cpp).
include(CheckCXXCompilerFlag)
# _a2d_path_if_compiler_takes(path parent flags): A2D_HAVE_<PATH>_PATH ON where the path it
# nests in (`parent`) is built and the compiler takes `flags` (a string), else OFF.
macro(_a2d_path_if_compiler_takes path parent flags)
  string(TOUPPER "${path}" _a2d_upper)
  set(A2D_HAVE_${_a2d_upper}_PATH OFF)
  if(${parent})
    check_cxx_compiler_flag("${flags}" A2D_COMPILER_TAKES_${_a2d_upper})
    if(A2D_COMPILER_TAKES_${_a2d_upper})
      set(A2D_HAVE_${_a2d_upper}_PATH ON)
    endif()
  endif()
endmacro()

set(A2D_AVX512_FLAGS -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma -mf16c)
_a2d_path_if_compiler_takes(avx512 A2D_HAVE_AVX2_PATH "-mavx512f -mavx512bw -mavx512dq -mavx512vl")

# a2d_add_avx512_sources(target files...): as a2d_add_avx2_sources, for the AVX-512 files.
function(a2d_add_avx512_sources target)
  _a2d_add_path_objects(${target} avx512 "${A2D_HAVE_AVX512_PATH}" "${A2D_AVX512_FLAGS}" ${ARGN})
endfunction()

# The AMX kernel path (Intel Sapphire Rapids and later): the AVX-512 kernels, and for bf16 inputs
# the bf16 kernels on AMX tiles (src/backends/cpu/kernels/amx/), compiled with the AVX-512 flags and
# -mamx-tile -mamx-bf16 -mavx512bf16 into attention2d_amx wherever the AVX-512 path is built and the
# compiler takes the flags, and chosen at run time on CPUs that have AMX-TILE, AMX-BF16 and
# AVX512-BF16 once Linux grants the process the tile state (dispatch.cpp).
set(A2D_AMX_FLAGS ${A2D_AVX512_FLAGS} -mamx-tile -mamx-bf16 -mavx512bf16)
_a2d_path_if_compiler_takes(amx A2D_HAVE_AVX512_PATH "-mamx-tile -mamx-bf16 -mavx512bf16")

# a2d_add_amx_sources(target files...): as a2d_add_avx2_sources, for the AMX files.
function(a2d_add_amx_sources target)
  _a2d_add_path_objects(${target} amx "${A2D_HAVE_AMX_PATH}" "${A2D_AMX_FLAGS}" ${ARGN})
endfunction()

# The AVX512-BF16 kernel path (AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids): the
# AVX-512 kernels, and for bf16 inputs the bf16 kernels with VDPBF16PS products
# (src/backends/cpu/kernels/avx512bf16/), compiled with the AVX-512 flags and -mavx512bf16 into
# attention2d_avx512bf16 wherever the AVX-512 path is built and the compiler takes the flag, and
# chosen at run time on CPUs that have AVX512-BF16 (dispatch.cpp).
set(A2D_AVX512BF16_FLAGS ${A2D_AVX512_FLAGS} -mavx512bf16)
_a2d_path_if_compiler_takes(avx512bf16 A2D_HAVE_AVX512_PATH "-mavx512bf16")

# a2d_add_avx512bf16_sources(target files...): as a2d_add_avx2_sources, for the AVX512-BF16 files.
function(a2d_add_avx512bf16_sources target)
  _a2d_add_path_objects(${target} avx512bf16 "${A2D_HAVE_AVX512BF16_PATH}"
                        "${A2D_AVX512BF16_FLAGS}" ${ARGN})
endfunction()

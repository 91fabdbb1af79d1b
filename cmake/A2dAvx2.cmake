# The AVX2/FMA kernel path: its sources are compiled with -mavx2 -mfma (and only they), and the
# library picks the path at run time (src/kernels/cpu/dispatch.cpp), so one binary runs on CPUs
# with and without AVX2. Only for x86-64 with GCC or Clang; elsewhere the portable path is all.
set(A2D_HAVE_AVX2_PATH OFF)
if(A2D_WITH_AVX2 AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$"
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set(A2D_HAVE_AVX2_PATH ON)
endif()

# a2d_add_avx2_sources(target files...): adds the files with the AVX2 flags, or nothing.
function(a2d_add_avx2_sources target)
  if(A2D_HAVE_AVX2_PATH)
    target_sources(${target} PRIVATE ${ARGN})
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
    target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX2_PATH=1)
  else()
    target_compile_definitions(${target} PRIVATE A2D_HAVE_AVX2_PATH=0)
  endif()
endfunction()

# Compiler warnings and the sanitizer build, as an interface target every target links.
add_library(a2d_warnings INTERFACE)
target_compile_options(a2d_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
# GCC 12 reports false -Wrestrict positives inside libstdc++'s std::string concatenation at -O2
# and above (GCC bug 105329, fixed in GCC 13); they are not in our code.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(a2d_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(A2D_WERROR)
  target_compile_options(a2d_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

# Error messages name files relative to the repository.
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${CMAKE_SOURCE_DIR}/=>)

if(A2D_SANITIZE)
  set(A2D_SANITIZER_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer
      -fno-sanitize-recover=undefined)
  add_compile_options(${A2D_SANITIZER_FLAGS})
  add_link_options(${A2D_SANITIZER_FLAGS})
  # Uninitialised algorithm buffers start as NaN here (src/algorithms/records.hpp), so that the
  # tests see a read of an element nothing wrote.
  add_compile_definitions(A2D_POISON_UNINITIALIZED)
  # The tests' own code and the command-line program's option and output code are built with
  # -Og here: instrumented at -O2, GoogleTest's assertion macros and the CLI's option tables made
  # those files 3-4x slower to compile than the library (86 s against 31 s for the cost model's
  # tests, then one file), which made this build the longest step of the suite. The
  # library, its tools and the reference they call stay at the build type's level, so the tests
  # run the same optimised instrumented code as before.
  set(A2D_SANITIZER_GLUE_FLAGS $<$<COMPILE_LANGUAGE:CXX>:-Og>)
endif()

# Fuzzing build (scripts/dev/fuzz.sh): clang's coverage instrumentation everywhere, with ASan and
# UBSan; the fuzz executables link libFuzzer.
option(A2D_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)
if(A2D_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "A2D_FUZZ needs clang: configure with CXX=clang++")
  endif()
  # Sanitizer instrumentation stops some `omp simd` loops from vectorising; that is expected here.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -Wno-pass-failed)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(A2D_POISON_UNINITIALIZED)
endif()

# Compiler warnings and the sanitizer build, as an interface target every target links.
add_library(a2d_warnings INTERFACE)
target_compile_options(a2d_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
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
endif()

# The Python package (python/): needs MPI, Python 3 with its development headers, pybind11 and
# mpi4py. Debian's interpreter (/usr/bin/python3, where python3-torch, python3-mpi4py and
# python3-pybind11 live) is preferred over whatever `python3` is first on PATH. Without one of
# them the package is not built and the configure log says which one is missing.
set(A2D_HAVE_PYTHON OFF)
if(A2D_WITH_PYTHON)
  if(NOT A2D_WITH_MPI)
    message(STATUS "attention2d: Python package off (it needs A2D_WITH_MPI)")
    return()
  endif()
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python COMPONENTS Interpreter Development.Module)
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 CONFIG QUIET)
  if(NOT Python_FOUND OR NOT pybind11_FOUND)
    message(STATUS "attention2d: Python package off (needs Python 3 headers and pybind11: "
                   "apt-get install python3-dev pybind11-dev)")
    return()
  endif()
  execute_process(COMMAND ${Python_EXECUTABLE} -c "import mpi4py; print(mpi4py.get_include())"
                  OUTPUT_VARIABLE A2D_MPI4PY_INCLUDE OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE mpi4py_missing ERROR_QUIET)
  if(mpi4py_missing)
    message(STATUS "attention2d: Python package off (no mpi4py for ${Python_EXECUTABLE}: "
                   "apt-get install python3-mpi4py)")
    return()
  endif()
  set(A2D_HAVE_PYTHON ON)
  # The extension module links the static library into a shared object.
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
endif()

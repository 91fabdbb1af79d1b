# The Python package (python/): Python 3 with its development headers and pybind11; where the
# interpreter has torch, also the extension built against it (attention2d._c10d: the caller's
# process group as the transport). MPI (the mpi4py path) is optional.
#
# The interpreter: -DPython_EXECUTABLE=..., else the project's virtual environment (.venv/, made
# by scripts/venv.sh: torch 2.11 from PyPI), else Debian's /usr/bin/python3. Without Python's
# headers or pybind11 the package is not built and the configure log says which one is missing.
set(A2D_HAVE_PYTHON OFF)
set(A2D_HAVE_TORCH_EXTENSION OFF)
if(A2D_WITH_PYTHON)
  if(NOT DEFINED Python_EXECUTABLE)
    if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
      set(Python_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    elseif(EXISTS /usr/bin/python3)
      set(Python_EXECUTABLE /usr/bin/python3)
    endif()
  endif()
  find_package(Python COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    execute_process(COMMAND ${Python_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir())"
                    OUTPUT_VARIABLE a2d_pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(a2d_pybind11_dir)
      set(pybind11_DIR ${a2d_pybind11_dir})
    endif()
  endif()
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 CONFIG QUIET)
  if(NOT Python_FOUND OR NOT pybind11_FOUND)
    message(STATUS "attention2d: Python package off (needs Python 3 headers and pybind11: "
                   "scripts/venv.sh, or apt-get install python3-dev pybind11-dev)")
    return()
  endif()
  set(A2D_HAVE_PYTHON ON)
  # The extension module links the static library into a shared object.
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)

  # torch, as installed for this interpreter. Read with -E (no PYTHONPATH) and the interpreter's own
  # site-packages on the path, so that a `pip install` with build isolation (whose build
  # environment hides the target's packages) still builds against the torch the package will
  # run with: a torch extension must match its torch release exactly.
  option(A2D_WITH_TORCH_EXTENSION "Build attention2d._c10d against the interpreter's torch" ON)
  if(A2D_WITH_TORCH_EXTENSION)
    execute_process(
      COMMAND ${Python_EXECUTABLE} -E -c "
import sys, sysconfig
sys.path[:0] = [sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]
import torch, torch.utils.cpp_extension as ext
print(torch.__version__.split('+')[0])
print(','.join(ext.include_paths()))
print(','.join(ext.library_paths()))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
      OUTPUT_VARIABLE a2d_torch OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE a2d_torch_missing ERROR_QUIET)
    if(a2d_torch_missing)
      message(STATUS "attention2d: no torch for ${Python_EXECUTABLE}: attention2d._c10d not built")
    else()
      string(REPLACE "\n" ";" a2d_torch "${a2d_torch}")
      list(GET a2d_torch 0 A2D_TORCH_VERSION)
      list(GET a2d_torch 1 A2D_TORCH_INCLUDE)
      list(GET a2d_torch 2 A2D_TORCH_LIBRARY_DIR)
      list(GET a2d_torch 3 A2D_TORCH_CXX11_ABI)
      string(REPLACE "," ";" A2D_TORCH_INCLUDE "${A2D_TORCH_INCLUDE}")
      string(REPLACE "," ";" A2D_TORCH_LIBRARY_DIR "${A2D_TORCH_LIBRARY_DIR}")
      set(A2D_HAVE_TORCH_EXTENSION ON)
      message(STATUS "attention2d: torch ${A2D_TORCH_VERSION} for ${Python_EXECUTABLE}: "
                     "attention2d._c10d built against it")
    endif()
  endif()
endif()

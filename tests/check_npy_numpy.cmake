# SPDX-License-Identifier: BSD-3-Clause
# ctest npy_numpy_interop: dpmlp's npy files against numpy, both ways.
#   cmake -DEXE=<test_npy> -DSCRIPT=<tests/check_npy_numpy.py> -DDIR=<scratch dir> -P check_npy_numpy.cmake
# 1. test_npy [numpy-write] writes models, arrays and a manifest into DIR/from_cpp;
# 2. python3 check_npy_numpy.py DIR numpy.load()s them (dtype, shape, order, bits, a forward pass) and writes
#    DIR/from_numpy with numpy.save;
# 3. test_npy [numpy-read] reads those back (and refuses the ones it must).
# The interpreter: $DPMLP_PYTHON if set, else the first of `python3` on PATH and /usr/bin/python3 that can
# import numpy (a pyenv or venv python3 on PATH may lack Debian's python3-numpy). With none, the test prints
# DPMLP_SKIP (ctest reports it skipped), or fails when DPMLP_REQUIRE_NUMPY=1 (set by scripts/test.sh, which
# installs python3-numpy).
foreach(v EXE SCRIPT DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_npy_numpy.cmake: pass -D${v}=...")
  endif()
endforeach()

set(_candidates)
if(DEFINED ENV{DPMLP_PYTHON})
  list(APPEND _candidates "$ENV{DPMLP_PYTHON}")
endif()
find_program(_path_python3 NAMES python3)
if(_path_python3)
  list(APPEND _candidates "${_path_python3}")
endif()
list(APPEND _candidates /usr/bin/python3)
set(_python "")
foreach(py IN LISTS _candidates)
  execute_process(COMMAND "${py}" -c "import numpy" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_python "${py}")
    break()
  endif()
endforeach()
if(NOT _python)
  if("$ENV{DPMLP_REQUIRE_NUMPY}" STREQUAL "1")
    message(FATAL_ERROR "no python3 with numpy (tried: ${_candidates}); install python3-numpy")
  endif()
  message("DPMLP_SKIP: no python3 with numpy (tried: ${_candidates}); install python3-numpy to run this test")
  return()
endif()
message("python: ${_python}")

file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("---- ${what}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc})")
  endif()
endfunction()

run_step("test_npy [numpy-write]" ${CMAKE_COMMAND} -E env "DPMLP_NPY_DIR=${DIR}" "${EXE}" "[numpy-write]")
run_step("${_python} check_npy_numpy.py" "${_python}" "${SCRIPT}" "${DIR}")
run_step("test_npy [numpy-read]" ${CMAKE_COMMAND} -E env "DPMLP_NPY_DIR=${DIR}" "${EXE}" "[numpy-read]")
message("npy_numpy_interop: passed")

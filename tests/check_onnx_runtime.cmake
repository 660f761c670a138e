# SPDX-License-Identifier: BSD-3-Clause
# ctest onnx_runtime: dpmlp's ONNX export, run by onnxruntime.
#   cmake -DEXE=<onnx_export_test> -DSCRIPT=<tests/check_onnx_runtime.py> -DDIR=<scratch dir> -P check_onnx_runtime.cmake
# 1. onnx_export_test [onnxruntime-write] writes models as ONNX files, raw rows and dpmlp's predictions for
#    them (.npy) and a manifest into DIR;
# 2. python3 check_onnx_runtime.py DIR checks each file with onnx.checker and runs it with onnxruntime against
#    dpmlp's predictions (within 1e-5 relative).
# The interpreter: the first of $DPMLP_ONNX_PYTHON, $DPMLP_PYTHON, `python3` on PATH and /usr/bin/python3 that
# can import numpy, onnx and onnxruntime (PyPI packages; scripts/test.sh installs them in a virtual
# environment and sets DPMLP_ONNX_PYTHON). With none, the test prints DPMLP_SKIP (ctest reports it skipped),
# or fails when DPMLP_REQUIRE_ONNX=1.
foreach(v EXE SCRIPT DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_onnx_runtime.cmake: pass -D${v}=...")
  endif()
endforeach()

set(_candidates)
foreach(var DPMLP_ONNX_PYTHON DPMLP_PYTHON)
  if(DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
    list(APPEND _candidates "$ENV{${var}}")
  endif()
endforeach()
find_program(_path_python3 NAMES python3)
if(_path_python3)
  list(APPEND _candidates "${_path_python3}")
endif()
list(APPEND _candidates /usr/bin/python3)
set(_python "")
foreach(py IN LISTS _candidates)
  execute_process(COMMAND "${py}" -c "import numpy, onnx, onnxruntime" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_python "${py}")
    break()
  endif()
endforeach()
if(NOT _python)
  set(_why "no python3 that imports numpy, onnx and onnxruntime (tried: ${_candidates}); "
           "pip install onnx onnxruntime, or set DPMLP_ONNX_PYTHON")
  if("$ENV{DPMLP_REQUIRE_ONNX}" STREQUAL "1")
    message(FATAL_ERROR ${_why})
  endif()
  message("DPMLP_SKIP: ${_why}")
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

run_step("onnx_export_test [onnxruntime-write]" ${CMAKE_COMMAND} -E env "DPMLP_ONNX_DIR=${DIR}" "${EXE}"
         "[onnxruntime-write]")
run_step("${_python} check_onnx_runtime.py" "${_python}" "${SCRIPT}" "${DIR}")
message("onnx_runtime: passed")

# SPDX-License-Identifier: BSD-3-Clause
# ctest onnx_runtime and example_train_csv_onnx: dpmlp's ONNX export, run by onnxruntime.
#   cmake -DEXE=<onnx_export_test> -DSCRIPT=<tests/check_onnx_runtime.py> -DDIR=<scratch dir> -P check_onnx_runtime.cmake
#     1. onnx_export_test [onnxruntime-write] writes models as ONNX files, raw rows and dpmlp's predictions for
#        them (.npy) and a manifest into DIR;
#     2. python3 check_onnx_runtime.py DIR checks each file with onnx.checker and runs it with onnxruntime
#        against dpmlp's predictions (within 1e-5 relative).
#   cmake -DTRAIN_CSV=<train_csv> -DMPIEXEC=... -DMPIFLAGS=... -DSCRIPT=<tests/check_train_csv_onnx.py> -DDIR=...
#     1. the script writes DIR/data.csv; train_csv trains on it at 2 ranks with --export DIR/model.onnx;
#     2. the script runs model.onnx with onnxruntime on the train and test rows: the mean squared errors
#        match the ones train_csv printed; 3. --export refuses a directory and a missing directory before
#        training, exit 2.
# The interpreter: the first of $DPMLP_ONNX_PYTHON, $DPMLP_PYTHON, `python3` on PATH and /usr/bin/python3 that
# can import numpy, onnx and onnxruntime (PyPI packages; scripts/test.sh installs them in a virtual
# environment and sets DPMLP_ONNX_PYTHON). With none, the test prints DPMLP_SKIP (ctest reports it skipped),
# or fails when DPMLP_REQUIRE_ONNX=1.
if(DEFINED TRAIN_CSV)
  set(EXE "${TRAIN_CSV}")
endif()
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

if(DEFINED TRAIN_CSV)
  separate_arguments(MPIFLAGS)
  run_step("check_train_csv_onnx.py make" "${_python}" "${SCRIPT}" make "${DIR}")
  set(_train ${MPIEXEC} -np 2 ${MPIFLAGS} ${TRAIN_CSV} "${DIR}/data.csv" --target y --allow-cpu-devices
             --progress off --seed 5 --steps 300 --hidden 16 --write-split "${DIR}/split.csv")
  execute_process(COMMAND ${_train} --export "${DIR}/model.onnx" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("---- train_csv --export\n${out}${err}")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "\ntrain mse ([^ ]+) test mse ([^ \n]+)\n")
    message(FATAL_ERROR "train_csv --export failed (exit ${rc})")
  endif()
  set(_train_mse "${CMAKE_MATCH_1}")
  set(_test_mse "${CMAKE_MATCH_2}")
  if(NOT out MATCHES "# exported [^\n]*model.onnx \\(ONNX\\): input x \\[N, 3\\] = a, b, c; output y \\[N, 1\\] = y")
    message(FATAL_ERROR "train_csv --export did not report the export as expected")
  endif()
  run_step("check_train_csv_onnx.py check" "${_python}" "${SCRIPT}" check "${DIR}" ${_train_mse} ${_test_mse})
  # Refused before any training: a directory, a file in a directory that does not exist.
  foreach(bad "${DIR}" "${DIR}/missing/model.onnx")
    execute_process(COMMAND ${_train} --export "${bad}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 2 OR NOT err MATCHES "--export ${bad}: (is a directory|the directory '[^']*' does not exist)"
       OR out MATCHES "train mse")
      message(FATAL_ERROR "train_csv --export ${bad}: exit ${rc}, expected 2 with a refusal before training\n${out}${err}")
    endif()
    message("---- train_csv --export ${bad}: refused (exit 2)\n${err}")
  endforeach()
  message("example_train_csv_onnx: passed")
  return()
endif()
run_step("onnx_export_test [onnxruntime-write]" ${CMAKE_COMMAND} -E env "DPMLP_ONNX_DIR=${DIR}" "${EXE}"
         "[onnxruntime-write]")
run_step("${_python} check_onnx_runtime.py" "${_python}" "${SCRIPT}" "${DIR}")
message("onnx_runtime: passed")

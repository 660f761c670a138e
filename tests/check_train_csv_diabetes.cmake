# SPDX-License-Identifier: BSD-3-Clause
# train_csv with its defaults on a small real data set, against ordinary least squares on the same split
# (cmake -DEXE=<train_csv> -DOLS=<ols_split> -DDATA=tests/data/diabetes.csv -DMPIEXEC=... -DMPIFLAGS=...
# -DWORK=<dir> -P check_train_csv_diabetes.cmake):
#   - the diabetes data (442 rows, 10 features; tests/data/README.md), train_csv's default split (seed 0) at
#     2 ranks with every other option at its default: its test MSE must be at most 1.10 x the test MSE of OLS
#     fitted on every non-test row (ols_split, Eigen);
#   - the same at 3 ranks prints the same errors (the same bits);
#   - the control: without a validation set (--validation-fraction 0, so no early stopping) the MLP overfits
#     and the same check fails (the ratio is above 1.10), so the check can tell.
separate_arguments(MPIFLAGS)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(train ranks split out_var)
  execute_process(COMMAND ${MPIEXEC} -np ${ranks} ${MPIFLAGS} ${EXE} "${DATA}" --target target --allow-cpu-devices
                          --progress off --write-split "${split}" ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  message(STATUS "train_csv at ${ranks} ranks ${ARGN}:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "train_csv exited ${rc}\n${err}")
  endif()
  if(NOT out MATCHES "\ntrain mse ([^ ]+) test mse ([^ \n]+)\n")
    message(FATAL_ERROR "no 'train mse .. test mse ..' line")
  endif()
  set(${out_var} "${CMAKE_MATCH_2}" PARENT_SCOPE)
  string(REGEX MATCH "train mse [^\n]+" line "${out}")
  set(${out_var}_line "${line}" PARENT_SCOPE)
endfunction()

# ---- the defaults
train(2 "${WORK}/split.csv" mlp)
execute_process(COMMAND ${OLS} "${DATA}" target "${WORK}/split.csv" ${mlp} 1.10 OUTPUT_VARIABLE ols RESULT_VARIABLE rc)
message(STATUS "${ols}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_csv's defaults: test MSE ${mlp} is more than 1.10 x OLS's (exit ${rc})\n${ols}")
endif()

# ---- the same bits at 3 ranks
train(3 "${WORK}/split3.csv" mlp3)
if(NOT mlp3_line STREQUAL mlp_line)
  message(FATAL_ERROR "3 ranks printed '${mlp3_line}', 2 ranks '${mlp_line}'")
endif()

# ---- the control: no validation set, no early stopping: the check fails
train(2 "${WORK}/split_none.csv" overfit --validation-fraction 0)
execute_process(COMMAND ${OLS} "${DATA}" target "${WORK}/split_none.csv" ${overfit} 1.10 OUTPUT_VARIABLE ols
                RESULT_VARIABLE rc)
message(STATUS "without validation: ${ols}")
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "without validation the MLP should overfit past 1.10 x OLS (ols_split exit 1), got exit ${rc}")
endif()
message(STATUS "train_csv on the diabetes data: within 1.10 x OLS with its defaults")

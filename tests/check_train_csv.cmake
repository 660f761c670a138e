# SPDX-License-Identifier: BSD-3-Clause
# Drives examples/train_csv at 2 ranks on CPU devices (cmake -DEXE=... -DMPIEXEC=... -DMPIFLAGS=... -DWORK=<dir>
# -P check_train_csv.cmake):
#   - a CSV made here, y = 3 x1 - 2 x2 + noise (400 rows, noise uniform on [-0.5, 0.5), variance 1/12),
#     trains to a test MSE near the noise level;
#   - by default 48 of the 320 training rows are held out for validation (--write-split marks them), the
#     validation loss is shown and early stopping watches it; --validation-fraction 0 trains exactly --steps
#     steps on all training rows; bad validation options are refused;
#   - without early stopping (--patience 0), 150 + 150 steps through --checkpoint end with the same numbers as
#     300 steps in one go;
#   - ragged, non-numeric, NaN, empty, header-only CSVs and a missing --target column are refused on every rank
#     with the file and line number, exit code 2; so is --epochs 0;
#   - mini-batches (--batch 64 --epochs 60) also reach the noise level, and 30 + 30 epochs through
#     --checkpoint end with the same numbers as 60 epochs in one go;
#   - a FIFO as the data file, the checkpoint or --write-split is refused on both ranks, without blocking;
#   - extreme but finite data: a feature or the target in units of 1e200 trains as linear.csv does; a 1e300 in
#     a test row is refused on every rank, naming its line; --hidden past 2048 and a --rate of -0 are refused
#     before any training; a byte order mark before the header is skipped, an ESC in a name shown as '?';
#   - without --allow-cpu-devices: the refusal line and exit 77 on a CPU build (-DDEVICE_BUILD=1: a run on 2 GPUs).
separate_arguments(MPIFLAGS)
if(NOT WORK)
  set(WORK "${CMAKE_CURRENT_BINARY_DIR}/train_csv_check")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# ---- the data: fixed-point arithmetic (CMake's math is integer-only), values in thousandths
function(milli_to_decimal value out)
  set(sign "")
  if(value LESS 0)
    set(sign "-")
    math(EXPR value "-(${value})")
  endif()
  math(EXPR whole "${value} / 1000")
  math(EXPR frac "${value} % 1000")
  if(frac LESS 10)
    set(frac "00${frac}")
  elseif(frac LESS 100)
    set(frac "0${frac}")
  endif()
  set(${out} "${sign}${whole}.${frac}" PARENT_SCOPE)
endfunction()

set(rows 400)
math(EXPR ndigits "${rows} * 11")
string(RANDOM LENGTH ${ndigits} ALPHABET 0123456789 RANDOM_SEED 20240611 digits)
set(csv "x1, x2 ,y\n")
math(EXPR last "${rows} - 1")
foreach(i RANGE ${last})
  math(EXPR at "${i} * 11")
  string(SUBSTRING "${digits}" ${at} 11 d)
  string(SUBSTRING "${d}" 0 4 a)
  string(SUBSTRING "${d}" 4 4 b)
  string(SUBSTRING "${d}" 8 3 e)
  # Leading zeros would read as octal in math(EXPR): strip them.
  foreach(v a b e)
    string(REGEX REPLACE "^0+([0-9])" "\\1" ${v} "${${v}}")
  endforeach()
  math(EXPR x1 "${a} - 5000")    # x1 in [-5, 5)
  math(EXPR x2 "${b} - 5000")    # x2 in [-5, 5)
  math(EXPR noise "${e} - 500")  # noise in [-0.5, 0.5)
  math(EXPR y "3 * ${x1} - 2 * ${x2} + ${noise}")
  milli_to_decimal(${x1} s1)
  milli_to_decimal(${x2} s2)
  milli_to_decimal(${y} sy)
  string(APPEND csv "${s1},${s2},${sy}\n")
endforeach()
file(WRITE "${WORK}/linear.csv" "${csv}")

function(run_train_csv out_var err_var rc_var)
  execute_process(COMMAND ${MPIEXEC} -np 2 ${MPIFLAGS} ${EXE} ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

# ---- training reaches the noise level (1/12 = 0.0833)
set(common --allow-cpu-devices --progress lines --target y --seed 3)
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 300)
message(STATUS "linear.csv, 300 steps:\n${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_csv on linear.csv exited ${rc}\n${err}")
endif()
if(NOT out MATCHES "\ntrain mse ([^ ]+) test mse ([^ \n]+)\n")
  message(FATAL_ERROR "no 'train mse .. test mse ..' line")
endif()
set(train_mse ${CMAKE_MATCH_1})
set(test_mse ${CMAKE_MATCH_2})
if(NOT test_mse LESS 0.125 OR NOT train_mse LESS 0.125 OR NOT test_mse GREATER 0.04)
  message(FATAL_ERROR "expected train and test MSE near the noise variance 0.0833, got ${train_mse} and ${test_mse}")
endif()
if(NOT out MATCHES "train 320 rows, test 80 \\(seed 3\\); 48 of the training rows held out for validation"
   OR NOT out MATCHES "\nstep [0-9]+/300 loss [^ ]+ val_loss " OR NOT out MATCHES "\ndone [0-9]+ steps"
   OR NOT out MATCHES "\n# early stopping: validation loss every step, patience 100"
   OR NOT out MATCHES "\n# validation mse [^ ]+ \\(48 rows\\)\n")
  message(FATAL_ERROR "the header, the validation lines or the progress lines are missing")
endif()

# ---- validation options: none (exactly --steps steps), every N steps, the split file, refusals
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 40 --validation-fraction 0 --write-split "${WORK}/nv.csv")
file(READ "${WORK}/nv.csv" nv_split)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\ndone 40 steps" OR out MATCHES "validation" OR out MATCHES "val_loss"
   OR nv_split MATCHES "validation")
  message(FATAL_ERROR "--validation-fraction 0: expected 40 steps and no validation, exit ${rc}\n${out}\n${err}")
endif()
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 40 --validate-every 10 --patience 1
              --write-split "${WORK}/v.csv")
file(READ "${WORK}/v.csv" v_split)
string(REGEX MATCHALL ",validation" v_rows "${v_split}")
list(LENGTH v_rows n_v)
string(REGEX MATCHALL ",test" t_rows "${v_split}")
list(LENGTH t_rows n_t)
if(NOT rc EQUAL 0 OR NOT out MATCHES "validation loss every 10 steps, patience 1" OR NOT n_v EQUAL 48 OR NOT n_t EQUAL 80)
  message(FATAL_ERROR "--validate-every 10: exit ${rc}, ${n_v} validation and ${n_t} test rows in the split\n${out}\n${err}")
endif()

# ---- without early stopping, the same 300 steps as 150 + 150 through a checkpoint: the same numbers (with it,
# each run stops and restores on its own)
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 300 --patience 0)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\nstep 300/300 loss " OR NOT out MATCHES "\ndone 300 steps")
  message(FATAL_ERROR "--patience 0: expected all 300 steps, exit ${rc}\n${out}\n${err}")
endif()
string(REGEX MATCH "train mse [^\n]+" one_go "${out}")
file(REMOVE "${WORK}/run.ckpt")
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 150 --patience 0 --checkpoint "${WORK}/run.ckpt")
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK}/run.ckpt")
  message(FATAL_ERROR "train_csv --checkpoint (first half) exited ${rc}\n${out}\n${err}")
endif()
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 150 --patience 0 --checkpoint "${WORK}/run.ckpt")
message(STATUS "resumed:\n${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "resumed from [^\n]*run.ckpt at step 150" OR NOT out MATCHES "\nstep 300/300 loss ")
  message(FATAL_ERROR "train_csv --checkpoint (second half) exited ${rc} or did not resume\n${out}\n${err}")
endif()
string(REGEX MATCH "train mse [^\n]+" resumed "${out}")
if(NOT resumed STREQUAL one_go)
  message(FATAL_ERROR "150 + 150 steps gave '${resumed}', 300 steps '${one_go}'")
endif()

# ---- refusals: exit 2, the message on every rank, naming the file and the line
function(expect_refusal name content pattern)
  file(WRITE "${WORK}/${name}" "${content}")
  run_train_csv(out err rc "${WORK}/${name}" --allow-cpu-devices --target y ${ARGN})
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "${name}: expected exit 2, got ${rc}\n${out}\n${err}")
  endif()
  foreach(r 0 1)
    if(NOT err MATCHES "train_csv: error \\(rank ${r}\\): [^\n]*${pattern}")
      message(FATAL_ERROR "${name}: rank ${r} did not report /${pattern}/:\n${err}")
    endif()
  endforeach()
  message(STATUS "${name}: refused on both ranks (${pattern})")
endfunction()

set(head "x1,x2,y\n1,2,3\n4,5,6\n7,8,9\n")
expect_refusal(ragged.csv "${head}1,2\n" "ragged\\.csv:5: 2 fields, but the header has 3 columns")
expect_refusal(text.csv "${head}1,2,3\n1,abc,3\n" "text\\.csv:6: column 2 \\('x2'\\): not a number: 'abc'")
expect_refusal(nan.csv "${head}nan,2,3\n" "nan\\.csv:5: column 1 \\('x1'\\): not finite: 'nan'")
expect_refusal(empty.csv "" "empty\\.csv: empty file")
expect_refusal(header.csv "x1,x2,y\n" "header\\.csv:1: no data rows")
expect_refusal(notarget.csv "${head}" "notarget\\.csv:1: no column 'z' \\(the header has: x1, x2, y\\)" --target z)
expect_refusal(epochs.csv "${head}" "--epochs must be positive" --batch 1 --epochs 0)
expect_refusal(vfrac.csv "${head}" "--validation-fraction must be in \\[0, 1\\)" --validation-fraction 1)
expect_refusal(patience.csv "${head}" "--patience must not be negative" --patience -1)
expect_refusal(vevery.csv "${head}" "--validate-every must be positive" --validate-every 0)
expect_refusal(restore.csv "${head}" "--restore-best must be yes or no, got 'maybe'" --restore-best maybe)
# Command-line numbers (examples/cli.hpp): read whole, and an int option past int's range refused, not wrapped.
expect_refusal(steps_range.csv "${head}" "--steps: out of range: '4294967297'" --steps 4294967297)
expect_refusal(steps_text.csv "${head}" "--steps: not an integer: '12x'" --steps 12x)
expect_refusal(rate_text.csv "${head}" "--rate: not a number: '0.1x'" --rate 0.1x)
# Options refused before any data is read or any step taken: --hidden past the errors' evaluator (it was
# refused only after training and writing the checkpoint), a learning rate that is not above 0 (-0 became the
# default).
file(REMOVE "${WORK}/hidden.ckpt")
expect_refusal(hidden.csv "${head}" "--hidden 4096: train_csv evaluates models up to 2048 units wide" --hidden 4096
               --checkpoint "${WORK}/hidden.ckpt")
if(EXISTS "${WORK}/hidden.ckpt")
  message(FATAL_ERROR "--hidden 4096: wrote the checkpoint before refusing")
endif()
# A CSV of 2049 features: the model's input layer past the evaluator too, refused once the header is read.
set(wide_header "")
set(wide_row "")
foreach(i RANGE 2048)
  string(APPEND wide_header "c${i},")
  string(APPEND wide_row "1,")
endforeach()
expect_refusal(wide.csv "${wide_header}y\n${wide_row}2\n${wide_row}3\n"
               "wide\\.csv:1: 2049 feature columns; train_csv evaluates models up to 2048 units wide")
expect_refusal(rate_minus_zero.csv "${head}" "--rate must be positive and finite, got -0" --rate -0)
expect_refusal(rate_zero.csv "${head}" "--rate must be positive and finite, got 0" --rate 0)
expect_refusal(rate_negative.csv "${head}" "--rate must be positive and finite, got -0.5" --optimizer sgd --rate -0.5)
# Header text in messages is sanitized: an ESC sequence in a name reaches the terminal as '?'.
string(ASCII 27 esc)
expect_refusal(escape.csv "x1${esc}[2J,y\n1,2\n2,3\n" "no column 'z' \\(the header has: x1\\?\\[2J, y\\)" --target z)
if(err MATCHES "${esc}")
  message(FATAL_ERROR "escape.csv: an ESC byte from the header reached the error output")
endif()
# A UTF-8 byte order mark (as spreadsheet programs write) before the header: the first column is found by name.
string(ASCII 239 187 191 bom)
file(WRITE "${WORK}/bom.csv" "${bom}y,x1\n1,2\n2,4\n3,6\n4,8\n5,10\n")
run_train_csv(out err rc "${WORK}/bom.csv" --allow-cpu-devices --target y --steps 3 --progress off)
if(NOT rc EQUAL 0 OR NOT out MATCHES "target 'y'")
  message(FATAL_ERROR "bom.csv: the column 'y' after a byte order mark was not found: exit ${rc}\n${out}\n${err}")
endif()

run_train_csv(out err rc "${WORK}/nowhere.csv" --allow-cpu-devices --target y)
if(NOT rc EQUAL 2 OR NOT err MATCHES "rank 0\\): [^\n]*nowhere\\.csv: cannot open" OR NOT err MATCHES "rank 1\\): [^\n]*nowhere")
  message(FATAL_ERROR "a missing file: expected exit 2 and the message on both ranks, got ${rc}\n${err}")
endif()

# --batch at least the training rows (272 after the 48 validation rows) is full batch, and accepted.
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 5 --batch 272)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--batch 320 (all training rows) should be accepted; exit ${rc}\n${err}")
endif()

# ---- mini-batches: 64 rows a step (5 steps an epoch of 320 rows), shuffled every epoch
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --batch 64 --epochs 60 --patience 0)
message(STATUS "linear.csv, mini-batches:\n${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "mini-batches of 64 rows, 60 epochs of 5 steps" OR NOT out MATCHES "\ndone 300 steps")
  message(FATAL_ERROR "train_csv --batch 64 --epochs 60 exited ${rc} or printed no mini-batch header\n${out}\n${err}")
endif()
if(NOT out MATCHES "\ntrain mse ([^ ]+) test mse ([^ \n]+)\n" OR NOT CMAKE_MATCH_2 LESS 0.125 OR NOT CMAKE_MATCH_1 LESS 0.125)
  message(FATAL_ERROR "mini-batches: expected train and test MSE near the noise variance 0.0833\n${out}")
endif()
string(REGEX MATCH "train mse [^\n]+" mb_one_go "${out}")
file(REMOVE "${WORK}/mb.ckpt")
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --batch 64 --epochs 30 --patience 0 --checkpoint "${WORK}/mb.ckpt")
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --batch 64 --epochs 30 --patience 0 --checkpoint "${WORK}/mb.ckpt")
string(REGEX MATCH "train mse [^\n]+" mb_resumed "${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "resumed from [^\n]*mb.ckpt at step 150" OR NOT mb_resumed STREQUAL mb_one_go)
  message(FATAL_ERROR "mini-batches, 30 + 30 epochs through a checkpoint gave '${mb_resumed}', 60 epochs '${mb_one_go}'\n${out}\n${err}")
endif()

# ---- extreme but finite values: a feature column of +-1e200 (its variance overflowed and the column was
# zeroed: train mse 0.94), a target of +-1e200 (`train mse inf`), a 1e300 in a test row (`test mse -nan`); all
# exited 0. Now the first two train as linear.csv does, and the third is refused, naming the line.
# body: the data lines, each after its "\n" (CMake's "^" matches wherever a replacement search resumes).
string(FIND "${csv}" "\n" header_end)
string(SUBSTRING "${csv}" ${header_end} -1 body)
string(REGEX REPLACE "\n([^,\n]+)," "\n\\1e200," bigx "${body}")
file(WRITE "${WORK}/big_x1.csv" "x1,x2,y${bigx}")
run_train_csv(out err rc "${WORK}/big_x1.csv" ${common} --steps 300 --progress off)
message(STATUS "big_x1.csv (x1 in units of 1e200):\n${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\ntrain mse ([^ ]+) test mse ([^ \n]+)\n" OR NOT CMAKE_MATCH_1 LESS 0.125
   OR NOT CMAKE_MATCH_2 LESS 0.125)
  message(FATAL_ERROR "big_x1.csv: expected train and test MSE near the noise variance 0.0833, exit ${rc}\n${out}\n${err}")
endif()
string(REGEX REPLACE "([^,\n]+)\n" "\\1e200\n" bigy "${body}")
file(WRITE "${WORK}/big_y.csv" "x1,x2,y${bigy}")
run_train_csv(out err rc "${WORK}/big_y.csv" ${common} --steps 300 --progress off)
message(STATUS "big_y.csv (y in units of 1e200):\n${out}")
# The errors in y's units are those of linear.csv times 1e400: past the double range, printed from their
# logarithm, e.g. 8.3e+398.
if(NOT rc EQUAL 0 OR NOT out MATCHES "\ntrain mse ([0-9.]+)e\\+(39[89]) test mse ([0-9.]+)e\\+(39[89])\n")
  message(FATAL_ERROR "big_y.csv: expected train and test MSE near 0.0833e400, exit ${rc}\n${out}\n${err}")
endif()
foreach(i 1 3)
  math(EXPR e "${i} + 1")
  set(value "${CMAKE_MATCH_${i}}")
  set(exponent "${CMAKE_MATCH_${e}}")
  if((exponent EQUAL 398 AND NOT value GREATER 4) OR (exponent EQUAL 399 AND NOT value LESS 1.25))
    message(FATAL_ERROR "big_y.csv: an MSE of ${value}e+${exponent} is not near 0.0833e400\n${out}")
  endif()
endforeach()
# A 1e300 in x1 of the last test row (rank 1's share): standardized into float it is inf.
run_train_csv(out err rc "${WORK}/linear.csv" ${common} --steps 1 --progress off --write-split "${WORK}/split.csv")
file(READ "${WORK}/split.csv" split)
string(REGEX MATCHALL "\n[0-9]+,test" test_rows "${split}")
list(GET test_rows -1 last_test)
string(REGEX REPLACE "[^0-9]*([0-9]+),test" "\\1" last_test "${last_test}")
math(EXPR last_line "${last_test} + 2")  # the header is line 1, row 0 line 2
file(STRINGS "${WORK}/linear.csv" csv_lines)
math(EXPR at "${last_line} - 1")
list(GET csv_lines ${at} bad_line)
string(REGEX REPLACE "^[^,]+," "1e300," bad_line "${bad_line}")
list(REMOVE_AT csv_lines ${at})
list(INSERT csv_lines ${at} "${bad_line}")
string(JOIN "\n" big_test ${csv_lines})
expect_refusal(big_test.csv "${big_test}\n"
               "rank 1: dpmlp::Standardizer::transform_columns: column 1 \\('x1'\\), line ${last_line} of [^\n]*big_test\\.csv \\(a test row\\): the value 1e\\+300 standardized \\(mean [^)]*\\) is not finite in float"
               --seed 3 --progress off)

# ---- no hang: a FIFO as the data file, the checkpoint or --write-split is refused on both ranks before anything
# opens it (rank 0 would block in fopen while rank 1 waits); a run that hangs fails at the TIMEOUT instead.
find_program(MKFIFO mkfifo)
if(MKFIFO)
  file(REMOVE "${WORK}/fifo.csv" "${WORK}/fifo.ckpt" "${WORK}/fifo_split.csv")
  execute_process(COMMAND ${MKFIFO} "${WORK}/fifo.csv" "${WORK}/fifo.ckpt" "${WORK}/fifo_split.csv"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mkfifo failed: ${rc}")
  endif()
  foreach(case "fifo.csv|${WORK}/fifo.csv;--steps;1"
               "fifo.ckpt|${WORK}/linear.csv;--steps;1;--checkpoint;${WORK}/fifo.ckpt"
               "fifo_split.csv|${WORK}/linear.csv;--steps;1;--write-split;${WORK}/fifo_split.csv")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(REMOVE_AT parts 0)
    string(TIMESTAMP t0 "%s")
    execute_process(COMMAND ${MPIEXEC} -np 2 ${MPIFLAGS} ${EXE} ${parts} --allow-cpu-devices --target y
                    --progress off OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
    string(TIMESTAMP t1 "%s")
    math(EXPR seconds "${t1} - ${t0}")
    if(NOT rc EQUAL 2)
      message(FATAL_ERROR "${name} (a FIFO): expected exit 2, got '${rc}' after ${seconds} s\n${out}\n${err}")
    endif()
    foreach(r 0 1)
      if(NOT err MATCHES "train_csv: error \\(rank ${r}\\): [^\n]*${name}' is a FIFO \\(named pipe\\), not a regular file")
        message(FATAL_ERROR "${name} (a FIFO): rank ${r} did not report it:\n${err}")
      endif()
    endforeach()
    message(STATUS "${name}, a FIFO: refused on both ranks in ${seconds} s")
  endforeach()
  file(REMOVE "${WORK}/fifo.csv" "${WORK}/fifo.ckpt" "${WORK}/fifo_split.csv")
endif()

# ---- without --allow-cpu-devices: on a CPU build the refusal and exit 77; on a GPU build (DEVICE_BUILD, run
# on a machine with 2 GPUs) a run on the GPUs
execute_process(COMMAND ${MPIEXEC} -np 2 ${MPIFLAGS} ${EXE} "${WORK}/linear.csv" --target y OUTPUT_VARIABLE out
                RESULT_VARIABLE rc)
if(DEVICE_BUILD)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "2 ranks on 2 (cuda|hip) devices")
    message(FATAL_ERROR "without --allow-cpu-devices on a GPU build: expected a run on 2 GPUs, got ${rc}: ${out}")
  endif()
elseif(NOT rc EQUAL 77 OR NOT out MATCHES "requires >= 2 physical accelerator devices; found 0")
  message(FATAL_ERROR "without --allow-cpu-devices: expected the refusal and exit 77, got ${rc}: ${out}")
endif()
message(STATUS "train_csv: all checks passed")

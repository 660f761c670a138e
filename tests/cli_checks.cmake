# SPDX-License-Identifier: BSD-3-Clause
# The programs as command-line tools: examples/multi_gpu_train, examples/train_csv, benchmarks/train_bench,
# workload_bench, gemm_bench and cpu_standardize_bench (those this build has).
#
# Included from tests/CMakeLists.txt, this file registers the tests; each test runs this same file as a
# script (cmake -DCHECK=... -P cli_checks.cmake), which does the checks:
#   CHECK=command_line (one test per program, cli_<program>): --help and -h exit 0 and print the usage once
#     (rank 0 only, at 2 ranks), on stdout; an unknown option and a stray argument exit 2 with a message on
#     every rank that points to --help (train_csv, whose argument is its data file: run without one);
#     multi_gpu_train and train_bench refuse --cols 1073741824 (2*C features past int) on every rank.
#   CHECK=progress (cli_train_csv_progress): train_csv at 2 ranks with its output going to a file, then to a
#     pipe: the default progress (--progress auto) writes plain lines, no ESC and no carriage return, though
#     OpenMPI gives the ranks a pseudo-terminal as stdout; --progress bar still draws the live line (so the
#     check would see the escape codes if they were there); --progress off prints no progress.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  set(_cli_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
               KOKKOS_NUM_THREADS=1 OMP_NUM_THREADS=1)
  set(_cli_args -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DMPIFLAGS=${DPMLP_MPIEXEC_PREFLAGS}")
  foreach(_program multi_gpu_train train_csv train_bench workload_bench gemm_bench cpu_standardize_bench)
    if(NOT TARGET ${_program})
      continue()
    endif()
    set(_ranks 2)
    if(_program STREQUAL "cpu_standardize_bench" OR _program STREQUAL "gemm_bench")
      set(_ranks 0)  # not an MPI program: run directly
    endif()
    add_test(NAME cli_${_program}
             COMMAND ${CMAKE_COMMAND} -DCHECK=command_line -DPROGRAM=${_program} -DEXE=$<TARGET_FILE:${_program}>
                     -DRANKS=${_ranks} ${_cli_args} -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(cli_${_program} PROPERTIES TIMEOUT 300 PROCESSORS 2 LABELS "cli;mpi"
                         ENVIRONMENT "${_cli_env}")
  endforeach()
  if(TARGET train_csv)
    add_test(NAME cli_train_csv_progress
             COMMAND ${CMAKE_COMMAND} -DCHECK=progress -DEXE=$<TARGET_FILE:train_csv> ${_cli_args}
                     -DWORK=${CMAKE_CURRENT_BINARY_DIR}/cli_train_csv_progress -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(cli_train_csv_progress PROPERTIES TIMEOUT 300 PROCESSORS 2 LABELS "cli;mpi;example"
                         SKIP_REGULAR_EXPRESSION "DPMLP_SKIP" ENVIRONMENT "${_cli_env}")
  endif()
  return()
endif()

# ---- script mode
separate_arguments(MPIFLAGS)
string(ASCII 27 esc)
string(ASCII 13 cr)

# run(<out> <err> <rc> RANKS n [OUTPUT_FILE f] ARGS args...): EXE under mpirun at n ranks (n = 0: directly).
function(run out_var err_var rc_var)
  cmake_parse_arguments(R "" "RANKS;OUTPUT_FILE" "ARGS" ${ARGN})
  set(command ${EXE} ${R_ARGS})
  if(R_RANKS GREATER 0)
    set(command ${MPIEXEC} -np ${R_RANKS} ${MPIFLAGS} ${command})
  endif()
  if(R_OUTPUT_FILE)
    execute_process(COMMAND ${command} OUTPUT_FILE "${R_OUTPUT_FILE}" ERROR_VARIABLE err RESULT_VARIABLE rc
                    TIMEOUT 240)
    file(READ "${R_OUTPUT_FILE}" out)
  else()
    execute_process(COMMAND ${command} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 240)
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

# How many times `what` occurs in `text`.
function(count_of out_var text what)
  string(LENGTH "${what}" n)
  set(count 0)
  string(FIND "${text}" "${what}" at)
  while(NOT at EQUAL -1)
    math(EXPR count "${count} + 1")
    math(EXPR at "${at} + ${n}")
    string(SUBSTRING "${text}" ${at} -1 text)
    string(FIND "${text}" "${what}" at)
  endwhile()
  set(${out_var} ${count} PARENT_SCOPE)
endfunction()

if(CHECK STREQUAL "command_line")
  set(printers 1)
  if(RANKS GREATER 1)
    set(printers ${RANKS})
  endif()
  foreach(flag --help -h)
    run(out err rc RANKS ${RANKS} ARGS ${flag})
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${PROGRAM} ${flag}: expected exit 0, got ${rc}\n${out}\n${err}")
    endif()
    count_of(usages "${out}" "Usage: ")
    if(NOT out MATCHES "^Usage: ${PROGRAM} " OR NOT usages EQUAL 1)
      message(FATAL_ERROR "${PROGRAM} ${flag}: expected one usage text on stdout (rank 0 only), starting "
                          "'Usage: ${PROGRAM} ', got ${usages}:\n${out}")
    endif()
    if(NOT out MATCHES "\nOptions:\n" OR NOT out MATCHES "\n  -h, --help +print this help and exit\n")
      message(FATAL_ERROR "${PROGRAM} ${flag}: no option list in the help:\n${out}")
    endif()
    if(out MATCHES "requires >= 2 physical" OR out MATCHES "\"bench\"")
      message(FATAL_ERROR "${PROGRAM} ${flag}: ran instead of printing the help:\n${out}")
    endif()
  endforeach()
  message(STATUS "${PROGRAM} --help:\n${out}")
  foreach(arguments "--no-such-option" "stray-argument")
    if(PROGRAM STREQUAL "train_csv" AND arguments STREQUAL "stray-argument")
      set(arguments "")  # train_csv takes a data file: instead, none at all
    endif()
    run(out err rc RANKS ${RANKS} ARGS ${arguments})
    count_of(mentions "${err}" "--help")
    if(NOT rc EQUAL 2 OR NOT mentions EQUAL printers)
      message(FATAL_ERROR "${PROGRAM} ${arguments}: expected exit 2 and a pointer to --help from each of ${printers} "
                          "rank(s), got exit ${rc} and ${mentions}:\n${err}")
    endif()
    message(STATUS "${PROGRAM} ${arguments}: exit 2:\n${err}")
  endforeach()
  # --cols C gives 2*C features, an int: 1073741824 overflowed it. Refused up front, on every rank.
  if(PROGRAM STREQUAL "multi_gpu_train" OR PROGRAM STREQUAL "train_bench")
    run(out err rc RANKS ${RANKS} ARGS --cols 1073741824)
    count_of(mentions "${err}" "--cols 1073741824: the model would see 2*C = 2147483648 features, more than an int holds (--cols at most 1073741823)")
    if(NOT rc EQUAL 2 OR NOT mentions EQUAL printers)
      message(FATAL_ERROR "${PROGRAM} --cols 1073741824: expected exit 2 and the refusal from each of ${printers} "
                          "rank(s), got exit ${rc} and ${mentions}:\n${err}")
    endif()
    message(STATUS "${PROGRAM} --cols 1073741824: exit 2:\n${err}")
  endif()
  message(STATUS "${PROGRAM}: the command-line checks passed")

elseif(CHECK STREQUAL "progress")
  file(REMOVE_RECURSE "${WORK}")
  file(MAKE_DIRECTORY "${WORK}")
  # y = 2 x1 - x2 + a small wobble, 80 rows
  set(csv "x1,x2,y\n")
  foreach(i RANGE 79)
    math(EXPR x1 "${i} % 7")
    math(EXPR x2 "(${i} * 3) % 11")
    math(EXPR y "2 * ${x1} - ${x2}")
    math(EXPR wobble "${i} % 3")
    string(APPEND csv "${x1},${x2},${y}.${wobble}\n")
  endforeach()
  file(WRITE "${WORK}/data.csv" "${csv}")
  set(common "${WORK}/data.csv" --target y --allow-cpu-devices --steps 40)

  # The default (--progress auto), to a file and to a pipe.
  run(to_file err rc RANKS 2 OUTPUT_FILE "${WORK}/train.log" ARGS ${common})
  if(rc EQUAL 77)
    message(STATUS "DPMLP_SKIP: train_csv needs 2 accelerators on this build (exit 77)")
    return()
  endif()
  run(to_pipe err2 rc2 RANKS 2 ARGS ${common})
  foreach(where file pipe)
    if(where STREQUAL "file")
      set(out "${to_file}")
      set(code ${rc})
    else()
      set(out "${to_pipe}")
      set(code ${rc2})
      set(err "${err2}")
    endif()
    message(STATUS "train_csv at 2 ranks, output to a ${where}:\n${out}")
    if(NOT code EQUAL 0)
      message(FATAL_ERROR "train_csv (output to a ${where}) exited ${code}\n${err}")
    endif()
    string(FIND "${out}" "${esc}" at_esc)
    string(FIND "${out}" "${cr}" at_cr)
    if(NOT at_esc EQUAL -1 OR NOT at_cr EQUAL -1)
      message(FATAL_ERROR "train_csv's output to a ${where} has terminal control characters (ESC at ${at_esc}, "
                          "CR at ${at_cr}; -1: none)")
    endif()
    if(NOT out MATCHES "\nstep 40/40 loss [^\n]+\ndone 40 steps" OR NOT out MATCHES "\ntrain mse ")
      message(FATAL_ERROR "train_csv's output to a ${where}: no plain progress lines")
    endif()
  endforeach()

  # --progress bar forces the live line, escape codes and all, even into a file.
  run(out err rc RANKS 2 OUTPUT_FILE "${WORK}/bar.log" ARGS ${common} --progress bar)
  string(FIND "${out}" "\rstep 40/40  loss " at_live)
  string(FIND "${out}" "${esc}[K" at_esc)
  if(NOT rc EQUAL 0 OR at_live EQUAL -1 OR at_esc EQUAL -1)
    message(FATAL_ERROR "train_csv --progress bar: expected the live line, exit ${rc}\n${out}\n${err}")
  endif()
  # --progress off: no progress at all.
  run(out err rc RANKS 2 ARGS ${common} --progress off)
  if(NOT rc EQUAL 0 OR out MATCHES "step [0-9]+/" OR out MATCHES "\ndone " OR NOT out MATCHES "\ntrain mse ")
    message(FATAL_ERROR "train_csv --progress off: expected no progress, exit ${rc}\n${out}\n${err}")
  endif()
  message(STATUS "train_csv: progress to a file or a pipe has no escape codes under mpirun")

else()
  message(FATAL_ERROR "cli_checks.cmake: CHECK must be command_line or progress, got '${CHECK}'")
endif()

# SPDX-License-Identifier: BSD-3-Clause
# On an OpenMP build: workload_bench at 1 rank x 1 thread, 1 rank x 2 threads, 2 ranks x 2 threads and 3 ranks x
# 1 thread gives the same params digest, for a deep model full batch and in mini-batches and for the seed's
# shape: the host engine's threads split blocks, never a block's sums. Each run must report the thread count it
# was given, so a build that ignored OMP_NUM_THREADS fails here rather than compare one thread with itself.
separate_arguments(MPIFLAGS)
set(cases "--widths 32,64,64,64,1 --rows 3000 --steps 3"
          "--widths 7,40,17,3 --activation tanh --rows 2500 --mode epoch --batch 512 --warmup 0"
          "--widths 32,32,1 --rows 20000 --steps 5")
foreach(label IN LISTS cases)
  separate_arguments(case UNIX_COMMAND "${label}")
  set(digests "")
  foreach(cfg "1;1" "1;2" "2;2" "3;1")
    list(GET cfg 0 ranks)
    list(GET cfg 1 threads)
    set(ENV{OMP_NUM_THREADS} ${threads})
    set(ENV{KOKKOS_NUM_THREADS} ${threads})
    set(ENV{OMP_PROC_BIND} false)
    execute_process(COMMAND ${MPIEXEC} -np ${ranks} ${MPIFLAGS} ${EXE} ${case} --repeats 1
                            --allow-cpu-devices
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${label} at ${ranks} ranks x ${threads} threads exited ${rc}:\n${out}\n${err}")
    endif()
    if(NOT out MATCHES "\"space\": \"OpenMP\", \"threads\": ${threads},")
      message(FATAL_ERROR "${label}: expected the OpenMP space with ${threads} threads a rank:\n${out}")
    endif()
    if(NOT out MATCHES "\"engine\": \"host\"")
      message(FATAL_ERROR "${label}: expected the host engine:\n${out}")
    endif()
    if(NOT out MATCHES "\"params_digest\": \"([0-9a-f]+)\"")
      message(FATAL_ERROR "${label}: no params digest at ${ranks} ranks x ${threads} threads:\n${out}")
    endif()
    message(STATUS "${label}: ${ranks} ranks x ${threads} threads: ${CMAKE_MATCH_1}")
    list(APPEND digests ${CMAKE_MATCH_1})
  endforeach()
  list(REMOVE_DUPLICATES digests)
  list(LENGTH digests distinct)
  if(NOT distinct EQUAL 1)
    message(FATAL_ERROR "${label}: params digests differ across threads and ranks: ${digests}")
  endif()
endforeach()
message(STATUS "identical params digests at 1 and 2 threads, 1 to 3 ranks")

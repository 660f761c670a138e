# SPDX-License-Identifier: BSD-3-Clause
# Helpers for dpmlp's own tests, examples and benchmarks (not installed).

# Warnings and sanitizers for dpmlp's own executables.
function(dpmlp_setup_executable target)
  target_link_libraries(${target} PRIVATE dpmlp::dpmlp)
  if(NOT DPMLP_KOKKOS_HAS_CUDA AND NOT DPMLP_KOKKOS_HAS_HIP)
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
  if(DPMLP_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${DPMLP_SANITIZE} -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${DPMLP_SANITIZE})
  endif()
endfunction()

# Where the MPI launcher lives and how it is told the rank count. OpenMPI refuses root and more ranks than
# cores unless told; CI runs as root on two cores.
set(DPMLP_MPIEXEC_PREFLAGS "" CACHE STRING "Flags passed to mpiexec before the rank count")
if(NOT DPMLP_MPIEXEC_PREFLAGS AND MPIEXEC_EXECUTABLE MATCHES "mpiexec|mpirun")
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _dpmlp_mpi_version ERROR_QUIET)
  if(_dpmlp_mpi_version MATCHES "Open MPI|OpenRTE")
    set(DPMLP_MPIEXEC_PREFLAGS --oversubscribe --bind-to none)
  endif()
endif()

# dpmlp_add_mpi_test(NAME <name> COMMAND <exe> [args...] RANKS <n>... [TIMEOUT s] [SKIP_RETURN_CODE c]
#                    [ENVIRONMENT k=v...])
# Registers <name>_np<n> for each rank count, with PROCESSORS so ctest -j does not oversubscribe further and a
# TIMEOUT so a hang fails in bounded time.
function(dpmlp_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT;SKIP_RETURN_CODE" "COMMAND;RANKS;ENVIRONMENT;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  list(GET T_COMMAND 0 _exe)
  list(REMOVE_AT T_COMMAND 0)
  if(TARGET ${_exe})
    set(_exe $<TARGET_FILE:${_exe}>)
  endif()
  foreach(n IN LISTS T_RANKS)
    set(_name ${T_NAME}_np${n})
    add_test(NAME ${_name} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${DPMLP_MPIEXEC_PREFLAGS}
                                   ${MPIEXEC_PREFLAGS} ${_exe} ${MPIEXEC_POSTFLAGS} ${T_COMMAND})
    set_tests_properties(${_name} PROPERTIES PROCESSORS ${n} TIMEOUT ${T_TIMEOUT} LABELS "mpi;${T_LABELS}")
    if(T_SKIP_RETURN_CODE)
      set_tests_properties(${_name} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
    endif()
    set(_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
             KOKKOS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${T_ENVIRONMENT})
    set_tests_properties(${_name} PROPERTIES ENVIRONMENT "${_env}")
  endforeach()
endfunction()

# SPDX-License-Identifier: BSD-3-Clause
# Finds dpmlp's public dependencies. Used by the top-level CMakeLists.txt and, installed, by dpmlpConfig.cmake,
# so a consumer gets exactly the same targets and fixes as dpmlp's own build.
#
# Sets DPMLP_KOKKOS_HAS_CUDA / DPMLP_KOKKOS_HAS_HIP / DPMLP_KOKKOS_HAS_OPENMP, and, on CUDA builds,
# DPMLP_HAVE_CUBLAS / DPMLP_HAVE_NCCL with the imported targets CUDA::cublas, CUDA::cublasLt and dpmlp::nccl,
# and DPMLP_HAVE_CUTLASS with DPMLP_CUTLASS_INCLUDE_DIR (CUTLASS's headers: CUTLASS_DIR, or PyPI's
# nvidia-cutlass wheel, whose cutlass_library ships them).

include(CMakeFindDependencyMacro)

if(NOT DEFINED DPMLP_FIND_DEPENDENCY)
  # In dpmlp's own build a missing dependency is fatal; in a consumer, find_dependency reports it.
  macro(_dpmlp_find name)
    find_package(${name} ${ARGN} REQUIRED)
  endmacro()
else()
  macro(_dpmlp_find name)
    find_dependency(${name} ${ARGN})
  endmacro()
endif()

# A version range ("3.4...<5") rejects Debian's 3.4.01, so ask for a minimum only.
_dpmlp_find(Kokkos 3.4)

# Debian's Kokkos 3.4 (Trilinos 13.2 packaging) attaches the non-existent include dir /usr/lib/include to
# its targets, which CMake then refuses. Replace every include dir that does not exist with the real
# Kokkos_INCLUDE_DIRS, once, on the imported targets themselves, so no dpmlp or consumer target needs a fix.
if(Kokkos_VERSION VERSION_LESS 4.0 AND DEFINED Kokkos_INCLUDE_DIRS)
  set(_dpmlp_kokkos_inc "")
  foreach(_dir IN LISTS Kokkos_INCLUDE_DIRS)
    get_filename_component(_real "${_dir}" REALPATH)
    list(APPEND _dpmlp_kokkos_inc "${_real}")
  endforeach()
  foreach(_tgt Kokkos::kokkos Kokkos::kokkoscore Kokkos::kokkoscontainers Kokkos::kokkosalgorithms
               kokkos kokkoscore kokkoscontainers kokkosalgorithms)
    if(TARGET ${_tgt})
      get_target_property(_aliased ${_tgt} ALIASED_TARGET)
      if(_aliased)
        continue()
      endif()
      get_target_property(_incs ${_tgt} INTERFACE_INCLUDE_DIRECTORIES)
      if(_incs)
        set(_keep "")
        foreach(_inc IN LISTS _incs)
          if(_inc MATCHES "^\\$<" OR EXISTS "${_inc}")
            list(APPEND _keep "${_inc}")
          endif()
        endforeach()
        list(APPEND _keep ${_dpmlp_kokkos_inc})
        list(REMOVE_DUPLICATES _keep)
        set_target_properties(${_tgt} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_keep}")
      endif()
    endif()
  endforeach()
endif()

set(DPMLP_KOKKOS_HAS_CUDA OFF)
set(DPMLP_KOKKOS_HAS_HIP OFF)
set(DPMLP_KOKKOS_HAS_OPENMP OFF)
if("CUDA" IN_LIST Kokkos_DEVICES OR Kokkos_ENABLE_CUDA)
  set(DPMLP_KOKKOS_HAS_CUDA ON)
endif()
if("HIP" IN_LIST Kokkos_DEVICES OR Kokkos_ENABLE_HIP)
  set(DPMLP_KOKKOS_HAS_HIP ON)
endif()
if("OPENMP" IN_LIST Kokkos_DEVICES OR Kokkos_ENABLE_OPENMP)
  set(DPMLP_KOKKOS_HAS_OPENMP ON)
endif()

_dpmlp_find(MPI)
if(NOT TARGET MPI::MPI_CXX)
  message(FATAL_ERROR "dpmlp needs MPI with C++ bindings target MPI::MPI_CXX (OpenMPI: libopenmpi-dev)")
endif()
_dpmlp_find(Eigen3 3.3 NO_MODULE)

set(DPMLP_HAVE_CUBLAS OFF)
set(DPMLP_HAVE_NCCL OFF)
set(DPMLP_HAVE_CUTLASS OFF)
if(DPMLP_KOKKOS_HAS_CUDA)
  if(NOT DEFINED DPMLP_ENABLE_CUBLAS)
    set(DPMLP_ENABLE_CUBLAS ON)
  endif()
  if(NOT DEFINED DPMLP_ENABLE_NCCL)
    set(DPMLP_ENABLE_NCCL ON)
  endif()
  if(DPMLP_ENABLE_CUBLAS OR DPMLP_ENABLE_NCCL)
    _dpmlp_find(CUDAToolkit)
  endif()
  if(DPMLP_ENABLE_CUBLAS AND TARGET CUDA::cublas AND TARGET CUDA::cublasLt)
    set(DPMLP_HAVE_CUBLAS ON)
  endif()
  if(DPMLP_ENABLE_NCCL)
    find_path(DPMLP_NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    find_library(DPMLP_NCCL_LIBRARY nccl HINTS ${NCCL_ROOT} ENV NCCL_ROOT ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64)
    if(DPMLP_NCCL_INCLUDE_DIR AND DPMLP_NCCL_LIBRARY)
      set(DPMLP_HAVE_NCCL ON)
      if(NOT TARGET dpmlp::nccl)
        add_library(dpmlp::nccl UNKNOWN IMPORTED)
        set_target_properties(dpmlp::nccl PROPERTIES IMPORTED_LOCATION "${DPMLP_NCCL_LIBRARY}"
                                                     INTERFACE_INCLUDE_DIRECTORIES "${DPMLP_NCCL_INCLUDE_DIR}")
      endif()
    else()
      message(STATUS "dpmlp: NCCL not found; the MPI communicator is the only one")
    endif()
  endif()
  if(NOT DEFINED DPMLP_ENABLE_CUTLASS)
    set(DPMLP_ENABLE_CUTLASS ON)
  endif()
  if(DPMLP_ENABLE_CUTLASS AND DPMLP_HAVE_CUBLAS)
    if(NOT DPMLP_CUTLASS_INCLUDE_DIR)
      find_package(Python3 COMPONENTS Interpreter QUIET)
      if(Python3_Interpreter_FOUND)
        execute_process(COMMAND ${Python3_EXECUTABLE} -c
                                "import cutlass_library, os; print(os.path.dirname(cutlass_library.__file__))"
                        OUTPUT_VARIABLE _dpmlp_cutlass_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      endif()
    endif()
    find_path(DPMLP_CUTLASS_INCLUDE_DIR cutlass/gemm/device/gemm_universal.h
              HINTS ${CUTLASS_DIR} ENV CUTLASS_DIR "${_dpmlp_cutlass_py}/source"
              PATH_SUFFIXES include)
    if(DPMLP_CUTLASS_INCLUDE_DIR)
      set(DPMLP_HAVE_CUTLASS ON)
    else()
      message(STATUS "dpmlp: CUTLASS not found (set CUTLASS_DIR, or pip install nvidia-cutlass); deep models "
                     "run on cuBLASLt's FP32 kernels instead of 3xTF32 tensor cores")
    endif()
  endif()
endif()

# Attaches dependencies and backend switches to a target: dpmlp's INTERFACE target (the default scope), or,
# with scope PRIVATE, the dpmlp_cuda_kernels library that compiles dpmlp's CUDA kernels.
function(dpmlp_link_dependencies target)
  set(scope INTERFACE)
  if(ARGC GREATER 1)
    set(scope ${ARGV1})
  endif()
  target_link_libraries(${target} ${scope} Kokkos::kokkos MPI::MPI_CXX Eigen3::Eigen)
  # dpmlp calls MPI's C API only. OpenMPI's and MPICH's mpi.h otherwise pull in the deprecated C++ bindings
  # in every C++ translation unit (about a second of compile time each, benchmarks/compile_time.sh).
  target_compile_definitions(${target} ${scope} OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  if(DPMLP_HAVE_CUBLAS)
    target_link_libraries(${target} ${scope} CUDA::cublas CUDA::cublasLt)
    target_compile_definitions(${target} ${scope} DPMLP_HAVE_CUBLAS=1)
  endif()
  if(DPMLP_HAVE_CUTLASS)
    target_include_directories(${target} SYSTEM ${scope} "${DPMLP_CUTLASS_INCLUDE_DIR}")
    target_compile_definitions(${target} ${scope} DPMLP_HAVE_CUTLASS=1)
  endif()
  if(DPMLP_HAVE_NCCL)
    target_link_libraries(${target} ${scope} dpmlp::nccl)
    target_compile_definitions(${target} ${scope} DPMLP_HAVE_NCCL=1)
  endif()
  if(DPMLP_KOKKOS_HAS_CUDA)
    target_link_libraries(${target} ${scope} CUDA::cudart)
  endif()
endfunction()

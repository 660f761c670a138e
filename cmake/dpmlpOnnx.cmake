# SPDX-License-Identifier: BSD-3-Clause
# dpmlp::onnx, the optional ONNX export (include/dpmlp/onnx.hpp, src/onnx.cpp): a small compiled library on
# top of the header-only core, built only where ONNX's C++ library and protobuf are found (Debian:
# libonnx-dev, libprotobuf-dev). Without them it is skipped with a message; dpmlp::dpmlp never needs them.
#
# Sets DPMLP_HAVE_ONNX (ON when dpmlp::onnx is built). The search itself is dpmlpOnnxDependencies.cmake,
# installed beside dpmlpConfig.cmake so that consumers of an installed dpmlp run the same one.
option(DPMLP_ENABLE_ONNX "Build dpmlp::onnx (dpmlp::save_onnx) when ONNX and protobuf are found" ON)

set(DPMLP_HAVE_ONNX OFF)
if(DPMLP_ENABLE_ONNX)
  include(dpmlpOnnxDependencies)
  if(DPMLP_ONNX_FOUND)
    set(DPMLP_HAVE_ONNX ON)
  else()
    message(STATUS "dpmlp: ONNX export (dpmlp::onnx) skipped: ${DPMLP_ONNX_MISSING} "
                   "(Debian: apt-get install libonnx-dev libprotobuf-dev)")
  endif()
endif()

if(DPMLP_HAVE_ONNX)
  # Static, position-independent: linked into a consumer's executable or shared library alike, with no
  # library of dpmlp's own to find at run time.
  add_library(dpmlp_onnx STATIC "${PROJECT_SOURCE_DIR}/src/onnx.cpp")
  add_library(dpmlp::onnx ALIAS dpmlp_onnx)
  set_target_properties(dpmlp_onnx PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME onnx)
  target_link_libraries(dpmlp_onnx PUBLIC dpmlp::dpmlp PRIVATE onnx onnx_proto protobuf::libprotobuf)
  # Consumers test this to compile their ONNX paths (train_csv's --export).
  target_compile_definitions(dpmlp_onnx INTERFACE DPMLP_HAVE_ONNX=1)
  export(TARGETS dpmlp_onnx NAMESPACE dpmlp:: FILE "${PROJECT_BINARY_DIR}/dpmlpOnnxTargets.cmake")
  if(DPMLP_INSTALL)
    install(TARGETS dpmlp_onnx EXPORT dpmlpOnnxTargets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
    install(EXPORT dpmlpOnnxTargets NAMESPACE dpmlp:: DESTINATION "${DPMLP_CMAKE_DIR}")
  endif()
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/dpmlpOnnxDependencies.cmake"
               "${PROJECT_BINARY_DIR}/dpmlpOnnxDependencies.cmake" COPYONLY)
if(DPMLP_INSTALL)
  install(FILES cmake/dpmlpOnnxDependencies.cmake DESTINATION "${DPMLP_CMAKE_DIR}")
endif()
message(STATUS "dpmlp: ONNX export (dpmlp::onnx) ${DPMLP_HAVE_ONNX}")

# SPDX-License-Identifier: BSD-3-Clause
# The libraries dpmlp::onnx is built on: protobuf (CMake's FindProtobuf: protobuf::libprotobuf) and ONNX's
# CMake package (the imported targets onnx and onnx_proto). Run by dpmlp's build (dpmlpOnnx.cmake) and by
# dpmlpConfig.cmake for consumers. Quiet: sets DPMLP_ONNX_FOUND, and DPMLP_ONNX_MISSING to what was not found.
#
# ONNX's package config links onnx_proto to protobuf::libprotobuf without searching for protobuf itself, so
# protobuf is searched first.
set(DPMLP_ONNX_FOUND FALSE)
set(DPMLP_ONNX_MISSING "")
if(NOT TARGET protobuf::libprotobuf)
  find_package(Protobuf QUIET)
endif()
if(NOT TARGET protobuf::libprotobuf)
  set(DPMLP_ONNX_MISSING "protobuf (libprotobuf-dev) not found")
  return()
endif()
if(NOT TARGET onnx_proto)
  find_package(ONNX CONFIG QUIET)
endif()
if(NOT TARGET onnx_proto OR NOT TARGET onnx)
  set(DPMLP_ONNX_MISSING "ONNX's CMake package (libonnx-dev: ONNXConfig.cmake) not found")
  return()
endif()
set(DPMLP_ONNX_FOUND TRUE)

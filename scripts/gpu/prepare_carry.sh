#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Stages what a GPU-machine run needs into .carry/ (git-ignored), for the `device` tool's `carry`:
#   .carry/build-cuda   the CUDA build's executables and CTest files (stripped), at /tmp/build-cuda there
#   .carry/build-port   optional: a build with cuBLAS and NCCL off (the portable path)
#   .carry/builds.tar.xz  the two builds packed, when they would pass 60 MB
# The tests' reference data (tests/data) and the anchors (benchmarks/anchors) are in the repository, which
# travels with every call as it is.
# Usage: scripts/gpu/prepare_carry.sh <cuda build dir> [<portable build dir>]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
rm -rf .carry && mkdir -p .carry
stage() {  # stage <build dir> <name>
  local src="$1" dst=".carry/$2"
  mkdir -p "$dst"
  (cd "$src" && find . \( -name CTestTestfile.cmake -o -name CMakeCache.txt \) -print0 | xargs -0 -I{} cp --parents {} "$root/$dst/")
  for exe in $(cd "$src" && find examples tests benchmarks -maxdepth 1 -type f -executable 2>/dev/null); do
    mkdir -p "$dst/$(dirname "$exe")"
    strip -o "$dst/$exe" "$src/$exe"
  done
}
stage "$1" build-cuda
if [ $# -ge 2 ]; then stage "$2" build-port; fi
# The device tool carries at most 64 MiB: past 60 MB, the builds travel as one .tar.xz (the GPU-side scripts
# unpack it). Every trainer executable holds the tensor kernels' instantiations (~2.6 MB each).
if [ "$(du -sb .carry | cut -f1)" -gt 60000000 ]; then
  (cd .carry && tar -cf - build-* | xz -T0 -6 > builds.tar.xz && rm -rf build-cuda build-port)
fi
du -sh .carry/*

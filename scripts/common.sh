#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Shared set-up for scripts/test.sh and scripts/demo.sh: install what is missing, configure, build.
# Environment:
#   BUILD_DIR     build folder (default: build)
#   BUILD_TYPE    CMake build type (default: Release)
#   Kokkos_ROOT   a Kokkos >= 4 install to use instead of Debian's Kokkos 3.4 (Serial)
#   CMAKE_ARGS    extra configure arguments
#   JOBS          parallel build jobs (default: nproc)
set -euo pipefail

DPMLP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
JOBS="${JOBS:-$(nproc)}"

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# MPI refuses to run as root, and more ranks than cores, unless told; CI runs as root on two cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

dpmlp_install_packages() {
  local pkgs=(cmake make g++ libopenmpi-dev openmpi-bin catch2 libeigen3-dev "$@")
  if [ -z "${Kokkos_ROOT:-}" ]; then pkgs+=(libtrilinos-kokkos-dev); fi
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "packages: all present"
    return
  fi
  command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and no apt-get to install them"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
}

# dpmlp_configure_and_build <build dir> [extra cmake args...]; DPMLP_BUILD_TARGET=<target>: build that one only.
dpmlp_configure_and_build() {
  local dir="$1"; shift
  local args=(-S "$DPMLP_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE="$BUILD_TYPE")
  if [ -n "${Kokkos_ROOT:-}" ]; then args+=(-DKokkos_ROOT="$Kokkos_ROOT"); fi
  # shellcheck disable=SC2206
  if [ -n "${CMAKE_ARGS:-}" ]; then args+=(${CMAKE_ARGS}); fi
  log "configure: cmake ${args[*]} $*"
  cmake "${args[@]}" "$@"
  log "build: $dir (-j$JOBS)${DPMLP_BUILD_TARGET:+, target $DPMLP_BUILD_TARGET}"
  cmake --build "$dir" -j "$JOBS" ${DPMLP_BUILD_TARGET:+--target "$DPMLP_BUILD_TARGET"}
}

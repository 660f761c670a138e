#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# compile_time.sh: what including dpmlp costs a user's translation unit, in compile time.
#
# Compiles (-c, no link) three TUs with the same flags, RUNS times each, interleaved so they share the
# machine's load, and reports each one's median and the difference to the bare Kokkos TU:
#   bare     Kokkos_Core.hpp and one parallel_for (the floor every Kokkos user already pays)
#   include  dpmlp/dpmlp.hpp and the same parallel_for (the cost of the headers alone)
#   trainer  a realistic user TU: dpmlp/dpmlp.hpp, an Mlp, a DataParallelTrainer<DefaultExecutionSpace>
#            constructed, set_data and train called, the evaluator in a user kernel
# Goal: trainer - bare <= GOAL seconds (default 3).
#
# CUDA builds: --cxx <Kokkos' nvcc_wrapper> with KOKKOS_INCLUDE pointing at a CUDA Kokkos and the CUDA flags
# in CXXFLAGS_EXTRA (e.g. "-extended-lambda -arch=sm_90 -DDPMLP_HAVE_CUBLAS=1 -DDPMLP_HAVE_CUTLASS=1
# -isystem <cutlass>/include"). --kernels-once compiles the TUs as CMake's dpmlp::dpmlp target does by
# default there (DPMLP_CUDA_KERNELS_SEPARATE: dpmlp's CUDA kernels compiled once, in dpmlp_cuda_kernels) and
# also times that library's one TU (src/cuda_kernels.cpp), which a build pays once, not per TU.
#
# Usage: benchmarks/compile_time.sh [--runs N] [--goal S] [--cxx g++] [--kernels-once] [--diagnose]
#   --diagnose  also prints, for the trainer TU, the include count and the heaviest headers (-H), and
#               the top phases of -ftime-report
# Environment: KOKKOS_INCLUDE (default /usr/include/trilinos, Debian's Kokkos 3.4), EIGEN_INCLUDE (default
# /usr/include/eigen3), CXXFLAGS_EXTRA. MPI's include flags come from `mpicxx --showme:compile`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=5
GOAL=3
CXX="${CXX:-g++}"
DIAGNOSE=0
KERNELS_ONCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --goal) GOAL="$2"; shift 2 ;;
    --cxx) CXX="$2"; shift 2 ;;
    --diagnose) DIAGNOSE=1; shift ;;
    --kernels-once) KERNELS_ONCE=1; shift ;;
    -h|--help) sed -n '3,25p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

KOKKOS_INCLUDE="${KOKKOS_INCLUDE:-/usr/include/trilinos}"
EIGEN_INCLUDE="${EIGEN_INCLUDE:-/usr/include/eigen3}"
[ -f "$KOKKOS_INCLUDE/Kokkos_Core.hpp" ] || { echo "no Kokkos_Core.hpp in $KOKKOS_INCLUDE" >&2; exit 1; }
MPI_FLAGS="$(mpicxx --showme:compile 2>/dev/null || true)"
[ -n "$MPI_FLAGS" ] || { echo "mpicxx --showme:compile gave nothing (OpenMPI's mpicxx needed)" >&2; exit 1; }

# shellcheck disable=SC2206
# OMPI_SKIP_MPICXX / MPICH_SKIP_MPICXX: the dpmlp::dpmlp target's INTERFACE definitions (a CMake user gets them).
FLAGS=(-O2 -std=c++17 -I"$ROOT/include" -isystem "$KOKKOS_INCLUDE" $MPI_FLAGS -isystem "$EIGEN_INCLUDE"
       -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 ${CXXFLAGS_EXTRA:-})
[ "$KERNELS_ONCE" = 1 ] && FLAGS+=(-DDPMLP_CUDA_KERNELS_SEPARATE=1)

WORK="$(mktemp -d "${TMPDIR:-/tmp}/dpmlp_compile_time.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/bare.cpp" <<'EOF'
#include <Kokkos_Core.hpp>

int main(int argc, char* argv[]) {
  Kokkos::initialize(argc, argv);
  {
    Kokkos::View<float*> v("v", 1000);
    Kokkos::parallel_for("fill", v.extent(0), KOKKOS_LAMBDA(const int i) { v(i) = 2.0f * i; });
    Kokkos::fence();
  }
  Kokkos::finalize();
  return 0;
}
EOF

cat > "$WORK/include.cpp" <<'EOF'
#include <dpmlp/dpmlp.hpp>

int main(int argc, char* argv[]) {
  Kokkos::initialize(argc, argv);
  {
    Kokkos::View<float*> v("v", 1000);
    Kokkos::parallel_for("fill", v.extent(0), KOKKOS_LAMBDA(const int i) { v(i) = 2.0f * i; });
    Kokkos::fence();
  }
  Kokkos::finalize();
  return 0;
}
EOF

cat > "$WORK/trainer.cpp" <<'EOF'
// A realistic user TU: the README's "Using it", with a user kernel calling the evaluator.
#include <dpmlp/dpmlp.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  dpmlp::initialize_kokkos_for_rank(MPI_COMM_WORLD);
  {
    using Space = Kokkos::DefaultExecutionSpace;
    using Matrix = Kokkos::View<float**, Kokkos::LayoutRight, Space::memory_space>;
    const std::int64_t global_rows = 4096;
    dpmlp::Mlp<float, Space::memory_space> model({32, 32, 1});
    model.init_jax(dpmlp::random::PRNGKey(1), 0.1f);
    dpmlp::DataParallelTrainer<Space> trainer(MPI_COMM_WORLD, model, global_rows, dpmlp::Sgd(0.02));
    const auto shard = trainer.shard();
    Matrix x("x", shard.rows(), 32), y("y", shard.rows(), 1), p("p", shard.rows(), 1);
    trainer.set_data(x, y);
    const auto result = trainer.train(100);
    const auto eval = model.evaluator();
    Kokkos::parallel_for("use", Kokkos::RangePolicy<Space>(0, shard.rows()), KOKKOS_LAMBDA(const std::int64_t i) {
      eval(Kokkos::subview(x, i, Kokkos::ALL), Kokkos::subview(p, i, Kokkos::ALL));
    });
    std::printf("%g -> %g\n", result.first_loss, result.last_loss);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
EOF

cp "$ROOT/src/cuda_kernels.cpp" "$WORK/kernels.cpp"
cp "$ROOT/src/cuda_trainers_float.cpp" "$WORK/trainers_f.cpp"
cp "$ROOT/src/cuda_trainers_double.cpp" "$WORK/trainers_d.cpp"
cp "$ROOT/src/cuda_trainers.inc" "$WORK/cuda_trainers.inc"  # their shared body

compile_seconds() {  # compile_seconds <tu>: one compile, wall seconds on stdout
  local t0 t1
  t0=$(date +%s.%N)
  "$CXX" "${FLAGS[@]}" -c "$WORK/$1.cpp" -o "$WORK/$1.o"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "compiler:  $($CXX --version | head -1)"
echo "flags:     ${FLAGS[*]}"
echo "machine:   $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
TUS=(bare include trainer)
[ "$KERNELS_ONCE" = 1 ] && TUS+=(kernels trainers_f trainers_d)
declare -A TIMES
# Warm the file cache. nvcc (Kokkos' nvcc_wrapper for CUDA) has no -fsyntax-only: a full compile there.
if "$CXX" --version 2>/dev/null | grep -q nvcc; then
  for tu in "${TUS[@]}"; do "$CXX" "${FLAGS[@]}" -c "$WORK/$tu.cpp" -o "$WORK/$tu.o"; done
else
  for tu in "${TUS[@]}"; do "$CXX" "${FLAGS[@]}" -fsyntax-only "$WORK/$tu.cpp"; done
fi
for ((r = 1; r <= RUNS; ++r)); do
  for tu in "${TUS[@]}"; do
    TIMES[$tu]+="$(compile_seconds "$tu") "
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '\n%-10s %8s   %s\n' tu median "runs (s)"
declare -A MED
for tu in "${TUS[@]}"; do
  MED[$tu]=$(tr ' ' '\n' <<<"${TIMES[$tu]}" | grep -v '^$' | median)
  printf '%-10s %8.2f   %s\n' "$tu" "${MED[$tu]}" "$(for t in ${TIMES[$tu]}; do printf '%.2f ' "$t"; done)"
done
INC=$(awk -v a="${MED[include]}" -v b="${MED[bare]}" 'BEGIN { print a - b }')
DIFF=$(awk -v a="${MED[trainer]}" -v b="${MED[bare]}" 'BEGIN { print a - b }')
printf '\nheaders alone (include - bare):   %+.2f s\n' "$INC"
printf 'realistic TU (trainer - bare):    %+.2f s   goal <= %s s: %s\n' "$DIFF" "$GOAL" \
  "$(awk -v d="$DIFF" -v g="$GOAL" 'BEGIN { print (d <= g ? "PASS" : "MISSED") }')"
if [ "$KERNELS_ONCE" = 1 ]; then
  printf 'once a build (dpmlp_cuda_kernels): %.2f s in all (kernels %.2f, float trainers %.2f, double trainers %.2f)\n' \
    "$(awk -v a="${MED[kernels]}" -v b="${MED[trainers_f]}" -v c="${MED[trainers_d]}" 'BEGIN { print a + b + c }')" \
    "${MED[kernels]}" "${MED[trainers_f]}" "${MED[trainers_d]}"
fi

if [ "$DIAGNOSE" = 1 ]; then
  echo
  echo "== -H (headers included by each TU; depth-1 = included directly by the TU)"
  for tu in bare trainer; do
    "$CXX" "${FLAGS[@]}" -fsyntax-only -H "$WORK/$tu.cpp" 2> "$WORK/$tu.H" || true
    printf '%-8s %5d header inclusions\n' "$tu" "$(grep -c '^\.' "$WORK/$tu.H")"
  done
  echo "-- headers in the trainer TU but not in the bare one, by the library header that pulls them in:"
  grep '^\.' "$WORK/bare.H" | sed 's/^\.* //' | sort -u > "$WORK/bare.list"
  awk -v bare="$WORK/bare.list" '
    BEGIN { while ((getline l < bare) > 0) seen[l] = 1 }
    /^\./ { match($0, /^\.+/); d = RLENGTH; f = substr($0, d + 2)
            if (f ~ /include\/dpmlp\//) owner[d] = f
            if (!(f in seen) && !(f ~ /include\/dpmlp\//)) { o = ""; for (k = d - 1; k >= 1; --k) if (k in owner) { o = owner[k]; break }
              n[o]++ }
            for (k in owner) if (k > d) delete owner[k] }
    END { for (o in n) printf "%6d  %s\n", n[o], (o == "" ? "(the TU)" : o) }' "$WORK/trainer.H" | sort -rn | head -15
  echo "-- the largest new header families:"
  grep '^\.' "$WORK/trainer.H" | sed 's/^\.* //' | sort -u | comm -23 - "$WORK/bare.list" |
    sed -E 's#^(/usr/include/[^/]+(/[^/]+)?)/.*#\1#; s#^(/usr/include/c\+\+/[0-9]+/[^/]+).*#\1#' | sort | uniq -c |
    sort -rn | head -10
  echo
  echo "== -ftime-report (trainer TU), the phases over 3% of the time"
  "$CXX" "${FLAGS[@]}" -c -ftime-report "$WORK/trainer.cpp" -o "$WORK/trainer.o" 2> "$WORK/trainer.ftr" || true
  # GCC prints "name : usr ( %) sys ( %) wall ( %) mem ( %)"; keep the lines whose wall share is >= 3%.
  awk -F'(' '/^ [a-zA-Z|]/ && NF >= 4 { split($4, w, "%"); if (w[1] + 0 >= 3) print }' "$WORK/trainer.ftr" | head -25
  grep -E '^ TOTAL' "$WORK/trainer.ftr" || true
fi

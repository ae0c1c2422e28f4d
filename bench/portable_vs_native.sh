#!/usr/bin/env bash
# Times the portable build's steps against a native build's, interleaved on one
# machine (docs/library.md, "Portable builds"). Run by hand:
#
#   meson setup build-native -Dnative=true && ninja -C build-native bench/dpgrad-bench
#   bench/portable_vs_native.sh build-native/bench/dpgrad-bench build/bench/dpgrad-bench [ROUNDS]
#
# Each round runs every model's none and ghost rows once with each binary, the
# two builds alternating (native first in odd rounds, portable first in even
# ones), so that load on the machine falls on both alike. A row's figure is its
# ms per step (dpgrad-bench's median over its timed steps); the ratio is the
# median over the rounds of portable / native. Prints a markdown table.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 NATIVE_DPGRAD_BENCH PORTABLE_DPGRAD_BENCH [ROUNDS (default 5)]" >&2
  exit 2
fi
native=$1 portable=$2 rounds=${3:-5}
for b in "$native" "$portable"; do
  [ -x "$b" ] || { echo "$0: $b is not an executable dpgrad-bench" >&2; exit 2; }
done
case $rounds in ''|*[!0-9]*|0) echo "$0: ROUNDS must be a whole number >= 1, got '$rounds'" >&2; exit 2 ;; esac

# model, batch, timed steps
rows=("mlp 256 200" "logreg 256 200" "cnn26k 256 20" "scatter-linear 256 10" "scatter-cnn 256 10"
  "bilstm598k 256 5" "bigru 256 5" "transformer 64 5" "transformer 256 3")
threads=${DPGRAD_BENCH_THREADS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# one binary's none and ghost rows of one model: "method ms" lines
run_row() {
  local bin=$1 model=$2 batch=$3 steps=$4
  "$bin" --model "$model" --batch "$batch" --methods none,ghost --steps "$steps" --threads "$threads" --json 2>/dev/null |
    sed -n 's/.*"method":"\([^"]*\)".*"ms_per_step":\([0-9.eE+-]*\).*/\1 \2/p'
}

for ((r = 1; r <= rounds; r++)); do
  echo "round $r of $rounds" >&2
  for row in "${rows[@]}"; do
    read -r model batch steps <<<"$row"
    order=(native portable)
    [ $((r % 2)) -eq 0 ] && order=(portable native)
    for build in "${order[@]}"; do
      bin=$native
      [ "$build" = portable ] && bin=$portable
      run_row "$bin" "$model" "$batch" "$steps" | while read -r method ms; do
        echo "$r $ms" >>"$out/$model-$batch-$method-$build"
      done
    done
  done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "| model | batch | method | native ms | portable ms | portable / native (median of $rounds rounds) | target |"
echo "|---|---:|---|---:|---:|---:|---|"
for row in "${rows[@]}"; do
  read -r model batch steps <<<"$row"
  for method in none ghost; do
    n=$out/$model-$batch-$method-native p=$out/$model-$batch-$method-portable
    if [ ! -s "$n" ] || [ ! -s "$p" ]; then
      echo "| $model | $batch | $method | - | - | - | no result |"
      continue
    fi
    ratio=$(awk 'NR == FNR { n[$1] = $2; next } ($1 in n) { print $2 / n[$1] }' "$n" "$p" | median)
    verdict=$(awk -v x="$ratio" 'BEGIN { print (x <= 1.10 ? "<= 1.10x: ok" : "<= 1.10x: MISSED") }')
    printf '| %s | %s | %s | %.2f | %.2f | %.3f | %s |\n' "$model" "$batch" "$method" \
      "$(cut -d' ' -f2 "$n" | median)" "$(cut -d' ' -f2 "$p" | median)" "$ratio" "$verdict"
  done
done

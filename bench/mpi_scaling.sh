#!/usr/bin/env bash
# Data-parallel scaling on this machine (docs/distributed.md): private steps of
# cnn26k (Fashion-MNIST) and bilstm598k (SpamAssassin), ghost clipping, logical
# batch 4096 clipped in physical chunks of PHYSICAL examples per rank (the
# fastest layout of one process too), as 1 process x 1 thread, 1 process x 2
# threads and 2 ranks x 1 thread, side by side; each the median of REPEATS runs
# of STEPS steps (time inside the steps; "comm" is the part spent summing and
# sending gradients, "wait" the part spent waiting for the slower rank).
#   bench/mpi_scaling.sh [BUILD_DIR] [STEPS] [REPEATS] [PHYSICAL]
set -euo pipefail
build=${1:-build} steps=${2:-4} repeats=${3:-3} physical=${4:-256}
train=$build/programs/dpgrad-train
command -v mpirun >/dev/null || { echo "mpirun not found (./dev deps installs openmpi-bin)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
field() { grep '"final":true' | sed -E "s/.*\"$1\":([^,}]*).*/\1/"; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

declare -A data=([cnn26k]=fashion-mnist [bilstm598k]=spamassassin)
printf '%-11s %-7s %9s %9s %9s %8s\n' model layout "s/step" "comm s" "wait s" speedup
for model in cnn26k bilstm598k; do
  args=(--dataset "${data[$model]}" --model "$model" --optimizer dp-sgd --lr 0.1 --batch-size 4096 --epochs 1
        --max-steps "$steps" --clip-strategy ghost --noise-multiplier 1 --physical-batch-size "$physical" --json)
  base=""
  for layout in 1x1 1x2 2x1; do
    per_step=() comm=() wait=()
    for _ in $(seq "$repeats"); do
      case $layout in
        1x1) out=$("$train" "${args[@]}" --threads 1 2>/dev/null) ;;
        1x2) out=$("$train" "${args[@]}" --threads 2 2>/dev/null) ;;
        2x1) out=$(mpirun -np 2 "$train" "${args[@]}" --threads 1 2>/dev/null) ;;
      esac
      per_step+=("$(echo "$out" | field step_seconds | awk -v s="$steps" '{print $1 / s}')")
      comm+=("$(echo "$out" | field communication_seconds | awk -v s="$steps" '{print ($1 == "" ? 0 : $1) / s}')")
      wait+=("$(echo "$out" | field wait_seconds | awk -v s="$steps" '{print ($1 == "" ? 0 : $1) / s}')")
    done
    t=$(printf '%s\n' "${per_step[@]}" | median)
    c=$(printf '%s\n' "${comm[@]}" | median)
    w=$(printf '%s\n' "${wait[@]}" | median)
    [ -z "$base" ] && base=$t
    printf '%-11s %-7s %9.3f %9.4f %9.4f %8.2f\n' "$model" "$layout" "$t" "$c" "$w" "$(awk -v a="$base" -v b="$t" 'BEGIN {print a / b}')"
  done
done

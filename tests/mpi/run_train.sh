#!/usr/bin/env bash
# dpgrad-train under mpirun, as a user runs it (docs/distributed.md):
#   run_train.sh MPIRUN DPGRAD_TRAIN
# 1. two ranks release what one process releases (reproducible noise, by name);
# 2. a strategy that cannot shard ends the job with a clear error, not a hang, and so does --help on one rank;
# 3. a rank killed mid-run ends the job; the run then resumes from its last
#    checkpoint, on 2 ranks and on 1 process, and finishes with the epsilon of
#    an uninterrupted run;
# 4. a private feature centre is the same release on 2 ranks as on 1 process.
set -uo pipefail
mpirun=$1 train=$2
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d "${TMPDIR:-/tmp}/dpgrad-mpi-train-XXXXXX")
trap 'rm -rf "$work"' EXIT
# checkpoint keys (docs/checkpoints.md) in a store of this script's own
export DPGRAD_KEY_STORE="$work/keys"
mkdir -m 700 "$DPGRAD_KEY_STORE"
fail() { echo "FAIL: $*" >&2; exit 1; }
np2() { "$mpirun" --oversubscribe -np 2 "$@"; }
field() { grep '"final":true' "$1" | sed -E "s/.*\"$2\":([^,}]*).*/\1/"; }

run=(--dataset synthetic --model mlp --hidden 16 --optimizer dp-sgd --lr 0.5 --batch-size 64)

# 1. the same numbers from 1 process (no MPI) and from 2 ranks
"$train" "${run[@]}" --epochs 2 --target-epsilon 3 --reproducible-noise --seed 3 --json >"$work/one.json" 2>/dev/null ||
  fail "the single-process run failed"
np2 "$train" "${run[@]}" --epochs 2 --target-epsilon 3 --reproducible-noise --seed 3 --json >"$work/two.json" 2>"$work/two.err" ||
  { cat "$work/two.err" >&2; fail "the 2-rank run failed"; }
[ "$(grep -c '"final":true' "$work/two.json")" = 1 ] || fail "2 ranks printed $(grep -c '"final":true' "$work/two.json") summaries, not 1"
[ "$(field "$work/two.json" processes)" = 2 ] || fail "the summary does not say \"processes\": 2"
for key in test_accuracy epsilon noise_multiplier; do
  [ "$(field "$work/one.json" $key)" = "$(field "$work/two.json" $key)" ] ||
    fail "$key: 1 process $(field "$work/one.json" $key), 2 ranks $(field "$work/two.json" $key)"
done
echo "ok: 2 ranks = 1 process (test accuracy $(field "$work/two.json" test_accuracy), epsilon $(field "$work/two.json" epsilon))"

# 2. refused on every rank, with the reason, and a non-zero exit
timeout 120 "$mpirun" --oversubscribe -np 2 "$train" "${run[@]}" --epochs 1 --target-epsilon 3 \
  --clip-strategy microbatch:4 >"$work/micro.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "microbatch on 2 ranks: exit code $rc (124: it hung)"
grep -q "cannot run on 2 processes" "$work/micro.out" || { cat "$work/micro.out" >&2; fail "no clear error for microbatch"; }
echo "ok: microbatch:4 on 2 ranks refused (exit $rc)"

# 2b. ranks started with different settings: refused on every rank, naming what differs, never a hang
differ() {  # differ NAME "rank 0's flags" "rank 1's flags" WHAT (flags over a base without the varied ones)
  local base="--dataset synthetic --model mlp --optimizer dp-sgd"
  # shellcheck disable=SC2086
  timeout 120 "$mpirun" --oversubscribe -np 1 "$train" $base $2 : -np 1 "$train" $base $3 >"$work/differ-$1.out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "ranks differing in $1: exit code $rc (124: it hung)"
  grep -q "differ in .*$4" "$work/differ-$1.out" || { cat "$work/differ-$1.out" >&2; fail "no message names $4"; }
  grep -q '"final"' "$work/differ-$1.out" && fail "ranks differing in $1 reported a result"
  echo "ok: ranks differing in $1 refused (exit $rc)"
}
same="--hidden 16 --lr 0.5 --batch-size 64 --epochs 1"
differ sigma "$same --noise-multiplier 2 --clip-norm 1" "$same --noise-multiplier 0.5 --clip-norm 50" "clip-norm"
differ epsilon "$same --target-epsilon 3" "$same --target-epsilon 8" "target-epsilon"
differ delta "$same --target-epsilon 3 --delta 1e-5" "$same --target-epsilon 3 --delta 1e-6" "delta"
differ sampler "$same --target-epsilon 3" "$same --target-epsilon 3 --sampler fixed" "sampler"
differ seed "$same --target-epsilon 3 --seed 1" "$same --target-epsilon 3 --seed 2" "seed"
differ checkpoints "$same --target-epsilon 3 --checkpoint-dir $work/c0" "$same --target-epsilon 3 --checkpoint-dir $work/c1" \
  "checkpoint-dir"
differ lr "--hidden 16 --batch-size 64 --epochs 1 --target-epsilon 3 --lr 0.1" \
  "--hidden 16 --batch-size 64 --epochs 1 --target-epsilon 3 --lr 0.2" "lr"
differ epochs "--hidden 16 --lr 0.5 --batch-size 64 --target-epsilon 3 --epochs 1" \
  "--hidden 16 --lr 0.5 --batch-size 64 --target-epsilon 3 --epochs 2" "epochs"
differ batch "--hidden 16 --lr 0.5 --epochs 1 --target-epsilon 3 --batch-size 64" \
  "--hidden 16 --lr 0.5 --epochs 1 --target-epsilon 3 --batch-size 32" "batch-size"
differ model "--lr 0.5 --batch-size 64 --epochs 1 --target-epsilon 3 --hidden 16" \
  "--lr 0.5 --batch-size 64 --epochs 1 --target-epsilon 3 --hidden 32" "hidden"

# 2c. one rank given --help or a refused command line, the other a run: every rank ends, never a hang
stops() {  # stops NAME "rank 0's flags" "rank 1's flags"
  # shellcheck disable=SC2086
  timeout 120 "$mpirun" --oversubscribe -np 1 "$train" $2 : -np 1 "$train" $3 >"$work/stop-$1.out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$1: exit code $rc (124: it hung)"
  grep -q "ended before the run" "$work/stop-$1.out" || { cat "$work/stop-$1.out" >&2; fail "$1: no message"; }
  grep -q '"final"' "$work/stop-$1.out" && fail "$1: a rank ran"
  echo "ok: $1 ended every rank (exit $rc)"
}
quick="--dataset synthetic --model mlp --hidden 16 --optimizer dp-sgd --lr 0.5 --batch-size 64 --epochs 1 --json"
stops help-on-rank-0 "--help" "$quick"
stops help-on-rank-1 "$quick" "--help"
stops bad-flag-on-rank-1 "$quick" "$quick --no-such-flag"
timeout 120 "$mpirun" --oversubscribe -np 2 "$train" --help >/dev/null 2>&1 || fail "--help on every rank: exit code $?"
echo "ok: --help on every rank exits 0"

# 3. killed, then resumed
long=("${run[@]}" --epochs 8 --target-epsilon 3 --json)
np2 "$train" "${long[@]}" >"$work/whole.json" 2>/dev/null || fail "the uninterrupted 2-rank run failed"
ckpt="$work/ckpt"
np2 "$train" "${long[@]}" --checkpoint-dir "$ckpt" >"$work/killed.json" 2>"$work/killed.err" &
job=$!
for _ in $(seq 600); do [ -f "$ckpt/latest" ] && break; sleep 0.1; done
[ -f "$ckpt/latest" ] || { kill $job; fail "no checkpoint appeared"; }
victim=$(pgrep -f -n "^$train .*--checkpoint-dir $ckpt") || fail "no rank process found"
kill -9 "$victim"
for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then kill -9 $job; fail "the job hung after a rank was killed"; fi
wait $job
rc=$?
[ $rc -ne 0 ] || fail "the job whose rank was killed exited 0"
grep -q '"final":true' "$work/killed.json" && fail "the killed job finished anyway (kill it earlier)"
grep -qiE "signal 9|killed" "$work/killed.err" || { cat "$work/killed.err" >&2; fail "no message says a rank was killed"; }
echo "ok: a rank killed mid-run ended the job (exit $rc, checkpoint at step $(cat "$ckpt/latest"))"
cp -r "$ckpt" "$work/ckpt1"
rm -f "$work/ckpt1/.lock"
# the key store as it was at the kill: the copy is resumed below as if the 2-rank resume had never run (that one
# moves the run's high-water mark past the copy, which is then refused as an older copy, by design)
cp -a "$DPGRAD_KEY_STORE" "$work/keys-at-kill"
np2 "$train" --resume --checkpoint-dir "$ckpt" --json >"$work/resumed.json" 2>"$work/resumed.err" ||
  { cat "$work/resumed.err" >&2; fail "the resumed run failed"; }
[ "$(field "$work/resumed.json" epsilon)" = "$(field "$work/whole.json" epsilon)" ] ||
  fail "epsilon: resumed $(field "$work/resumed.json" epsilon), uninterrupted $(field "$work/whole.json" epsilon)"
[ "$(field "$work/resumed.json" steps)" = "$(field "$work/whole.json" steps)" ] || fail "the resumed run's step count differs"
echo "ok: resumed and finished at epsilon $(field "$work/resumed.json" epsilon), as the uninterrupted run"
# the same checkpoint on one process: the batches never depended on the number of ranks
"$train" --resume --checkpoint-dir "$work/ckpt1" --json >"$work/rewound.out" 2>&1 &&
  fail "the copy older than the run's latest checkpoint was resumed"
grep -q "older copy" "$work/rewound.out" || { cat "$work/rewound.out" >&2; fail "no message names the older copy"; }
echo "ok: the copy older than the run's high-water mark was refused"
rm -rf "$DPGRAD_KEY_STORE" && cp -a "$work/keys-at-kill" "$DPGRAD_KEY_STORE"
"$train" --resume --checkpoint-dir "$work/ckpt1" --json >"$work/resumed1.json" 2>"$work/resumed1.err" ||
  { cat "$work/resumed1.err" >&2; fail "the 2-rank checkpoint did not resume on one process"; }
[ "$(field "$work/resumed1.json" epsilon)" = "$(field "$work/whole.json" epsilon)" ] ||
  fail "epsilon resumed on 1 process: $(field "$work/resumed1.json" epsilon), uninterrupted $(field "$work/whole.json" epsilon)"
[ "$(field "$work/resumed1.json" processes)" = 1 ] || fail "the resumed single-process run does not say \"processes\": 1"
echo "ok: the 2-rank checkpoint also resumed on one process, at the same epsilon"

# 4. a private feature centre: the ranks' rows summed, noised once; 2 ranks release what 1 process releases
centred=(--dataset synthetic --model scatter-linear --optimizer dp-momentum --lr 1 --clip-norm 0.1 --batch-size 64
  --train-limit 512 --test-limit 128 --epochs 2 --target-epsilon 3 --centre-features 5 --reproducible-noise --seed 4
  --json)
"$train" "${centred[@]}" >"$work/centre1.json" 2>/dev/null || fail "the single-process centred run failed"
np2 "$train" "${centred[@]}" >"$work/centre2.json" 2>"$work/centre2.err" ||
  { cat "$work/centre2.err" >&2; fail "the 2-rank centred run failed"; }
for key in test_accuracy epsilon noise_multiplier feature_mean; do  # feature_mean: its release's noise multiplier
  [ "$(field "$work/centre1.json" $key)" = "$(field "$work/centre2.json" $key)" ] ||
    fail "--centre-features, $key: 1 process $(field "$work/centre1.json" $key), 2 ranks $(field "$work/centre2.json" $key)"
done
echo "ok: --centre-features on 2 ranks = 1 process (test accuracy $(field "$work/centre2.json" test_accuracy))"

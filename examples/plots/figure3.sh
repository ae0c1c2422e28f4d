#!/usr/bin/env bash
# Figure 3 of Bu et al. 2021 (DP-SGD-JL): epsilon after each epoch for JL dimensions
# K = 1, 3, 5, 10, 30 (the sound account, and the paper's pair beside it, which is not an
# upper bound) and for exact DP-SGD, in the paper's IMDb setting, computed by
# `dpgrad-account --curve` and drawn with gnuplot. Builds nothing.
#   examples/plots/figure3.sh [DPGRAD_ACCOUNT [OUTPUT.png]]
# Writes OUTPUT.png and, next to it, OUTPUT's name with .dat (the numbers plotted).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
account=${1:-$root/build/programs/dpgrad-account}
out=${2:-$here/figure3.png}
dat=${out%.png}.dat

# The IMDb run of the paper (§3.1): 25000 reviews, batch 256. The noise multiplier,
# delta and number of epochs are chosen here (see README.md).
n=25000 batch=256 sigma=1.0 delta=1e-5 epochs=20
jl_dims=(1 3 5 10 30)

say() { printf '[figure3] %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

[ -x "$account" ] || die "no dpgrad-account at $account (build it: ninja -C build, or give its path)"
command -v gnuplot >/dev/null || die "gnuplot not found (sudo apt-get install gnuplot-nox; ./dev deps does)"
case $out in *.png) ;; *) die "the output must end in .png, got $out" ;; esac
mkdir -p "$(dirname "$out")"
terminal=pngcairo
[[ $(gnuplot -e 'set terminal' 2>&1) == *pngcairo* ]] || terminal=png

# The epsilon column(s) of one curve, one line per epoch ("inf" where none is proved);
# the table's values are rounded up. With --jl-paper-pair a second column holds the
# paper pair's figure (a comparison, not an upper bound).
curve() {
  "$account" --dataset-size $n --batch-size $batch --noise-multiplier $sigma --delta $delta \
    --epochs $epochs --curve "$@" |
    awk 'table { out = $3; if (NF > 3) out = out " " $4; print out } $1 == "epoch" && $2 == "steps" { table = 1 }'
}

columns=() names=()
timed() {  # timed NAME ARGS...: runs one curve into a temporary column file
  local name=$1; shift
  local file start=$SECONDS
  file=$(mktemp)
  curve "$@" >"$file"
  [ "$(wc -l <"$file")" -eq $epochs ] || die "dpgrad-account $* did not print $epochs epochs"
  columns+=("$file") names+=("$name")
  say "$name: $((SECONDS - start)) s"
}
trap 'rm -f "${columns[@]}"' EXIT
total=$SECONDS
for k in "${jl_dims[@]}"; do timed "jl$k jl${k}paper" --accountant pld --jl-dim "$k" --jl-paper-pair; done
timed pld --accountant pld
timed rdp --accountant rdp

{
  echo "# epsilon after each epoch (upper bounds, rounded up; inf: none proved), delta = $delta"
  echo "# N = $n, batch = $batch (q = $batch/$n), noise multiplier = $sigma, add/remove-one neighbours"
  echo "# jlK: DP-SGD-JL with K projections (PLD accountant, sound: X revealed, mixture over X)"
  echo "# jlKpaper: the paper's pair (N(0,1), E_X N(Z,1)): NOT an upper bound, comparison only"
  echo "# pld, rdp: exact per-sample norms"
  echo "# epoch ${names[*]}"
  paste -d ' ' <(seq 1 $epochs) "${columns[@]}"
} >"$dat"

# One plot element per curve: drawn where finite; a curve with no finite epsilon keeps
# its key entry (a NaN function draws nothing) and every title says where inf was.
series() {  # series COLUMN LABEL STYLE
  local infs finite
  infs=$(awk -v c="$1" '!/^#/ && $c == "inf" { printf "%s%s", sep, $1; sep = "," }' "$dat")
  finite=$(awk -v c="$1" '!/^#/ && $c != "inf"' "$dat")
  if [ -z "$infs" ]; then echo "'$dat' using 1:$1 with $3 title '$2'"
  elif [ -z "$finite" ]; then echo "NaN with $3 title '$2: epsilon = inf at every epoch (not drawn)'"
  else echo "'$dat' using 1:$1 with $3 title '$2: inf at epochs $infs (not drawn)'"
  fi
}
colours=('#d62728' '#ff7f0e' '#2ca02c' '#1f77b4' '#9467bd')
plots=()
for i in "${!jl_dims[@]}"; do
  plots+=("$(series $((2 * i + 2)) "DP-SGD-JL(${jl_dims[i]}), PLD (upper bound)" \
    "linespoints lw 2 pt 7 ps 0.7 lc rgb '${colours[i % ${#colours[@]}]}'")")
  plots+=("$(series $((2 * i + 3)) "DP-SGD-JL(${jl_dims[i]}), paper pair (NOT an upper bound)" \
    "lines lw 1.5 dt 3 lc rgb '${colours[i % ${#colours[@]}]}'")")
done
col=$((2 * ${#jl_dims[@]} + 2))
plots+=("$(series $col "DP-SGD, exact norms, PLD" "linespoints lw 2 pt 5 ps 0.7 lc rgb 'black'")")
plots+=("$(series $((col + 1)) "DP-SGD, exact norms, RDP (reference)" "lines lw 1.5 dt 2 lc rgb 'gray40'")")
plot_list=$(IFS=','; echo "${plots[*]}")

gnuplot <<EOF
set terminal $terminal size 960,720 font 'sans,11'
set output '$out'
set title "Privacy of DP-SGD-JL against epochs (Bu et al. 2021, Fig. 3 setting: IMDb, N = $n, batch $batch)\nnoise multiplier $sigma, delta = $delta, $epochs epochs (chosen here); dotted: the paper's pair, not an upper bound" noenhanced
set xlabel 'epoch' offset 0,0.3
set ylabel 'epsilon at delta = $delta (upper bound)' noenhanced
set logscale y
set format y '%g'
set grid xtics ytics mytics
set xrange [0.5:$epochs.5]
set xtics 1,1,$epochs
set key below left Left reverse width 2 spacing 1.1 noenhanced
set autoscale yfix
set offsets 0, 0, graph 0.06, graph 0.06
set datafile missing 'inf'
plot $plot_list
EOF
say "wrote $out and $dat in $((SECONDS - total)) s"

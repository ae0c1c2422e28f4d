#!/usr/bin/env bash
# The fine-tuning experiment of EXPERIMENTS.md ("Fine-tuning an imported
# model"): Fashion-MNIST classes 5-9 as the private data, a CNN pretrained on
# classes 0-4 (the public data, bench/onnx_pretrain.py) fine-tuned privately
# with its convolutions frozen and unfrozen, against the same architecture
# trained from scratch privately; epsilon 1 and 3, three runs each.
#   bench/onnx_finetune.sh MODELS_DIR [BUILD_DIR] > results.jsonl
# MODELS_DIR holds pretrained.onnx and scratch.onnx. One JSON line per run.
set -euo pipefail
models=${1:?MODELS_DIR}
build=${2:-build}
common="--dataset fashion-mnist --classes 5,6,7,8,9 --optimizer dp-momentum --lr 0.5 --batch-size 1024 --epochs 20 --json"
for eps in 1 3; do
  for run in 1 2 3; do
    for setting in scratch frozen unfrozen; do
      case $setting in
        scratch) args="--model onnx:$models/scratch.onnx" ;;
        frozen) args="--model onnx:$models/pretrained.onnx --freeze conv" ;;
        unfrozen) args="--model onnx:$models/pretrained.onnx" ;;
      esac
      final=$("$build/programs/dpgrad-train" $args $common --target-epsilon "$eps" --seed "$run" | tail -n 1)
      echo "{\"setting\": \"$setting\", \"epsilon_target\": $eps, \"run\": $run, \"final\": $final}"
    done
  done
done

#!/usr/bin/env bash
# Inference latency (`vramlab bench-inference`): per-call select_action latency at a fixed rate,
# p50/p95/p99/max against the frame budget, for two randomly initialised checkpoints written by a
# one-step `vramlab train` on random data (latency depends on shapes, not on the weights):
#   - ACT, lerobot's default model (ResNet18, dim_model 512, chunk_size 100, n_action_steps 100),
#     one 480×640 camera, 14-dim state/action, at 30 fps: action queue and temporal ensembling;
#   - Diffusion Policy, lerobot's defaults at PushT size (one 96×96 camera, state/action 2,
#     n_obs_steps 2, horizon 16, n_action_steps 8, DDPM 100 steps), at PushT's 10 fps;
#     24 calls, 3 of them sampling a chunk (~75 s each on 2 CPU cores).
# BACKEND=flex (default) | wgpu | cuda (built with that feature). Writes
# benches/results/inference/<backend>/{act,diffusion}/{latency.jsonl,summary.md}.
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${BACKEND:-flex}
features=()
[ "$backend" != flex ] && features=(--features "$backend")
cargo build --release "${features[@]}"
bin=target/release/vramlab
out=benches/results/inference/$backend
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The newest checkpoint of a run (`last`, or the highest step on layouts without it).
newest() { ls -d "$1"/checkpoints/*/ | sort | tail -1; }
common=(--dataset.type=random --steps=1 --batch_size=1 --save_freq=0 --num_workers=0 --backend="$backend")

$bin train --policy.type=act "${common[@]}" --output_dir="$work/act"
$bin bench-inference --checkpoint "$(newest "$work/act")" --backend="$backend" --fps=30 \
  --calls="${ACT_CALLS:-300}" --out "$out/act"

$bin train --policy.type=diffusion "${common[@]}" --output_dir="$work/diffusion"
$bin bench-inference --checkpoint "$(newest "$work/diffusion")" --backend="$backend" --fps=10 \
  --calls="${DIFFUSION_CALLS:-24}" --warmup=1 --out "$out/diffusion"

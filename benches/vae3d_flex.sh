#!/usr/bin/env bash
# The VAE memory/speed report on flex (CPU): batch size × gradient checkpointing × precision ×
# config, 3 steps per point, grid 8×32×32 (the reference trains at 32×128×128: too slow for
# a CPU sweep of 36 points; the relative effects are what the report is for).
# Writes benches/results/vae3d_flex/{sweep.csv,sweep.md} and the per-point runs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
out=benches/results/vae3d_flex
rm -rf "$out/points"
target/release/vramlab sweep --config configs/vae3d_ultra.toml --steps=3 --save_freq=0 \
  --scheduler.type=constant --scheduler.warmup_steps=0 \
  --sweep.policy.preset=ultra_lightweight,lightweight,base32 \
  --sweep.batch_size=1,2 \
  --sweep.gradient_checkpointing=off,blocks,balanced \
  --sweep.precision=f32,bf16 \
  --output_dir="$out"
# Keep the report and per-point metrics; drop the checkpoints (weights) from the repo.
find "$out/points" -name checkpoints -type d -prune -exec rm -rf {} +

#!/usr/bin/env bash
# ACT memory report on flex (CPU), lerobot default model (dim_model 512, dim_feedforward 3200,
# 4 encoder / 1 decoder / 4 VAE layers, ResNet18), one camera at a REDUCED 3×120×160
# (a quarter of 480×640 per side: layer4 map 4×5 = 20 image tokens instead of 300), 14-dim
# state/action, random normalised inputs (memory depends on shapes only).
#   1. chunk_size {10,30,50,100} × batch_size {1,4,8}
#   2. toggles at chunk_size 100, batch_size 4: use_vae off, block checkpointing, frozen backbone
# Writes benches/results/act_flex/{grid,toggles_*}/sweep.{csv,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
bin=target/release/vramlab
common=(--policy.type=act --dataset.type=random --policy.camera_shape=3,120,160 --steps=3 --save_freq=0 --dataset.num_scenes=16)
out=benches/results/act_flex
$bin sweep "${common[@]}" --sweep.policy.chunk_size=10,30,50,100 --sweep.batch_size=1,4,8 \
  --policy.n_action_steps=10 --output_dir="$out/grid"
for toggle in "policy.use_vae=true,false" "gradient_checkpointing=off,blocks" "policy.freeze_backbone=false,true"; do
  name=${toggle%%=*}; name=${name#policy.}
  $bin sweep "${common[@]}" --policy.chunk_size=100 --policy.n_action_steps=100 --batch_size=4 \
    "--sweep.$toggle" --output_dir="$out/toggles_$name"
done
find "$out" -name checkpoints -type d -prune -exec rm -rf {} +
# 3. Full resolution (one 480×640 camera: 300 image tokens), batch 2: which sequence drives memory?
$bin sweep --policy.type=act --dataset.type=random --steps=3 --save_freq=0 --dataset.num_scenes=4 --batch_size=2 \
  --policy.n_action_steps=10 --sweep.policy.chunk_size=10,100 --output_dir="$out/fullres"
find "$out" -name checkpoints -type d -prune -exec rm -rf {} +

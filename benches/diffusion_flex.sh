#!/usr/bin/env bash
# Diffusion Policy memory report on flex (CPU): lerobot's default model (ResNet18 + GroupNorm,
# UNet down_dims 512/1024/2048, 262.7M parameters) on PushT shapes (state 2, action 2, one
# 96×96 camera cropped to 84×84), batch 16, random normalised inputs (memory depends on shapes).
#   1. toggles: precision {f32, bf16} × gradient_checkpointing {off, blocks} × freeze_backbone
#   2. shape axes: horizon {16, 32, 64}, n_obs_steps {2, 4}; down_dims 256/512/1024
# Writes benches/results/diffusion_flex/*/sweep.{csv,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
bin=target/release/vramlab
common=(--policy.type=diffusion --dataset.type=random --steps=3 --save_freq=0 --dataset.num_scenes=16 --batch_size=16)
out=benches/results/diffusion_flex
$bin sweep "${common[@]}" --sweep.precision=f32,bf16 --sweep.gradient_checkpointing=off,blocks \
  --sweep.policy.freeze_backbone=false,true --output_dir="$out/toggles"
$bin sweep "${common[@]}" --sweep.policy.horizon=16,32,64 --output_dir="$out/horizon"
$bin sweep "${common[@]}" --sweep.policy.n_obs_steps=2,4 --output_dir="$out/n_obs_steps"
# A list-valued field is not a sweep axis: the narrower UNet is its own one-point sweep (compare
# with the f32/off/false point of the toggles).
$bin sweep "${common[@]}" --policy.down_dims=256,512,1024 --sweep.batch_size=16 --output_dir="$out/down_dims_256_512_1024"
find "$out" -name checkpoints -type d -prune -exec rm -rf {} +

#!/usr/bin/env bash
# `vramlab fit` on the three built-in configs under the budgets of issue 12, on flex (CPU):
#   ACT (configs/act_push.toml)                 2 GiB
#   Diffusion-small (diffusion_push_small.toml)  1 GiB
#   the VAE main job (vae3d_ultra.toml)          100 MiB
# Each writes benches/results/fit/<name>/{fit.md,fit.csv,fit.jsonl,fit.svg,log.txt}. The budget
# is a cap in every trial (the counting allocator); the recommendation is re-measured.
# Speeds are from 2 timed steps per trial on a shared machine: they rank, they do not benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
# BIN: an already built binary (default: build target/release/vramlab).
if [ -z "${BIN:-}" ]; then cargo build --release; BIN=target/release/vramlab; fi
out=benches/results/fit
run() {
  local name=$1 config=$2 budget=$3
  rm -rf "$out/$name"
  mkdir -p "$out/$name"
  "$BIN" fit --config "$config" --budget="$budget" --output_dir="$out/$name" 2>&1 | tee "$out/$name/log.txt"
  rm -rf "$out/$name/trials"
}
run vae3d_ultra_100MiB configs/vae3d_ultra.toml 100MiB
run diffusion_small_1GiB configs/diffusion_push_small.toml 1GiB
run act_push_2GiB configs/act_push.toml 2GiB

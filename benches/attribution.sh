#!/usr/bin/env bash
# Where each memory row of issue 11 goes, stage by stage: step 2 of each config recorded with
# --memory_timeline and attributed (memory_attribution.md: what each forward stage allocated,
# what it still held when the backward began, how far it rose above its entry), next to the
# estimator's per-module rows for the same config (estimate.md). flex, f32, random inputs.
# Batches are cut from the issue's rows (ACT 48 → 8, Diffusion 64 → 16) to run on a 2-core
# machine, every stored activation scaling with the batch; ACT b48 240×320 is the issue's row.
#   bash benches/attribution.sh            → benches/results/attribution/<config>/
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-}
if [ -z "$bin" ]; then cargo build --release; bin=target/release/vramlab; fi
out=benches/results/attribution
mkdir -p "$out"
common=(--steps=2 --save_checkpoint=false --memory_timeline=2 --memory_timeline_min_bytes=1048576 --precision=f32)
act=(--policy.type=act --policy.pretrained_backbone_weights=null --dataset.type=random --dataset.num_scenes=8 --policy.state_dim=14 --policy.action_dim=14
     --policy.chunk_size=100 --policy.n_action_steps=100)
dif=(--policy.type=diffusion --dataset.type=random --dataset.num_scenes=8 --policy.state_dim=2 --policy.action_dim=2
     --policy.horizon=16 --batch_size=16)
run() {
  local name=$1; shift
  local d="$out/$name"
  rm -rf "$d"
  echo "== $name: $*"
  "$bin" train "${common[@]}" "$@" --output_dir="$d" >/dev/null
  "$bin" estimate "$@" > "$d/estimate.md"
  rm -rf "$d/memory_timeline" "$d/checkpoints"
}
run vae_ultra_b2_8x32x32 --config=configs/vae3d_ultra.toml
run act_b8_c100_96x96 "${act[@]}" --batch_size=8 --policy.camera_shape=3,96,96
run act_b8_c100_240x320 "${act[@]}" --batch_size=8 --policy.camera_shape=3,240,320
# Issue 11's own row (PyTorch on an H100: 3,860 MiB allocated), f32, batch 48.
run act_b48_c100_240x320 "${act[@]}" --policy.camera_shape=3,240,320 --batch_size=48
run diffusion_b16_h16_96x96_crop84 "${dif[@]}" --policy.camera_shape=3,96,96 --policy.crop_shape=84,84
echo "wrote $out/*/memory_attribution.md"

#!/usr/bin/env bash
# The lerobot round trip (not run by CI: it installs lerobot 0.4.4 + torch, ~3 GB).
#
#   vramlab → lerobot: vramlab trains ACT and Diffusion for a few steps on a LeRobot dataset;
#                      lerobot 0.4.4 loads each checkpoint with its own `from_pretrained` and
#                      processors, and its `select_action` on raw observations must equal
#                      `vramlab predict` on the same observations (Diffusion: DDIM, same noise).
#   lerobot → vramlab: lerobot-train writes ACT and Diffusion checkpoints; the same comparison.
#   Then vramlab fine-tunes from the lerobot checkpoint (--policy.path), resumes its own run,
#   and resumes lerobot's run from lerobot's checkpoint.
#
# Usage: tests/lerobot_roundtrip/run.sh        (env: LEROBOT_VENV, WORK, DATA, TOL)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${LEROBOT_VENV:-target/lerobot-venv}
WORK=${WORK:-target/lerobot-roundtrip}
DATA=${DATA:-../shared/datasets/pusht_v30}
TOL=${TOL:-1e-4}

if ! "$VENV/bin/python" -c "import lerobot" 2>/dev/null; then
  echo "setting up lerobot 0.4.4 in $VENV (PyPI)…"
  python3 -m venv "$VENV"
  if ! "$VENV/bin/pip" install -q "lerobot==0.4.4"; then
    echo "error: could not install lerobot==0.4.4 from the package registry (offline or unreachable); nothing was checked" >&2
    exit 1
  fi
fi
[ -d "$DATA" ] || { echo "error: no dataset at $DATA (set DATA=a LeRobot v3.0 dataset)" >&2; exit 1; }
cargo build --release -q
bin=$PWD/target/release/vramlab
rm -rf "$WORK"; mkdir -p "$WORK"
# lerobot reads the local dataset without the hub; its torchcodec needs system FFmpeg, PyAV does not.
export HF_HUB_OFFLINE=1

act=(--policy.chunk_size=10 --policy.n_action_steps=10 --policy.dim_model=64 --policy.dim_feedforward=128
     --policy.n_heads=4 --policy.n_encoder_layers=2 --policy.n_decoder_layers=1 --policy.n_vae_encoder_layers=2
     --policy.latent_dim=8 --policy.pretrained_backbone_weights=null)
diffusion=(--policy.down_dims='[32,64]' --policy.noise_scheduler_type=DDIM --policy.num_inference_steps=10
           --policy.crop_shape='[84,84]')

echo "== vramlab trains"
"$bin" train --policy.type=act "${act[@]}" --dataset.type=lerobot --dataset.root="$DATA" \
  --steps=3 --batch_size=4 --num_workers=0 --output_dir="$WORK/vramlab_act"
"$bin" train --policy.type=diffusion "${diffusion[@]}" --dataset.type=lerobot --dataset.root="$DATA" \
  --steps=3 --batch_size=4 --num_workers=0 --output_dir="$WORK/vramlab_diffusion"

echo "== lerobot trains"
for p in act diffusion; do
  if [ "$p" = act ]; then flags=("${act[@]}"); else flags=("${diffusion[@]}"); fi
  "$VENV/bin/lerobot-train" --policy.type=$p "${flags[@]}" --dataset.repo_id=local/roundtrip \
    --dataset.root="$DATA" --dataset.video_backend=pyav --steps=2 --batch_size=2 --num_workers=0 \
    --policy.device=cpu --policy.push_to_hub=false --wandb.enable=false --save_freq=2 \
    --output_dir="$WORK/lerobot_$p" > "$WORK/lerobot_$p.log" 2>&1 || { tail -20 "$WORK/lerobot_$p.log"; exit 1; }
done

echo "== select_action: lerobot vs vramlab predict"
"$VENV/bin/python" tests/lerobot_roundtrip/roundtrip.py --vramlab "$bin" --work "$WORK/compare" --tol "$TOL" \
  vramlab_act="$WORK/vramlab_act/checkpoints/last" vramlab_diffusion="$WORK/vramlab_diffusion/checkpoints/last" \
  lerobot_act="$WORK/lerobot_act/checkpoints/last" lerobot_diffusion="$WORK/lerobot_diffusion/checkpoints/last"

echo "== vramlab fine-tunes a lerobot checkpoint (--policy.path), then resumes its own run"
"$bin" train --policy.type=act --policy.path="$WORK/lerobot_act/checkpoints/last/pretrained_model" \
  --dataset.type=lerobot --dataset.root="$DATA" --steps=2 --batch_size=2 --num_workers=0 \
  --output_dir="$WORK/finetune_act"
"$bin" train --resume --output_dir="$WORK/finetune_act" --steps=4

echo "== vramlab resumes lerobot's own run (weights, optimizer state, step, train_config.json)"
cp -r "$WORK/lerobot_act" "$WORK/lerobot_act_resumed"
"$bin" train --resume --output_dir="$WORK/lerobot_act_resumed" --steps=4
[ "$(wc -l < "$WORK/lerobot_act_resumed/metrics.jsonl")" -eq 2 ] || { echo "error: expected steps 3 and 4 after resuming at step 2" >&2; exit 1; }
echo "round trip: all checks passed"

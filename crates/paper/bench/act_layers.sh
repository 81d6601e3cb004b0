#!/usr/bin/env bash
# Measures what one ACT transformer layer stores for backward on vramlab's flex backend:
# the same ACT run (random inputs of the configured shapes) with 1 vs more encoder (or decoder)
# layers, everything else fixed, so the difference of `activation_bytes` (forward peak minus
# live bytes before the forward) is the extra layers' stored activations.
# Output: CSV on stdout (camera H W, batch, chunk, precision, enc layers, dec layers, activation
# bytes of steps 2 and 3). Usage: bench/act_layers.sh [VRAMLAB_BINARY] > act_layers_flex.csv
set -euo pipefail
bin=${1:-target/release/vramlab}
root=$(cd "$(dirname "$0")/../../.." && pwd)
tmp=$(mktemp -d)
echo "height,width,batch,chunk,precision,n_encoder_layers,n_decoder_layers,act_bytes_step2,act_bytes_step3"
run() { # H W B C PREC ENC DEC
  local out="$tmp/run"
  rm -rf "$out"
  "$bin" train --config "$root/configs/act_pusht.toml" --dataset.type=random --steps=3 --num_workers=0 \
    --save_freq=0 --batch_size="$3" --policy.chunk_size="$4" --policy.n_action_steps="$4" \
    --precision="$5" --policy.camera_shape=3,"$1","$2" --policy.pretrained_backbone_weights=null \
    --policy.n_encoder_layers="$6" --policy.n_decoder_layers="$7" --output_dir "$out" >/dev/null 2>&1
  local a2 a3
  a2=$(sed -n 2p "$out/metrics.jsonl" | grep -o '"activation_bytes":[0-9]*' | cut -d: -f2)
  a3=$(sed -n 3p "$out/metrics.jsonl" | grep -o '"activation_bytes":[0-9]*' | cut -d: -f2)
  echo "$1,$2,$3,$4,$5,$6,$7,$a2,$a3"
}
for enc in 1 3 5; do run 240 320 8 30 f32 "$enc" 1; done
for dec in 3 5; do run 240 320 8 30 f32 1 "$dec"; done
for enc in 1 5; do run 240 320 4 30 f32 "$enc" 1; done
for enc in 1 5; do run 480 640 4 30 f32 "$enc" 1; done
for enc in 1 5; do run 240 320 8 30 bf16 "$enc" 1; done
rm -rf "$tmp"

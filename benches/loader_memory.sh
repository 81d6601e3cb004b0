#!/usr/bin/env bash
# The data loader's own host memory (`loader_peak_bytes`: decoding and batching in workers, and
# batches waiting in the prefetch queue), per `--num_workers` × `--prefetch_factor` ×
# `--persistent_workers`, next to the model's step peak, which must not move. ACT on the
# built-in push demonstrations (AV1-decoded 96×96 camera), a small transformer so it runs fast.
#   bash benches/loader_memory.sh   → benches/results/loader_memory/table.md
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-}
if [ -z "$bin" ]; then cargo build --release; bin=target/release/vramlab; fi
out=benches/results/loader_memory
scratch=${SCRATCH:-target/loader_memory}
mkdir -p "$out" "$scratch"
common=(--config configs/act_push.toml --steps=8 --save_checkpoint=false --batch_size=16 --policy.pretrained_backbone_weights=null
        --policy.dim_model=64 --policy.n_heads=4 --policy.dim_feedforward=128 --policy.n_encoder_layers=1 --policy.n_vae_encoder_layers=1
        --dataset.root="$scratch/push")
rows=()
for w in 0 1 2 4; do
  for pf in 2 4; do
    [ "$w" = 0 ] && [ "$pf" = 4 ] && continue
    for pw in true false; do
      [ "$w" = 0 ] && [ "$pw" = false ] && continue
      d="$scratch/w${w}_pf${pf}_${pw}"
      rm -rf "$d"
      "$bin" train "${common[@]}" --num_workers="$w" --prefetch_factor="$pf" --persistent_workers="$pw" --output_dir="$d" >/dev/null 2>"$d.log" || { cat "$d.log"; exit 1; }
      rows+=("$w $pf $pw $d")
    done
  done
done
python3 - "$out/table.md" "${rows[@]}" <<'PY'
import json, sys
out, rows = sys.argv[1], sys.argv[2:]
mib = lambda b: f"{b / 2**20:,.1f}"
lines = ["# Data loader host memory vs loader settings", "",
         "ACT (small transformer, batch 16) on the built-in push demonstrations, flex, 8 steps; figures are the max over steps 2–8.",
         "`loader_peak_bytes`: bytes held by the loader (decoding, batching, prefetch queue), exact, counted apart from the model;",
         "`peak_step_bytes`: the model's step peak, which the loader settings must not move. Command: `bash benches/loader_memory.sh`.", "",
         "| num_workers | prefetch_factor | persistent_workers | loader peak MiB | model step peak MiB | median data wait ms |",
         "|---:|---:|---|---:|---:|---:|"]
for r in rows:
    w, pf, pw, d = r.split(" ", 3)
    recs = [json.loads(l) for l in open(f"{d}/metrics.jsonl")][1:]
    waits = sorted(x["data_wait_s"] for x in recs)
    lines.append(f"| {w} | {pf} | {pw} | {mib(max(x.get('loader_peak_bytes') or 0 for x in recs))} | {mib(max(x['peak_step_bytes'] for x in recs))} | {1000 * waits[len(waits) // 2]:.1f} |")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY

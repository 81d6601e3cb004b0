#!/usr/bin/env bash
# The README's main job (configs/vae3d_ultra.toml, 150 steps on flex) with step 2's allocation
# timeline recorded: benches/results/main_job/{summary.md,metrics.jsonl,memory.svg,
# memory_breakdown.svg,step_2.pickle}. Open step_2.pickle at https://pytorch.org/memory_viz.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then cargo build --release; BIN=target/release/vramlab; fi
out=benches/results/main_job
run=$(mktemp -d)/vae3d_ultra
"$BIN" train --config configs/vae3d_ultra.toml --memory_timeline=2 --memory_timeline_min_bytes=1024 --output_dir="$run"
mkdir -p "$out"
cp "$run"/{summary.md,metrics.jsonl,memory.svg,memory_breakdown.svg} "$out"/
cp "$run"/memory_timeline/step_2.pickle "$out"/
rm -rf "$(dirname "$run")"

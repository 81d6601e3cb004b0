#!/usr/bin/env bash
# The seed report's headline: ACT (batch 48, chunk_size 100) vs Diffusion Policy (batch 64,
# horizon 16), lerobot defaults otherwise, one camera, f32, measured peak memory split into
# parameters / gradients / optimizer state / activations (counting allocator, exact).
# Reduced image sizes so it runs on a CPU machine: 96×96 (PushT's camera; Diffusion crops
# 84×84) and 240×320 (half of ALOHA's 480×640; Diffusion crops 210×280, the same 7/8 ratio).
# Inputs are random tensors of the right shapes (memory depends on shapes only).
# Writes benches/results/act_vs_diffusion/{points/*,table.md}.
#   bash benches/act_vs_diffusion.sh [SIZES...]   (default: 96x96 240x320)
#   ACT_ONLY=1 bash benches/act_vs_diffusion.sh 480x640   (ACT at ALOHA's full camera size)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
bin=target/release/vramlab
out=benches/results/act_vs_diffusion
mkdir -p "$out/points"
sizes=("$@")
[ $# -eq 0 ] && sizes=(96x96 240x320)
common=(--dataset.type=random --dataset.num_scenes=8 --steps=3 --save_freq=0 --save_checkpoint=false --precision=f32 --policy.state_dim=2 --policy.action_dim=2)
for s in "${sizes[@]}"; do
  h=${s%x*}; w=${s#*x}
  ch=$((h * 7 / 8)); cw=$((w * 7 / 8))
  [ "$h" = 96 ] && ch=84 && cw=84
  d="$out/points/act_b48_c100_${s}"
  [ -f "$d/summary.md" ] || $bin train --policy.type=act "${common[@]}" --policy.camera_shape=3,$h,$w \
      --batch_size=48 --policy.chunk_size=100 --policy.n_action_steps=100 --output_dir="$d"
  # Where ACT's activations come from: the same run without the VAE encoder over the chunk.
  d="$out/points/act_b48_c100_novae_${s}"
  [ -f "$d/summary.md" ] || $bin train --policy.type=act "${common[@]}" --policy.camera_shape=3,$h,$w \
      --batch_size=48 --policy.chunk_size=100 --policy.n_action_steps=100 --policy.use_vae=false --output_dir="$d"
  [ "${ACT_ONLY:-0}" = 1 ] && continue
  d="$out/points/diffusion_b64_h16_${s}"
  [ -f "$d/summary.md" ] || $bin train --policy.type=diffusion "${common[@]}" --policy.camera_shape=3,$h,$w \
      --policy.crop_shape=$ch,$cw --batch_size=64 --policy.horizon=16 --output_dir="$d"
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
mib = lambda b: f"{b / 2**20:,.0f}"
rows = []
for d in sorted((out / "points").iterdir()):
    recs = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    steady = recs[1:] or recs  # step 1 allocates the optimizer state
    m = lambda k: max(r[k] for r in steady)
    cfg = json.loads((d / "run_config.json").read_text())
    rows.append((d.name, m("param_bytes"), m("grad_bytes"), m("optimizer_state_bytes"), m("activation_bytes"),
                 m("peak_step_bytes"), sorted(r["step_time_s"] for r in steady)[len(steady) // 2]))
lines = ["# ACT (batch 48, chunk_size 100) vs Diffusion Policy (batch 64, horizon 16)", "",
         "flex CPU backend, f32, counting allocator (exact peak). Steps 2-3 of 3 (step 1 allocates the optimizer state).",
         "Command: `bash benches/act_vs_diffusion.sh`", "",
         "| run | params MiB | grads MiB | optimizer MiB | activations MiB | **peak step MiB** | s/step |",
         "|---|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    lines.append(f"| {r[0]} | {mib(r[1])} | {mib(r[2])} | {mib(r[3])} | {mib(r[4])} | **{mib(r[5])}** | {r[6]:.1f} |")
lines += ["", "Ratios ACT / Diffusion (same camera size):", ""]
by = {r[0]: r for r in rows}
for name, r in by.items():
    if name.startswith("act_"):
        size = name.rsplit("_", 1)[1]
        for dn in [k for k in by if k.startswith("diffusion_") and k.endswith("_" + size)]:
            d = by[dn]
            lines.append(f"- {name} / {dn}: peak {r[5] / d[5]:.2f}×, activations {r[4] / max(d[4], 1):.2f}×, "
                         f"static (params + grads + optimizer) {(r[1] + r[2] + r[3]) / (d[1] + d[2] + d[3]):.2f}×")
(out / "table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY

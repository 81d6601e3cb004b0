#!/usr/bin/env bash
# Validation of `vramlab estimate` against flex's exact peaks (counting allocator).
# Each point: `vramlab train` for 3 steps (one process per point, random inputs where the
# model allows, no loader workers), then `vramlab estimate` with the same flags. Compared:
# peak_step_bytes, max over steps 2..3 (step 1 has no optimizer state yet; summary.md's
# convention), vs the estimate's steady-state peak. Points span batch, chunk_size / horizon,
# image / grid size, precision, checkpointing, frozen backbone and use_vae on ACT, Diffusion
# and the VAE. Writes benches/results/estimate/validation.{csv,md}; per-point runs and
# estimates under benches/results/estimate/points/ (checkpoints removed).
# MEASURE=0 reuses the measured runs already there (re-estimates only).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
bin=target/release/vramlab
out=benches/results/estimate
pts=$out/points
mkdir -p "$pts"
common=(--steps=3 --save_freq=0 --num_workers=0)
vae=(--config configs/vae3d_ultra.toml --scheduler.type=constant --scheduler.warmup_steps=0)
act=(--policy.type=act --dataset.type=random --dataset.num_scenes=8 --policy.camera_shape=3,96,96 --policy.chunk_size=20 --policy.n_action_steps=20 --policy.pretrained_backbone_weights=null)
dif=(--policy.type=diffusion --dataset.type=random --dataset.num_scenes=8 --policy.down_dims=64,128,256 --policy.camera_shape=3,64,64 --policy.crop_shape=56,56 --policy.pretrained_backbone_weights=null)
points=(
  "vae_b1|${vae[*]} --batch_size=1"
  "vae_b2|${vae[*]} --batch_size=2"
  "vae_b4|${vae[*]} --batch_size=4"
  "vae_grid16x32x32|${vae[*]} --batch_size=1 --dataset.grid=16,32,32"
  "vae_grid8x64x64|${vae[*]} --batch_size=1 --dataset.grid=8,64,64"
  "vae_b2_bf16|${vae[*]} --batch_size=2 --precision=bf16"
  "vae_b2_blocks|${vae[*]} --batch_size=2 --gradient_checkpointing=blocks"
  "vae_b2_blocks_bf16|${vae[*]} --batch_size=2 --gradient_checkpointing=blocks --precision=bf16"
  "vae_b2_balanced|${vae[*]} --batch_size=2 --gradient_checkpointing=balanced"
  "vae_lightweight_b1|${vae[*]} --batch_size=1 --policy.preset=lightweight"
  "vae_base32_b1|${vae[*]} --batch_size=1 --policy.preset=base32"
  "vae_b1_accum2|${vae[*]} --batch_size=1 --grad_accum_steps=2"
  "act_b2|${act[*]} --batch_size=2"
  "act_b8|${act[*]} --batch_size=8"
  "act_b4_chunk100|${act[*]} --batch_size=4 --policy.chunk_size=100 --policy.n_action_steps=100"
  "act_b4_img192|${act[*]} --batch_size=4 --policy.camera_shape=3,192,192"
  "act_b4_bf16|${act[*]} --batch_size=4 --precision=bf16"
  "act_b4_blocks|${act[*]} --batch_size=4 --gradient_checkpointing=blocks"
  "act_b4_frozen|${act[*]} --batch_size=4 --policy.freeze_backbone=true"
  "act_b4_novae|${act[*]} --batch_size=4 --policy.use_vae=false"
  "diffusion_b4|${dif[*]} --batch_size=4"
  "diffusion_b16|${dif[*]} --batch_size=16"
  "diffusion_b8_h32|${dif[*]} --batch_size=8 --policy.horizon=32"
  "diffusion_b8_img96|${dif[*]} --batch_size=8 --policy.camera_shape=3,96,96 --policy.crop_shape=84,84"
  "diffusion_b8_bf16|${dif[*]} --batch_size=8 --precision=bf16"
  "diffusion_b8_blocks|${dif[*]} --batch_size=8 --gradient_checkpointing=blocks"
  "diffusion_b8_frozen|${dif[*]} --batch_size=8 --policy.freeze_backbone=true"
)
for p in "${points[@]}"; do
  name=${p%%|*}; flags=${p#*|}
  dir=$pts/$name
  # shellcheck disable=SC2086
  if [[ "${MEASURE:-1}" != 0 || ! -s $dir/run/metrics.jsonl ]]; then
    rm -rf "$dir/run"
    echo "== measuring $name" >&2
    $bin train $flags "${common[@]}" --output_dir="$dir/run" >"$dir.train.log" 2>&1 || { echo "train failed: $name (see $dir.train.log)" >&2; continue; }
    rm -rf "$dir/run/checkpoints"; mv "$dir.train.log" "$dir/train.log"
  fi
  # shellcheck disable=SC2086
  $bin estimate $flags "${common[@]}" --output_dir="$dir" >/dev/null 2>"$dir/estimate.log"
  printf '%s\n' "$flags" >"$dir/flags.txt"
done
python3 - "$out" "${points[@]%%|*}" <<'PY'
import json, sys, os
out, names = sys.argv[1], sys.argv[2:]
MiB = 2**20
rows = []
for n in names:
    d = os.path.join(out, "points", n)
    try:
        recs = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl"))]
        est = json.load(open(os.path.join(d, "estimate.json")))
    except OSError:
        rows.append((n, None)); continue
    steady = recs[1:] or recs
    m = max(steady, key=lambda r: r["peak_step_bytes"])
    meas = {k: max(r[k] for r in steady) for k in ("peak_step_bytes", "peak_forward_bytes", "peak_backward_bytes", "peak_optimizer_bytes", "param_bytes", "grad_bytes", "optimizer_state_bytes", "activation_bytes", "live_before_forward_bytes")}
    phase = max(("forward", meas["peak_forward_bytes"]), ("backward", meas["peak_backward_bytes"]), ("optimizer", meas["peak_optimizer_bytes"]), key=lambda x: x[1])[0]
    err = (est["peak_step_bytes"] - meas["peak_step_bytes"]) / meas["peak_step_bytes"] * 100
    # Which term is off most: compare per category / phase.
    terms = {
        "parameters": est["param_bytes"] - meas["param_bytes"],
        "gradients": est["grad_bytes"] - meas["grad_bytes"],
        "optimizer state": est["optimizer_state_bytes"] - meas["optimizer_state_bytes"],
        "forward activations+workspace": est["peak_forward_bytes"] - meas["peak_forward_bytes"],
        "backward (stored+grads+workspace)": est["peak_backward_bytes"] - meas["peak_backward_bytes"],
        "optimizer-step temporaries": est["peak_optimizer_bytes"] - meas["peak_optimizer_bytes"],
    }
    worst = max(terms.items(), key=lambda kv: abs(kv[1]))
    rows.append((n, dict(meas=meas, phase=phase, est=est, err=err, worst=worst)))
csv = ["point,measured_peak_bytes,estimated_peak_bytes,error_pct,measured_phase,estimated_phase,measured_fwd,estimated_fwd,measured_bwd,estimated_bwd,measured_opt,estimated_opt,largest_term_off,largest_term_off_bytes"]
md = ["# `vramlab estimate` vs flex-measured exact peaks", "",
      "Generated by `benches/estimate_validation.sh`. Measured: `peak_step_bytes` of `metrics.jsonl`, max over steps 2..3",
      "(step 1 has no optimizer state yet: the convention of summary.md and sweep.md). Estimated: `vramlab estimate`,",
      "steady state, computed from shapes only. MiB = 2^20 bytes. The last column names the estimate's term (category or",
      "phase peak) farthest from its measured counterpart, signed estimate − measured.", "",
      "| point | measured peak | estimated peak | error | phase (meas / est) | fwd meas / est | bwd meas / est | opt meas / est | term most off |",
      "|---|---:|---:|---:|---|---:|---:|---:|---|"]
ok = 0; worst_abs = 0.0
for n, r in rows:
    if r is None:
        md.append(f"| {n} | failed | | | | | | | |"); continue
    m, e = r["meas"], r["est"]
    f = lambda b: f"{b / MiB:.1f}"
    wt, wb = r["worst"]
    miss = abs(r["err"]) > 10
    ok += not miss; worst_abs = max(worst_abs, abs(r["err"]))
    md.append(f"| {n} | {f(m['peak_step_bytes'])} | {f(e['peak_step_bytes'])} | {'**' if miss else ''}{r['err']:+.1f} %{'**' if miss else ''} | {r['phase']} / {e['peak_phase']} | {f(m['peak_forward_bytes'])} / {f(e['peak_forward_bytes'])} | {f(m['peak_backward_bytes'])} / {f(e['peak_backward_bytes'])} | {f(m['peak_optimizer_bytes'])} / {f(e['peak_optimizer_bytes'])} | {wt} {wb / MiB:+.1f} MiB |")
    csv.append(f"{n},{m['peak_step_bytes']},{e['peak_step_bytes']},{r['err']:.2f},{r['phase']},{e['peak_phase']},{m['peak_forward_bytes']},{e['peak_forward_bytes']},{m['peak_backward_bytes']},{e['peak_backward_bytes']},{m['peak_optimizer_bytes']},{e['peak_optimizer_bytes']},{wt},{wb}")
n_ok = sum(1 for _, r in rows if r is not None)
md += ["", f"**{ok} of {n_ok} points within ±10 %; largest |error| {worst_abs:.1f} %.**", ""]
open(os.path.join(out, "validation.csv"), "w").write("\n".join(csv) + "\n")
open(os.path.join(out, "validation.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY

#!/usr/bin/env bash
# Interleaved A/B of one of kernels.sh's rows on wgpu (ROW: act, the default: ACT b8 1 camera
# 96×96 chunk 100; dif: Diffusion b8 96×96 crop 84; vae: VAE ultra b2 8×32×32; f32): ROUNDS
# rounds, each running every variant once, one process after the other, so a noisy VM slows all
# variants of a round alike. Each variant keeps its own kernel cache across rounds
# (its first process fills it); COLD=1 empties it before every process. Appends one JSON line
# per process to LOG: step 1, the steps after it and their median, launches, kernels compiled in
# step 1, peak reserved, the losses.
#
#   VARIANTS="main|target/wgpu/release/vramlab|;old|/tmp/vramlab-old|;cubek|target/wgpu/release/vramlab|VRAMLAB_WIDE_UNIT_MATMUL=0" \
#     ROUNDS=3 STEPS=4 LOG=ab.jsonl bash benches/ab_wgpu.sh
#   ROW=dif VARIANTS=… bash benches/ab_wgpu.sh
#
# VARIANTS: entries `name|binary|ENV=VAL ENV2=VAL` separated by `;` (the env part may be empty).
# WORK (default a fresh temporary folder, kept): runs and kernel caches. On lavapipe set
# VK_ICD_FILENAMES (as CI does); MESA_SHADER_CACHE_DISABLE=true in a variant's env measures
# lavapipe's compiles without Mesa's shader cache.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${VARIANTS:?name|binary|env entries separated by ;}"
row=${ROW:-act}
log=${LOG:-${row}_ab.jsonl}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
echo "ab_wgpu ($row): runs and kernel caches in $work; results appended to $log" >&2
. benches/kernel_rows.sh   # act, dif, vae: kernels.sh's rows
case $row in
  act) args=("${act[@]}") ;;
  dif) args=("${dif[@]}") ;;
  vae) args=("${vae[@]}") ;;
  *) echo "ab_wgpu: ROW=$row: one of act, dif, vae" >&2; exit 2 ;;
esac
IFS=';' read -ra entries <<< "$VARIANTS"
for round in $(seq 1 "${ROUNDS:-3}"); do
  for entry in "${entries[@]}"; do
    IFS='|' read -r name bin envs <<< "$entry"
    run=$work/run-$name
    rm -rf "$run"
    [ -n "${COLD:-}" ] && rm -rf "$work/kc-$name"
    start=$(date -u +%H:%M:%S); load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086  # the env part is a list of assignments
    env $envs "$bin" train --backend="${BACKEND:-wgpu}" --precision=f32 --steps="${STEPS:-4}" --save_checkpoint=false \
      --kernel_cache_dir="$work/kc-$name" "${args[@]}" --output_dir="$run" >"$work/$name.out" 2>"$work/$name.err"
    rc=$?
    AB_ROW=$row python3 - "$run/metrics.jsonl" "$name" "$round" "$start" "$load" "$rc" "$envs" >> "$log" <<'PY'
import json, os, statistics, sys
path, name, rnd, start, load, rc, envs = sys.argv[1:]
recs = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
steps = [r["step_time_s"] for r in recs]
print(json.dumps({
    "row": os.environ["AB_ROW"], "round": int(rnd), "variant": name, "env": envs, "start_utc": start, "load_avg_1m": float(load), "rc": int(rc),
    "step1_s": steps[0] if steps else None, "steps_s": steps[1:],
    "steady_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
    "launches": recs[-1].get("kernel_launches") if recs else None,
    "compiled_step1": recs[0].get("kernels_compiled") if recs else None,
    "peak_reserved_mib": round(max(r["peak_reserved_bytes"] for r in recs) / 2**20, 1) if recs else None,
    "loss": [round(r["loss"], 6) for r in recs if "loss" in r]}))
PY
    tail -n1 "$log" | cut -c1-240
  done
done

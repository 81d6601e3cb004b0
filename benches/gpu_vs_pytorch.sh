#!/usr/bin/env bash
# PyTorch CUDA (eager, lerobot 0.4.4) vs vramlab --backend=cuda on the same configurations:
# median step time, peak allocated / reserved memory, step 1 cold (fresh empty kernel cache) and
# warm (second process on the same cache, the same steps with kernel accounting off: the time
# ratio's vramlab step; the cold process's counted step beside it), and the vramlab / PyTorch ratios. Writes
# benches/results/gpu_vs_pytorch/<gpu name slug>/{table.md,raw.jsonl,fixture_check.txt}.
#
#   bash benches/gpu_vs_pytorch.sh [ROW...]      # default: the GPU rows of ../shared/baselines/README.md,
#                                                # most important first: VAE ultra b2 → ACT b8 480×640 →
#                                                # Diffusion b64 96×96 → the rest
#   ROWS=vae STEPS=8 bash benches/gpu_vs_pytorch.sh
#   BIN=target/cuda/release/vramlab TORCH_PYTHON=python3 WHEELS_DIR=~/lerobot-wheels bash benches/gpu_vs_pytorch.sh
#
# One short GPU session (the device machine: 15 minutes in all, start included):
#   BUDGET_S=420 RESULTS_COPY=$OUT BIN=<stripped prebuilt binary> FIXTURE_DIR=<copied oracle dir> \
#     WHEELS_DIR=<wheels> bash benches/gpu_vs_pytorch.sh
# BUDGET_S caps the whole run (each process gets what is left; rows that no longer fit are recorded
# as not run); after every row the table is rewritten and, with RESULTS_COPY, copied there as
# table.md, results.tgz (the results folder: table, raw.jsonl, parity, each row's records under
# rows/<row>/, with autotune.md: what the searches chose, key by key for the convolutions) and kernel_cache.tgz (the rows' kernel caches): three files, as the device tool
# returns at most 8; so a run killed by its time limit still returns every finished row. KERNEL_CACHE_SEED=<that
# kernel_cache folder or .tgz> lets a later run start warm. While the budget lasts, the VAE row
# again through benches/kernels.sh (into kernels/): right after the first row,
# BIN_UNTUNED=<a `cuda-untuned` build, maybe .xz> with Burn's autotune compiled out (the cold
# start); after the next two rows, BIN_FUSION=<a `cuda,fusion` build, maybe .xz> with Burn's
# fusion and our kernels as custom operations, the main build at --autotune=minimal, BIN_FUSION
# with VRAMLAB_COMPOSED_KERNELS=1 (fusion, composed ops), the main build with CubeCL's pages and
# with VRAMLAB_KERNEL_ACCOUNTING=off (what counting launches costs); between the first fusion row and the
# next, KERNEL_TESTS_DIR=<gpu_prepare.sh's tests folder>: the #[cube] kernels' tests on this GPU
# (benches/gpu_kernel_tests.sh, kernel_tests.txt); then the main build with each kernel timed
# (VRAMLAB_KERNEL_ACCOUNTING=time: the costliest kernels in the row's note). Then the other rows.
# Parity on the same GPU: `vramlab predict` on the fixtures in FIXTURE_DIR (default
# ../shared/oracle; vae3d_ultra right after the first row, which leaves it PARITY_RESERVE_S
# (30 s) of the budget; act_small and diffusion_small at the end while the budget lasts),
# compared by `baseline.py parity` (tolerance PARITY_TOL, default 5e-3: TF32) into parity.txt.
#
# PyTorch: $TORCH_PYTHON or python3 (the image's torch); lerobot 0.4.4 and its pure-Python needs
# are installed from WHEELS_DIR (pip --no-index --no-deps --target) when missing; without it the
# script prints how to make that directory and exits 4. vramlab: $BIN, else
# `CARGO_TARGET_DIR=target/cuda cargo build --release --no-default-features --features cuda`.
# Each vramlab run may compile kernels for minutes on a cold cache: VP_TIMEOUT (default 1800 s)
# stops a run, recorded as timed out.
#
# Without CUDA (no nvidia-smi, or torch.cuda.is_available() false) it runs PyTorch CPU vs
# vramlab flex instead, into benches/results/gpu_vs_pytorch/cpu-<cpu model>-<N>c/, says so in
# the table, and defaults to the CPU rows (ROWS=gpu runs the GPU list anyway, slowly).
source "$(dirname "$0")/lib_vs_pytorch.sh"

VP_COMMAND="$(vp_env_prefix TORCH_PYTHON BIN BIN_UNTUNED BIN_FUSION KERNEL_TESTS_DIR ROWS STEPS WHEELS_DIR BUDGET_S KERNEL_CACHE_SEED)bash benches/gpu_vs_pytorch.sh${*:+ $*}"
mode=cpu
why=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  vp_setup_torch_gpu
  if [ "$("$VP_PY" -c 'import torch; print(torch.cuda.is_available())')" = True ]; then
    mode=cuda
  else
    why="nvidia-smi sees a GPU but torch.cuda.is_available() is false for $VP_PY"
  fi
else
  why="no nvidia-smi / no NVIDIA GPU"
  vp_setup_torch_cpu
fi

if [ "$mode" = cuda ]; then
  vp_cuda_env
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  VP_DEVICE_NAME="GPU: $gpu_name (driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1))"
  out=benches/results/gpu_vs_pytorch/$(vp_report slug "$gpu_name")
  mapfile -t rows < <(vp_rows gpu "$@")
  if [ $# -eq 0 ] && [ -z "${ROWS:-}" ]; then
    # The most important rows first, so a short budget still gives them.
    first=(vae_ultra_b2_8x32x32 act_b8_480x640 diffusion_b64_96_crop84)
    rest=()
    for r in "${rows[@]}"; do [[ " ${first[*]} " == *" $r "* ]] || rest+=("$r"); done
    rows=("${first[@]}" "${rest[@]}")
  fi
  title="PyTorch CUDA vs vramlab cuda on $gpu_name: step time, memory, step 1 cold/warm"
else
  cpu_name=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
  VP_DEVICE_NAME="CPU: $cpu_name × $(nproc) (no CUDA: $why)"
  out=benches/results/gpu_vs_pytorch/cpu-$(vp_report slug "$cpu_name")-$(nproc)c
  mapfile -t rows < <(vp_rows cpu "$@")
  title="No CUDA here ($why): PyTorch CPU vs vramlab flex, the CPU-only fallback of gpu_vs_pytorch.sh"
  vp_log "no CUDA ($why): measuring PyTorch CPU vs vramlab flex into $out"
fi
[ "${#rows[@]}" -gt 0 ] || vp_die 2 "no rows selected"
vp_setup_vramlab "$( [ "$mode" = cuda ] && echo cuda || echo flex)"
vp_log "rows: ${rows[*]}; PyTorch: $VP_PY; vramlab: $VP_BIN"
vp_prepare_out "$out"
fixtures=${FIXTURE_DIR:-$VP_ROOT/../shared/oracle}
backend=$( [ "$mode" = cuda ] && echo cuda || echo flex)
: >"$out/parity.txt"
# The rows before the VAE parity check leave it this many seconds of the budget (cuda: its predict
# reads the VAE row's kernel cache, seconds; the first GPU run spent the whole budget before it).
VP_RESERVE_S=$( [ "$mode" = cuda ] && echo "${PARITY_RESERVE_S:-30}" || echo 0)
if [[ "${KERNEL_CACHE_SEED:-}" == *.tgz ]]; then
  [ -f "$KERNEL_CACHE_SEED" ] || vp_die 2 "KERNEL_CACHE_SEED=$KERNEL_CACHE_SEED: no such file"
  mkdir -p "$VP_SCRATCH_OUT/seed"
  tar xzf "$KERNEL_CACHE_SEED" -C "$VP_SCRATCH_OUT/seed" || vp_die 2 "KERNEL_CACHE_SEED=$KERNEL_CACHE_SEED: cannot unpack it"
  KERNEL_CACHE_SEED=$VP_SCRATCH_OUT/seed/kernel_cache
fi
[ -n "${KERNEL_CACHE_SEED:-}" ] && VP_HEADER_NOTE="step 1 \"cold\" ran on kernel caches seeded from an earlier run (KERNEL_CACHE_SEED), not empty ones"

# vramlab predict on one fixture with this backend, compared with the fixture's outputs.
parity() {
  local name=$1 fx="$fixtures/$1" dir="$VP_SCRATCH_OUT/parity_$1"
  [ -f "$fx/outputs.safetensors" ] || { echo "=> $name: skipped ($fx absent)" >>"$out/parity.txt"; return 0; }
  # The time kept back for this check (VP_RESERVE_S) is its own from here.
  [ "$name" != vae3d_ultra ] || VP_RESERVE_S=0
  [ "$(vp_left 600)" -ge "${VP_MIN_PARITY_S:-10}" ] || { echo "=> $name: not run: BUDGET_S=$BUDGET_S spent" >>"$out/parity.txt"; return 0; }
  mkdir -p "$dir"
  local cache=()
  [ "$mode" = cuda ] && cache=(--kernel_cache_dir="$VP_SCRATCH_OUT/vae_ultra_b2_8x32x32/kernel_cache")
  vp_log "parity: vramlab predict --backend=$backend on $name"
  local rc=0 t0
  t0=$(date +%s)
  timeout --kill-after=10 "$(vp_left 600)" "$VP_BIN" predict --backend="$backend" "${cache[@]}" \
    --checkpoint="$fx/pretrained_model" --inputs="$fx/inputs.safetensors" --out="$dir/outputs.safetensors" \
    >"$dir/predict.log" 2>&1 || rc=$?
  local report
  if [ "$rc" = 0 ]; then
    report=$("$VP_PY" "$VP_TORCH_DIR/baseline.py" parity "$dir/outputs.safetensors" "$fx/outputs.safetensors" --tolerance "${PARITY_TOL:-5e-3}" 2>&1 || true)
  else
    report="predict failed (exit $rc): $(tail -3 "$dir/predict.log")"
  fi
  {
    echo "## $name: vramlab predict --backend=$backend ($(( $(date +%s) - t0 )) s, exit $rc)"
    echo "$report"
    echo "=> $name: $(echo "$report" | tail -1)"
  } >>"$out/parity.txt"
  sed -i "s|$fixtures|FIXTURE_DIR|g" "$out/parity.txt"
}

# The results folder into RESULTS_COPY as three files, whatever the number of rows: the device
# tool returns at most 8 files (one folder deep), and a flat copy of every row's records once
# outgrew that and lost the table. `table.md` to read at once; `results.tgz`, the results folder
# without its kernel caches (`tar xzf results.tgz -C benches/results/gpu_vs_pytorch` puts it in
# place); `kernel_cache.tgz`, the rows' kernel caches (KERNEL_CACHE_SEED takes that file as it is).
# Each is written to a `.part` name and renamed, so a run killed mid-copy leaves the last whole one.
copy_out() {
  [ -n "${RESULTS_COPY:-}" ] || return 0
  mkdir -p "$RESULTS_COPY"
  cp "$out/table.md" "$RESULTS_COPY/table.md.part" && mv "$RESULTS_COPY/table.md.part" "$RESULTS_COPY/table.md"
  tar czf "$RESULTS_COPY/results.tgz.part" -C "$(dirname "$out")" --exclude=kernel_cache --exclude=autotune_seed \
    "$(basename "$out")" && mv "$RESULTS_COPY/results.tgz.part" "$RESULTS_COPY/results.tgz"
  if [ -d "$out/kernel_cache" ]; then
    tar czf "$RESULTS_COPY/kernel_cache.tgz.part" -C "$out" kernel_cache && mv "$RESULTS_COPY/kernel_cache.tgz.part" "$RESULTS_COPY/kernel_cache.tgz"
  fi
  return 0
}

# After each row: the table so far, the row's kernel cache next to the results, a copy out.
vp_after_row() {
  local row=$1
  vp_header "$VP_SCRATCH_OUT/header.md" "$mode" "$out"
  vp_report table "$out/raw.jsonl" --out "$out/table.md" --header-file "$VP_SCRATCH_OUT/header.md" --title "$title" >/dev/null
  # The row's own records (kernel counts per step, summaries, the ends of the logs), for reading later.
  if [ -n "$row" ] && [ -d "$VP_SCRATCH_OUT/$row" ]; then
    local f keep="$out/rows/$row"
    mkdir -p "$keep"
    for f in run/metrics.jsonl run/summary.md run_warm/metrics.jsonl run_warm/summary.md; do
      [ -f "$VP_SCRATCH_OUT/$row/$f" ] && cp "$VP_SCRATCH_OUT/$row/$f" "$keep/${f//\//_}"
    done
    for f in vramlab.log vramlab_warm.log torch.log; do
      [ -f "$VP_SCRATCH_OUT/$row/$f" ] && tail -c 20000 "$VP_SCRATCH_OUT/$row/$f" >"$keep/$f"
    done
  fi
  if [ "$mode" = cuda ] && [ -d "$VP_SCRATCH_OUT/$row/kernel_cache" ]; then
    mkdir -p "$out/kernel_cache/$row" "$out/rows/$row"
    cp -r "$VP_SCRATCH_OUT/$row/kernel_cache/." "$out/kernel_cache/$row/"
    # What the searches chose, in results.tgz (kernel_cache.tgz may not come back): per tuner,
    # and the convolutions' short search key by key (nn::cube::conv's GEMMs against the tiles).
    vp_report autotune "$out/kernel_cache/$row" --keys nn-cube-conv >"$out/rows/$row/autotune.md" 2>&1 || true
  fi
  [ "$row" = "${rows[0]}" ] && parity vae3d_ultra
  copy_out
}

# The VAE row again with another build of vramlab, through benches/kernels.sh (cold and warm
# step 1, steady step, kernels compiled, launches), while at least MIN_S (default 120) of the
# budget is left: `kernels_row BIN VARIANT [ENV=VALUE…]`. BIN may be xz-compressed (`.xz`, as
# gpu_prepare.sh carries it): it is unpacked first.
kernels_row() {
  [ "$mode" = cuda ] && [ -n "$1" ] || return 0
  local bin=$1 variant=$2 left
  shift 2
  left=$(vp_left 600)
  if [ "$left" -lt "${MIN_S:-120}" ]; then
    vp_log "kernels row '$variant': not run, ${left} s of BUDGET_S left"
    return 0
  fi
  if [[ "$bin" == *.xz ]]; then
    local plain
    plain=$VP_SCRATCH_OUT/$(basename "$bin" .xz)
    [ -x "$plain" ] || vp_unxz "$bin" "$plain" || { vp_log "kernels row '$variant': cannot unpack $bin (xz)"; return 0; }
    bin=$plain
  fi
  vp_log "kernels row '$variant': $bin, ${left} s left"
  env "$@" BACKEND=cuda VARIANT="$variant" BIN="$bin" STEPS=4 ROW_TIMEOUT_S=$(( left / 2 )) BUDGET_S="$left" \
    NOTE="run by gpu_vs_pytorch.sh after its rows, on the same GPU" bash benches/kernels.sh vae >&2 || vp_log "kernels.sh failed"
  mkdir -p "$out/kernels"
  cp benches/results/kernels/cuda/raw.jsonl benches/results/kernels/cuda/table.md "$out/kernels/" 2>/dev/null || true
  copy_out
}

# The #[cube] kernels' tests built for cuda (gpu_prepare.sh: KERNEL_TESTS_DIR=.gpu/tests), while
# KERNEL_TESTS_MIN_S (default 60) of the budget is left, capped by it and by KERNEL_TESTS_S
# (default 150): benches/gpu_kernel_tests.sh into kernel_tests.txt, summarised in the table's header.
kernel_tests() {
  [ "$mode" = cuda ] && [ -n "${KERNEL_TESTS_DIR:-}" ] || return 0
  local left
  left=$(vp_left 600)
  if [ "$left" -lt "${KERNEL_TESTS_MIN_S:-60}" ]; then
    vp_log "kernel tests: not run, ${left} s of BUDGET_S left"
    echo "=> not run: ${left} s of BUDGET_S=$BUDGET_S left" >"$out/kernel_tests.txt"
  else
    [ "$left" -gt "${KERNEL_TESTS_S:-150}" ] && left=${KERNEL_TESTS_S:-150}
    vp_log "kernel tests: $KERNEL_TESTS_DIR, at most ${left} s"
    KERNEL_TESTS_S=$left bash "$VP_ROOT/benches/gpu_kernel_tests.sh" "$KERNEL_TESTS_DIR" "$out" || vp_log "gpu_kernel_tests.sh failed"
  fi
  vp_after_row ""
  copy_out
}

vp_fixture_check "$out"
# The most important row; then the cold start with Burn's autotune compiled out (issue 24, item 4:
# the `cuda-untuned` build), which no run reached while it came after ACT, whose autotuned cold
# step 1 outlasted a whole budget (2026-11-28: unfinished after 321 s); then the next two rows,
# the other VAE variants (fusion, autotune level) and the other rows.
vp_run_rows "$mode" "$out" "${rows[0]}"
kernels_row "${BIN_UNTUNED:-}" "autotune off (cuda-untuned build)"
vp_run_rows "$mode" "$out" "${rows[@]:1:2}"
# Burn's fusion (issue 24): with our #[cube] kernels as custom ops, then with the composed ops.
kernels_row "${BIN_FUSION:-}" "fusion + custom kernels (cuda,fusion build)"
kernel_tests
# Where the VAE's steady step goes on this GPU, kernel by kernel (CubeCL times each kernel alone,
# so the row's steps are slower than untimed ones; its note lists the costliest kernels).
kernels_row "$VP_BIN" "kernels timed (main build, VRAMLAB_KERNEL_ACCOUNTING=time)" VRAMLAB_KERNEL_ACCOUNTING=time
kernels_row "$VP_BIN" "autotune minimal (main build, --autotune=minimal)" EXTRA=--autotune=minimal
# Matrix products autotuned as Burn's instead of the fixed kernel (the default since 2026-11-28):
# what the fixed kernel costs the steady step, what the search costs step 1.
kernels_row "$VP_BIN" "matmul autotuned (main build, --matmul_autotune=true)" EXTRA=--matmul_autotune=true
# Convolutions searched as Burn's (8 forward / 7 weight-gradient candidates a shape) instead of
# nn::cube::conv's short search (4 / 3, the default since 2026-11-28): what each costs step 1 and
# the steady step.
kernels_row "$VP_BIN" "conv full autotune (main build, --conv_full_autotune=true)" EXTRA=--conv_full_autotune=true
kernels_row "${BIN_FUSION:-}" "fusion, composed ops (same build, VRAMLAB_COMPOSED_KERNELS=1)" VRAMLAB_COMPOSED_KERNELS=1
# CubeCL's pages instead of exact-size buffers (cuda's default since 2026-11-29): what the pages
# (sized by the card) cost in reserved memory, and whether the exact pool costs time.
kernels_row "$VP_BIN" "memory pool pages (main build, --gpu_memory_pool=pages)" EXTRA=--gpu_memory_pool=pages
# Kernel accounting off: every row above counts launches from CubeCL's profiling logger, which
# formats and sends a line per launch from the training thread; this row says what that costs
# the steady step (launches and compilations are then not counted).
kernels_row "$VP_BIN" "kernel accounting off (main build, VRAMLAB_KERNEL_ACCOUNTING=off)" VRAMLAB_KERNEL_ACCOUNTING=off
[ "${#rows[@]}" -le 3 ] || vp_run_rows "$mode" "$out" "${rows[@]:3}"
parity act_small
parity diffusion_small
vp_after_row ""
vp_log "results: $out (table.md, raw.jsonl, parity.txt${RESULTS_COPY:+; copied to $RESULTS_COPY})"

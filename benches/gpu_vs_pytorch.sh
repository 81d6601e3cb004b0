#!/usr/bin/env bash
# PyTorch CUDA (eager, lerobot 0.4.4) vs vramlab --backend=cuda on the same configurations:
# median step time, peak allocated / reserved memory, step 1 cold (fresh empty kernel cache) and
# warm (second process on the same cache), and the vramlab / PyTorch ratios. Writes
# benches/results/gpu_vs_pytorch/<gpu name slug>/{table.md,raw.jsonl,fixture_check.txt}.
#
#   bash benches/gpu_vs_pytorch.sh [ROW...]      # default: the GPU rows of ../shared/baselines/README.md
#   ROWS=vae STEPS=8 bash benches/gpu_vs_pytorch.sh
#   BIN=target/cuda/release/vramlab TORCH_PYTHON=python3 WHEELS_DIR=~/lerobot-wheels bash benches/gpu_vs_pytorch.sh
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

VP_COMMAND="$(vp_env_prefix TORCH_PYTHON BIN ROWS STEPS WHEELS_DIR)bash benches/gpu_vs_pytorch.sh${*:+ $*}"
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
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  VP_DEVICE_NAME="GPU: $gpu_name (driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1))"
  out=benches/results/gpu_vs_pytorch/$(vp_report slug "$gpu_name")
  mapfile -t rows < <(vp_rows gpu "$@")
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
vp_fixture_check "$out"
vp_run_rows "$mode" "$out" "${rows[@]}"
vp_header "$VP_SCRATCH_OUT/header.md" "$mode" "$out"
vp_report table "$out/raw.jsonl" --out "$out/table.md" --header-file "$VP_SCRATCH_OUT/header.md" --title "$title"

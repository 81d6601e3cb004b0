#!/usr/bin/env bash
# PyTorch CPU (eager, lerobot 0.4.4) vs vramlab flex (the default CPU backend) on the same
# configurations, in one run: per row a PyTorch process and a vramlab process back to back.
# Writes benches/results/cpu_vs_pytorch/<machine>/{table.md,raw.jsonl,fixture_check.txt}: median step
# time, peak memory, step 1, and the vramlab / PyTorch ratios.
#
#   bash benches/cpu_vs_pytorch.sh [ROW...]          # default: the CPU rows (ACT b8 240×320,
#                                                    # Diffusion PushT b8, VAE ultra b2 8×32×32)
#   TORCH_PYTHON=/path/to/python bash benches/cpu_vs_pytorch.sh   # use an existing torch + lerobot
#   ROWS=vae STEPS=8 BIN=/tmp/vramlab bash benches/cpu_vs_pytorch.sh
#   MACHINE=my-laptop bash benches/cpu_vs_pytorch.sh  # the folder name under benches/results/cpu_vs_pytorch/
#
# <machine> defaults to the CPU model, the core count and the widest vector ISA the CPU has
# (e.g. amd-epyc-2c-avx512), so tables from different machines sit side by side.
#
# Without TORCH_PYTHON, PyTorch CPU + lerobot 0.4.4 are installed into a venv at
# ${VRAMLAB_TORCH_VENV:-~/.cache/vramlab/torch-venv} (pip, torch from the CPU index); if the
# package registry cannot be reached the script says so and exits 3. Without BIN it runs
# `cargo build --release`. Other settings: benches/lib_vs_pytorch.sh; rows: benches/torch/rows.py.
source "$(dirname "$0")/lib_vs_pytorch.sh"

VP_COMMAND="$(vp_env_prefix TORCH_PYTHON BIN ROWS STEPS MACHINE)bash benches/cpu_vs_pytorch.sh${*:+ $*}"
cpu_isa=baseline
grep -qw avx2 /proc/cpuinfo 2>/dev/null && cpu_isa=avx2
grep -qw avx512f /proc/cpuinfo 2>/dev/null && cpu_isa=avx512
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
out=benches/results/cpu_vs_pytorch/${MACHINE:-$(vp_report slug "${cpu_model:-cpu}")-$(nproc)c-$cpu_isa}
mapfile -t rows < <(vp_rows cpu "$@")
[ "${#rows[@]}" -gt 0 ] || vp_die 2 "no rows selected"
vp_setup_torch_cpu
vp_setup_vramlab flex
VP_DEVICE_NAME="CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') × $(nproc)"
vp_log "rows: ${rows[*]}; PyTorch: $VP_PY; vramlab: $VP_BIN"
vp_prepare_out "$out"
vp_fixture_check "$out"
vp_run_rows cpu "$out" "${rows[@]}"
vp_header "$VP_SCRATCH_OUT/header.md" cpu "$out"
vp_report table "$out/raw.jsonl" --out "$out/table.md" --header-file "$VP_SCRATCH_OUT/header.md" \
  --title "PyTorch CPU vs vramlab flex: step time and memory, same configs, same run"

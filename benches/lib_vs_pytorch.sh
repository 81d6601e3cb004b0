# shellcheck shell=bash
# Shared by benches/cpu_vs_pytorch.sh and benches/gpu_vs_pytorch.sh (source it, do not run it):
# finding a python with torch + lerobot 0.4.4, the vramlab binary, the VAE fixture check, and
# running each row on both sides (PyTorch: benches/torch/baseline.py; vramlab: `vramlab train`)
# into one raw JSONL, then the table (benches/torch/report.py).
#
# Environment understood by both scripts:
#   TORCH_PYTHON   a python with torch (+ lerobot 0.4.4 for ACT/Diffusion) importable; skips set-up
#   BIN            the vramlab binary to measure (default: built by the script)
#   ROWS           rows to run: names, tags cpu/gpu, kinds act/diffusion/vae, or prefix* (also args)
#   STEPS          steps per run (default 5 on CPU, 8 on CUDA); timing = median of steps 3..STEPS
#   VP_TIMEOUT     seconds per run before it is stopped and recorded as timed out (default 1800)
#   BUDGET_S       wall-clock seconds for all rows together, counted from the script's start: each
#                  run is capped at what is left, and rows that no longer fit (under VP_MIN_ROW_S,
#                  default 45 s, left) are recorded as "not run: budget spent"
#   KERNEL_CACHE_SEED  cuda: a directory of per-row kernel caches (<row>/) written by an earlier
#                  run (its kernel_cache/ next to the results; gpu_vs_pytorch.sh also takes the
#                  kernel_cache.tgz in its RESULTS_COPY): each row starts from its copy, so
#                  "step 1 cold" is then "seeded" (said in the table header)
#   APPEND=1       keep the other rows' records already in raw.jsonl (default: start afresh)
#   VP_SCRATCH     where vramlab's run directories and kernel caches go (default target/vs_pytorch)
#   VP_TORCH_LEROBOT_FLAGS=1  PyTorch with lerobot-train's cudnn.benchmark + TF32 matmuls (default: PyTorch's defaults)

set -euo pipefail
VP_T0=$(date +%s)
VP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$VP_ROOT"
export PYTHONDONTWRITEBYTECODE=1
VP_TORCH_DIR="$VP_ROOT/benches/torch"
VP_FIXTURE="${FIXTURE_DIR:-$VP_ROOT/../shared/oracle}/vae3d_ultra"
# lerobot 0.4.4's pure-Python needs on an image that already has torch, torchvision, accelerate,
# einops, imageio, safetensors, huggingface_hub, pyyaml, typing-inspect (PyAV: a stand-in is used).
VP_LEROBOT_WHEELS="lerobot==0.4.4 draccus==0.10.0 diffusers==0.35.2 datasets==4.4.1 dill multiprocess deepdiff==8.6.1 orderly-set mergedeep toml pyserial termcolor jsonlines"

# "NAME=value " for each NAME set in the environment (shell-quoted), to print a command line.
vp_env_prefix() {
  local n
  for n in "$@"; do
    [ -n "${!n:-}" ] && printf '%s=%q ' "$n" "${!n}"
  done
  return 0
}

vp_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
vp_die() {
  local rc=$1; shift
  printf 'error: %s\n' "$*" >&2
  exit "$rc"
}

# A python3 for the report side (json only; no torch needed).
vp_report_py() { command -v python3 || echo "${TORCH_PYTHON:-python3}"; }
vp_report() { "$(vp_report_py)" "$VP_TORCH_DIR/report.py" "$@"; }

# ---------------------------------------------------------------------------------- PyTorch

# Is lerobot's ACT / Diffusion importable by $1? (prints the probe's JSON)
vp_probe() { "$1" "$VP_TORCH_DIR/baseline.py" probe --lerobot; }

# Can this machine reach the package indexes pip would use? ($@: index URLs)
vp_registry_reachable() {
  python3 - "$@" <<'PY'
import sys, urllib.request
for url in sys.argv[1:]:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=15).close()
    except Exception as e:  # noqa: BLE001
        print(f"  {url}: {e}", file=sys.stderr)
        sys.exit(1)
PY
}

# Sets VP_PY to a python with torch (CPU build is enough) and lerobot 0.4.4: $TORCH_PYTHON, or a
# venv at ${VRAMLAB_TORCH_VENV:-~/.cache/vramlab/torch-venv}, created here when absent.
vp_setup_torch_cpu() {
  if [ -n "${TORCH_PYTHON:-}" ]; then
    VP_PY=$TORCH_PYTHON
    vp_probe "$VP_PY" >/dev/null || vp_die 2 "TORCH_PYTHON=$TORCH_PYTHON cannot import torch and lerobot 0.4.4's ACT/Diffusion (see the probe above)"
    return
  fi
  local venv=${VRAMLAB_TORCH_VENV:-$HOME/.cache/vramlab/torch-venv}
  local torch_index=${VRAMLAB_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
  local pypi=${PIP_INDEX_URL:-https://pypi.org/simple}
  VP_PY="$venv/bin/python"
  if [ -x "$VP_PY" ] && vp_probe "$VP_PY" >/dev/null 2>&1; then
    vp_log "PyTorch side: $VP_PY (existing venv)"
    return
  fi
  vp_log "setting up PyTorch CPU + lerobot 0.4.4 in $venv (set TORCH_PYTHON to use an existing python instead)"
  if ! vp_registry_reachable "${pypi%/}/lerobot/"; then
    vp_die 3 "the package registry is unreachable (${pypi}); cannot install torch + lerobot 0.4.4.
  Run where pip can reach it, or point TORCH_PYTHON at a python that already imports torch and lerobot 0.4.4."
  fi
  # torch < 2.11: lerobot 0.4.4's bound; from the CPU index so pip does not pull a CUDA build,
  # or, where only PyPI answers, PyPI's build (it bundles CUDA libraries; same CPU kernels).
  local torch_from=(--index-url "$torch_index") extra=(--extra-index-url "$torch_index")
  if ! vp_registry_reachable "${torch_index%/}/torch/"; then
    vp_log "the CPU wheel index $torch_index is unreachable: installing PyPI's torch (with CUDA libraries, a few GB)"
    torch_from=() extra=()
  fi
  python3 -m venv "$venv" || vp_die 3 "python3 -m venv $venv failed (install the python3-venv package?)"
  "$venv/bin/pip" install --quiet "torch<2.11" "torchvision<0.26" "${torch_from[@]}" \
    || vp_die 3 "pip install torch (${torch_from[*]:-PyPI}) failed"
  "$venv/bin/pip" install --quiet "lerobot==0.4.4" "${extra[@]}" \
    || vp_die 3 "pip install lerobot==0.4.4 failed"
  vp_probe "$VP_PY" >/dev/null || vp_die 3 "the new venv $venv still cannot import lerobot's ACT/Diffusion (probe above)"
}

# Sets VP_PY for the GPU script: $TORCH_PYTHON or python3 (the image's torch); lerobot and its
# pure-Python needs come from WHEELS_DIR (pip --no-index --no-deps --target) when not importable.
vp_setup_torch_gpu() {
  VP_PY=${TORCH_PYTHON:-python3}
  "$VP_PY" -c 'import torch' 2>/dev/null || vp_die 2 "$VP_PY cannot import torch: set TORCH_PYTHON to a python with torch"
  if vp_probe "$VP_PY" >/dev/null 2>&1; then
    return
  fi
  local target=${VRAMLAB_LEROBOT_TARGET:-$HOME/.cache/vramlab/lerobot-site}
  if [ -d "$target/lerobot" ]; then
    export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
    vp_probe "$VP_PY" >/dev/null 2>&1 && { vp_log "lerobot from $target"; return; }
  fi
  if [ -z "${WHEELS_DIR:-}" ] || ! ls "${WHEELS_DIR}"/*.whl >/dev/null 2>&1; then
    local pyver
    pyver=$("$VP_PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    local why="no WHEELS_DIR given"
    [ -z "${WHEELS_DIR:-}" ] || why="WHEELS_DIR=$WHEELS_DIR holds no .whl"
    vp_die 4 "$VP_PY has torch but cannot import lerobot 0.4.4 ($why).
  On a machine with internet access, download the pure-Python wheels:
    pip download --no-deps --only-binary=:all: --python-version $pyver -d lerobot-wheels \\
      $VP_LEROBOT_WHEELS
  carry lerobot-wheels/ here and run again with WHEELS_DIR=/path/to/lerobot-wheels
  (they are installed with pip --no-index --no-deps --target $target, nothing else is touched).
  Or set TORCH_PYTHON to a python that imports torch and lerobot 0.4.4."
  fi
  vp_log "installing lerobot 0.4.4 + pure-Python deps from $WHEELS_DIR into $target"
  "$VP_PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS_DIR" --target "$target" "$WHEELS_DIR"/*.whl \
    || vp_log "warning: pip install from WHEELS_DIR=$WHEELS_DIR failed"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
  # Not fatal: the VAE rows need no lerobot, and the ACT/Diffusion rows record PyTorch's error.
  vp_probe "$VP_PY" \
    || vp_log "warning: lerobot still does not import after installing WHEELS_DIR (the probe above names what is missing: add that wheel); the ACT/Diffusion rows will record PyTorch's import error"
}

# vramlab's CUDA needs, found at run time (cudarc loads them, nothing is linked): the toolkit's
# headers for NVRTC (CubeCL reads CUDA_PATH, else /usr/local/cuda, /opt/cuda, /usr) and
# libnvrtc / libcuda on the loader's path. Sets CUDA_PATH from nvcc where CubeCL would not find the
# toolkit, puts the toolkit's and the Python NVIDIA wheels' library folders on LD_LIBRARY_PATH
# (after what is there), and sets VP_CUDA_ENV to one line saying what was found.
vp_cuda_env() {
  local root=${CUDA_PATH:-} d libs=""
  if [ -z "$root" ]; then
    for d in /usr/local/cuda /opt/cuda; do [ -d "$d/include" ] && { root=$d; break; }; done
  fi
  if [ -z "$root" ] && command -v nvcc >/dev/null 2>&1; then
    root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
  [ -z "$root" ] || export CUDA_PATH=$root
  local wheel_libs
  wheel_libs=$("${VP_PY:-python3}" -c 'import glob, os, nvidia
for base in nvidia.__path__:
    for p in sorted(glob.glob(os.path.join(base, "*", "lib"))): print(p)' 2>/dev/null || true)
  for d in ${root:+"$root/lib64" "$root/targets/x86_64-linux/lib"} $wheel_libs; do
    [ -n "$d" ] && [ -d "$d" ] && libs+="${libs:+:}$d"
  done
  [ -z "$libs" ] || export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs"
  local nvrtc ldp=${LD_LIBRARY_PATH:-}
  nvrtc=$( { ldconfig -p 2>/dev/null | grep -o 'libnvrtc\.so[.0-9]*' ; for d in ${ldp//:/ }; do ls "$d"/libnvrtc.so* 2>/dev/null; done; } | head -3 | tr '\n' ' ' || true)
  VP_CUDA_ENV="CUDA_PATH=${CUDA_PATH:-none found} ($( [ -d "${CUDA_PATH:-/nonexistent}/include" ] && echo "include/ present" || echo "no include/: NVRTC cannot compile CubeCL's kernels")); nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not on PATH'); libnvrtc: ${nvrtc:-not found}"
  vp_log "CUDA for vramlab: $VP_CUDA_ENV"
}

# vp_fixture_check OUT_DIR: the VAE port against the reference fixture (when ../shared is
# present), result in OUT_DIR/fixture_check.txt. Exits non-zero on a mismatch.
vp_fixture_check() {
  local out=$1
  if [ -f "$VP_FIXTURE/outputs.safetensors" ]; then
    vp_log "fixture check: benches/torch/baseline.py --check-fixture ../shared/oracle/vae3d_ultra"
    local rc=0
    "$VP_PY" "$VP_TORCH_DIR/baseline.py" --check-fixture "$VP_FIXTURE" >"$out/fixture_check.txt" 2>&1 || rc=$?
    sed -i "s|$VP_ROOT/../shared|../shared|g" "$out/fixture_check.txt"
    cat "$out/fixture_check.txt" >&2
    [ "$rc" = 0 ] || vp_die 5 "the PyTorch VAE port does not match the reference fixture (exit $rc); not benchmarking"
  else
    vp_log "fixture check skipped: $VP_FIXTURE absent (../shared not mounted)"
    echo "skipped: ../shared/oracle/vae3d_ultra absent" >"$out/fixture_check.txt"
  fi
}

# ---------------------------------------------------------------------------------- vramlab

# vp_unxz SRC.xz DEST: unpacks an xz-compressed executable (as gpu_prepare.sh carries the builds)
# with Python's lzma (the device image may lack xz); fails without leaving a partial DEST.
vp_unxz() {
  mkdir -p "$(dirname "$2")"
  if python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2.part"; then
    chmod +x "$2.part" && mv "$2.part" "$2"
  else
    rm -f "$2.part"
    return 1
  fi
}

# Sets VP_BIN: $BIN (unpacked first when xz-compressed, `.xz`, as gpu_prepare.sh carries it),
# else builds. $1: flex | cuda.
vp_setup_vramlab() {
  if [[ "${BIN:-}" == *.xz ]]; then
    [ -f "$BIN" ] || vp_die 2 "BIN=$BIN: no such file"
    local plain
    plain="$VP_ROOT/target/vs_pytorch/$(basename "$BIN" .xz)"
    vp_unxz "$BIN" "$plain" || vp_die 2 "BIN=$BIN: cannot unpack it (xz)"
    vp_log "unpacked $BIN to $plain"
    BIN=$plain
  fi
  if [ -n "${BIN:-}" ]; then
    [ -x "$BIN" ] || vp_die 2 "BIN=$BIN is not an executable"
    VP_BIN=$BIN
  elif [ "$1" = cuda ]; then
    vp_log "building vramlab with CUDA (target/cuda)"
    CARGO_TARGET_DIR=target/cuda cargo build --release --no-default-features --features cuda >&2
    VP_BIN=target/cuda/release/vramlab
  else
    vp_log "building vramlab (release, flex)"
    cargo build --release >&2
    VP_BIN=target/release/vramlab
  fi
  # The binary's own version and date; the commit is HEAD at run time (a given BIN may be older).
  local dirty=""
  [ -z "$(git status --porcelain -- crates 2>/dev/null)" ] || dirty=" with crates/ modified in the work tree"
  VP_BIN_VERSION="$("$VP_BIN" --version 2>/dev/null | head -1), file dated $(date -u -r "$VP_BIN" '+%Y-%m-%d %H:%M UTC'); HEAD $(git rev-parse --short HEAD 2>/dev/null || echo '?')$dirty"
}

# ---------------------------------------------------------------------------------- rows

# vp_run_rows MODE OUT_DIR ROW...   MODE: cpu (torch CPU vs flex) | cuda (torch CUDA vs cuda)
# Appends one PyTorch and one vramlab record per row to OUT_DIR/raw.jsonl.
vp_run_rows() {
  local mode=$1 out=$2; shift 2
  local raw="$out/raw.jsonl" steps=${STEPS:-}
  [ -n "$steps" ] || { [ "$mode" = cuda ] && steps=8 || steps=5; }
  local tmo=${VP_TIMEOUT:-1800}
  local backend torch_dev
  if [ "$mode" = cuda ]; then backend=cuda; torch_dev=cuda; else backend=flex; torch_dev=cpu; fi
  local device_name=$VP_DEVICE_NAME
  local min_row=${VP_MIN_ROW_S:-45}
  for row in "$@"; do
    local work="$VP_SCRATCH_OUT/$row"
    rm -rf "$work"
    mkdir -p "$work"
    if [ -n "${BUDGET_S:-}" ] && [ "$(vp_left "$tmo")" -lt "$min_row" ]; then
      vp_log "$row: not run: BUDGET_S=$BUDGET_S spent ($(( $(date +%s) - VP_T0 )) s elapsed)"
      vp_report error-record "$row" --backend "vramlab-$backend" --device "$device_name" --rc 0 \
        --why "not run: BUDGET_S=$BUDGET_S spent" --out "$raw" >/dev/null
      vp_after_row "$row"
      continue
    fi
    # PyTorch, in its own process (peaks are per process).
    vp_log "$row: PyTorch ($torch_dev, $steps steps)"
    local rc=0
    local torch_flags=()
    [ "${VP_TORCH_LEROBOT_FLAGS:-0}" = 1 ] && torch_flags=(--lerobot-train-flags)
    timeout --kill-after=10 "$(vp_left "$tmo")" "$VP_PY" "$VP_TORCH_DIR/baseline.py" run "$row" --steps "$steps" --device "$torch_dev" \
      "${torch_flags[@]}" >"$work/torch.out" 2>"$work/torch.log" || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 1 ] && [ -s "$work/torch.out" ]; then
      tail -1 "$work/torch.out" >>"$raw"
    else
      vp_report error-record "$row" --backend "torch-$torch_dev" --device "$device_name" --rc "$rc" --log "$work/torch.log" --out "$raw" >/dev/null
    fi
    vp_log "$row: $(vp_summary "$raw" torch "$row")"

    # vramlab: a fresh empty kernel cache (cold), then on cuda a second process on the same cache
    # (warm). The cold process counts kernels (CubeCL's profiling logger: a formatted line per
    # launch, from the training thread); the warm one runs the same steps with
    # VRAMLAB_KERNEL_ACCOUNTING=off, so the table also has a steady step without that cost
    # (PyTorch's side counts nothing).
    local args
    mapfile -t args < <(vp_report vramlab-args "$row")
    local common=(--backend="$backend" --save_checkpoint=false --num_workers=0 --seed=1000)
    local warm_opts=()
    if [ "$mode" = cuda ]; then
      mkdir -p "$work/kernel_cache"
      if [ -n "${KERNEL_CACHE_SEED:-}" ] && [ -d "$KERNEL_CACHE_SEED/$row" ]; then
        cp -r "$KERNEL_CACHE_SEED/$row/." "$work/kernel_cache/"
        vp_log "$row: kernel cache seeded from $KERNEL_CACHE_SEED/$row"
      fi
      common+=(--kernel_cache_dir="$work/kernel_cache")
    fi
    vp_log "$row: vramlab $backend ($steps steps)"
    local load_before
    load_before=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
    rc=0
    local t0 why=""
    t0=$(date +%s)
    timeout --kill-after=10 "$(vp_left "$tmo")" "$VP_BIN" train "${args[@]}" "${common[@]}" --steps="$steps" --output_dir="$work/run" \
      >"$work/vramlab.log" 2>&1 || rc=$?
    case "$rc" in 124|137) why="stopped at its time limit after $(( $(date +%s) - t0 )) s" ;; esac
    if [ "$mode" = cuda ] && [ "$rc" = 0 ]; then
      vp_log "$row: vramlab $backend warm (second process, same kernel cache, $steps steps, kernel accounting off)"
      local wrc=0
      VRAMLAB_KERNEL_ACCOUNTING=off timeout --kill-after=10 "$(vp_left "$tmo")" "$VP_BIN" train "${args[@]}" "${common[@]}" --steps="$steps" --output_dir="$work/run_warm" \
        >"$work/vramlab_warm.log" 2>&1 || wrc=$?
      warm_opts=(--warm-dir "$work/run_warm" --warm-rc "$wrc" --warm-log "$work/vramlab_warm.log")
    fi
    vp_report vramlab-record "$row" "$work/run" --backend "vramlab-$backend" --device "$device_name" \
      --version "$VP_BIN_VERSION" --rc "$rc" --why "$why" --log "$work/vramlab.log" --load-before "$load_before" \
      "${warm_opts[@]}" --out "$raw" >/dev/null || true
    vp_log "$row: $(vp_summary "$raw" vramlab "$row")"
    vp_after_row "$row"
  done
}

# Seconds a run may take now: VP_TIMEOUT ($1), capped by what is left of BUDGET_S less the
# VP_RESERVE_S seconds kept back for a later check (never below 1).
vp_left() {
  local tmo=$1
  if [ -n "${BUDGET_S:-}" ]; then
    local left=$(( BUDGET_S - ($(date +%s) - VP_T0) - ${VP_RESERVE_S:-0} ))
    [ "$left" -lt "$tmo" ] && tmo=$left
  fi
  [ "$tmo" -lt 1 ] && tmo=1
  echo "$tmo"
}

# Called after each row (recorded or skipped); a script overrides it to write its table as it goes.
vp_after_row() { :; }

# One line about the last record of a side (and row) in raw.jsonl: vp_summary RAW SIDE ROW.
vp_summary() {
  "$(vp_report_py)" - "$1" "$2" "$3" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mine = [x for x in recs if x["backend"].startswith(sys.argv[2]) and x.get("name") == sys.argv[3]]
r = mine[-1] if mine else {"backend": sys.argv[2], "error": "no record written"}
if "error" in r:
    print(f"{r['backend']}: {r['error']}")
else:
    off = f"; warm process, kernel accounting off: {r['ms_step_median_uncounted']:.1f} ms/step" if "ms_step_median_uncounted" in r else ""
    print(f"{r['backend']}: {r['ms_step_median']:.1f} ms/step (median of steps {r['timed_steps']}), step 1 {r['step1_s']:.2f} s{off}")
PY
}

# vp_prepare_out OUT_DIR: the results dir (raw.jsonl reset unless APPEND=1) and its scratch dir.
vp_prepare_out() {
  local out=$1
  mkdir -p "$out"
  [ "${APPEND:-0}" = 1 ] || : >"$out/raw.jsonl"
  VP_SCRATCH_OUT="${VP_SCRATCH:-$VP_ROOT/target/vs_pytorch}/$(basename "$(dirname "$out")")_$(basename "$out")"
  mkdir -p "$VP_SCRATCH_OUT"
}

# vp_rows TAG [ARGS...]: the selected row names (ROWS env or args; default: rows tagged TAG).
vp_rows() {
  local tag=$1; shift
  local sel="${*:-${ROWS:-}}"
  # shellcheck disable=SC2086
  vp_report rows --tag "$tag" $sel
}

# The CPU's vector extensions that matter to the kernels, from /proc/cpuinfo (e.g. "avx512f
# avx512bw avx512dq avx512vl avx2 fma").
vp_cpu_isa_flags() {
  local have="" f flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2- || true) "
  for f in avx2 fma avx512f avx512bw avx512dq avx512vl avx512_bf16; do
    case "$flags" in *" $f "*) have+="${have:+ }$f" ;; esac
  done
  echo "${have:-none of avx2/fma/avx512 (or /proc/cpuinfo unreadable)}"
}

# The ISA caps set in this environment, as a clause of the header's ISA line (empty if none):
# vramlab's VRAMLAB_SIMD, PyTorch's ATEN_CPU_CAPABILITY and oneDNN's ONEDNN_MAX_CPU_ISA.
vp_isa_caps() {
  local v caps=""
  for v in VRAMLAB_SIMD ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA; do
    [ -n "${!v:-}" ] && caps="$caps${caps:+, }\`$v=${!v}\`"
  done
  [ -z "$caps" ] || echo "; caps set for this run: $caps"
}

# PyTorch's CPU capability from `baseline.py probe`'s JSON ($1).
vp_torch_capability() {
  "$(vp_report_py)" -c 'import json, sys
try:
    print(json.loads(sys.argv[1]).get("cpu_capability", "?"))
except ValueError:
    print("?")' "$1"
}

# vramlab's flex-kernel ISA level, as its runs' summary.md reports it (the first row's run under
# OUT_DIR's scratch dir), e.g. "avx512; GEMM up to AVX-512 (…)" or "avx2 (VRAMLAB_SIMD=avx2; the
# CPU has avx512); GEMM up to AVX2 (…)".
vp_vramlab_isa() {
  local f line
  for f in "$VP_SCRATCH_OUT"/*/run/summary.md; do
    [ -f "$f" ] || continue
    line=$(grep -m1 -F '**cpu kernels (flex)**' "$f" | sed 's/^.*\*\*: //')
    [ -n "$line" ] && { echo "$line"; return; }
  done
  echo "? (no run's summary.md names it)"
}

# vp_header FILE MODE OUT_DIR: the table's preamble (machine, versions, method), markdown.
vp_header() {
  local file=$1 mode=$2 out=$3
  # The probe imports torch and lerobot (seconds): once per script, the table is rewritten per row.
  [ -n "${VP_TORCH_INFO:-}" ] || VP_TORCH_INFO=$("$VP_PY" "$VP_TORCH_DIR/baseline.py" probe --lerobot 2>/dev/null || true)
  local torch_info=$VP_TORCH_INFO
  local mem
  mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null || echo '?')
  {
    local host_cpu=""
    [ "$mode" = cuda ] && host_cpu="; host CPU $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') × $(nproc)"
    echo "- **Machine**: $VP_DEVICE_NAME$host_cpu; $mem RAM; host \`$(hostname)\`; $(date -u '+%Y-%m-%d %H:%M UTC')."
    [ "$mode" = cuda ] || echo "- **Vector ISA**: CPU flags: $(vp_cpu_isa_flags); PyTorch's \`torch.backends.cpu.get_cpu_capability()\`: \`$(vp_torch_capability "$torch_info")\`; vramlab's flex kernels: \`$(vp_vramlab_isa "$out")\` (\`VRAMLAB_SIMD\` caps vramlab's own kernels, not the GEMM; a \`--features flex-avx2\` build has the GEMM's AVX2 kernels only)$(vp_isa_caps)."
    echo "- **PyTorch side**: $(vp_report torch-line "$torch_info"); eager, no torch.compile."
    [ -z "${VP_CUDA_ENV:-}" ] || echo "- **CUDA for vramlab**: $VP_CUDA_ENV."
    echo "- **vramlab side**: \`$VP_BIN\` — $VP_BIN_VERSION; \`--backend=$( [ "$mode" = cuda ] && echo cuda || echo flex)\`, \`--dataset.type=random\` for ACT/Diffusion, built-in voxel scenes for the VAE, \`--num_workers=0 --save_checkpoint=false\`."
    echo "- **Command**: \`$VP_COMMAND\`; $( [ -n "${STEPS:-}" ] && echo "STEPS=$STEPS" || { [ "$mode" = cuda ] && echo "8 steps" || echo "5 steps"; }) per run, each run its own process, the two sides of a row back to back."
    echo "- **Fixture check** (PyTorch VAE port vs the reference's outputs, \`fixture_check.txt\`): $(tail -1 "$out/fixture_check.txt" 2>/dev/null || echo 'not run')."
    [ -s "$out/parity.txt" ] && echo "- **vramlab parity on this device** (\`predict\` on the fixtures, \`parity.txt\`): $(grep '^=> ' "$out/parity.txt" | sed 's/^=> //' | tr '\n' ';' | sed 's/;$//; s/;/; /g')."
    [ -s "$out/kernel_tests.txt" ] && echo "- **#[cube] kernel tests on this device** (\`benches/gpu_kernel_tests.sh\`, \`kernel_tests.txt\`): $(grep '^=> ' "$out/kernel_tests.txt" | sed 's/^=> //' | tr '\n' ';' | sed 's/;$//; s/;/; /g')."
    [ -n "${VP_HEADER_NOTE:-}" ] && echo "- **Note**: $VP_HEADER_NOTE."
    [ -n "${BUDGET_S:-}" ] && echo "- **Budget**: BUDGET_S=$BUDGET_S s for the whole run; rows that did not fit are listed as not run."
    echo
    echo "Ratio of fastest steps = vramlab's fastest timed step / PyTorch's: less sensitive to other jobs than the medians."
    echo
    echo "One train step = forward + loss + backward + clip_grad_norm_ + optimizer step (lerobot 0.4.4's presets for ACT/Diffusion; AdamW as \`configs/vae3d_ultra.toml\` for the VAE) on random inputs of the row's shapes; benches/torch/baseline.py's docstring has the details. ms/step = median of steps 3..N; ratios are vramlab / PyTorch (below 1: vramlab faster or smaller)."
    if [ "$mode" = cuda ]; then
      echo "PyTorch CUDA settings: $( [ "${VP_TORCH_LEROBOT_FLAGS:-0}" = 1 ] && echo "lerobot-train's (cudnn.benchmark, TF32 matmuls)" || echo "PyTorch's defaults (no TF32 matmuls, cudnn.benchmark off; VP_TORCH_LEROBOT_FLAGS=1 sets lerobot-train's)")."
      echo "PyTorch memory: \`torch.cuda.max_memory_allocated\` / \`max_memory_reserved\` after \`reset_peak_memory_stats()\` at the start of step 3. vramlab: allocated = \`peak_step_bytes\` sampled at the trainer's probe points (a lower bound), reserved = CubeCL's pool, both max over steps 3..N. Step 1 cold = vramlab with a fresh empty \`--kernel_cache_dir\`; warm = a second process on the same cache. vramlab's cold process counts kernels (CubeCL's profiling logger formats a line per launch on the training thread: launches and compilations in its metrics.jsonl); the warm process runs the same steps with \`VRAMLAB_KERNEL_ACCOUNTING=off\`: **time ratio** is its median step (steps 3..N) over PyTorch's, as PyTorch counts nothing; \"counted\" is the cold process's. PyTorch's step 1 is the first step of its process (no persistent kernel cache)."
    else
      echo "On a CPU PyTorch's allocator is not instrumented: its memory is the process **peak RSS** (\`getrusage\` ru_maxrss: the interpreter, torch's libraries and allocator caching included), a bound, not comparable to vramlab's exact allocated peak, so the allocated ratio is n/a. vramlab's RSS is sampled at its probe points (\`peak_reserved_bytes\` on flex). The RSS ratio is therefore rough; vramlab's exact allocated peak (counting allocator) is listed for reference."
      echo
      echo "**This machine is shared** with other jobs (builds, tests): absolute times are noise, only the same-run ratios mean something, and even those move run to run."
    fi
  } >"$file"
}

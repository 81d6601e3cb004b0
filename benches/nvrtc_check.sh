#!/usr/bin/env bash
# NVRTC check without a GPU (issue 24): are the kernels vramlab launches on CubeCL valid CUDA?
#
# A GPU is lent to a few sessions only, for 15 minutes; a kernel that NVRTC rejects would cost
# such a run every row. Here every kernel that wgpu (Mesa lavapipe) compiles while the `#[cube]`
# kernel tests and the three kernel-accounting rows run is also lowered to CUDA C++ by CubeCL's
# own CUDA code generator (cubecl-cpp, the options cubecl-cuda gives an sm_90 device), then
# compiled by NVRTC as cubecl-cuda does it (`--gpu-architecture=sm_90a`, the CUDA headers), with
# ptxas's report (registers, spills) and cubecl-cuda's launch checks (cube size, shared memory).
#
#   bash benches/nvrtc_check.sh                 # the kernel tests and the vae, act, dif rows, in f32 and f16
#   ROWS="vae" TESTS=0 bash benches/nvrtc_check.sh
#   HALF_ROWS= bash benches/nvrtc_check.sh      # the rows in f32 only (HALF_ROWS defaults to ROWS)
#   NVRTC_ROOT=/usr/local/cuda bash benches/nvrtc_check.sh   # a CUDA toolkit instead of the wheels
#   ROWS= NVRTC_TARGET_DIR=target/wgpu NVRTC_OFFLINE_OK=1 TESTS_REQUIRED=1 bash benches/nvrtc_check.sh   # CI
#
# How: scratch copies of cubecl-runtime and cubecl-wgpu (from cargo's registry, the versions in
# Cargo.lock) get a hook (`benches/nvrtc/patch.py`: `KernelTask::compile` hands a fresh definition
# of each kernel to `benches/nvrtc/cuda_dump.rs`), and vramlab is built against them with
# `cargo --config patch…` into $NVRTC_WORK (default target/nvrtc; the Cargo.lock entries cargo
# adds for the patch are undone on exit). NVRTC and the headers: NVRTC_ROOT (lib/libnvrtc.so.*, include/), else the
# nvidia-cuda-nvrtc, -runtime and -cccl wheels ($CUDA_WHEELS, default 13.0.*, the CUDA of the
# H100 run) fetched with pip (NVRTC_OFFLINE_OK=1: without them, say so, still build and run the
# tests, and skip only NVRTC). TESTS_REQUIRED=1: the kernel tests must pass on lavapipe (exit
# status 4 otherwise, their failures printed), so CI runs them here once. The build goes
# to NVRTC_TARGET_DIR (default $NVRTC_WORK/target; another build's target folder shares the
# dependencies CubeCL does not touch). Writes $OUT_DIR (default benches/results/kernels/nvrtc)/report.md
# and report.jsonl; exit status 1 when a source fails, 4 when TESTS_REQUIRED=1 and a test failed.
#
# What it cannot see: the IR is the one lavapipe's properties give (line sizes, no matrix units),
# so the kernels a GPU runs on its matrix units (cubek's tensor-core matmuls and convolutions,
# Burn's and cubek's code) are not in it. lavapipe has no bf16: f16 is seen, through the tests
# and the rows run again with --precision=f16 (dumps `<row>_f16`), and those f16 kernels are
# checked again as bf16 (dumps `tests_bf16`, `<row>_bf16`: the IR with each f16 made bf16,
# `benches/nvrtc/cuda_dump.rs`), what cubecl-cpp writes for a bf16 run of the same kernels at
# lavapipe's line sizes. NVRTC's compile times here are this machine's, one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${NVRTC_WORK:-$root/target/nvrtc}
out=${OUT_DIR:-$root/benches/results/kernels/nvrtc}
read -r -a rows <<<"${ROWS-vae act dif}"
read -r -a half_rows <<<"${HALF_ROWS-${rows[*]}}"
log() { echo "[nvrtc_check $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "$2"; exit "$1"; }
mkdir -p "$work" "$out"
# cargo records a [patch] in Cargo.lock: the repository's copy is put back on exit.
cp Cargo.lock "$work/Cargo.lock.orig"
trap 'cp "$work/Cargo.lock.orig" "$root/Cargo.lock"' EXIT

version=$(awk '/^name = "cubecl-runtime"$/ { getline; gsub(/[^0-9.]/, ""); print }' Cargo.lock)
[ -n "$version" ] || die 2 "Cargo.lock names no cubecl-runtime"
registry=""
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/; do
  [ -d "$d/cubecl-runtime-$version" ] && [ -d "$d/cubecl-wgpu-$version" ] && [ -d "$d/cubecl-cpp-$version" ] && registry=$d
done
[ -n "$registry" ] || die 2 "cubecl-runtime, -wgpu and -cpp $version are not in cargo's registry: run \`cargo fetch\` first"

[ "${TESTS_REQUIRED:-0}" != 1 ] || [ "${TESTS:-1}" != 0 ] || die 2 "TESTS_REQUIRED=1 with TESTS=0: no kernel tests to require"

# 1. NVRTC and the CUDA headers.
cuda=${NVRTC_ROOT:-$work/cuda/nvidia/cu13}
nvrtc=1
if ! compgen -G "$cuda/lib/libnvrtc.so.*" >/dev/null; then
  [ -z "${NVRTC_ROOT:-}" ] || die 2 "NVRTC_ROOT=$NVRTC_ROOT: no lib/libnvrtc.so.* there"
  wheels=${CUDA_WHEELS:-13.0.*}
  log "NVRTC and the CUDA headers: pip wheels nvidia-cuda-{nvrtc,runtime,cccl}==$wheels into $work/cuda"
  rm -rf "$work/wheels" "$work/cuda"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$work/wheels" \
    "nvidia-cuda-nvrtc==$wheels" "nvidia-cuda-runtime==$wheels" "nvidia-cuda-cccl==$wheels" \
    || { [ "${NVRTC_OFFLINE_OK:-0}" = 1 ] || die 2 "pip could not fetch the NVRTC wheels (offline?): set NVRTC_ROOT to a CUDA toolkit (lib/libnvrtc.so.*, include/)"
         log "NVRTC skipped: pip could not fetch the NVRTC wheels (offline?) and NVRTC_OFFLINE_OK=1; the kernels still run on lavapipe"
         nvrtc=0; }
  if [ "$nvrtc" = 1 ]; then
    for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/cuda"; done
    compgen -G "$cuda/lib/libnvrtc.so.*" >/dev/null || die 2 "the wheels did not give $cuda/lib/libnvrtc.so.*"
  fi
fi

# 2. The patched copies, 3. vramlab built against them.
python3 benches/nvrtc/patch.py "$registry" "$version" "$work/patch" >&2
target=${NVRTC_TARGET_DIR:-$work/target}
cargo_patched() {
  CARGO_TARGET_DIR=$target cargo \
    --config "patch.crates-io.cubecl-runtime.path=\"$work/patch/cubecl-runtime\"" \
    --config "patch.crates-io.cubecl-wgpu.path=\"$work/patch/cubecl-wgpu\"" "$@"
}
tests=()
if [ "${TESTS:-1}" != 0 ]; then
  log "building the #[cube] kernel tests for wgpu against the patched CubeCL ($target)"
  mapfile -t tests < <(cargo_patched test --release --no-run --lib -p vramlab-models -p vramlab-train \
    --features vramlab-models/wgpu,vramlab-models/autotune,vramlab-train/wgpu --message-format=json \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("vramlab_models", "vramlab_train"):
        print(m["executable"])')
  [ "${#tests[@]}" = 2 ] || die 3 "the test build did not give the two test binaries"
fi
if [ "${#rows[@]}" -gt 0 ] || [ "${#half_rows[@]}" -gt 0 ]; then
  log "building vramlab (wgpu) against the patched CubeCL"
  cargo_patched build --release --no-default-features --features wgpu >&2 || die 3 "cargo build failed"
fi

# 4. Run them, every kernel lowered to CUDA C++ into $work/dump/<name>.
export VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}
rm -rf "$work/dump"
dumps=()
notes=()
tests_failed=0
if [ "${#tests[@]}" -gt 0 ]; then
  log "kernel tests (cube_tests) with every kernel lowered to CUDA C++"
  results=""
  for t in "${tests[@]}"; do
    b=$(basename "$t")
    VRAMLAB_CUDA_DUMP=$work/dump/tests VRAMLAB_CUDA_DUMP_BF16=$work/dump/tests_bf16 "$t" cube_tests >"$work/tests_$b.log" 2>&1 || tests_failed=1
    # A binary that ran no test counts as failed: the filter would otherwise pass on nothing.
    grep -q "test result: ok. [1-9]" "$work/tests_$b.log" || tests_failed=1
    results+="${b%%-*} $(grep -ho '[0-9]* passed; [0-9]* failed' "$work/tests_$b.log" | tail -1 || true); "
  done
  dumps+=("tests=$work/dump/tests" "tests_bf16=$work/dump/tests_bf16")
  notes+=("tests: \`cube_tests\` on lavapipe (${results%; })" "tests_bf16: the tests' kernels with f16 in them, every f16 made bf16 in the IR (\`benches/nvrtc/cuda_dump.rs\`)")
  log "kernel tests: ${results%; }"
  if [ "$tests_failed" = 1 ]; then
    log "some kernel tests failed (or a binary ran none) on lavapipe (logs: $work/tests_*.log); their kernels are checked anyway"
    if [ "${TESTS_REQUIRED:-0}" = 1 ]; then
      for t in "${tests[@]}"; do sed -n '/^failures:/,$p' "$work/tests_$(basename "$t").log" | head -120 >&2; done
    fi
  fi
fi
# shellcheck source=kernel_rows.sh
source benches/kernel_rows.sh
# run_row ROW PRECISION DUMP [BF16_DUMP]: the row's 2 training steps with every kernel lowered to
# CUDA C++ into $work/dump/DUMP and, with BF16_DUMP, each kernel with f16 in it also retyped to
# bf16 into $work/dump/BF16_DUMP. Sets row_rc (the run's exit status) and row_args (its arguments).
run_row() {
  local r=$1 precision=$2 dump=$3 bf16=${4:-}
  declare -p "$r" >/dev/null 2>&1 || die 2 "unknown row $r (vae, act, dif)"
  local -n args=$r
  log "row $dump: 2 training steps in $precision, every kernel lowered to CUDA C++${bf16:+, the half ones also as bf16}"
  rm -rf "$work/run_$dump"
  row_rc=0
  row_args="${args[*]}"
  env VRAMLAB_CUDA_DUMP="$work/dump/$dump" ${bf16:+VRAMLAB_CUDA_DUMP_BF16="$work/dump/$bf16"} timeout "${ROW_TIMEOUT_S:-1200}" \
    "$target/release/vramlab" train --backend=wgpu --precision="$precision" --steps=2 --save_checkpoint=false \
    --kernel_cache_dir="$work/run_$dump/kernel_cache" "${args[@]}" --output_dir="$work/run_$dump/out" \
    >"$work/row_$dump.log" 2>&1 || row_rc=$?
  dumps+=("$dump=$work/dump/$dump")
  [ -z "$bf16" ] || dumps+=("$bf16=$work/dump/$bf16")
}
for r in "${rows[@]}"; do
  run_row "$r" f32 "$r"
  notes+=("$r: \`vramlab train --backend=wgpu --precision=f32 --steps=2 $row_args\` (exit $row_rc)")
done
# The same rows in f16, each kernel with f16 in it also retyped to bf16: the half-precision
# training kernels as a --precision=bf16 run on a GPU would compile them, at lavapipe's line sizes.
for r in "${half_rows[@]}"; do
  run_row "$r" f16 "${r}_f16" "${r}_bf16"
  notes+=("${r}_f16: the $r row with \`--precision=f16\` (exit $row_rc)" "${r}_bf16: that run's kernels with f16 in them, every f16 made bf16 in the IR")
done

# 5. NVRTC.
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1 || true)
header="- **Machine**: $cpu × $(nproc), no GPU; wgpu over Mesa lavapipe; $(date -u '+%Y-%m-%d %H:%M') UTC; HEAD $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' + uncommitted crates/').
- **Command**: \`$(for v in ROWS HALF_ROWS TESTS NVRTC_ROOT CUDA_WHEELS; do [ -n "${!v+x}" ] && printf '%s=%q ' "$v" "${!v}"; done)bash benches/nvrtc_check.sh\`; CubeCL $version.
- **Dumps**: $(printf '%s; ' "${notes[@]}")
- **Not covered**: the IR is what lavapipe's properties give (line sizes; no matrix units, so not the tensor-core matmuls and convolutions a GPU takes, which are cubek's; \`matmul_entry\` here is lavapipe's unit matmul, whose blocks a GPU never runs); bf16 only as f16 kernels retyped, the tests' and the f16 rows' (lavapipe has none: a bf16 run's own line sizes, and any kernel only bf16 takes, are not seen). NVRTC times are this machine's, one thread."
status=0
if [ "$nvrtc" = 1 ]; then
  log "NVRTC on $(printf '%s ' "${dumps[@]}")"
  LD_LIBRARY_PATH=$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} python3 benches/nvrtc/check.py --cuda "$cuda" \
    --out "$out/report.md" --header "$header" "${dumps[@]}" || status=$?
else
  printf '# NVRTC check\n\n%s\n\nNVRTC skipped: the wheels could not be fetched (NVRTC_OFFLINE_OK=1).\n' "$header" >"$out/report.md"
fi
[ "$status" = 0 ] || exit "$status"
if [ "${TESTS_REQUIRED:-0}" = 1 ] && [ "$tests_failed" = 1 ]; then
  log "TESTS_REQUIRED=1: kernel tests failed or ran none on lavapipe"
  exit 4
fi

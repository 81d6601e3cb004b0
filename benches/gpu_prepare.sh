#!/usr/bin/env bash
# Everything a short GPU session carries to the device machine, prepared here (it has no network
# and ../shared does not travel): a stripped release build with CUDA, the vae3d_ultra parity
# fixture, lerobot 0.4.4's pure-Python wheels. Then one call runs benches/gpu_vs_pytorch.sh
# under a budget; the command is printed at the end.
#
#   bash benches/gpu_prepare.sh [DIR]       # default DIR: .gpu (git-ignored); all four builds ~70 min
#                                           # on 2 cores (the main one alone ~7 min incremental);
#                                           # a DIR built from the same crates/ and Cargo files
#                                           # is reused as it is (REUSE=0 rebuilds)
#   SKIP_BUILD=1 bash benches/gpu_prepare.sh   # reuse target/cuda/release/vramlab
#   UNTUNED=0 bash benches/gpu_prepare.sh       # without the autotune-off build (vramlab-untuned.xz,
#                                               # ~1/5 of the binary's size; built first: a second
#                                               # build of the burn crates and ours, minutes more)
#   TESTS=0 bash benches/gpu_prepare.sh         # without the #[cube] kernel tests built for cuda
#                                               # (tests/*.xz: the models and train crates' lib test
#                                               # binaries, run by benches/gpu_kernel_tests.sh;
#                                               # their own target dir, target/cuda-tests; left out
#                                               # first if over the carry limit)
#   FUSION=0 bash benches/gpu_prepare.sh        # without the `cuda,fusion` build (vramlab-fusion.xz:
#                                               # Burn's fusion + our #[cube] kernels as custom ops;
#                                               # built before the main one, a third build; carried
#                                               # only if everything fits the carry limit with it)
#
# The device tool carries at most 64 MiB: the binary (~30–40 MiB stripped, carried xz-compressed), the VAE fixture
# (3.3 MiB) and the wheels (~10 MiB) fit; act_small (44 MiB) and diffusion_small (61 MiB) do not,
# so their parity is recorded as skipped unless FIXTURES names them and they fit.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
limit_mib=${CARRY_LIMIT_MIB:-64}
untuned=${UNTUNED:-1}
fusion=${FUSION:-1}
tests=${TESTS:-1}
# A folder this script filled earlier from the same source is kept as it is (REUSE=0 rebuilds):
# its builds are of the commit its built_from.txt names, with nothing uncommitted under crates/,
# Cargo.toml or Cargo.lock then or now, and those paths unchanged since. A session that is lent
# a GPU then starts its run at once instead of after the builds (about an hour on 2 cores).
built_source_unchanged() {
  local stamp=$1/built_from.txt commit
  [ -f "$stamp" ] && [ -f "$1/vramlab.xz" ] || return 1
  commit=$(head -1 "$stamp")
  [ "$(wc -l <"$stamp")" -eq 1 ] || return 1
  git cat-file -e "$commit^{commit}" 2>/dev/null || return 1
  git diff --quiet "$commit" -- crates Cargo.toml Cargo.lock || return 1
  [ -z "$(git status --porcelain -- crates Cargo.toml Cargo.lock)" ]
}
if [ "${REUSE:-1}" = 1 ] && built_source_unchanged "$dir"; then
  echo "gpu_prepare: reusing $dir, built from $(head -1 "$dir/built_from.txt" | cut -c1-10) (crates/, Cargo.toml and Cargo.lock unchanged since; REUSE=0 rebuilds): $(cd "$dir" && ls -d -- * | tr '\n' ' ')"
  reused=1
else
  reused=0
fi
if [ "$reused" = 0 ]; then
rm -rf "$dir"
mkdir -p "$dir/oracle" "$dir/wheels"
if [ "$tests" = 1 ] && [ "${SKIP_BUILD:-0}" != 1 ]; then
  # The lib tests (with flex, which the tests compare against, and autotune, for the short
  # convolution search); cube_tests picks CUDA when built without wgpu. Dev-dependencies change
  # Burn's features, hence a target dir of its own.
  mkdir -p "$dir/tests"
  CARGO_TARGET_DIR=target/cuda-tests cargo test --release --no-run --lib -p vramlab-models -p vramlab-train \
    --features vramlab-models/cuda,vramlab-models/autotune,vramlab-train/cuda --message-format=json \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line) if line.startswith("{") else {}
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["target"]["name"], m["executable"])' >"$dir/tests/list.txt"
  while read -r crate exe; do
    strip -o "$dir/tests/$crate" "$exe"
    xz -T0 -6 "$dir/tests/$crate"
  done <"$dir/tests/list.txt"
  rm "$dir/tests/list.txt"
  [ -n "$(ls "$dir/tests")" ] || { echo "gpu_prepare: no test binary built" >&2; exit 2; }
fi
if [ "$untuned" = 1 ] && [ "${SKIP_BUILD:-0}" != 1 ]; then
  # Built first, so that target/cuda/release/vramlab is the autotuned one afterwards.
  CARGO_TARGET_DIR=target/cuda cargo build --release --no-default-features --features cuda-untuned
  strip -o "$dir/vramlab-untuned" target/cuda/release/vramlab
  xz -T0 -6 "$dir/vramlab-untuned"
fi
if [ "$fusion" = 1 ] && [ "${SKIP_BUILD:-0}" != 1 ]; then
  # Its own target dir: Burn's crates with `fusion` differ from the main build's.
  CARGO_TARGET_DIR=target/cuda-fusion cargo build --release --no-default-features --features cuda,fusion
  strip -o "$dir/vramlab-fusion" target/cuda-fusion/release/vramlab
  xz -T0 -6 "$dir/vramlab-fusion"
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CARGO_TARGET_DIR=target/cuda cargo build --release --no-default-features --features cuda
fi
[ -x target/cuda/release/vramlab ] || { echo "gpu_prepare: target/cuda/release/vramlab missing (build failed?)" >&2; exit 2; }
strip -o "$dir/vramlab" target/cuda/release/vramlab
# Compressed like the other builds (about a fifth of its size): benches/lib_vs_pytorch.sh unpacks it.
xz -T0 -6 "$dir/vramlab"
for f in ${FIXTURES:-vae3d_ultra}; do
  [ -d "../shared/oracle/$f" ] || { echo "gpu_prepare: ../shared/oracle/$f missing" >&2; exit 2; }
  cp -r "../shared/oracle/$f" "$dir/oracle/"
done
# The GPU image has torch, torchvision and most of lerobot's needs; these are the rest
# (../shared/baselines/wheels.txt), for the image's python (PYTHON_VERSION, default 3.12).
# shellcheck disable=SC1091
source benches/lib_vs_pytorch.sh
# shellcheck disable=SC2086
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
  -d "$dir/wheels" $VP_LEROBOT_WHEELS \
  || echo "gpu_prepare: pip download failed: the run needs lerobot importable on the device (WHEELS_DIR)" >&2
# Which source the builds are of, so a later session can tell whether they are stale.
{ git rev-parse HEAD; git status --porcelain -- crates Cargo.toml Cargo.lock
  [ "${SKIP_BUILD:-0}" != 1 ] || echo "SKIP_BUILD=1: target/cuda/release/vramlab as it was, of whatever source"; } >"$dir/built_from.txt"
[ -d "$dir/tests" ] && cp "$dir/built_from.txt" "$dir/tests/"
fi
size=$(du -sm "$dir" | cut -f1)
if [ "$size" -gt "$limit_mib" ] && [ -d "$dir/tests" ]; then
  # The kernel tests leave first: the rows, parity and the other builds come before them.
  echo "gpu_prepare: ${size} MiB with the kernel tests ($(du -sm "$dir/tests" | cut -f1) MiB) is over the carry limit: left out" >&2
  rm -rf "$dir/tests"
  size=$(du -sm "$dir" | cut -f1)
fi
if [ "$size" -gt "$limit_mib" ] && [ -f "$dir/vramlab-fusion.xz" ]; then
  # The fusion build is the first thing to leave: the main rows, parity and autotune-off come first.
  echo "gpu_prepare: ${size} MiB with vramlab-fusion.xz ($(du -sm "$dir/vramlab-fusion.xz" | cut -f1) MiB) is over the carry limit: left out" >&2
  rm -f "$dir/vramlab-fusion.xz"
  size=$(du -sm "$dir" | cut -f1)
fi
echo "gpu_prepare: $dir is ${size} MiB (carry limit ${limit_mib} MiB)"
[ "$size" -le "$limit_mib" ] || { echo "gpu_prepare: over the carry limit: drop fixtures (FIXTURES=vae3d_ultra) or the autotune-off build (UNTUNED=0)" >&2; exit 3; }
seed=benches/results/gpu_vs_pytorch/nvidia-h100-80gb-hbm3/autotune_seed
# The NVRTC check's report names the commit it ran on: did the #[cube] kernels change since?
nvrtc_report=benches/results/kernels/nvrtc/report.md
checked=$(grep -o 'HEAD [0-9a-f]\{7,\}' "$nvrtc_report" 2>/dev/null | head -1 | cut -d' ' -f2 || true)
kernels=(crates/models/src/nn/cube crates/models/src/nn/lean crates/train/src/optim_kernels)
if [ -z "$checked" ]; then
  echo "gpu_prepare: no NVRTC report ($nvrtc_report): \`bash benches/nvrtc_check.sh\` checks the kernels compile for CUDA without a GPU" >&2
elif ! git diff --quiet "$checked" -- "${kernels[@]}" 2>/dev/null; then
  echo "gpu_prepare: the #[cube] kernels changed since the NVRTC check ($checked, $nvrtc_report): run \`bash benches/nvrtc_check.sh\` (~25 min) before the GPU" >&2
else
  echo "gpu_prepare: NVRTC check: $(grep -o '[0-9]* of [0-9]* sources compile[^*]*' "$nvrtc_report" | head -1) (at $checked; kernels unchanged since)"
fi
cat <<CMD
Run on the device (carry: ["$dir"], timeout_s ≤ 540):
  BUDGET_S=420 RESULTS_COPY=\$OUT BIN=$dir/vramlab.xz FIXTURE_DIR=$dir/oracle WHEELS_DIR=$dir/wheels \\
    TORCH_PYTHON=python3 $( [ -f "$dir/vramlab-untuned.xz" ] && echo "BIN_UNTUNED=$dir/vramlab-untuned.xz " )$( [ -f "$dir/vramlab-fusion.xz" ] && echo "BIN_FUSION=$dir/vramlab-fusion.xz " )$( [ -d "$dir/tests" ] && echo "KERNEL_TESTS_DIR=$dir/tests " )bash benches/gpu_vs_pytorch.sh
$( [ -d "$dir/tests" ] && printf '%s\n%s' "The #[cube] kernel tests run after the first fusion row while KERNEL_TESTS_MIN_S (60 s) of the budget is" "left; else, at once in a second call while the machine is warm: KERNEL_TESTS_S=150 bash benches/gpu_kernel_tests.sh $dir/tests \$OUT" )
A second run that starts warm adds KERNEL_CACHE_SEED=<the first run's kernel_cache folder or
kernel_cache.tgz> (carry it too); the table then calls step 1 "seeded", not cold.
The committed $seed
(H100, 2026-11-27; filed by device index, device-0-0-cuda, so an H200 would load it too) holds
Burn's own searches: its convolution and matmul tuners, which today's defaults replace by
nn::cube::conv's short search and the fixed matmul kernel (cached under other names). It would
spare little of a step 1 and would cost the cold-start figure (issue 24: cold step 1 <= 2 min):
leave it out unless a row cannot finish otherwise.
CMD

#!/usr/bin/env bash
# The #[cube] kernels' tests on an NVIDIA GPU: the test binaries `benches/gpu_prepare.sh` builds
# with `cuda` (crates/models/src/nn/lean/cube_tests.rs: the lean nodes' kernels against Burn's
# composed ops and autodiff; crates/train/src/optim_kernels/cube_tests.rs: the AdamW update and
# the gradient norm), carried xz-compressed, run under a time limit. CI runs the same tests on
# lavapipe; on a GPU the kernels meet matrix units (TF32 products), warps and NVRTC, which no CI
# machine has. Writes DIR/kernel_tests.txt: per binary its exit status, seconds, the harness's
# result line and, for failures, what it printed.
#
#   bash benches/gpu_kernel_tests.sh TESTS_DIR OUT_DIR        # TESTS_DIR: *.xz (or plain) test binaries
#   KERNEL_TESTS_S=150 bash benches/gpu_kernel_tests.sh .gpu/tests $OUT
#
# KERNEL_TESTS_S (default 150) caps all binaries together; a binary stopped by it keeps the lines
# of the tests that finished ("timed out" in the summary). Tests run on all cores (NVRTC compiles
# in each test's thread). gpu_vs_pytorch.sh calls this after its rows when KERNEL_TESTS_DIR is set
# and its budget still has KERNEL_TESTS_MIN_S (default 60) left.
tests_dir=$(realpath "${1:?usage: gpu_kernel_tests.sh TESTS_DIR OUT_DIR}")
out_dir=$(realpath -m "${2:?usage: gpu_kernel_tests.sh TESTS_DIR OUT_DIR}")
# vp_unxz (the lib moves to the repository root, hence the absolute paths above); a failing test
# binary must not stop the script, so not -e.
source "$(dirname "$0")/lib_vs_pytorch.sh"
set +e
limit=${KERNEL_TESTS_S:-150}
mkdir -p "$out_dir"
report=$out_dir/kernel_tests.txt
work=$(mktemp -d)
t0=$(date +%s)
{
  echo "# #[cube] kernel tests on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'a machine without nvidia-smi') ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  [ -f "$tests_dir/built_from.txt" ] && echo "built from $(head -1 "$tests_dir/built_from.txt")"
} >"$report"
shopt -s nullglob
bins=("$tests_dir"/*)
ran=0
for packed in "${bins[@]}"; do
  name=$(basename "$packed" .xz)
  [ "$name" = built_from.txt ] && continue
  bin=$work/$name
  if [[ "$packed" == *.xz ]]; then
    vp_unxz "$packed" "$bin" || { echo "=> $name: cannot unpack $packed" >>"$report"; continue; }
  else
    bin=$packed
  fi
  left=$(( limit - ($(date +%s) - t0) ))
  if [ "$left" -lt 10 ]; then
    echo "=> $name: not run: KERNEL_TESTS_S=$limit spent" >>"$report"
    continue
  fi
  s=$(date +%s)
  # --show-output: what passing tests printed (the strided test's notes on Burn's own kernels).
  timeout "$left" "$bin" cube_tests --test-threads="$(nproc)" --show-output >"$work/$name.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - s ))
  ran=$((ran + 1))
  passed=$(grep -c ' \.\.\. ok$' "$work/$name.log")
  failed=$(grep -c ' \.\.\. FAILED$' "$work/$name.log")
  result=$(grep -m1 '^test result:' "$work/$name.log" || true)
  case $rc in
    0) verdict="passed" ;;
    124|137) verdict="timed out after ${took} s (KERNEL_TESTS_S=$limit)" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  {
    echo "=> $name: $verdict: $passed passed, $failed failed in ${took} s${result:+ ($result)}"
    grep ' \.\.\. FAILED$' "$work/$name.log" | sed 's/^/   /'
    echo "--- $name: output (last 12 kB)"
    tail -c 12000 "$work/$name.log"
    echo
  } >>"$report"
  echo "gpu_kernel_tests: $name: $verdict: $passed passed, $failed failed in ${took} s" >&2
done
[ "$ran" -gt 0 ] || { echo "=> no test binary ran (TESTS_DIR=$tests_dir)" >>"$report"; echo "gpu_kernel_tests: no test binary in $tests_dir" >&2; }
rm -rf "$work"

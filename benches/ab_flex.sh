#!/usr/bin/env bash
# Interleaved A/B of vramlab flex builds or ISA levels on one row of benches/torch/rows.py:
# vramlab only (no PyTorch), REPS rounds, each round one process per variant in turn, so a
# shared machine's drift hits every variant alike. Prints median and fastest step (steps 3..N,
# data wait excluded) and the exact allocated peak of each process.
#
#   bash benches/ab_flex.sh ROW STEPS REPS NAME=BIN[:SIMD] ...
#   bash benches/ab_flex.sh act_b8_240x320 6 2 old=/tmp/vramlab-old new=target/release/vramlab new-avx2=target/release/vramlab:avx2
#
# SIMD, when given, is VRAMLAB_SIMD for that variant (it caps vramlab's own kernels, not the GEMM).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { sed -n 2,10p "$0" >&2; exit 2; }
row=$1 steps=$2 reps=$3; shift 3
mapfile -t args < <(python3 benches/torch/report.py vramlab-args "$row")
scratch=${VP_SCRATCH:-target/ab_flex}
mkdir -p "$scratch"
for rep in $(seq "$reps"); do
  for v in "$@"; do
    name=${v%%=*} spec=${v#*=}
    bin=${spec%%:*} simd=""
    [ "$spec" != "$bin" ] && simd=${spec#*:}
    d="$scratch/$row-$name-$rep"
    rm -rf "$d"
    env ${simd:+VRAMLAB_SIMD=$simd} "$bin" train "${args[@]}" --backend=flex --save_checkpoint=false \
      --num_workers=0 --seed=1000 --steps="$steps" --output_dir="$d" >"$d.log" 2>&1 \
      || { echo "$name rep$rep: exit $? (log: $d.log)"; continue; }
    python3 - "$d/metrics.jsonl" "$name" "$rep" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = [r["step_time_s"] - r.get("data_wait_s", 0) for r in recs[2:]] or [recs[-1]["step_time_s"]]
print(f"{sys.argv[2]:<12} rep{sys.argv[3]}  median {statistics.median(t) * 1e3:9.1f} ms  fastest {min(t) * 1e3:9.1f} ms  "
      f"peak {max(r['peak_step_bytes'] for r in recs):,} B")
PY
  done
done

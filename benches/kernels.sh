#!/usr/bin/env bash
# Kernel accounting per row on a CubeCL backend (wgpu, cuda): kernel launches per step, kernels
# compiled in step 1, step 1 cold (empty kernel/autotune cache) and warm (a second process on the
# same cache), the steady step, peak reserved. One row per (variant, config); a variant is a
# build or a setting (`VARIANT=main`, `VARIANT=fusion`, `VARIANT=autotune-off` …). Rows of earlier
# runs with other variants are kept, so variants run one after another land in one table.
# Writes benches/results/kernels/<backend>/{raw.jsonl,table.md}.
#
#   VARIANT=main BIN=target/wgpu/release/vramlab bash benches/kernels.sh [ROW...]
#   VARIANT=fusion BIN=target/wgpu-fusion/release/vramlab bash benches/kernels.sh vae
#   VARIANT=autotune-minimal EXTRA="--autotune=minimal" bash benches/kernels.sh vae
#   VARIANT=autotune-off BIN=target/wgpu/release/vramlab bash benches/kernels.sh vae   # built with
#     `--features wgpu-untuned` (Burn's autotune compiled out: each op's default kernel)
#
# ROWs: vae (VAE ultra b2 8×32×32), act (ACT b8, 1 camera 96×96, chunk 100), diffusion
# (Diffusion b8, 96×96 crop 84); default all three, in that order; `table` only rewrites table.md. BACKEND (default wgpu),
# STEPS per cold run (default 4: step 1 + three steady steps), ROW_TIMEOUT_S per process
# (default 900), BUDGET_S for the whole script (default 2400): a row that would start after the
# budget is spent is written to the table as not run, and a process stopped by ROW_TIMEOUT_S as
# timed out with the steps it finished. NOT_RUN="why" records the given rows as not run, with
# that reason. NOTE="…" adds a note to the rows run; each row notes the load average at its start
# and end. On wgpu set VK_ICD_FILENAMES for lavapipe (CI's machine).
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${BACKEND:-wgpu}
variant=${VARIANT:-main}
steps=${STEPS:-4}
row_timeout=${ROW_TIMEOUT_S:-900}
budget=${BUDGET_S:-2400}
bin=${BIN:-target/$backend/release/vramlab}
extra=(${EXTRA:-})
out=benches/results/kernels/$backend
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
t_start=$(date +%s)

. benches/kernel_rows.sh   # act, dif, vae: the rows' arguments
declare -A label=([vae]="VAE ultra b2 8×32×32" [act]="ACT b8, 1 cam 96×96, chunk 100" [diffusion]="Diffusion b8 96×96 crop 84")
rows=("$@")
[ "${#rows[@]}" -gt 0 ] || rows=(vae act diffusion)
[ "${rows[0]}" != table ] || rows=()   # `kernels.sh table`: rewrite table.md from raw.jsonl only
if [ "${#rows[@]}" -gt 0 ] && [ -z "${NOT_RUN:-}" ] && [ ! -x "$bin" ]; then
  CARGO_TARGET_DIR=target/$backend cargo build --release --no-default-features --features "$backend"
  bin=target/$backend/release/vramlab
fi

# One process: `run NAME STEPS CACHE_DIR ARGS…` → $scratch/NAME/{metrics.jsonl,status}.
run() {
  local name=$1 n=$2 cache=$3; shift 3
  local d="$scratch/$name"
  rm -rf "$d"
  mkdir -p "$d"
  local t0 rc=0
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$row_timeout" "$bin" train --backend="$backend" --precision=f32 --steps="$n" --save_checkpoint=false \
    --kernel_cache_dir="$cache" "$@" "${extra[@]}" --output_dir="$d/run" >"$d/stdout" 2>"$d/stderr" || rc=$?
  echo "$rc $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }')" >"$d/status"
  [ -f "$d/run/metrics.jsonl" ] && cp "$d/run/metrics.jsonl" "$d/metrics.jsonl" || : >"$d/metrics.jsonl"
  echo "  $name: exit $rc, $(wc -l <"$d/metrics.jsonl") steps, $(cut -d' ' -f2 "$d/status" | cut -c1-6) s" >&2
  [ "$rc" -eq 0 ] || tail -3 "$d/stderr" >&2
}

for row in ${rows[@]+"${rows[@]}"}; do
  case $row in vae) args=("${vae[@]}") ;; act) args=("${act[@]}") ;; diffusion) args=("${dif[@]}") ;;
    *) echo "kernels.sh: unknown row '$row' (vae, act, diffusion)" >&2; exit 2 ;; esac
  elapsed=$(( $(date +%s) - t_start ))
  cache="$scratch/kcache-$row"
  rm -rf "$cache"
  note="not run: the script's budget (BUDGET_S=$budget s) was spent before this row"
  [ -z "${NOT_RUN:-}" ] || note="not run: $NOT_RUN"
  if [ "$elapsed" -ge "$budget" ] || [ -n "${NOT_RUN:-}" ]; then
    echo "== $row: $note" >&2
    python3 - "$out/raw.jsonl" "$variant" "$row" "${label[$row]}" "$note" <<'EOF'
import json, sys
path, variant, row, label, note = sys.argv[1:6]
lines = [l for l in open(path)] if __import__("os").path.exists(path) else []
keep = [l for l in lines if not (json.loads(l)["variant"] == variant and json.loads(l)["row"] == row)]
keep.append(json.dumps({"variant": variant, "row": row, "label": label, "note": note}) + "\n")
open(path, "w").writelines(keep)
EOF
    continue
  fi
  echo "== $row ($variant): ${args[*]} ${extra[*]}" >&2
  export ROW_LOAD0; ROW_LOAD0=$(cut -d' ' -f1 /proc/loadavg)
  run "$row-cold" "$steps" "$cache" "${args[@]}"
  # The warm process: the same kernel/autotune cache, step 1 only matters.
  if [ -s "$scratch/$row-cold/metrics.jsonl" ]; then run "$row-warm" 1 "$cache" "${args[@]}"; else mkdir -p "$scratch/$row-warm"; : >"$scratch/$row-warm/metrics.jsonl"; echo "1 0" >"$scratch/$row-warm/status"; fi
  python3 - "$out/raw.jsonl" "$variant" "$row" "${label[$row]}" "$scratch/$row-cold" "$scratch/$row-warm" "$row_timeout" "$bin ${args[*]} ${extra[*]}" <<'EOF'
import json, os, statistics, sys
path, variant, row, label, cold, warm, timeout, command = sys.argv[1:9]
def load(d):
    rc, secs = open(os.path.join(d, "status")).read().split()
    recs = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
    return int(rc), float(secs), recs
rc, secs, recs = load(cold)
wrc, wsecs, wrecs = load(warm)
r = {"variant": variant, "row": row, "label": label, "command": command, "steps": len(recs), "process_s": round(secs, 2)}
notes = []
if rc in (124, 137):
    notes.append(f"cold process stopped at ROW_TIMEOUT_S={timeout} s after {len(recs)} step(s)")
elif rc != 0:
    notes.append(f"cold process failed (exit {rc})")
if recs:
    s1 = recs[0]
    r["step1_cold_s"] = s1["step_time_s"]
    r["compiled_step1"] = s1.get("kernels_compiled")
    r["launches_step1"] = s1.get("kernel_launches")
    r["autotune_step1_s"] = s1.get("autotune_s")
    r["autotune_searches_step1"] = s1.get("autotune_searches")
    steady = recs[1:]
    if steady:
        r["steady_step_s"] = statistics.median(x["step_time_s"] for x in steady)
        ls = [x["kernel_launches"] for x in steady if x.get("kernel_launches") is not None]
        r["launches_per_step"] = statistics.median(ls) if ls else None
        r["compiled_after_step1"] = sum(x.get("kernels_compiled") or 0 for x in steady)
        # VRAMLAB_KERNEL_ACCOUNTING=time: each kernel timed alone (slower steps); where the
        # steady steps' kernel time goes, mean seconds a step by kernel (each step's top 20).
        timed = [x for x in steady if x.get("kernel_time_s") is not None]
        if timed:
            r["kernel_time_s"] = statistics.median(x["kernel_time_s"] for x in timed)
            by = {}
            for x in timed:
                for name, t in x.get("top_kernel_time", []):
                    by[name] = by.get(name, 0.0) + t / len(timed)
            r["top_kernel_time"] = sorted(([k, round(v, 6)] for k, v in by.items()), key=lambda kv: -kv[1])[:10]
    r["peak_reserved_bytes"] = max(x["peak_reserved_bytes"] for x in recs)
if wrecs:
    r["step1_warm_s"] = wrecs[0]["step_time_s"]
    r["compiled_step1_warm"] = wrecs[0].get("kernels_compiled")
    r["autotune_step1_warm_s"] = wrecs[0].get("autotune_s")
elif recs:
    notes.append("warm process " + ("stopped at the timeout" if wrc in (124, 137) else f"failed (exit {wrc})"))
load0 = os.environ.get("ROW_LOAD0")
notes.append(f"1-min load average {load0} at the row's start, {os.getloadavg()[0]:.1f} at its end ({os.cpu_count()} CPUs)")
if os.environ.get("NOTE"):
    notes.append(os.environ["NOTE"])
r["note"] = "; ".join(notes)
lines = [l for l in open(path)] if os.path.exists(path) else []
keep = [l for l in lines if not (json.loads(l)["variant"] == variant and json.loads(l)["row"] == row)]
keep.append(json.dumps(r) + "\n")
open(path, "w").writelines(keep)
EOF
done

# The table: rows in config order, variants in the order they were first written.
python3 - "$out/raw.jsonl" "$out/table.md" "$backend" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') × $(nproc)" \
  "$(git rev-parse --short HEAD 2>/dev/null)$([ -z "$(git status --porcelain -- crates 2>/dev/null)" ] || echo ' + uncommitted crates/')" <<'EOF'
import json, sys
path, table, backend, machine, rev = sys.argv[1:6]
recs = [json.loads(l) for l in open(path) if l.strip()]
order = {"vae": 0, "act": 1, "diffusion": 2}
variants = list(dict.fromkeys(r["variant"] for r in recs))
recs.sort(key=lambda r: (order.get(r["row"], 9), variants.index(r["variant"])))
def f(v, fmt):
    return "–" if v is None else fmt.format(v)
out = [f"# Kernels per step on {backend}: launches, compilations, cold and warm step 1",
       "",
       f"Machine: {machine}" + (" (wgpu over Mesa lavapipe, CPU Vulkan)" if backend == "wgpu" else "") + f"; tree {rev}.",
       "Written by `benches/kernels.sh` (raw lines: `raw.jsonl`, with each row's command). f32, random/procedural inputs.",
       "Launches and compilations are counted from CubeCL's log messages (`crates/probe/src/kernels.rs`):",
       "compilations and autotune searches exactly, launches exactly in total (a few can be counted in the",
       "neighbouring step). *step 1 cold*: a fresh process with an empty kernel/autotune cache; *warm*: a",
       "second process on that cache (wgpu has no WGSL kernel cache in CubeCL 0.10, so warm step 1 still compiles",
       "every kernel; CUDA reads PTX from it). *steady*: median of the steps after the first. Peak reserved:",
       "CubeCL's pools, exact.",
       "",
       "| config | variant | launches/step (steady) | launches step 1 | kernels compiled, step 1 | step 1 cold s | of it autotune s | step 1 warm s | steady step s | peak reserved MiB | note |",
       "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for r in recs:
    res = r.get("peak_reserved_bytes")
    note = r.get("note", "")
    if r.get("kernel_time_s") is not None:
        # Names without their runtime part, whose `|` would split the table's cell.
        name = lambda k: " ".join(p for p in k.split(" | ") if not p.endswith("Runtime")).replace("|", "/")
        top = ", ".join(f"{name(k)} {v * 1e3:.2f}" for k, v in r.get("top_kernel_time", []))
        note = (note + "; " if note else "") + f"kernels timed one by one: {r['kernel_time_s'] * 1e3:.1f} ms of kernel time a steady step; most, ms a step: {top}"
    out.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
        r["label"], r["variant"], f(r.get("launches_per_step"), "{:.0f}"), f(r.get("launches_step1"), "{}"),
        f(r.get("compiled_step1"), "{}"), f(r.get("step1_cold_s"), "{:.2f}"), f(r.get("autotune_step1_s"), "{:.2f}"),
        f(r.get("step1_warm_s"), "{:.2f}"), f(r.get("steady_step_s"), "{:.3f}"),
        f(None if res is None else res / 2**20, "{:.1f}"), note))
open(table, "w").write("\n".join(out) + "\n")
print("\n".join(out))
EOF

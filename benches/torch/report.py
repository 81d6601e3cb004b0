#!/usr/bin/env python3
"""The vramlab side and the report of the PyTorch-vs-vramlab benches (no torch needed).

    report.py vramlab-args ROW                      # vramlab train flags of a row, one per line
    report.py rows [SELECTION] [--tag cpu|gpu]      # row names (see rows.py)
    report.py autotune KERNEL_CACHE_DIR             # CubeCL autotune cache → markdown (tuners, winners)
    report.py autotune DIR --keys nn-cube-conv      # … and those tuners key by key, every candidate's time
    report.py vramlab-record ROW RUN_DIR --backend B --device D [--warm-dir DIR] [--rc N --log F] [--out F]
    report.py error-record ROW --backend B --rc N --log F [--why TEXT] [--device D] [--out F]
    report.py slug TEXT                             # a directory-name slug
    report.py torch-line PROBE_JSON                 # one line of versions from `baseline.py probe`
    report.py table RAW.jsonl --out table.md --title T [--header-file F]

vramlab's numbers come from its metrics.jsonl (one record per optimizer step): step time =
median of `step_time_s - data_wait_s` over steps 3..N (PyTorch's clock also starts after its
batch exists; the data wait is listed separately), step 1 = `step_time_s` of step 1, peaks =
max of `peak_step_bytes` / `peak_reserved_bytes` over steps 3..N (the window in which PyTorch's
peak statistics are reset). On flex, `peak_step_bytes` is exact (counting allocator) and
`peak_reserved_bytes` is the process RSS sampled at the trainer's probe points; on cuda the
allocated peak is sampled at probe points (a lower bound) and reserved is CubeCL's pool.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import re
import statistics
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rows as rowdefs  # noqa: E402

MIB = 2**20


def tail(path: Path | None, n: int = 12) -> str:
    if not path or not Path(path).exists():
        return ""
    lines = Path(path).read_text(errors="replace").splitlines()
    # Progress bars redraw with \r: keep what the terminal would show last.
    return "\n".join(l.rsplit("\r", 1)[-1] for l in lines[-n:]).strip()


def emit(rec: dict, out: Path | None):
    line = json.dumps(rec)
    print(line)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as f:
            f.write(line + "\n")


def read_metrics(run_dir: Path) -> list[dict]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()]


def compute_ms(timed: list[dict]) -> list[float]:
    """Each timed step's time less its data wait, ms (PyTorch's batch is made before its clock starts)."""
    return [1000 * (r["step_time_s"] - r.get("data_wait_s", 0.0)) for r in timed]


def vramlab_record(a) -> dict:
    row = rowdefs.ROWS[a.row]
    recs = read_metrics(a.run_dir)
    base = {"name": row.name, "label": row.title, "kind": row.kind, "backend": a.backend, "device": a.device,
            "vramlab": a.version, "batch": row.batch, "precision": row.precision, "ckpt": row.ckpt,
            "run_dir": str(a.run_dir), "flags": row.vramlab_args(),
            "loadavg_1min": [a.load_before, round(os.getloadavg()[0], 2)]}  # at start, at end
    if a.rc not in (None, 0) or not recs:
        why = a.why or ("timed out" if a.rc in (124, 137) else f"exit status {a.rc}")
        if not recs and a.rc in (None, 0):
            why = "no metrics.jsonl"
        elif a.rc in (124, 137):
            why += f"; {len(recs)} step(s) finished" if recs else "; step 1 had not finished"
        return {**base, "error": why, "steps_done": len(recs), "tail": tail(a.log)}
    timed = recs[2:] if len(recs) >= 3 else recs[-1:]
    compute = compute_ms(timed)
    rec = {
        **base,
        "steps": len(recs),
        "timed_steps": f"{recs.index(timed[0]) + 1}..{len(recs)}",
        "ms_step_median": statistics.median(compute),
        "ms_step_min": min(compute),
        "ms_step_wall_median": 1000 * statistics.median(r["step_time_s"] for r in timed),
        "ms_data_wait_median": 1000 * statistics.median(r.get("data_wait_s", 0.0) for r in timed),
        "step1_s": recs[0]["step_time_s"],
        "step_times_s": [round(r["step_time_s"], 6) for r in recs],
        "peak_allocated_bytes": max(r["peak_step_bytes"] for r in timed),
        "peak_allocated_exact": a.backend.endswith("flex"),
        "peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in timed),
        # On flex the reserved figure is the process RSS (sampled at probe points).
        "rss_peak_bytes": max(r["peak_reserved_bytes"] for r in recs) if a.backend.endswith("flex") else None,
        "param_bytes": recs[-1].get("param_bytes"),
        "loss_first": recs[0].get("loss"),
        "loss_last": recs[-1].get("loss"),
    }
    if a.warm_dir:
        warm = read_metrics(a.warm_dir)
        if a.warm_rc not in (None, 0) or not warm:
            rec["step1_warm_error"] = ("timed out" if a.warm_rc in (124, 137) else f"exit status {a.warm_rc}") + (
                ": " + tail(a.warm_log, 3) if a.warm_log else "")
        else:
            rec["step1_warm_s"] = warm[0]["step_time_s"]
            # The warm process runs the same steps with kernel accounting off
            # (lib_vs_pytorch.sh): its steady step, timed as the cold process's.
            if len(warm) >= 3:
                wcompute = compute_ms(warm[2:])
                rec["ms_step_median_uncounted"] = statistics.median(wcompute)
                rec["ms_step_min_uncounted"] = min(wcompute)
                rec["timed_steps_uncounted"] = f"3..{len(warm)}"
    return rec


def error_record(a) -> dict:
    row = rowdefs.ROWS[a.row]
    why = a.why or ("timed out" if a.rc in (124, 137) else f"exit status {a.rc}")
    return {"name": row.name, "label": row.title, "kind": row.kind, "backend": a.backend, "device": a.device,
            "batch": row.batch, "precision": row.precision, "ckpt": row.ckpt, "error": why, "tail": tail(a.log)}


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return re.sub(r"-+", "-", s) or "unknown"


# ----------------------------------------------------------------------------- table


def fmt_ms(v):
    return "" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")


def fmt_mib(b):
    return "" if b is None else (f"{b / MIB:,.0f}" if b >= 100 * MIB else f"{b / MIB:.1f}")


def fmt_s(v):
    return "" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")


def ratio(a, b):
    if a is None or b is None or not b:
        return "n/a"
    return f"{a / b:.2f}×"


def err_cell(rec):
    e = rec.get("error", "")
    last = [l for l in rec.get("tail", "").splitlines() if l.strip()][-1:] or [""]
    msg = (e + (": " + last[0] if last[0] else "")).replace("|", "\\|")
    return msg[:160]


def load(raw: Path) -> tuple[list[str], dict]:
    """Rows in first-seen order; the last record per (row, side) wins."""
    order, by = [], {}
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        side = "torch" if r["backend"].startswith("torch") else "vramlab"
        if r["name"] not in order:
            order.append(r["name"])
        by[(r["name"], side)] = r
    return order, by


def table(a) -> str:
    order, by = load(a.raw)
    order = [n for n in rowdefs.ROWS if n in order]  # the rows' canonical order
    torch_recs = [by[(n, "torch")] for n in order if (n, "torch") in by]
    on_cpu = all(r["backend"] == "torch-cpu" for r in torch_recs) if torch_recs else True
    out = [f"# {a.title}", ""]
    if a.header_file and Path(a.header_file).exists():
        out += Path(a.header_file).read_text().rstrip().splitlines() + [""]

    loads = [(n, s, by[(n, s)].get("loadavg_1min")) for n in order for s in ("torch", "vramlab")
             if (n, s) in by and by[(n, s)].get("loadavg_1min")]
    ncpu = os.cpu_count() or 1
    busiest = max((max(l) for _, _, l in loads if all(x is not None for x in l)), default=0.0)
    if on_cpu and busiest > ncpu + 1:
        out += [f"**Warning: this run competed with other jobs** (1-min load average up to {busiest:.1f} on {ncpu} "
                "logical CPUs, listed under the table). Multi-threaded steps then slow down by amounts that differ between "
                "the two sides and from step to step; compare these ratios only with runs made under a similar load.", ""]
    if on_cpu:
        out += [
            "| config | PyTorch ms/step | vramlab ms/step | **time ratio** | ratio of fastest steps | PyTorch peak RSS MiB "
            "| vramlab peak RSS MiB | RSS ratio | vramlab peak allocated MiB (exact) | allocated ratio | PyTorch step 1 s "
            "| vramlab step 1 s | step-1 ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    else:
        out += [
            "| config | PyTorch ms/step | vramlab ms/step | **time ratio** | ratio of fastest steps | vramlab ms/step, kernels counted "
            "| time ratio, counted | PyTorch peak alloc MiB "
            "| vramlab peak alloc MiB (sampled, ≥) | alloc ratio | PyTorch peak reserved MiB | vramlab peak reserved MiB "
            "| reserved ratio | PyTorch step 1 s | vramlab step 1 s cold | cold ratio | vramlab step 1 s warm | warm ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    notes = []
    for n in order:
        row = rowdefs.ROWS[n]
        t, v = by.get((n, "torch"), {}), by.get((n, "vramlab"), {})
        label = f"{row.title} `{n}`"
        cells_t_err = "error" in t or not t
        cells_v_err = "error" in v or not v
        if cells_t_err:
            notes.append(f"- `{n}` PyTorch: {err_cell(t) if t else 'not run'}")
        if cells_v_err:
            notes.append(f"- `{n}` vramlab: {err_cell(v) if v else 'not run'}")
        tg = (lambda k: None) if cells_t_err else t.get
        vg = (lambda k: None) if cells_v_err else v.get
        tms, vms = tg("ms_step_median"), vg("ms_step_median")
        t_err_txt = "error" if cells_t_err and t else ("—" if cells_t_err else None)
        v_err_txt = "error" if cells_v_err and v else ("—" if cells_v_err else None)
        c = lambda x, err: err if err is not None else x  # noqa: E731
        if on_cpu:
            out.append("| " + " | ".join([
                label,
                c(fmt_ms(tms), t_err_txt), c(fmt_ms(vms), v_err_txt), f"**{ratio(vms, tms)}**",
                ratio(vg("ms_step_min"), tg("ms_step_min")),
                c(fmt_mib(tg("rss_peak_bytes")), t_err_txt), c(fmt_mib(vg("rss_peak_bytes")), v_err_txt),
                ratio(vg("rss_peak_bytes"), tg("rss_peak_bytes")),
                c(fmt_mib(vg("peak_allocated_bytes")), v_err_txt), "n/a",
                c(fmt_s(tg("step1_s")), t_err_txt), c(fmt_s(vg("step1_s")), v_err_txt), ratio(vg("step1_s"), tg("step1_s")),
            ]) + " |")
        else:
            warm = vg("step1_warm_s")
            warm_txt = fmt_s(warm) if warm is not None else ("n/a" if vg("backend") is None or not str(vg("backend")).endswith("cuda") or cells_v_err else "error")
            if v.get("step1_warm_error"):
                notes.append(f"- `{n}` vramlab warm run: {v['step1_warm_error'][:160]}")
            # The headline step: the warm process's, kernel accounting off, where it ran
            # (older records: the counted one, as the "counted" columns then repeat).
            vms_off = vg("ms_step_median_uncounted")
            vhead = vms_off if vms_off is not None else vms
            vmin = vg("ms_step_min_uncounted") if vms_off is not None else vg("ms_step_min")
            out.append("| " + " | ".join([
                label,
                c(fmt_ms(tms), t_err_txt), c(fmt_ms(vhead), v_err_txt), f"**{ratio(vhead, tms)}**",
                ratio(vmin, tg("ms_step_min")),
                c(fmt_ms(vms), v_err_txt), ratio(vms, tms),
                c(fmt_mib(tg("peak_allocated_bytes")) or "n/a", t_err_txt), c(fmt_mib(vg("peak_allocated_bytes")), v_err_txt),
                ratio(vg("peak_allocated_bytes"), tg("peak_allocated_bytes")),
                c(fmt_mib(tg("peak_reserved_bytes") or tg("rss_peak_bytes")), t_err_txt),
                c(fmt_mib(vg("peak_reserved_bytes")), v_err_txt),
                ratio(vg("peak_reserved_bytes"), tg("peak_reserved_bytes") or tg("rss_peak_bytes")),
                c(fmt_s(tg("step1_s")), t_err_txt), c(fmt_s(vg("step1_s")), v_err_txt), ratio(vg("step1_s"), tg("step1_s")),
                c(warm_txt, v_err_txt), ratio(warm, tg("step1_s")),
            ]) + " |")
    # Data wait inside vramlab's step (not in either step time above).
    waits = [(n, by[(n, "vramlab")].get("ms_data_wait_median")) for n in order
             if (n, "vramlab") in by and by[(n, "vramlab")].get("ms_data_wait_median") is not None]
    if waits:
        out += ["", "vramlab's median data wait per step (random-batch generation and upload inside its step, "
                    "left out of its ms/step as PyTorch's batch is made before its clock starts): "
                + ", ".join(f"`{n}` {w:.1f} ms" for n, w in waits) + "."]
    losses = [(n, by[(n, s)].get("loss_first"), by[(n, s)].get("loss_last"), s) for n in order for s in ("torch", "vramlab")
              if (n, s) in by and by[(n, s)].get("loss_first") is not None]
    if losses:
        out += ["", "Loss first → last step (sanity: both train, on different random inputs): "
                + "; ".join(f"`{n}` {s} {l0:.3g} → {l1:.3g}" for n, l0, l1, s in losses) + "."]
    if loads:
        out += ["", f"1-min load average at the start → end of each run ({os.cpu_count()} logical CPUs here; a run itself "
                    f"adds up to about {os.cpu_count()}, so figures well above that mean other jobs were competing for the CPUs): "
                + "; ".join(f"`{n}` {s} {l[0]} → {l[1]}" for n, s, l in loads) + "."]
    if notes:
        out += ["", "Failed or missing runs:", ""] + notes
    return "\n".join(out) + "\n"


def median_us(candidate: dict) -> float:
    """A CubeCL autotune candidate's median time (`computation.median`, a Rust Duration), in µs."""
    m = candidate["computation"]["median"]
    return m["secs"] * 1e6 + m["nanos"] / 1e3


def autotune_summary(cache_dir: Path) -> str:
    """CubeCL's autotune cache (`<kernel_cache_dir>/autotune/<version>/<device>/*.json.log`, one JSON
    line per tuned key) as markdown: per tuner, keys tuned, candidates tried and failed, the winners,
    and the summed median time of the winners against that of each key's slowest working candidate."""
    files = sorted(cache_dir.rglob("*.json.log"))
    rows = ["| tuner | keys tuned | candidates tried | of them failed | winners (keys won) | winners' median time, µs (sum over keys) | slowest working candidate's (sum) |",
            "|---|---:|---:|---:|---|---:|---:|"]
    total_keys = total_cands = 0
    for f in files:
        if "autotune" not in f.parts:
            continue
        keys = cands = failed = 0
        won: dict[str, int] = {}
        t_win = t_slow = 0.0
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            v = json.loads(line)["value"]
            keys += 1
            cands += len(v["results"])
            ok = [r["outcome"]["Ok"] for r in v["results"] if "Ok" in r["outcome"]]
            failed += len(v["results"]) - len(ok)
            best = [r for r in ok if r["index"] == v["fastest_index"]]
            if best:
                won[best[0]["name"]] = won.get(best[0]["name"], 0) + 1
                t_win += median_us(best[0])
            if ok:
                t_slow += max(median_us(r) for r in ok)
        total_keys += keys
        total_cands += cands
        name = f.name.removesuffix(".json.log").removeprefix("burn_cubecl-kernel-")
        winners = ", ".join(f"{k} {n}" for k, n in sorted(won.items(), key=lambda kv: -kv[1]))
        rows.append(f"| {name} | {keys} | {cands} | {failed} | {winners} | {t_win:,.0f} | {t_slow:,.0f} |")
    rows.append(f"| **all** | **{total_keys}** | **{total_cands}** | | | | |")
    return "\n".join(rows) + "\n"


def autotune_candidate(result: dict) -> tuple[str | None, float | None, str]:
    """One candidate of a tuned key: its name, its median time in µs when it ran, else why not
    (the error's kind, e.g. `InvalidSamples` for a kernel that could not be set up, `Skip`)."""
    kind, body = next(iter(result["outcome"].items()))
    if kind == "Ok":
        return body.get("name"), median_us(body), ""
    if isinstance(body, dict) and body:
        reason, detail = next(iter(body.items()))
        return (detail.get("name") if isinstance(detail, dict) else None), None, reason
    return None, None, str(body)


def autotune_keys(cache_dir: Path, tuner: str) -> str:
    """Every key of the tuners whose file name contains `tuner`, one table per tuner: the key (its
    JSON, compact), each candidate's median time in µs (or why it did not run) and the winner, so
    a candidate can be compared with the others shape by shape."""
    out = []
    for f in sorted(cache_dir.rglob("*.json.log")):
        if "autotune" not in f.parts or tuner not in f.name:
            continue
        entries = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        names: list[str] = []
        for e in entries:
            for r in e["value"]["results"]:
                name = autotune_candidate(r)[0]
                if name and name not in names:
                    names.append(name)
        out += ["", f"### {f.name.removesuffix('.json.log')} ({len(entries)} keys; µs, CubeCL's median per launch)", "",
                "| key | " + " | ".join(names) + " | winner |", "|---|" + "---:|" * len(names) + "---|"]
        for e in entries:
            cells = dict.fromkeys(names, "–")
            winner = ""
            for r in e["value"]["results"]:
                name, us, why = autotune_candidate(r)
                if name is None:
                    continue
                cells[name] = f"{us:,.1f}" if us is not None else why
                if us is not None and r["outcome"]["Ok"].get("index") == e["value"]["fastest_index"]:
                    winner = name
            key = json.dumps(e["key"]["key"], separators=(",", ":")).replace("|", "/")
            out.append(f"| `{key}` | " + " | ".join(cells[n] for n in names) + f" | {winner} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("vramlab-args")
    p.add_argument("row", choices=sorted(rowdefs.ROWS))
    p = sub.add_parser("rows")
    p.add_argument("selection", nargs="*")
    p.add_argument("--tag", default="cpu")
    p = sub.add_parser("vramlab-record")
    p.add_argument("row", choices=sorted(rowdefs.ROWS))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--backend", required=True)
    p.add_argument("--device", default="")
    p.add_argument("--version", default="")
    p.add_argument("--rc", type=int)
    p.add_argument("--log", type=Path)
    p.add_argument("--load-before", type=float, help="1-min load average when the run started")
    p.add_argument("--warm-dir", type=Path)
    p.add_argument("--warm-rc", type=int)
    p.add_argument("--warm-log", type=Path)
    p.add_argument("--why", default="", help="the reason to record when the run failed (e.g. killed at its time limit after N s)")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("error-record")
    p.add_argument("row", choices=sorted(rowdefs.ROWS))
    p.add_argument("--backend", required=True)
    p.add_argument("--device", default="")
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--why", default="", help="the reason to print instead of the exit status (e.g. not run: budget spent)")
    p.add_argument("--log", type=Path)
    p.add_argument("--out", type=Path)
    p = sub.add_parser("slug")
    p.add_argument("text", nargs="+")
    p = sub.add_parser("torch-line")
    p.add_argument("probe")
    p = sub.add_parser("autotune", help="a CubeCL autotune cache as a markdown table")
    p.add_argument("cache_dir", type=Path)
    p.add_argument("--keys", metavar="TUNER", help="also every key of the tuners whose file name contains TUNER, candidate by candidate")
    p = sub.add_parser("table")
    p.add_argument("raw", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--header-file", type=Path)
    a = ap.parse_args()

    if a.cmd == "vramlab-args":
        print("\n".join(rowdefs.ROWS[a.row].vramlab_args()))
    elif a.cmd == "rows":
        print("\n".join(r.name for r in rowdefs.select(" ".join(a.selection), a.tag)))
    elif a.cmd == "vramlab-record":
        rec = vramlab_record(a)
        emit(rec, a.out)
        return 1 if "error" in rec else 0
    elif a.cmd == "error-record":
        emit(error_record(a), a.out)
    elif a.cmd == "slug":
        print(slug(" ".join(a.text)))
    elif a.cmd == "torch-line":
        try:
            d = json.loads(a.probe)
        except ValueError:
            d = {}
        av = d.get("av", "?")
        av = av if av.startswith("PyAV") else f"PyAV stand-in ({av})"
        cap = f", CPU capability `{d['cpu_capability']}`" if d.get("cpu_capability") else ""
        print(f"torch {d.get('torch', '?')}{cap}, lerobot {d.get('lerobot', '?')}, {av}, python `{d.get('python', '?')}`")
    elif a.cmd == "autotune":
        print(autotune_summary(a.cache_dir), end="")
        if a.keys:
            print(autotune_keys(a.cache_dir, a.keys), end="")
    elif a.cmd == "table":
        text = table(a)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

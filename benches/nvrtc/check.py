"""Compile CUDA C++ kernel sources with NVRTC as cubecl-cuda 0.10 does (`--gpu-architecture=sm_90a`,
the CUDA headers and their `cccl` folder, `-lineinfo`), plus `--ptxas-options=-v` for what ptxas
reports (registers, spills), and check the limits cubecl-cuda checks before a launch (units and
dimensions of a cube, shared memory). Writes a markdown report and a JSONL line per kernel source.

    python3 benches/nvrtc/check.py --cuda CUDA_ROOT --out REPORT.md [--arch sm_90a] [--jobs N] NAME=DUMP_DIR...

CUDA_ROOT holds lib/libnvrtc.so.* and include/ (the nvidia-cuda-nvrtc, -runtime and -cccl wheels
unpacked: `nvidia/cu13`). Exit status 1 when any source fails. Sources compile `--jobs` at a time
(default: the CPUs), each on one thread: NVRTC's calls are thread-safe for separate programs and
ctypes releases the GIL around them.
"""
import argparse, concurrent.futures, ctypes, glob, json, os, re, time

p = argparse.ArgumentParser()
p.add_argument("--cuda", required=True)
p.add_argument("--out", required=True)
p.add_argument("--arch", default="sm_90a")
p.add_argument("--header", default="", help="markdown put under the title (machine, command)")
p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="sources compiled at a time")
p.add_argument("dumps", nargs="+", help="NAME=DIR: a folder of .cu/.err/.panic files, named in the report")
a = p.parse_args()

libs = sorted(glob.glob(os.path.join(a.cuda, "lib", "libnvrtc.so.*[0-9]")))
libs = [l for l in libs if "alt" not in l and "builtins" not in l]
if not libs:
    raise SystemExit(f"check.py: no lib/libnvrtc.so.* under {a.cuda}")
nvrtc = ctypes.CDLL(libs[0])
major, minor = ctypes.c_int(), ctypes.c_int()
nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
inc = os.path.join(a.cuda, "include")
options = [f"--gpu-architecture={a.arch}", f"--include-path={inc}", "-lineinfo", "--ptxas-options=-v"]
if os.path.isdir(os.path.join(inc, "cccl")):
    options.append(f"--include-path={os.path.join(inc, 'cccl')}")
options_c = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])

# cubecl-cuda's checks: CubeDim within the device's (1024, 1024, 64), at most 1024 units, shared
# memory within the opt-in maximum (H100/H200: 227 KiB).
MAX_UNITS, MAX_DIM, MAX_SHARED = 1024, (1024, 1024, 64), 232448


def compile_source(text):
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), None, 0, None, None) != 0:
        return 1, "nvrtcCreateProgram failed", 0.0
    t0 = time.perf_counter()
    rc = nvrtc.nvrtcCompileProgram(prog, len(options), options_c)
    seconds = time.perf_counter() - t0
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), seconds


def one(path):
    base = os.path.basename(path)
    name, ext = base.rsplit("-", 1)[0], base.rsplit(".", 1)[1]
    rec = {"file": base, "kernel": name, "status": "ok", "problems": []}
    text = open(path, errors="replace").read()
    if ext != "cu":
        rec.update(status=f"lowering failed ({ext})", log=text[:4000])
        return rec
    first = text.split("\n", 1)[0].split()
    if first[:2] == ["//", "vramlab-dump"]:
        x, y, z, shared = int(first[3]), int(first[4]), int(first[5]), int(first[7])
        rec.update(cube_dim=[x, y, z], shared_bytes=shared)
        if x * y * z > MAX_UNITS or x > MAX_DIM[0] or y > MAX_DIM[1] or z > MAX_DIM[2]:
            rec["problems"].append(f"cube {x}×{y}×{z} over CUDA's limits")
        if shared > MAX_SHARED:
            rec["problems"].append(f"{shared} B of shared memory, over {MAX_SHARED}")
    rc, log, seconds = compile_source(text)
    rec["nvrtc_s"] = round(seconds, 4)
    m = re.search(r"Used (\d+) registers", log)
    rec["registers"] = int(m.group(1)) if m else None
    spills = [int(s) for s in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    rec["spill_bytes"] = sum(spills)
    if rc != 0:
        rec.update(status="NVRTC failed", log=log[:4000])
    elif rec["problems"]:
        rec["status"] = "over a launch limit"
    return rec


rows, records = [], []
pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs))
for spec in a.dumps:
    label, folder = spec.split("=", 1)
    files = sorted(glob.glob(os.path.join(folder, "*")))
    recs = [dict(r, dump=label) for r in pool.map(one, files)]
    records += recs
    bad = [r for r in recs if r["status"] != "ok"]
    rows.append((label, len(recs), len({r["kernel"] for r in recs}), len(bad), sum(r.get("nvrtc_s", 0) for r in recs),
                 sum(1 for r in recs if r.get("spill_bytes"))))

with open(os.path.splitext(a.out)[0] + ".jsonl", "w") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")

bad = [r for r in records if r["status"] != "ok"]
md = [f"# NVRTC check: vramlab's CubeCL kernels as CUDA C++, without a GPU", ""]
if a.header:
    md += [a.header, ""]
md += [f"NVRTC {major.value}.{minor.value}, options `{' '.join(o for o in options if 'include-path' not in o)}` (and the CUDA headers), "
       f"as cubecl-cuda 0.10 compiles for an sm_90 device, `--ptxas-options=-v` added. "
       f"**{len(records) - len(bad)} of {len(records)} sources compile and fit CUDA's launch limits; {len(bad)} do not.**", "",
       "| dump | sources (distinct kernels) | kernel names | failing | NVRTC s, all sources (each on one thread) | sources with register spills |",
       "|---|---:|---:|---:|---:|---:|"]
for label, n, names, nbad, secs, spill in rows:
    md.append(f"| {label} | {n} | {names} | {nbad} | {secs:.1f} | {spill} |")
md += ["", "## Per kernel name (all dumps)", "",
       "| kernel | sources | failing | max registers | max spill bytes | max shared bytes | largest cube | NVRTC s, max / sum |",
       "|---|---:|---:|---:|---:|---:|---|---:|"]
by = {}
for r in records:
    by.setdefault(r["kernel"], []).append(r)
for name, rs in sorted(by.items(), key=lambda kv: -sum(r.get("nvrtc_s", 0) for r in kv[1])):
    regs = [r["registers"] for r in rs if r.get("registers") is not None]
    cubes = [r["cube_dim"] for r in rs if r.get("cube_dim")]
    big = max(cubes, key=lambda c: c[0] * c[1] * c[2]) if cubes else None
    secs = [r.get("nvrtc_s", 0) for r in rs]
    md.append(f"| `{name}` | {len(rs)} | {sum(r['status'] != 'ok' for r in rs)} | {max(regs) if regs else '–'} | "
              f"{max(r.get('spill_bytes') or 0 for r in rs)} | {max(r.get('shared_bytes') or 0 for r in rs)} | "
              f"{'×'.join(map(str, big)) if big else '–'} | {max(secs):.2f} / {sum(secs):.2f} |")
if bad:
    md += ["", "## Failures", ""]
    for r in bad:
        md += [f"### {r['dump']}: `{r['file']}`: {r['status']}", "", "; ".join(r["problems"]), "", "```", r.get("log", "")[:3000], "```", ""]
open(a.out, "w").write("\n".join(md) + "\n")
print(f"{len(records) - len(bad)} of {len(records)} sources ok; report: {a.out}")
raise SystemExit(1 if bad else 0)

#!/usr/bin/env python3
"""PyTorch eager baseline for vramlab's benches: one full train step of the same configurations
vramlab trains, timed and memory-measured the way PyTorch users measure it.

    python baseline.py run ROW [--steps N] [--device auto|cpu|cuda] [--out FILE.jsonl]
    python baseline.py --check-fixture DIR      # the VAE port against a reference fixture
    python baseline.py probe [--lerobot]         # JSON: torch, CUDA, device; lerobot importable?
    python baseline.py saved ROW [--batch N]     # JSON: what autograd keeps for the backward, per module
    python baseline.py parity GOT WANT [--tolerance T]  # `vramlab predict` outputs vs a fixture's outputs

One train step = forward (policy.forward(batch) for lerobot's policies, as lerobot-train calls
it; the VAE's forward + compute_loss) + backward + clip_grad_norm_ + optimizer step + zero_grad.
Random inputs of the row's shapes, already in normalised units (lerobot 0.4.4 normalises in its
processor pipeline, outside policy.forward, so no statistics are involved): images and states
N(0, 1), actions a random walk, no padding; the VAE gets occupancy ~6 % with features on the
occupied voxels. A fresh batch each step, made before the step's clock starts.

Timing: wall time per step (torch.cuda.synchronize() before and after on CUDA); reported:
step 1 (cold: first kernels, allocator growth, optimizer state) and the median of steps 3..N.
Memory on CUDA: torch.cuda.max_memory_allocated / max_memory_reserved after
reset_peak_memory_stats() at the start of step 3, i.e. over the timed window. On CPU PyTorch's
allocator is not instrumented: the process peak RSS (getrusage ru_maxrss) is reported instead,
a bound that includes the interpreter and libraries, not comparable to an exact allocation peak.

CUDA settings are PyTorch's defaults (no TF32 matmuls, cudnn.benchmark off); --lerobot-train-flags
sets what lerobot-train sets (cudnn.benchmark = True, TF32 matmuls).

Precision bf16: torch.autocast(bfloat16) around the forward and loss (lerobot's use_amp),
weights and optimizer in f32. Checkpointing (VAE only): torch.utils.checkpoint per residual
block, the reference's use_checkpoint.

Optimizers (lerobot 0.4.4 presets; the VAE as vramlab's configs/vae3d_ultra.toml):
- ACT: AdamW lr 1e-5 (backbone group 1e-5), weight decay 1e-4, betas (0.9, 0.999), eps 1e-8,
  clip 10, constant LR.
- Diffusion: Adam lr 1e-4, betas (0.95, 0.999), eps 1e-8, weight decay 1e-6, clip 10, cosine
  schedule with 500 warmup steps.
- VAE: AdamW lr 2e-4, weight decay 0, clip 1.0 (cosine with 10 warmup steps in vramlab's config;
  constant here: the schedule costs nothing measurable).

lerobot 0.4.4 imports PyAV at import time; when `import av` fails, a stand-in from stubs/ that
only satisfies the import is used (VRAMLAB_BENCH_AV_STUB=1 forces it). transformers is hidden
from lerobot (VRAMLAB_BENCH_KEEP_TRANSFORMERS=1 keeps it): ACT and Diffusion do not use it, and
lerobot's other policies fail to import with transformers 5.x.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # keep benches/torch free of __pycache__

import argparse
import json
import math
import os
import platform
import resource
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rows as rowdefs  # noqa: E402

FIXTURE_TOLERANCE = 1e-4


# ----------------------------------------------------------------------------- imports


def prepare_lerobot_import() -> str:
    """Make `import lerobot.policies...` work here; returns how PyAV was satisfied."""
    if os.environ.get("VRAMLAB_BENCH_KEEP_TRANSFORMERS") != "1" and "transformers" not in sys.modules:
        # A None entry makes `import transformers` raise ImportError and find_spec return None,
        # so lerobot's availability checks see it as absent.
        sys.modules["transformers"] = None
    stubs = str(HERE / "stubs")
    if os.environ.get("VRAMLAB_BENCH_AV_STUB") == "1":
        for k in [k for k in sys.modules if k == "av" or k.startswith("av.")]:
            del sys.modules[k]
        sys.path.insert(0, stubs)
        import av  # noqa: F401

        return "stub (forced)"
    try:
        import av  # noqa: F401

        return f"PyAV {getattr(av, '__version__', '?')}"
    except ImportError:
        sys.path.insert(0, stubs)
        import av  # noqa: F401

        return "stub (PyAV not installed)"


def rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def rss_peak() -> int:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * (1 if sys.platform == "darwin" else 1024)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------- models


def build_act(row, device, torch):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    h, w = row.image
    cfg = ACTConfig(
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(row.state_dim,)),
            "observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(row.action_dim,))},
        chunk_size=row.chunk,
        n_action_steps=row.chunk,
        pretrained_backbone_weights=None,  # no download; the architecture (FrozenBatchNorm2d) is the same
        device=device.type,
    )
    policy = ACTPolicy(cfg).to(device)
    groups = policy.get_optim_params()  # lerobot's two groups: the rest, and the backbone at lr_backbone
    opt = torch.optim.AdamW(groups, lr=cfg.optimizer_lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.optimizer_weight_decay)
    b = row.batch

    def batch(g):
        return {
            "observation.state": torch.randn(b, row.state_dim, device=device, generator=g),
            "observation.images.top": torch.randn(b, 3, h, w, device=device, generator=g),
            "action": torch.cumsum(0.1 * torch.randn(b, row.chunk, row.action_dim, device=device, generator=g), dim=1),
            "action_is_pad": torch.zeros(b, row.chunk, dtype=torch.bool, device=device),
        }

    return policy, lambda bt: policy.forward(bt)[0], batch, opt, None, 10.0


def build_diffusion(row, device, torch):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    h, w = row.image
    cfg = DiffusionConfig(
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(row.state_dim,)),
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(row.action_dim,))},
        horizon=row.horizon,
        crop_shape=tuple(row.crop) if row.crop else None,
        device=device.type,
    )
    policy = DiffusionPolicy(cfg).to(device)
    opt = torch.optim.Adam(policy.get_optim_params(), lr=cfg.optimizer_lr, betas=tuple(cfg.optimizer_betas),
                           eps=cfg.optimizer_eps, weight_decay=cfg.optimizer_weight_decay)
    warm, total = cfg.scheduler_warmup_steps, 100_000

    def factor(step):  # linear warmup, then half-cosine decay (diffusers' "cosine")
        if step < warm:
            return step / max(1, warm)
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    b, n_obs = row.batch, cfg.n_obs_steps

    def batch(g):
        return {
            "observation.state": torch.randn(b, n_obs, row.state_dim, device=device, generator=g),
            "observation.image": torch.randn(b, n_obs, 3, h, w, device=device, generator=g),
            "action": torch.cumsum(0.1 * torch.randn(b, row.horizon, row.action_dim, device=device, generator=g), dim=1),
            "action_is_pad": torch.zeros(b, row.horizon, dtype=torch.bool, device=device),
        }

    return policy, lambda bt: policy.forward(bt)[0], batch, opt, sched, 10.0


def build_vae(row, device, torch):
    import vae3d

    cfg = vae3d.preset(row.preset, use_checkpoint=row.ckpt)
    model = vae3d.Vae3d(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    f = [1, 1, 1]
    for i in range(len(cfg.encoder_channel_mult) - 1):
        f = [a * s for a, s in zip(f, vae3d.level_stride(i))]
    latent = [cfg.latent_dim] + [-(-n // k) for n, k in zip(row.grid, f)]

    def batch(g):
        d, hh, ww = row.grid
        b = row.batch
        occ = (torch.rand(b, 1, d, hh, ww, device=device, generator=g) < 0.06).float()
        feats = torch.randn(b, 3, d, hh, ww, device=device, generator=g) * occ
        eps = torch.randn(b, *latent, device=device, generator=g)
        return torch.cat([occ, feats], dim=1), eps

    def loss(bt):
        x, eps = bt
        recon, mean, logvar = model(x, eps)
        return model.compute_loss(x, recon, mean, logvar)["loss"]

    return model, loss, batch, opt, None, 1.0


BUILDERS = {"act": build_act, "diffusion": build_diffusion, "vae": build_vae}


# ----------------------------------------------------------------------------- run


def run_row(row, steps: int, device_arg: str, lerobot_train_flags: bool = False) -> dict:
    rss_start = rss_now()
    load_start = os.getloadavg()[0]
    av_how = prepare_lerobot_import() if row.kind in ("act", "diffusion") else "not needed"
    import torch

    cuda = device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is false")
    device = torch.device("cuda" if cuda else "cpu")
    if lerobot_train_flags:
        # What lerobot-train sets before training (scripts/lerobot_train.py).
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    if cuda:
        dev_name = torch.cuda.get_device_name(device)
    else:
        dev_name = f"{cpu_model()} ({os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()})"
    lerobot_version = None
    if row.kind in ("act", "diffusion"):
        import importlib.metadata as md

        lerobot_version = md.version("lerobot")

    torch.manual_seed(1000)
    t_build = time.perf_counter()
    model, loss_fn, make_batch, opt, sched, clip = BUILDERS[row.kind](row, device, torch)
    model.train()
    build_s = time.perf_counter() - t_build
    params = sum(p.numel() for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    rss_built = rss_now()
    gen = torch.Generator(device=device)
    gen.manual_seed(1000)
    autocast = (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)) if row.precision == "bf16" \
        else (lambda: torch.autocast(device_type=device.type, enabled=False))
    if row.precision not in ("f32", "bf16"):
        raise SystemExit(f"precision {row.precision}: only f32 and bf16")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    times, losses, grad_norms = [], [], []
    for step in range(1, steps + 1):
        bt = make_batch(gen)
        sync()
        if step == 3 and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        with autocast():
            loss = loss_fn(bt)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(trainable, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        grad_norms.append(float(gn))
        del bt, loss

    timed = times[2:] if len(times) >= 3 else times[-1:]
    rec = {
        "name": row.name,
        "label": row.title,
        "kind": row.kind,
        "backend": "torch-cuda" if cuda else "torch-cpu",
        "device": dev_name,
        "torch": torch.__version__,
        "lerobot": lerobot_version,
        "av": av_how,
        "python": platform.python_version(),
        # PyTorch's defaults unless --lerobot-train-flags: f32 matmuls in full f32, cuDNN convs may use TF32.
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32} if cuda else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark if cuda else None,
        "batch": row.batch,
        "precision": row.precision,
        "ckpt": row.ckpt,
        "params": params,
        "steps": steps,
        "timed_steps": f"{steps - len(timed) + 1}..{steps}",
        "ms_step_median": 1000 * statistics.median(timed),
        "ms_step_min": 1000 * min(timed),
        "step1_s": times[0],
        "step_times_s": [round(t, 6) for t in times],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
        "rss_peak_bytes": rss_peak(),
        "rss_start_bytes": rss_start,
        "rss_after_build_bytes": rss_built,
        "build_s": build_s,
        "loadavg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],  # at start, at end
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "grad_norm_last": grad_norms[-1],
    }
    if not all(math.isfinite(x) for x in losses):
        rec["error"] = "non-finite loss"
    return rec


# ----------------------------------------------------------------------------- fixture


def check_fixture(d: Path) -> int:
    """The VAE port against a reference fixture: eval-mode outputs with z = mean and the loss
    terms; then block checkpointing's gradients against plain autograd's. Exit status 1 when
    any relative error (max |got - want| / max |want|) exceeds FIXTURE_TOLERANCE."""
    import torch
    from safetensors.torch import load_file

    import vae3d

    cfg_json = json.loads((d / "pretrained_model" / "config.json").read_text())
    cfg = vae3d.Vae3dConfig.from_dict(cfg_json)
    cfg.use_checkpoint = False
    model = vae3d.Vae3d(cfg)
    missing = model.load_state_dict(load_file(str(d / "pretrained_model" / "model.safetensors")), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    model.eval()
    x = load_file(str(d / "inputs.safetensors"))["x"]
    want = load_file(str(d / "outputs.safetensors"))
    with torch.no_grad():
        recon, mean, logvar = model(x)
        got = {"recon": recon, "mean": mean, "logvar": logvar, **model.compute_loss(x, recon, mean, logvar)}
    params = sum(p.numel() for p in model.parameters())
    print(f"fixture {d}: {params:,} parameters, torch {torch.__version__}, input {tuple(x.shape)}")
    worst = 0.0
    for k in ["mean", "logvar", "recon", "loss", "recon_loss", "kl_loss"]:
        if k not in want:
            print(f"  {k:<11} absent from outputs.safetensors")
            continue
        w, g = want[k].double(), got[k].detach().double().reshape(want[k].shape)
        abs_err = (g - w).abs().max().item()
        rel = abs_err / max(w.abs().max().item(), 1e-30)
        worst = max(worst, rel)
        print(f"  {k:<11} max abs error {abs_err:.3e}   relative (to max |want|) {rel:.3e}")

    # Checkpointing must not change gradients (training mode, the fixture's weights and input).
    torch.manual_seed(0)
    eps = torch.randn_like(mean)
    grads = []
    for ck in (False, True):
        for m in model.modules():
            if isinstance(m, vae3d.ResBlock):
                m.use_checkpoint = ck
        model.train()
        model.zero_grad(set_to_none=True)
        r, mu, lv = model(x, eps)
        model.compute_loss(x, r, mu, lv)["loss"].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    g_rel = ((grads[1] - grads[0]).abs().max() / grads[0].abs().max()).item()
    worst_all = max(worst, g_rel)
    print(f"  gradients, checkpointed vs plain: relative {g_rel:.3e}")
    ok = worst_all <= FIXTURE_TOLERANCE
    print(f"fixture check {'PASSED' if ok else 'FAILED'}: worst relative error {worst_all:.3e} (tolerance {FIXTURE_TOLERANCE:g})")
    return 0 if ok else 1


def parity(got_path: Path, want_path: Path, tolerance: float) -> int:
    """Every tensor of `want_path` (a fixture's outputs.safetensors) against the same name in
    `got_path` (what `vramlab predict` wrote): max |got - want| / max |want| per tensor. Exit
    status 1 when one exceeds `tolerance` or is missing, 0 otherwise."""
    from safetensors.torch import load_file

    got, want = load_file(str(got_path)), load_file(str(want_path))
    worst, ok = 0.0, True
    for k in sorted(want):
        if k not in got:
            print(f"  {k:<20} missing from {got_path.name}")
            ok = False
            continue
        w, g = want[k].double(), got[k].double()
        if tuple(w.shape) != tuple(g.shape):
            print(f"  {k:<20} shape {tuple(g.shape)}, want {tuple(w.shape)}")
            ok = False
            continue
        abs_err = (g - w).abs().max().item() if w.numel() else 0.0
        rel = abs_err / max(w.abs().max().item() if w.numel() else 0.0, 1e-30)
        worst = max(worst, rel)
        print(f"  {k:<20} max abs error {abs_err:.3e}   relative (to max |want|) {rel:.3e}")
    ok = ok and worst <= tolerance
    print(f"parity {'PASSED' if ok else 'FAILED'}: worst relative error {worst:.3e} (tolerance {tolerance:g})")
    return 0 if ok else 1


def probe(with_lerobot: bool) -> int:
    import torch

    cuda = torch.cuda.is_available()
    info = {"python": sys.executable, "torch": torch.__version__, "cuda_available": cuda,
            "device": torch.cuda.get_device_name(0) if cuda else cpu_model(), "cpu_model": cpu_model(),
            "cpus": os.cpu_count()}
    # The widest vector ISA PyTorch's CPU kernels dispatch to on this machine (e.g. "AVX512",
    # "AVX2", "DEFAULT"; ATEN_CPU_CAPABILITY caps it).
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as e:  # noqa: BLE001  (older torch: no such function)
        info["cpu_capability"] = f"unknown ({type(e).__name__})"
    rc = 0
    if with_lerobot:
        try:
            info["av"] = prepare_lerobot_import()
            import importlib.metadata as md

            from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: F401
            from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: F401

            info["lerobot"] = md.version("lerobot")
            if info["lerobot"] != "0.4.4":
                info["warning"] = f"lerobot {info['lerobot']}, the benches reproduce 0.4.4"
        except Exception as e:  # noqa: BLE001  (report any import failure, e.g. a missing module)
            info["lerobot_error"] = f"{type(e).__name__}: {e}"
            rc = 1
    print(json.dumps(info))
    return rc



# ----------------------------------------------------------------------------- saved tensors


def saved_row(row, batch: int | None) -> dict:
    """One forward (+ loss) of `row` under `torch.autograd.graph.saved_tensors_hooks`: every
    tensor autograd saves for the backward, counted once per storage (views and in-place
    results share one), parameters and buffers excluded, attributed to the innermost module
    whose forward was running when it was saved. CPU, f32; exact bytes of PyTorch's own choice
    of saved tensors (not an allocator figure: outputs that are saved are counted, transient
    workspaces are not)."""
    import dataclasses

    if row.kind in ("act", "diffusion"):
        prepare_lerobot_import()
    import torch

    if batch is not None:
        row = dataclasses.replace(row, batch=batch)
    torch.manual_seed(1000)
    model, loss_fn, make_batch, _opt, _sched, _clip = BUILDERS[row.kind](row, torch.device("cpu"), torch)
    model.train()
    owned = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    stack: list[str] = ["(top)"]
    names = {m: n or "(root)" for n, m in model.named_modules()}
    def enter(mod, _inp):
        stack.append(names[mod])

    def leave(_mod, _inp, _out):
        stack.pop()  # returns None: the module's output stays as it is

    hooks = []
    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(enter))
        hooks.append(m.register_forward_hook(leave))
    seen: dict[int, tuple[str, int, str, tuple]] = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in owned and ptr not in seen:
            seen[ptr] = (stack[-1], st.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape))
        return t

    gen = torch.Generator().manual_seed(1000)
    bt = make_batch(gen)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(bt)
    for h in hooks:
        h.remove()
    per: dict[str, int] = {}
    for mod, nbytes, _dt, _shape in seen.values():
        per[mod] = per.get(mod, 0) + nbytes
    largest = sorted(seen.values(), key=lambda v: -v[1])[:40]
    del loss
    return {"row": row.name, "batch": row.batch, "torch": torch.__version__, "saved_bytes": sum(per.values()),
            "tensors": len(seen), "per_module": per,
            "largest": [{"module": m, "bytes": b, "dtype": d, "shape": list(sh)} for m, b, d, sh in largest]}


# ----------------------------------------------------------------------------- CLI


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--check-fixture":
        argv[0] = "check-fixture"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure one row, print (and append) one JSON line")
    r.add_argument("row", choices=sorted(rowdefs.ROWS))
    r.add_argument("--steps", type=int, default=None, help="default 8 on CUDA, 5 on CPU")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    r.add_argument("--out", type=Path, help="append the JSON line to this file")
    r.add_argument("--lerobot-train-flags", action="store_true",
                   help="set what lerobot-train sets: cudnn.benchmark and TF32 matmuls (default: PyTorch's defaults)")
    c = sub.add_parser("check-fixture", help="VAE port vs a reference fixture directory")
    c.add_argument("dir", type=Path)
    pa = sub.add_parser("parity", help="compare `vramlab predict` outputs with a fixture's outputs.safetensors")
    pa.add_argument("got", type=Path)
    pa.add_argument("want", type=Path)
    pa.add_argument("--tolerance", type=float, default=5e-3, help="max relative error (default 5e-3: TF32 on CUDA)")
    pr = sub.add_parser("probe", help="print torch / CUDA / lerobot facts as JSON; exit 1 if --lerobot fails to import")
    pr.add_argument("--lerobot", action="store_true", help="also import lerobot's ACT and Diffusion policies")
    sv = sub.add_parser("saved", help="JSON: what autograd keeps for the backward (one forward, CPU, f32), per module")
    sv.add_argument("row", choices=sorted(rowdefs.ROWS))
    sv.add_argument("--batch", type=int, help="override the row's batch size")
    a = ap.parse_args(argv)

    if a.cmd == "check-fixture":
        return check_fixture(a.dir)
    if a.cmd == "parity":
        return parity(a.got, a.want, a.tolerance)
    if a.cmd == "probe":
        return probe(a.lerobot)
    if a.cmd == "saved":
        print(json.dumps(saved_row(rowdefs.ROWS[a.row], a.batch)))
        return 0
    row = rowdefs.ROWS[a.row]
    steps = a.steps
    if steps is None:
        import torch

        on_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
        steps = 8 if on_cuda else 5
    if steps < 1:
        raise SystemExit("--steps must be >= 1")
    rec = run_row(row, steps, a.device, a.lerobot_train_flags)
    line = json.dumps(rec)
    print(line, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 1 if "error" in rec else 0


if __name__ == "__main__":
    sys.exit(main())

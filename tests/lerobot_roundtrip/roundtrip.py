"""Does a policy checkpoint act the same in lerobot 0.4.4 and in vramlab?

For each checkpoint directory given (a `pretrained_model/` or a checkpoint step directory holding
one, written by vramlab or by lerobot-train), on raw observations of the policy's shapes:
  lerobot:  PreTrainedPolicy.from_pretrained + make_pre_post_processors(pretrained_path=...) ->
            preprocessor -> policy.select_action (Diffusion: with a fixed initial noise) ->
            postprocessor
  vramlab:  `vramlab predict --checkpoint DIR` on the same raw observations (its processors
            read from the same files), output `action`
and checks that the two agree within --tol (absolute) on the policy's normalised action (what
select_action returns before the postprocessor), reporting the difference in the dataset's units
too (PushT's actions are pixel coordinates in the hundreds, where float32 itself resolves ~3e-5).

Usage: python roundtrip.py --vramlab BIN --work DIR [--tol 1e-4] LABEL=CHECKPOINT_DIR ...
Prints one line per checkpoint and exits non-zero if any disagrees or fails to load.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lerobot.policies.factory import get_policy_class, make_pre_post_processors


def pretrained_dir(path: Path) -> Path:
    inner = path / "pretrained_model"
    return inner if (inner / "config.json").exists() else path


def raw_observation(cfg, gen):
    """One raw observation (no batch axis): state in [-1, 1] x 100, camera frames in [0, 1]."""
    obs = {}
    for key, feat in cfg.input_features.items():
        shape = tuple(feat.shape)
        if feat.type.name == "VISUAL":
            obs[key] = torch.rand(shape, generator=gen)
        else:
            obs[key] = (torch.rand(shape, generator=gen) * 2 - 1) * 100
    return obs


def compare(label: str, ckpt: Path, vramlab: str, work: Path, tol: float) -> bool:
    ckpt = pretrained_dir(ckpt)
    kind = json.loads((ckpt / "config.json").read_text())["type"]
    policy = get_policy_class(kind).from_pretrained(str(ckpt))
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(ckpt))
    gen = torch.Generator().manual_seed(0)
    obs = raw_observation(policy.config, gen)

    policy.reset()
    batch = pre(dict(obs))
    kwargs = {}
    noise = None
    if kind == "diffusion":
        cfg = policy.config
        noise = torch.randn((1, cfg.horizon, cfg.action_feature.shape[0]), generator=gen)
        kwargs["noise"] = noise
    with torch.no_grad():
        normalised = policy.select_action(batch, **kwargs)
        action = post(normalised.clone())

    # vramlab's predict takes a batch axis (and Diffusion's observation-step axis, filled with
    # copies of the first observation as lerobot's queue is on the first call).
    inputs = {}
    for key, value in obs.items():
        v = value.unsqueeze(0)
        if kind == "diffusion":
            v = v.unsqueeze(1).repeat_interleave(policy.config.n_obs_steps, dim=1)
        inputs[key] = v.contiguous().float()
    if noise is not None:
        inputs["initial_noise"] = noise.float()
    inp = work / f"{label}_inputs.safetensors"
    out = work / f"{label}_outputs.safetensors"
    save_file(inputs, str(inp))
    run = subprocess.run([vramlab, "predict", f"--checkpoint={ckpt}", f"--inputs={inp}", f"--out={out}"], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL {label}: vramlab predict exited {run.returncode}: {run.stderr.strip()}")
        return False
    outs = load_file(str(out))
    ours = outs["action"]
    ours_norm = outs["eval_actions" if kind == "act" else "ddim_actions"][:, 0]
    theirs = action.reshape(ours.shape).float()
    diff = (ours - theirs).abs().max().item()
    norm_diff = (ours_norm - normalised.reshape(ours_norm.shape).float()).abs().max().item()
    ok = norm_diff <= tol
    print(
        f"{'ok  ' if ok else 'FAIL'} {label}: {kind} {ckpt}\n"
        f"     lerobot select_action {theirs.flatten().tolist()}\n"
        f"     vramlab predict       {ours.flatten().tolist()}\n"
        f"     max |diff| normalised {norm_diff:.3e} (tolerance {tol:.0e}); in the dataset's units {diff:.3e}"
    )
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vramlab", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("checkpoints", nargs="+", help="LABEL=DIR")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    ok = True
    for item in a.checkpoints:
        label, _, path = item.partition("=")
        try:
            ok &= compare(label, Path(path), a.vramlab, a.work, a.tol)
        except Exception as e:  # a checkpoint lerobot cannot load is a failure of the round trip
            print(f"FAIL {label}: {type(e).__name__}: {e}")
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""The configurations ("rows") the PyTorch-vs-vramlab benches measure, in one place: what the
PyTorch driver builds (baseline.py) and the vramlab flags that build the same thing
(report.py vramlab-args). No torch import here, so the report side runs on any python3.

Kinds:
- act: lerobot 0.4.4 ACT defaults (ResNet18, dim_model 512, 4 encoder + 1 decoder layers, VAE
  with 4 layers, dropout 0.1), one camera `observation.images.top`, state/action 14.
- diffusion: lerobot 0.4.4 Diffusion Policy defaults (ResNet18 + GroupNorm, 32 keypoints,
  UNet 512/1024/2048, DDPM 100, n_obs_steps 2), one camera `observation.image`, state/action 2.
- vae: the 4D-Radar 3D-VAE preset, input grid (D, H, W), 4 channels.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    name: str
    kind: str  # act | diffusion | vae
    batch: int
    label: str
    precision: str = "f32"  # f32 | bf16
    ckpt: bool = False  # gradient checkpointing (VAE: per residual block)
    image: tuple = (96, 96)  # camera (H, W)
    crop: tuple | None = None  # diffusion crop (H, W)
    chunk: int = 100  # act chunk_size (= n_action_steps)
    horizon: int = 16  # diffusion horizon
    state_dim: int = 14
    action_dim: int = 14
    preset: str = "ultra_lightweight"  # vae
    grid: tuple = (8, 32, 32)  # vae (D, H, W)
    tags: tuple = field(default=())

    @property
    def title(self) -> str:
        """The label with precision and checkpointing: a table row's name."""
        return f"{self.label}, {self.precision}" + (" + checkpointing" if self.ckpt else "")

    def vramlab_args(self) -> list[str]:
        """Flags for `vramlab train` (besides --steps/--output_dir/--backend/...)."""
        common = [f"--batch_size={self.batch}", f"--precision={self.precision}",
                  f"--gradient_checkpointing={'blocks' if self.ckpt else 'off'}"]
        if self.kind == "act":
            h, w = self.image
            return ["--policy.type=act", "--dataset.type=random", "--dataset.num_scenes=8",
                    f"--policy.camera_shape=3,{h},{w}", "--policy.num_cameras=1",
                    f"--policy.state_dim={self.state_dim}", f"--policy.action_dim={self.action_dim}",
                    f"--policy.chunk_size={self.chunk}", f"--policy.n_action_steps={self.chunk}"] + common
        if self.kind == "diffusion":
            h, w = self.image
            ch, cw = self.crop or self.image
            return ["--policy.type=diffusion", "--dataset.type=random", "--dataset.num_scenes=8",
                    f"--policy.camera_shape=3,{h},{w}", f"--policy.crop_shape={ch},{cw}",
                    f"--policy.state_dim={self.state_dim}", f"--policy.action_dim={self.action_dim}",
                    f"--policy.horizon={self.horizon}"] + common
        if self.kind == "vae":
            d, h, w = self.grid
            return ["--config=configs/vae3d_ultra.toml", f"--policy.preset={self.preset}",
                    f"--dataset.grid={d},{h},{w}", "--dataset.num_scenes=8"] + common
        raise ValueError(self.kind)


def _act(name, b, hw, label, **kw):
    return Row(name, "act", b, label, image=hw, **kw)


def _dp(name, b, hw, crop, label, **kw):
    return Row(name, "diffusion", b, label, image=hw, crop=crop, state_dim=2, action_dim=2, **kw)


def _vae(name, b, grid, label, **kw):
    return Row(name, "vae", b, label, grid=grid, **kw)


_ALL = [
    # The CPU rows (the issue's): PyTorch CPU vs vramlab flex.
    _act("act_b8_240x320", 8, (240, 320), "ACT defaults, b8, 1 cam 240×320, chunk 100, state/action 14", tags=("cpu",)),
    _dp("diffusion_b8_96_crop84", 8, (96, 96), (84, 84), "Diffusion PushT defaults, b8 h16, 96×96 crop 84, state/action 2", tags=("cpu",)),
    _vae("vae_ultra_b2_8x32x32", 2, (8, 32, 32), "VAE ultra_lightweight, b2, grid 8×32×32", tags=("cpu", "gpu")),
    # The GPU rows (../shared/baselines/README.md's H100 table).
    _act("act_b8_480x640", 8, (480, 640), "ACT defaults, b8, 1 cam 480×640, chunk 100, state/action 14", tags=("gpu",)),
    _act("act_b8_480x640_bf16", 8, (480, 640), "ACT defaults, b8, 1 cam 480×640, chunk 100, state/action 14", precision="bf16", tags=("gpu",)),
    _act("act_b48_480x640", 48, (480, 640), "ACT b48 chunk 100, 480×640", tags=("gpu",)),
    _act("act_b48_240x320", 48, (240, 320), "ACT b48 chunk 100, 240×320", tags=("gpu",)),
    _act("act_b48_96x96", 48, (96, 96), "ACT b48 chunk 100, 96×96", tags=("gpu",)),
    _dp("diffusion_b64_96_crop84", 64, (96, 96), (84, 84), "Diffusion PushT defaults, b64 h16, 96×96 crop 84, state/action 2", tags=("gpu",)),
    _dp("diffusion_b64_96_crop84_bf16", 64, (96, 96), (84, 84), "Diffusion PushT defaults, b64 h16, 96×96 crop 84, state/action 2", precision="bf16", tags=("gpu",)),
    _dp("diffusion_b64_240x320_crop210x280", 64, (240, 320), (210, 280), "Diffusion b64 h16, 240×320 crop 210×280", tags=("gpu",)),
    _vae("vae_ultra_b2_8x32x32_bf16", 2, (8, 32, 32), "VAE ultra_lightweight, b2, grid 8×32×32", precision="bf16", tags=("gpu",)),
    _vae("vae_ultra_b1_32x128x128", 1, (32, 128, 128), "VAE ultra_lightweight, b1, grid 32×128×128", tags=("gpu",)),
    _vae("vae_ultra_b1_32x128x128_bf16", 1, (32, 128, 128), "VAE ultra_lightweight, b1, grid 32×128×128", precision="bf16", tags=("gpu",)),
    _vae("vae_ultra_b1_32x128x128_ckpt", 1, (32, 128, 128), "VAE ultra_lightweight, b1, grid 32×128×128", ckpt=True, tags=("gpu",)),
    _vae("vae_ultra_b1_32x128x128_bf16_ckpt", 1, (32, 128, 128), "VAE ultra_lightweight, b1, grid 32×128×128", precision="bf16", ckpt=True, tags=("gpu",)),
]
ROWS = {r.name: r for r in _ALL}


def select(spec: str, default_tag: str) -> list[Row]:
    """Rows from a selection: empty -> every row tagged `default_tag`; otherwise a list of
    names, tags (`cpu`, `gpu`), kinds (`act`, `diffusion`, `vae`) or name prefixes, separated
    by commas or spaces. Order follows the table above."""
    words = [w for w in spec.replace(",", " ").split() if w]
    if not words:
        return [r for r in _ALL if default_tag in r.tags]
    out, unknown = [], []
    for w in words:
        hit = [r for r in _ALL if w in r.tags or w == r.kind or r.name == w or (w.endswith("*") and r.name.startswith(w[:-1]))]
        if not hit:
            unknown.append(w)
        out += [r for r in hit if r not in out]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; rows: {', '.join(ROWS)}; or tags cpu/gpu, kinds act/diffusion/vae, prefix*")
    return [r for r in _ALL if r in out]

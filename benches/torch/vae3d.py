"""The 4D-Radar 3D-VAE in PyTorch, ported from vramlab's Rust model (crates/models/src/vae3d/).

Only what the bench needs: the architecture with the reference's ``state_dict`` key names
(``encoder.down_blocks.0.0.conv1.weight``, ``decoder.up_blocks.0.2.conv.weight``,
``encoder.mid_block.0/2`` with the identity in slot 1, ``quant_conv``, ...), so a reference
or vramlab checkpoint loads with ``load_state_dict(strict=True)``; the posterior split with
logvar clamped to [-30, 20]; and the loss as vramlab computes it (the reference's
``compute_loss(reduction="mean")`` at 08c7eb9: occupancy- and channel-weighted squared error,
false-positive and occupancy-mass terms, plus ``kl_weight * KL``).

Mixed precision is left to ``torch.autocast``; GroupNorm runs in f32 (as the reference's
GroupNorm32 does) and the moments, reconstruction and loss are returned in f32, as vramlab
does. ``use_checkpoint`` recomputes each residual block in the backward pass
(``torch.utils.checkpoint``, non-reentrant), which is where the reference applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# Strides of encoder level i (= upsampling scales of decoder level i), (depth, height, width);
# levels past the list use (1, 2, 2). The depth axis is halved once only.
LEVEL_STRIDES = [(1, 2, 2), (2, 2, 2), (1, 2, 2)]
LOGVAR_RANGE = (-30.0, 20.0)


def level_stride(i: int) -> tuple[int, int, int]:
    return LEVEL_STRIDES[i] if i < len(LEVEL_STRIDES) else (1, 2, 2)


@dataclass
class Vae3dConfig:
    """The reference constructor's arguments (defaults: its `standard` architecture)."""

    in_channels: int = 4
    out_channels: int = 4
    latent_dim: int = 4
    base_channels: int = 64
    encoder_channel_mult: tuple = (1, 2, 4)
    decoder_channel_mult: tuple = (4, 2, 1)
    num_res_blocks: int = 2
    use_attention: bool = True
    kl_weight: float = 1e-6
    occupied_weight: float = 8.0
    empty_weight: float = 1.0
    channel_weights: tuple | None = (4.0, 0.2, 0.5, 0.2)
    false_positive_weight: float = 0.0
    occupancy_mass_weight: float = 0.0
    dropout: float = 0.0
    use_checkpoint: bool = False
    num_heads: int = 4
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "Vae3dConfig":
        known = set(cls.__dataclass_fields__) - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        cfg = cls(**kw)
        cfg.extra = {k: v for k, v in d.items() if k not in known}
        return cfg


# name -> (base_channels, encoder mult, decoder mult, num_res_blocks, attention); the presets
# set fp 4 / mass 1 on top of the constructor defaults (vramlab's Vae3dConfig::preset).
PRESETS = {
    "ultra_lightweight": (16, (1, 2, 2), (2, 2, 1), 1, False),
    "lightweight": (24, (1, 2, 3), (3, 2, 1), 1, False),
    "base32": (32, (1, 2, 4), (4, 2, 1), 1, False),
    "standard": (64, (1, 2, 4), (4, 2, 1), 2, True),
}


def preset(name: str, **over) -> Vae3dConfig:
    b, enc, dec, nres, attn = PRESETS[name]
    cfg = Vae3dConfig(
        base_channels=b,
        encoder_channel_mult=enc,
        decoder_channel_mult=dec,
        num_res_blocks=nres,
        use_attention=attn,
        false_positive_weight=4.0,
        occupancy_mass_weight=1.0,
    )
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def group_count(channels: int, max_groups: int = 32) -> int:
    """Largest divisor of `channels` that is <= min(max_groups, channels) (vramlab's rule; equal
    to the reference's min(32, C) whenever PyTorch can build that)."""
    g = max(1, min(max_groups, channels))
    while channels % g:
        g -= 1
    return g


class GroupNormF32(nn.GroupNorm):
    """GroupNorm computed in f32, returned in the input's dtype."""

    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


def norm(c: int) -> nn.Module:
    return GroupNormF32(group_count(c), c, eps=1e-5)


def conv(cin: int, cout: int, k: int, stride=1) -> nn.Conv3d:
    return nn.Conv3d(cin, cout, k, stride=stride, padding=k // 2)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, use_checkpoint: bool):
        super().__init__()
        self.norm1 = norm(cin)
        self.conv1 = conv(cin, cout, 3)
        self.norm2 = norm(cout)
        self.conv2 = conv(cout, cout, 3)
        # No parameters (and no keys) when the width is unchanged.
        self.skip = conv(cin, cout, 1) if cin != cout else nn.Identity()
        self.use_checkpoint = use_checkpoint

    def body(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h

    def forward(self, x):
        if self.use_checkpoint and self.training and torch.is_grad_enabled():
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class Down(nn.Module):
    def __init__(self, c: int, stride):
        super().__init__()
        self.conv = conv(c, c, 3, stride)

    def forward(self, x):
        return self.conv(x)


class Up(nn.Module):
    def __init__(self, c: int, scale):
        super().__init__()
        self.conv = conv(c, c, 3)
        self.scale = tuple(float(s) for s in scale)

    def forward(self, x):
        x = F.interpolate(x, scale_factor=self.scale, mode="trilinear", align_corners=False)
        return self.conv(x)


class Attention(nn.Module):
    """Self-attention over all voxels: q, k, v are contiguous C-channel blocks of the 1x1x1
    qkv conv, each split into heads; output channels in (head, head_dim) order."""

    def __init__(self, c: int, heads: int):
        super().__init__()
        self.norm = norm(c)
        self.qkv = conv(c, 3 * c, 1)
        self.proj = conv(c, c, 1)
        self.heads = heads

    def forward(self, x):
        b, c, d, h, w = x.shape
        n, hd = d * h * w, c // self.heads
        qkv = self.qkv(self.norm(x)).reshape(b, 3, self.heads, hd, n).transpose(-1, -2)
        out = F.scaled_dot_product_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2])  # [b, heads, n, hd]
        return x + self.proj(out.transpose(-1, -2).reshape(b, c, d, h, w))


def mid_block(c: int, cfg: Vae3dConfig) -> nn.Sequential:
    return nn.Sequential(
        ResBlock(c, c, cfg.use_checkpoint),
        Attention(c, cfg.num_heads) if cfg.use_attention else nn.Identity(),
        ResBlock(c, c, cfg.use_checkpoint),
    )


class Encoder(nn.Module):
    def __init__(self, cfg: Vae3dConfig):
        super().__init__()
        b, mults = cfg.base_channels, cfg.encoder_channel_mult
        self.conv_in = conv(cfg.in_channels, b, 3)
        self.down_blocks = nn.ModuleList()
        ch = b
        for i, m in enumerate(mults):
            level = nn.ModuleList()
            for _ in range(cfg.num_res_blocks):
                level.append(ResBlock(ch, b * m, cfg.use_checkpoint))
                ch = b * m
            if cfg.use_attention and i == len(mults) - 1:
                level.append(Attention(ch, cfg.num_heads))
            if i + 1 < len(mults):
                level.append(Down(ch, level_stride(i)))
            self.down_blocks.append(level)
        self.mid_block = mid_block(ch, cfg)
        self.norm_out = norm(ch)
        self.conv_out = conv(ch, 2 * cfg.latent_dim, 3)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.down_blocks:
            for layer in level:
                h = layer(h)
        h = self.mid_block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: Vae3dConfig):
        super().__init__()
        b, mults = cfg.base_channels, cfg.decoder_channel_mult
        ch = b * mults[0]
        self.conv_in = conv(cfg.latent_dim, ch, 3)
        self.mid_block = mid_block(ch, cfg)
        self.up_blocks = nn.ModuleList()
        for i, m in enumerate(mults):
            level = nn.ModuleList()
            for _ in range(cfg.num_res_blocks + 1):
                level.append(ResBlock(ch, b * m, cfg.use_checkpoint))
                ch = b * m
            if cfg.use_attention and i == 0:
                level.append(Attention(ch, cfg.num_heads))
            if i + 1 < len(mults):
                level.append(Up(ch, level_stride(i)))
            self.up_blocks.append(level)
        self.norm_out = norm(ch)
        self.conv_out = conv(ch, cfg.out_channels, 3)

    def forward(self, z):
        h = self.mid_block(self.conv_in(z))
        for level in self.up_blocks:
            for layer in level:
                h = layer(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Vae3d(nn.Module):
    def __init__(self, cfg: Vae3dConfig):
        super().__init__()
        if cfg.dropout != 0.0:
            raise ValueError("only dropout 0 is supported (as in vramlab)")
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quant_conv = conv(cfg.latent_dim, cfg.latent_dim, 1)
        self.post_quant_conv = conv(cfg.latent_dim, cfg.latent_dim, 1)

    def forward(self, x, eps: torch.Tensor | None = None):
        """Returns (recon, mean, logvar), all f32. eps=None: z = mean (deterministic);
        otherwise z = mean + exp(logvar / 2) * eps (the reference draws randn_like)."""
        moments = self.encoder(x).float()
        mean, logvar = moments.chunk(2, dim=1)
        logvar = logvar.clamp(*LOGVAR_RANGE)
        z = mean if eps is None else mean + torch.exp(0.5 * logvar) * eps
        # quant_conv is applied after sampling, as the reference's VAE3D.encode does.
        recon = self.decoder(self.post_quant_conv(self.quant_conv(z)))
        return recon.float(), mean, logvar

    def compute_loss(self, x, recon, mean, logvar) -> dict:
        cfg = self.cfg
        x, recon = x.float(), recon.float()
        occ_t, occ_p = x[:, :1], recon[:, :1]
        occupied = (occ_t > 0).float()
        spatial = occupied * (cfg.occupied_weight - cfg.empty_weight) + cfg.empty_weight
        diff = (recon - x).square() * spatial
        denom = spatial.mean().clamp_min(1e-6)
        cw = cfg.channel_weights
        if cw is not None and len(cw) == x.shape[1]:
            diff = diff * torch.tensor(cw, dtype=torch.float32, device=x.device).view(1, -1, 1, 1, 1)
            denom = denom * max(sum(cw) / len(cw), 1e-6)
        recon_loss = diff.mean() / denom
        if cfg.false_positive_weight > 0:
            fp = (F.relu(occ_p - occ_t).square() * (occ_t <= 0).float()).mean()
            recon_loss = recon_loss + cfg.false_positive_weight * fp
        if cfg.occupancy_mass_weight > 0:
            mass = (F.relu(occ_p).mean() - F.relu(occ_t).mean()).abs()
            recon_loss = recon_loss + cfg.occupancy_mass_weight * mass
        kl_loss = -0.5 * (1 + logvar - mean.square() - logvar.exp()).mean()
        return {"loss": recon_loss + cfg.kl_weight * kl_loss, "recon_loss": recon_loss, "kl_loss": kl_loss}


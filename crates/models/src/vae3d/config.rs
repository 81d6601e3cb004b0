//! Configuration of the 3D convolutional VAE.
//!
//! Reference: mlkh21/4D-Radar `diffusion_consistency_radar/cm/vae_3d.py` @ 08c7eb9 — the
//! constructor of `VAE3D` (field names and defaults) and the `create_*_vae_config()` presets.
//!
//! A reference `config.json` is the constructor's keyword arguments plus `"type": "vae3d"`;
//! it deserializes into [`Vae3dConfig`] unchanged. Keys the reference writes but vramlab has no
//! use for (`type`, `use_checkpoint`) are accepted and ignored; any other unknown key is an
//! error that names it.
//!
//! # GroupNorm groups
//! The reference's `normalization(C)` builds `GroupNorm(min(32, C), C)`, which PyTorch rejects
//! when `min(32, C)` does not divide `C` (e.g. 48 channels in the reference's own
//! `lightweight` preset: the reference cannot build it). vramlab uses the largest divisor of
//! `C` that is `<= min(32, C)` instead (48 → 24 groups), see [`crate::nn::group_count`]. For
//! every channel count the reference can build, the two rules agree.

use std::path::Path;

pub use crate::policy::InvalidField;
use crate::policy::{OptimizerKind, OptimizerPreset, TORCH_ADAM_BETAS, TORCH_ADAM_EPS};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Which reconstruction loss [`super::Vae3d::compute_loss`] computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vae3dLossKind {
    /// The reference's `compute_loss(reduction="mean")`: occupancy- and channel-weighted MSE,
    /// false-positive and occupancy-mass terms, plus `kl_weight · KL`.
    #[default]
    Reference,
    /// Plain mean squared error over all elements, plus `kl_weight · KL`.
    Mse,
}


impl Vae3dLossKind {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Constructor arguments of the reference `VAE3D`, plus vramlab's `loss` and `num_heads`.
///
/// Defaults are the reference constructor's defaults (note: `false_positive_weight` and
/// `occupancy_mass_weight` default to 0 there; every preset sets them to 4 and 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct Vae3dConfig {
    /// Channels of the input volume (channel 0 is occupancy for the reference loss).
    pub in_channels: usize,
    /// Channels of the reconstruction (must equal `in_channels` for the loss).
    pub out_channels: usize,
    /// Channels of the latent (the encoder outputs `2 · latent_dim`: mean and logvar).
    pub latent_dim: usize,
    /// Width of the first encoder level; level `i` has `base_channels · channel_mult[i]`.
    pub base_channels: usize,
    /// Encoder width multipliers, one per level. Level `i < last` downsamples with stride
    /// `(1,2,2)`, `(2,2,2)`, then `(1,2,2)` for any further level.
    pub encoder_channel_mult: Vec<usize>,
    /// Decoder width multipliers, one per level; upsampling mirrors the encoder strides.
    pub decoder_channel_mult: Vec<usize>,
    /// Residual blocks per encoder level (the decoder has one more per level).
    pub num_res_blocks: usize,
    /// Self-attention at the encoder's last level, the decoder's first level and in both
    /// mid blocks (the reference's `standard` preset).
    pub use_attention: bool,
    /// β of the KL term.
    pub kl_weight: f64,
    /// Weight of voxels whose occupancy (`x[:, 0]`) is > 0.
    pub occupied_weight: f64,
    /// Weight of empty voxels.
    pub empty_weight: f64,
    /// Per-output-channel weights of the squared error (`None`: unweighted).
    pub channel_weights: Option<Vec<f32>>,
    /// Weight of the squared positive occupancy error on empty voxels.
    pub false_positive_weight: f64,
    /// Weight of `|mean relu(pred occ) − mean relu(target occ)|`.
    pub occupancy_mass_weight: f64,
    /// Dropout in the residual blocks. Only 0 is supported (see [`Vae3dConfig::validate`]).
    pub dropout: f64,
    /// vramlab: which loss to compute (absent from reference configs: `reference`).
    #[serde(skip_serializing_if = "Vae3dLossKind::is_default")]
    pub loss: Vae3dLossKind,
    /// vramlab: attention heads (the reference hard-codes `SelfAttention3D(ch)` → 4).
    #[serde(skip_serializing_if = "is_default_heads")]
    pub num_heads: usize,
}

const DEFAULT_HEADS: usize = 4;

fn is_default_heads(n: &usize) -> bool {
    *n == DEFAULT_HEADS
}

impl Default for Vae3dConfig {
    /// The reference constructor's defaults (its `standard` architecture, fp/mass terms off).
    fn default() -> Self {
        Self {
            in_channels: 4,
            out_channels: 4,
            latent_dim: 4,
            base_channels: 64,
            encoder_channel_mult: vec![1, 2, 4],
            decoder_channel_mult: vec![4, 2, 1],
            num_res_blocks: 2,
            use_attention: true,
            kl_weight: 1e-6,
            occupied_weight: 8.0,
            empty_weight: 1.0,
            channel_weights: Some(vec![4.0, 0.2, 0.5, 0.2]),
            false_positive_weight: 0.0,
            occupancy_mass_weight: 0.0,
            dropout: 0.0,
            loss: Vae3dLossKind::Reference,
            num_heads: DEFAULT_HEADS,
        }
    }
}

/// Keys of a reference `config.json` that are accepted and ignored: the checkpoint's model
/// type tag and the reference's activation-checkpointing switch (vramlab's trainer decides
/// checkpointing itself, through the stage view).
const IGNORED_KEYS: [&str; 2] = ["type", "use_checkpoint"];

// `remote = "Self"` turns the derived impls into inherent functions, so the trait impls
// below can pre-process the map (drop the ignored keys) and still reuse the derive, with
// `deny_unknown_fields` naming any other stray key.
impl Serialize for Vae3dConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Vae3dConfig::serialize(self, s)
    }
}

impl<'de> Deserialize<'de> for Vae3dConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        if let Some(t) = map.get("type")
            && t.as_str() != Some("vae3d")
        {
            return Err(D::Error::custom(format!("field `type`: expected \"vae3d\", found {t}")));
        }
        for key in IGNORED_KEYS {
            map.remove(key);
        }
        Vae3dConfig::deserialize(serde_json::Value::Object(map)).map_err(D::Error::custom)
    }
}

/// Reading this config from a `config.json` (shared by every model config).
pub type Vae3dConfigError = crate::policy::ConfigFileError;

/// One named preset: the architecture columns; loss weights are the reference's for all.
struct Preset {
    name: &'static str,
    base_channels: usize,
    encoder_channel_mult: &'static [usize],
    decoder_channel_mult: &'static [usize],
    num_res_blocks: usize,
    use_attention: bool,
}

/// The presets (parameter counts in the tests). `ultra_lightweight`, `lightweight` and
/// `standard` are the reference's `create_*_vae_config()`; `base32` is the seed report's
/// 7.65M-parameter model.
const PRESETS: &[Preset] = &[
    Preset { name: "ultra_lightweight", base_channels: 16, encoder_channel_mult: &[1, 2, 2], decoder_channel_mult: &[2, 2, 1], num_res_blocks: 1, use_attention: false },
    Preset { name: "lightweight", base_channels: 24, encoder_channel_mult: &[1, 2, 3], decoder_channel_mult: &[3, 2, 1], num_res_blocks: 1, use_attention: false },
    Preset { name: "base32", base_channels: 32, encoder_channel_mult: &[1, 2, 4], decoder_channel_mult: &[4, 2, 1], num_res_blocks: 1, use_attention: false },
    Preset { name: "standard", base_channels: 64, encoder_channel_mult: &[1, 2, 4], decoder_channel_mult: &[4, 2, 1], num_res_blocks: 2, use_attention: true },
];

/// Downsampling strides of encoder level `i` (and upsampling scales of decoder level `i`),
/// as `[depth, height, width]`: the reference's default list `[(1,2,2), (2,2,2), (1,2,2)]`,
/// `(1,2,2)` past its end. The depth (Z) axis of the radar volume is only halved once.
pub fn level_stride(i: usize) -> [usize; 3] {
    const STRIDES: [[usize; 3]; 3] = [[1, 2, 2], [2, 2, 2], [1, 2, 2]];
    STRIDES.get(i).copied().unwrap_or([1, 2, 2])
}

impl Vae3dConfig {
    /// A named preset (see [`Vae3dConfig::preset_names`]), with the reference presets' loss
    /// weights: kl 1e-6, occupied 8, empty 1, channel weights (4, 0.2, 0.5, 0.2), fp 4, mass 1.
    pub fn preset(name: &str) -> Option<Self> {
        let p = PRESETS.iter().find(|p| p.name == name)?;
        Some(Self {
            base_channels: p.base_channels,
            encoder_channel_mult: p.encoder_channel_mult.to_vec(),
            decoder_channel_mult: p.decoder_channel_mult.to_vec(),
            num_res_blocks: p.num_res_blocks,
            use_attention: p.use_attention,
            false_positive_weight: 4.0,
            occupancy_mass_weight: 1.0,
            ..Self::default()
        })
    }

    /// Names accepted by [`Vae3dConfig::preset`], smallest model first.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS.iter().map(|p| p.name).collect()
    }

    /// Channels entering the encoder's mid block (= width of its last level).
    pub fn encoder_out_channels(&self) -> usize {
        self.base_channels * self.encoder_channel_mult.last().copied().unwrap_or(1)
    }

    /// Channels of the decoder's conv_in and mid block (= width of its first level).
    pub fn decoder_in_channels(&self) -> usize {
        self.base_channels * self.decoder_channel_mult.first().copied().unwrap_or(1)
    }

    /// Total spatial reduction `[depth, height, width]` of the encoder.
    pub fn downsample_factor(&self) -> [usize; 3] {
        let mut f = [1; 3];
        for i in 0..self.encoder_channel_mult.len().saturating_sub(1) {
            let s = level_stride(i);
            (0..3).for_each(|a| f[a] *= s[a]);
        }
        f
    }

    /// Check that the config builds a model whose loss is defined.
    pub fn validate(&self) -> Result<(), InvalidField> {
        let bad = |field, msg: String| Err(InvalidField { field, msg });
        for (field, v) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("latent_dim", self.latent_dim),
            ("base_channels", self.base_channels),
            ("num_heads", self.num_heads),
        ] {
            if v == 0 {
                return bad(field, "must be > 0".into());
            }
        }
        if self.in_channels != self.out_channels {
            return bad(
                "out_channels",
                format!("must equal in_channels ({}) for the reconstruction loss, got {}", self.in_channels, self.out_channels),
            );
        }
        for (field, mult) in [("encoder_channel_mult", &self.encoder_channel_mult), ("decoder_channel_mult", &self.decoder_channel_mult)] {
            if mult.is_empty() {
                return bad(field, "must list at least one level".into());
            }
            if mult.contains(&0) {
                return bad(field, format!("multipliers must be > 0, got {mult:?}"));
            }
        }
        if let Some(cw) = &self.channel_weights {
            if cw.len() != self.out_channels {
                return bad("channel_weights", format!("has {} entries, out_channels is {}", cw.len(), self.out_channels));
            }
            if cw.iter().any(|w| !w.is_finite() || *w < 0.0) {
                return bad("channel_weights", format!("must be finite and >= 0, got {cw:?}"));
            }
        }
        for (field, w) in [
            ("kl_weight", self.kl_weight),
            ("occupied_weight", self.occupied_weight),
            ("empty_weight", self.empty_weight),
            ("false_positive_weight", self.false_positive_weight),
            ("occupancy_mass_weight", self.occupancy_mass_weight),
        ] {
            if !w.is_finite() || w < 0.0 {
                return bad(field, format!("must be finite and >= 0, got {w}"));
            }
        }
        if self.dropout != 0.0 {
            // Recomputing a stage for gradient checkpointing would draw a different dropout
            // mask than the forward did; every reference preset uses 0.
            return bad("dropout", format!("only 0 is supported, got {}", self.dropout));
        }
        if self.use_attention {
            // Attention sits at the encoder's last width and the decoder's first width.
            for c in [self.encoder_out_channels(), self.decoder_in_channels()] {
                if c % self.num_heads != 0 {
                    return bad("num_heads", format!("{} heads do not divide the {c} attention channels", self.num_heads));
                }
            }
        }
        Ok(())
    }

    /// Parse a config from JSON text (the reference `config.json` format) and validate it.
    pub fn from_json_str(text: &str) -> Result<Self, serde_json::Error> {
        let cfg: Self = serde_json::from_str(text)?;
        cfg.validate().map_err(serde_json::Error::custom)?;
        Ok(cfg)
    }

    /// Read and validate a reference-format `config.json`.
    pub fn from_json_file(path: &Path) -> Result<Self, Vae3dConfigError> {
        crate::policy::read_config(path, Self::validate)
    }

    /// The reference-format JSON: `"type": "vae3d"`, the constructor arguments, and
    /// `"use_checkpoint": false`. vramlab's `loss` / `num_heads` appear only when they differ
    /// from their defaults, so a reference-compatible model writes only reference keys.
    pub fn to_reference_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("type".into(), "vae3d".into());
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) {
            map.extend(fields);
        }
        map.insert("use_checkpoint".into(), false.into());
        serde_json::Value::Object(map)
    }

    /// The 4D-Radar training script's optimizer: AdamW, lr 1e-4, no weight decay, no gradient
    /// clipping, constant learning rate.
    pub fn optimizer_preset(&self) -> OptimizerPreset {
        OptimizerPreset {
            kind: OptimizerKind::AdamW,
            lr: 1e-4,
            betas: TORCH_ADAM_BETAS,
            eps: TORCH_ADAM_EPS,
            weight_decay: 0.0,
            grad_clip_norm: None,
            scheduler: None,
            backbone: None,
        }
    }

    /// Number of parameters of the model this config builds, in closed form (the tests check
    /// it against [`Vae3dConfig::init`]).
    pub fn num_params(&self) -> usize {
        let conv = |cin: usize, cout: usize, k: usize| cout * cin * k * k * k + cout;
        let norm = |c: usize| 2 * c;
        let res = |cin: usize, cout: usize| {
            norm(cin) + conv(cin, cout, 3) + norm(cout) + conv(cout, cout, 3) + if cin != cout { conv(cin, cout, 1) } else { 0 }
        };
        let attn = |c: usize| norm(c) + conv(c, 3 * c, 1) + conv(c, c, 1);
        let mid = |c: usize| 2 * res(c, c) + if self.use_attention { attn(c) } else { 0 };

        // Encoder.
        let b = self.base_channels;
        let mut n = conv(self.in_channels, b, 3);
        let mut ch = b;
        let levels = self.encoder_channel_mult.len();
        for (i, m) in self.encoder_channel_mult.iter().enumerate() {
            for _ in 0..self.num_res_blocks {
                n += res(ch, b * m);
                ch = b * m;
            }
            if self.use_attention && i == levels - 1 {
                n += attn(ch);
            }
            if i + 1 < levels {
                n += conv(ch, ch, 3);
            }
        }
        n += mid(ch) + norm(ch) + conv(ch, 2 * self.latent_dim, 3);

        // quant_conv, post_quant_conv.
        n += 2 * conv(self.latent_dim, self.latent_dim, 1);

        // Decoder.
        let mut ch = self.decoder_in_channels();
        n += conv(self.latent_dim, ch, 3) + mid(ch);
        let levels = self.decoder_channel_mult.len();
        for (i, m) in self.decoder_channel_mult.iter().enumerate() {
            for _ in 0..self.num_res_blocks + 1 {
                n += res(ch, b * m);
                ch = b * m;
            }
            if self.use_attention && i == 0 {
                n += attn(ch);
            }
            if i + 1 < levels {
                n += conv(ch, ch, 3);
            }
        }
        n + norm(ch) + conv(ch, self.out_channels, 3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_listed() {
        let names = Vae3dConfig::preset_names();
        assert_eq!(names, ["ultra_lightweight", "lightweight", "base32", "standard"]);
        for n in names {
            let c = Vae3dConfig::preset(n).unwrap();
            c.validate().unwrap();
            assert_eq!(c.false_positive_weight, 4.0);
            assert_eq!(c.occupancy_mass_weight, 1.0);
        }
        assert!(Vae3dConfig::preset("huge").is_none());
    }

    #[test]
    fn closed_form_counts() {
        let count = |n| Vae3dConfig::preset(n).unwrap().num_params();
        assert_eq!(count("ultra_lightweight"), 694_788);
        assert_eq!(count("lightweight"), 2_717_716);
        assert_eq!(count("base32"), 7_652_628);
        assert_eq!(count("standard"), 40_847_092);
    }

    #[test]
    fn reference_json_round_trip_and_ignored_keys() {
        let c = Vae3dConfig::preset("lightweight").unwrap();
        let v = c.to_reference_json();
        assert_eq!(v["type"], "vae3d");
        assert_eq!(v["use_checkpoint"], false);
        assert!(v.get("loss").is_none() && v.get("num_heads").is_none(), "vramlab defaults are not written: {v}");
        let back = Vae3dConfig::from_json_str(&v.to_string()).unwrap();
        assert_eq!(back, c);

        let mse = Vae3dConfig { loss: Vae3dLossKind::Mse, num_heads: 2, ..c };
        let v = mse.to_reference_json();
        assert_eq!(v["loss"], "mse");
        assert_eq!(Vae3dConfig::from_json_str(&v.to_string()).unwrap(), mse);
    }

    #[test]
    fn unknown_and_wrong_keys_are_named() {
        let e = Vae3dConfig::from_json_str(r#"{"type":"vae3d","base_chanels":16}"#).unwrap_err().to_string();
        assert!(e.contains("base_chanels"), "{e}");
        let e = Vae3dConfig::from_json_str(r#"{"type":"act"}"#).unwrap_err().to_string();
        assert!(e.contains("type"), "{e}");
        let e = Vae3dConfig::from_json_str(r#"{"num_res_blocks":"two"}"#).unwrap_err().to_string();
        assert!(e.contains("invalid type"), "{e}");
        // Missing keys take the reference constructor's defaults.
        let c = Vae3dConfig::from_json_str(r#"{"use_checkpoint":true,"base_channels":32}"#).unwrap();
        assert_eq!(c, Vae3dConfig { base_channels: 32, ..Vae3dConfig::default() });
    }

    #[test]
    fn validate_names_the_field() {
        let base = Vae3dConfig::preset("ultra_lightweight").unwrap();
        let field = |c: Vae3dConfig| c.validate().unwrap_err().field;
        assert_eq!(field(Vae3dConfig { encoder_channel_mult: vec![], ..base.clone() }), "encoder_channel_mult");
        assert_eq!(field(Vae3dConfig { decoder_channel_mult: vec![1, 0], ..base.clone() }), "decoder_channel_mult");
        assert_eq!(field(Vae3dConfig { base_channels: 0, ..base.clone() }), "base_channels");
        assert_eq!(field(Vae3dConfig { channel_weights: Some(vec![1.0; 3]), ..base.clone() }), "channel_weights");
        assert_eq!(field(Vae3dConfig { out_channels: 3, channel_weights: None, ..base.clone() }), "out_channels");
        assert_eq!(field(Vae3dConfig { dropout: 0.1, ..base.clone() }), "dropout");
        assert_eq!(field(Vae3dConfig { use_attention: true, num_heads: 3, ..base.clone() }), "num_heads");
        assert_eq!(field(Vae3dConfig { kl_weight: f64::NAN, ..base }), "kl_weight");
    }

    #[test]
    fn downsample_factor_follows_reference_strides() {
        assert_eq!(Vae3dConfig::default().downsample_factor(), [2, 4, 4]);
        let four = Vae3dConfig { encoder_channel_mult: vec![1, 1, 1, 1], ..Vae3dConfig::default() };
        assert_eq!(four.downsample_factor(), [2, 8, 8]);
    }
}

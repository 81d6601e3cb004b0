//! The 3D convolutional VAE of the 4D-Radar project (mlkh21/4D-Radar
//! `diffusion_consistency_radar/cm/vae_3d.py` @ 08c7eb9), natively in Burn.
//!
//! - [`config`]: [`Vae3dConfig`] — reference constructor arguments, presets, validation,
//!   reference `config.json` I/O.
//! - [`model`]: [`Vae3d`] — encoder / decoder with reference parameter names, mixed
//!   precision, the reference loss; its forward is a fold over typed stages ([`Vae3dStage`]).
//! - [`load`]: [`load_pretrained`] / [`save_pretrained`] — checkpoint directories.

pub mod config;
pub mod graph;
pub mod torch_graph;
pub mod load;
pub mod model;

pub use config::{InvalidField, Vae3dConfig, Vae3dConfigError, Vae3dLossKind, level_stride};
pub use load::{Vae3dLoadError, load_pretrained, load_weights, save_pretrained};
pub use model::{
    Downsample3d, ResBlock3d, SelfAttention3d, Upsample3d, Vae3d, Vae3dDecoder, Vae3dEncoder, Vae3dInput, Vae3dLoss,
    Vae3dOutput, Vae3dStage, Vae3dState, VaeLayer, mean_all, split_moments, upsample_trilinear,
};

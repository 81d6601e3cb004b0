# The kernel-accounting rows' training arguments (sourced by kernels.sh and ab_wgpu.sh, so an
# A/B runs exactly the table's row): `vae` VAE ultra b2 8×32×32, `act` ACT b8 1 camera 96×96
# chunk 100, `dif` Diffusion b8 96×96 crop 84.
# shellcheck disable=SC2034  # used by the scripts that source this file
act=(--policy.type=act --policy.pretrained_backbone_weights=null --dataset.type=random --dataset.num_scenes=8
     --policy.state_dim=14 --policy.action_dim=14 --policy.camera_shape=3,96,96 --policy.num_cameras=1
     --policy.chunk_size=100 --policy.n_action_steps=100 --batch_size=8)
dif=(--policy.type=diffusion --dataset.type=random --dataset.num_scenes=8 --policy.state_dim=2 --policy.action_dim=2
     --policy.camera_shape=3,96,96 --policy.crop_shape=84,84 --policy.horizon=16 --batch_size=8)
vae=(--config=configs/vae3d_ultra.toml --policy.preset=ultra_lightweight --dataset.grid=8,32,32 --dataset.num_scenes=8 --batch_size=2)

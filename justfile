# vramlab recipes. `just` is optional: every recipe is a plain cargo command
# (install it with `cargo install just`).

# Build the release binary (default backend: flex, the pure-Rust CPU backend).
build features="flex":
    cargo build --release --no-default-features --features {{features}}

# The README's test command.
test:
    cargo test

# Everything CI runs (tests + wgpu-on-lavapipe smoke test).
ci:
    bash .ci/run

# Train (the README's main job by default). Extra flags: just train --steps=20
train config="configs/vae3d_ultra.toml" *flags="":
    cargo run --release -- train --config {{config}} {{flags}}

# Parameter counts and static bytes of a config.
info config="configs/vae3d_ultra.toml" *flags="":
    cargo run --release -- info --config {{config}} {{flags}}

# A sweep grid, e.g. just sweep configs/vae3d_ultra.toml --sweep.batch_size=1,2,4
sweep config *flags:
    cargo run --release -- sweep --config {{config}} {{flags}}

# The committed flex VAE report (benches/results/vae3d_flex/).
bench-vae3d:
    bash benches/vae3d_flex.sh

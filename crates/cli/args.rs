//! The command line, by clap: subcommands, `--help` per subcommand, shell completions. Config
//! fields with a dot (`--policy.chunk_size=50`, `--dataset.root DIR`) are lerobot-style
//! overrides of the config tree: they are taken out before clap sees the rest, and the config
//! loader names the valid fields on a typo. Top-level run flags are clap arguments (so clap
//! suggests `--batch_size` for `--batchsize`) and become overrides too.
//!
//! Every clap type of the binary is here; `commands/` only reads them.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use serde::Serialize;

/// Memory-instrumented training on Burn: ACT, Diffusion Policy and the 4D-Radar 3D-VAE.
#[derive(Parser, Debug)]
#[command(name = "vramlab", version, after_help = OVERRIDES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Dotted config overrides (`--policy.chunk_size=50`), in command-line order.
    #[arg(skip)]
    pub overrides: Vec<(String, String)>,
}

const OVERRIDES_HELP: &str = "\
Any config field can be set as --a.b.c=value (lists: 1,2,4), e.g. --policy.type=act \
--policy.chunk_size=50 --dataset.root=DIR --optimizer.lr=1e-4. Unknown names are errors that \
list the valid ones.";

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a workload, measuring memory every step (metrics.jsonl, summary.md, checkpoints).
    #[command(after_help = OVERRIDES_HELP)]
    Train(RunArgs),
    /// One training step of a config in a scratch directory (removed after): fills the GPU
    /// backends' kernel and autotune caches so the real run's first step is fast.
    #[command(after_help = OVERRIDES_HELP)]
    Warmup(RunArgs),
    /// Check the memory probe of a backend against a known allocation pattern (device buffers
    /// whose true high-water mark is known): exact / lower-bound / upper-bound, per figure.
    ProbeCheck(RunArgs),
    /// Parameter counts per module and static bytes of a config, without training.
    #[command(after_help = OVERRIDES_HELP)]
    Info(RunArgs),
    /// Peak training memory predicted from shapes alone (no allocation): parameters,
    /// gradients, optimizer state, stored activations per module, workspace, and the phase.
    #[command(after_help = OVERRIDES_HELP)]
    Estimate(EstimateArgs),
    /// A grid of measured runs (--sweep.<field>=v1,v2,…), one process each → CSV + markdown.
    #[command(after_help = OVERRIDES_HELP)]
    Sweep(RunArgs),
    /// The largest batch and the fastest settings that fit a memory budget, by short measured
    /// runs (each capped at the budget on the CPU backend); recommends a command line.
    #[command(after_help = OVERRIDES_HELP)]
    Fit(FitArgs),
    /// Run a checkpoint on model-level inputs and write the outputs (port parity checks).
    Predict(PredictArgs),
    /// Per-call select_action latency of a policy checkpoint at a fixed rate (p50/p95/p99/max).
    BenchInference(BenchInferenceArgs),
    /// LeRobot datasets: inspect, benchmark the loader, record the built-in demonstrations.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The run config: a TOML file, the top-level flags below, and dotted overrides.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML config file, or lerobot's `train_config.json` (lerobot's name `--config_path` works
    /// too).
    #[arg(long, visible_alias = "config_path", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub flags: RunFlags,
}

/// Top-level config fields as flags (each is the config field of the same name).
#[derive(Args, Debug, Default, Serialize)]
pub struct RunFlags {
    /// Samples per micro-batch [default: 8].
    #[arg(long = "batch_size", value_name = "N")]
    batch_size: Option<String>,
    /// Optimizer steps [default: 100].
    #[arg(long, value_name = "N")]
    steps: Option<String>,
    /// Micro-batches per optimizer step [default: 1].
    #[arg(long = "grad_accum_steps", value_name = "N")]
    grad_accum_steps: Option<String>,
    /// Run directory [default: runs/<job_name or policy>-<UTC time>].
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: Option<String>,
    #[arg(long = "job_name", value_name = "NAME")]
    job_name: Option<String>,
    /// flex (CPU, default), wgpu or cuda — those compiled into this binary (without flex, the
    /// default is the one it was built for: cuda, else wgpu).
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// GPU index for wgpu / cuda [default: 0].
    #[arg(long, value_name = "N")]
    device: Option<String>,
    /// wgpu/cuda: CubeCL autotune effort: minimal, balanced (CubeCL's default), extensive, full.
    #[arg(long, value_name = "LEVEL")]
    autotune: Option<String>,
    /// wgpu/cuda: compiled-kernel and autotune cache [default: $VRAMLAB_CACHE_DIR, else
    /// $XDG_CACHE_HOME/vramlab/cubecl, else ~/.cache/vramlab/cubecl].
    #[arg(long = "kernel_cache_dir", value_name = "DIR")]
    kernel_cache_dir: Option<String>,
    /// wgpu/cuda: autotune matrix products too (Burn's search per shape) instead of one fixed
    /// kernel [default: false].
    #[arg(long = "matmul_autotune", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    matmul_autotune: Option<String>,
    /// wgpu/cuda: Burn's full autotune search for the convolutions instead of a short one over
    /// the kernels that win on a GPU (none without matrix units) [default: false].
    #[arg(long = "conv_full_autotune", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    conv_full_autotune: Option<String>,
    /// wgpu/cuda: device memory as buffers of each tensor's exact size (`exact`, cuda's default)
    /// or CubeCL's pages, sized by the device's memory (`pages`, wgpu's default).
    #[arg(long = "gpu_memory_pool", value_name = "exact|pages")]
    gpu_memory_pool: Option<String>,
    /// f32 (default), bf16 or f16: compute precision (weights stay f32).
    #[arg(long, value_name = "P")]
    precision: Option<String>,
    /// off (default), blocks (= true) or balanced.
    #[arg(long = "gradient_checkpointing", value_name = "MODE")]
    gradient_checkpointing: Option<String>,
    #[arg(long, value_name = "N")]
    seed: Option<String>,
    /// Continue the run in --output_dir from its latest checkpoint.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    resume: Option<String>,
    /// Checkpoint every N steps (0 = only at the end).
    #[arg(long = "save_freq", value_name = "N")]
    save_freq: Option<String>,
    /// Write checkpoints (lerobot's `save_checkpoint`) [default: true]; false measures only.
    #[arg(long = "save_checkpoint", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    save_checkpoint: Option<String>,
    /// Record every allocation and free during these steps (e.g. 3 or 3,4) and export each as
    /// a snapshot for https://pytorch.org/memory_viz (memory_timeline/step_<N>.pickle).
    #[arg(long = "memory_timeline", value_name = "STEPS")]
    memory_timeline: Option<String>,
    /// Leave blocks smaller than this out of the timeline file (not out of its peak) [default: 0].
    #[arg(long = "memory_timeline_min_bytes", value_name = "BYTES")]
    memory_timeline_min_bytes: Option<String>,
    /// A log line every N steps besides the progress bar.
    #[arg(long = "log_freq", value_name = "N")]
    log_freq: Option<String>,
    /// Loader worker threads [default: 2].
    #[arg(long = "num_workers", value_name = "N")]
    num_workers: Option<String>,
    /// Batches in flight per worker [default: 2].
    #[arg(long = "prefetch_factor", value_name = "N")]
    prefetch_factor: Option<String>,
    /// Keep loader workers across epochs.
    #[arg(long = "persistent_workers", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    persistent_workers: Option<String>,
}

impl RunFlags {
    /// The flags given, as `(field, value)` overrides.
    pub fn overrides(&self) -> Vec<(String, String)> {
        let serde_json::Value::Object(map) = serde_json::to_value(self).unwrap_or_default() else { return Vec::new() };
        map.into_iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string()))).collect()
    }
}

/// `vramlab estimate`: the run flags and the runtime to predict.
#[derive(Args, Debug)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The runtime to predict: `vramlab` (this backend's own peak) or `pytorch-cuda` (PyTorch
    /// eager on CUDA: max_memory_allocated, max_memory_reserved, nvidia-smi).
    #[arg(long, value_name = "NAME", default_value = "vramlab")]
    pub target: String,
}

#[derive(Args, Debug)]
pub struct FitArgs {
    /// The memory to fit in: 24GiB, 1.5GiB, 512MiB, 16GB (GiB/MiB binary, GB/MB decimal).
    #[arg(long, value_name = "BYTES")]
    pub budget: String,
    /// Steps per trial: the first pays one-time costs, the median of the rest is the speed.
    #[arg(long = "trial_steps", value_name = "N", default_value_t = 3)]
    pub trial_steps: u64,
    /// Upper end of the largest-batch search.
    #[arg(long = "max_batch", value_name = "N", default_value_t = 1024)]
    pub max_batch: u64,
    /// Candidates the estimator puts above this many budgets are not run (0 = run all).
    #[arg(long, value_name = "FACTOR", default_value_t = 1.25)]
    pub prune: f64,
    /// `pytorch-cuda`: the largest batch PyTorch eager fits in the budget, predicted (nothing
    /// runs); `vramlab` (default): measured trials on this backend.
    #[arg(long, value_name = "NAME", default_value = "vramlab")]
    pub target: String,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// A checkpoint directory (vramlab's `checkpoints/<step>/` or lerobot's `pretrained_model/`).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Model-level inputs (safetensors, the fixture's tensor names).
    #[arg(long, value_name = "FILE")]
    pub inputs: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args, Debug)]
pub struct BenchInferenceArgs {
    /// A policy `pretrained_model/` dir (config.json + model.safetensors), a checkpoint dir
    /// holding one (vramlab's `checkpoints/<step>/`), or a run's `checkpoints/` (its `last`).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// Control rate: one `select_action` call per 1/fps seconds (the frame budget).
    #[arg(long, default_value_t = 30.0)]
    pub fps: f64,
    /// Measured calls per mode.
    #[arg(long, default_value_t = 300)]
    pub calls: usize,
    /// Calls before the measured ones, excluded (then the policy is reset).
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// both: ACT's action queue and temporal ensembling (Diffusion: queue only).
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    /// Queue mode's actions per model call [default: the checkpoint's].
    #[arg(long = "n_action_steps", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub n_action_steps: Option<u64>,
    /// ACT ensembling weight decay wᵢ = exp(−coeff·i) [default: the checkpoint's, else 0.01];
    /// ensembling runs with n_action_steps = 1, as lerobot requires.
    #[arg(long = "temporal_ensemble_coeff", value_name = "C")]
    pub temporal_ensemble_coeff: Option<f64>,
    /// flex (CPU, default), wgpu or cuda — those compiled into this binary (without flex, the
    /// default is the one it was built for: cuda, else wgpu).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// GPU index for wgpu / cuda [default: 0].
    #[arg(long, value_name = "N")]
    pub device: Option<String>,
    /// f32 (default), bf16 or f16: compute precision.
    #[arg(long, value_name = "P")]
    pub precision: Option<String>,
    /// Seed of the synthetic cameras, states and diffusion noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write `latency.jsonl` (one line per call) and `summary.md` here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    Both,
    Queue,
    Ensemble,
}

#[derive(Subcommand, Debug)]
pub enum DatasetCommand {
    /// What a LeRobot v2.1 / v3.0 dataset holds.
    Info { path: PathBuf },
    /// Loader throughput per worker count, and sequential video decode.
    Bench {
        path: PathBuf,
        /// Samples per worker setting.
        #[arg(long, default_value_t = 96)]
        samples: usize,
        /// Worker counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
        workers: Vec<usize>,
        #[arg(long = "batch_size", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        batch_size: u64,
    },
    /// Record the built-in push demonstrations as a LeRobot v3.0 dataset.
    Generate {
        path: PathBuf,
        #[arg(long, default_value_t = 20)]
        episodes: usize,
        /// Camera size in pixels (square).
        #[arg(long = "image_size", default_value_t = 96)]
        image_size: usize,
    },
}

/// `--a.b=v` / `--a.b v`: a dotted override, split into key and value.
fn dotted(arg: &str) -> Option<(String, Option<String>)> {
    let flag = arg.strip_prefix("--")?;
    let (key, value) = match flag.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (flag, None),
    };
    key.contains('.').then(|| (key.to_string(), value))
}

/// Parse the command line: dotted overrides out first, the rest by clap.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let mut rest = Vec::new();
    let mut overrides = Vec::new();
    let mut it = args.into_iter().peekable();
    while let Some(arg) = it.next() {
        match arg.to_str().and_then(dotted) {
            Some((key, Some(value))) => overrides.push((key, value)),
            Some((key, None)) => {
                // A bare dotted flag is a boolean switch, unless a value follows.
                let value = match it.peek().and_then(|n| n.to_str()) {
                    Some(next) if !next.starts_with("--") => it.next().and_then(|v| v.into_string().ok()).unwrap_or_default(),
                    _ => "true".to_string(),
                };
                overrides.push((key, value));
            }
            None => rest.push(arg),
        }
    }
    let mut cli = Cli::try_parse_from(rest)?;
    if !overrides.is_empty() && !matches!(cli.command, Command::Train(_) | Command::Warmup(_) | Command::Info(_) | Command::Estimate(_) | Command::Sweep(_) | Command::Fit(_) | Command::Predict(_)) {
        let (key, _) = &overrides[0];
        return Err(Cli::command().error(clap::error::ErrorKind::UnknownArgument, format!("--{key}: this command takes no config fields")));
    }
    cli.overrides = overrides;
    Ok(cli)
}

/// Write the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut Cli::command(), "vramlab", &mut std::io::stdout());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Cli, clap::Error> {
        parse(std::iter::once("vramlab").chain(args.iter().copied()).map(OsString::from))
    }

    #[test]
    fn dotted_overrides_and_run_flags_both_become_overrides() {
        let cli = parse_str(&["train", "--policy.type=act", "--steps=3", "--dataset.root", "/d", "--resume", "--policy.use_vae"]).unwrap();
        let Command::Train(run) = &cli.command else { panic!("{cli:?}") };
        assert_eq!(cli.overrides, vec![("policy.type".into(), "act".into()), ("dataset.root".into(), "/d".into()), ("policy.use_vae".into(), "true".into())]);
        let flags = run.flags.overrides();
        assert!(flags.contains(&("steps".into(), "3".into())) && flags.contains(&("resume".into(), "true".into())), "{flags:?}");
    }

    #[test]
    fn a_typo_in_a_run_flag_suggests_the_name() {
        let err = parse_str(&["train", "--batchsize=2"]).unwrap_err().to_string();
        assert!(err.contains("--batchsize") && err.contains("--batch_size"), "{err}");
    }

    #[test]
    fn help_and_completions_cover_every_subcommand() {
        Cli::command().debug_assert();
        let mut buf = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut Cli::command(), "vramlab", &mut buf);
        let script = String::from_utf8(buf).unwrap();
        for word in ["train", "info", "sweep", "predict", "bench-inference", "dataset", "--batch_size", "--gradient_checkpointing"] {
            assert!(script.contains(word), "{word}");
        }
    }
}

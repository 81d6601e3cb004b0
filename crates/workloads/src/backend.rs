//! The one place where backends are chosen. Everything else is generic over `B`.
//!
//! Each backend comes in two autodiff flavours: plain, and Burn's `BalancedCheckpointing`
//! (for `--gradient_checkpointing=balanced`). Each has a memory probe: the counting allocator
//! on CPU, CubeCL's per-stream memory statistics on wgpu/cuda, which also counts kernels
//! (launches, compilations, autotune searches: [`vramlab_probe::kernels`]; set
//! `VRAMLAB_KERNEL_ACCOUNTING=off` to leave CubeCL's loggers as configured, `=time` to time every
//! kernel as well, which slows the step: see [`vramlab_probe::kernels`]).

use std::fmt;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::prelude::Backend;
use burn::tensor::DType;
use burn::tensor::backend::AutodiffBackend;
use vramlab_models::nn::{LeanBackend, Precision};
use vramlab_train::OptimKernels;
use vramlab_probe::MemoryProbe;
use vramlab_train::CheckpointMode;

use crate::{Result, WorkloadError};

/// `--backend`: which Burn backend runs the job (`cpu` is `flex`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    #[serde(alias = "cpu")]
    Flex,
    Wgpu,
    Cuda,
}

impl Default for BackendKind {
    /// flex where this binary has it (every default build); in a build without it, the GPU
    /// backend it was built for (cuda before wgpu), so `cargo build --no-default-features
    /// --features cuda` trains on CUDA without `--backend=cuda`.
    fn default() -> Self {
        [Self::Flex, Self::Cuda, Self::Wgpu].into_iter().find(|kind| kind.compiled().is_ok()).unwrap_or(Self::Flex)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        })
    }
}

/// Backends compiled into this binary.
pub fn compiled() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "flex") {
        v.push("flex");
    }
    if cfg!(feature = "wgpu") {
        v.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    v
}

impl BackendKind {
    /// This backend, or an error when it is not compiled into this binary.
    pub fn compiled(self) -> Result<Self> {
        if !compiled().contains(&self.to_string().as_str()) {
            return Err(WorkloadError::Backend(format!(
                "--backend={self}: not compiled into this binary (compiled: {}); rebuild with `--features {self}`",
                compiled().join(", ")
            )));
        }
        Ok(self)
    }
}

/// `--autotune`: how hard CubeCL searches kernel variants on first use of a shape (wgpu, cuda).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutotuneLevel {
    Minimal,
    Balanced,
    Extensive,
    Full,
}

impl AutotuneLevel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Balanced => "balanced",
            Self::Extensive => "extensive",
            Self::Full => "full",
        }
    }
}

/// `--gpu_memory_pool`: how CubeCL keeps device memory (wgpu, cuda). Either way nothing is given
/// back during a run, so the reserved peak stays exact.
///
/// - `pages`: CubeCL's default pools (`SubSlices`): tensors are slices of pages whose sizes
///   follow the device's memory (a quarter of it, then quarters of that, down to ~32 MiB). On an
///   H100 80 GB a tensor of 5–40 MB takes its place in a 318.6 MiB page, on an H200 one of
///   9–70 MB in a 561.6 MiB page; a small model reserves a page per size class
///   (VAE ultra b2 on the H100: 103 MiB reserved against PyTorch's 60). cuda cannot be given
///   other pools (cubecl-cuda 0.10 builds its server with `RuntimeOptions::default()`).
/// - `exact`: every buffer its tensor's exact size (CubeCL's persistent pool, `persistent_memory
///   = "enforced"`), reused by later tensors of the same size: reserved does not depend on the
///   device's size. For a run whose shapes repeat every step (vramlab's batches always have
///   `batch_size` rows); shapes that change would each keep buffers of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMemoryPool {
    Pages,
    Exact,
}

impl GpuMemoryPool {
    /// The pool a backend takes when `--gpu_memory_pool` is not given: `exact` on cuda (pages
    /// sized by the card: see the type's docs), `pages` on wgpu (on lavapipe, CI's device, pages
    /// reserved 5–6 % less than exact sizes: `benches/results/kernels/wgpu/memory_pool.md`).
    pub fn default_for(backend: BackendKind) -> Self {
        if backend == BackendKind::Cuda { Self::Exact } else { Self::Pages }
    }
}

/// CubeCL's on-disk caches and autotune effort for the GPU backends (one setting per process:
/// CubeCL's configuration is global).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// Where compiled kernels (CUDA PTX) and autotune results are kept; `None`:
    /// `$VRAMLAB_CACHE_DIR`, else `$XDG_CACHE_HOME/vramlab/cubecl`, else `~/.cache/vramlab/cubecl`.
    pub kernel_cache_dir: Option<std::path::PathBuf>,
    /// `None`: a `cubecl.toml` or `CUBECL_AUTOTUNE_LEVEL` if set, else CubeCL's `balanced`.
    pub autotune: Option<AutotuneLevel>,
    /// Matrix products autotuned as Burn's (true) or one fixed kernel each (false, default):
    /// `vramlab_models::nn::cube::matmul`.
    pub matmul_autotune: bool,
    /// Convolutions searched as Burn's (true) or over the few kernels of
    /// `vramlab_models::nn::cube::conv` (false, default).
    pub conv_full_autotune: bool,
    /// `None`: [`GpuMemoryPool::default_for`] the backend, unless a `cubecl.toml` enforces
    /// persistent memory (then `exact`).
    pub memory_pool: Option<GpuMemoryPool>,
}

impl GpuOptions {
    /// The cache directory these options name, with the per-user default.
    pub fn cache_dir(&self) -> std::path::PathBuf {
        use std::path::PathBuf;
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        self.kernel_cache_dir
            .clone()
            .or_else(|| env("VRAMLAB_CACHE_DIR"))
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("vramlab/cubecl")))
            .or_else(|| env("HOME").map(|h| h.join(".cache/vramlab/cubecl")))
            .unwrap_or_else(|| PathBuf::from(".vramlab-cache/cubecl"))
    }
}

/// This executable's identity for the compiled-kernel cache: a hash of its own bytes (hex), or
/// `unknown-build` when it cannot be read. CubeCL 0.10 keys a cached PTX kernel by the kernel's
/// type name, launch settings and compile-time arguments, not by its body
/// (`cubecl_runtime::id::KernelId::stable_hash`): a rebuilt binary whose kernel changed would
/// load the old PTX. One cache folder per build rules that out.
pub fn build_id() -> String {
    use std::hash::Hasher as _;
    use std::io::Read as _;
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let hash = || -> std::io::Result<u64> {
            let mut f = std::fs::File::open(std::env::current_exe()?)?;
            // SipHash with fixed keys: the same bytes give the same id in every process.
            let mut h = std::hash::DefaultHasher::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.write(&buf[..n]);
            }
            Ok(h.finish())
        };
        hash().map_or_else(|_| "unknown-build".into(), |h| format!("{h:016x}"))
    })
    .clone()
}

/// Where compiled kernels go under a cache directory: one folder per build ([`build_id`]);
/// autotune results stay in the directory itself (they name candidates, not code).
pub fn compiled_kernel_dir(cache_dir: &std::path::Path, build: &str) -> std::path::PathBuf {
    cache_dir.join("kernels").join(build)
}

/// Point CubeCL's kernel and autotune caches at [`GpuOptions::cache_dir`] and set the autotune
/// level, before the first device is created; returns the line to print. A `cubecl.toml` (or
/// `[cubecl]` in `burn.toml`) and the `CUBECL_*` variables still apply; these options win where
/// given, and the cache directory replaces only CubeCL's defaults (no kernel cache; autotune
/// results under `target/`). Once CubeCL has read its configuration it cannot change: later
/// calls in the same process report what is in force.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn configure_cubecl(opts: &GpuOptions, backend: BackendKind) -> Result<String> {
    use burn::cubecl::config::autotune::AutotuneLevel as L;
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::memory::PersistentMemory;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let describe = |c: &CubeClRuntimeConfig| {
        let root = |c: &CacheConfig| c.root().display().to_string();
        let level = match c.autotune.level {
            L::Minimal => "minimal",
            L::Balanced => "balanced",
            L::Extensive => "extensive",
            L::Full => "full",
        };
        let kernels = c.compilation.cache.as_ref().map_or("off".to_string(), root);
        let tune = if cfg!(feature = "autotune") { format!("autotune level {level}") } else { "autotune off (built without Burn's `autotune`: each op's default kernel)".into() };
        let matmul = if opts.matmul_autotune { "matmul autotuned (--matmul_autotune)" } else { "matmul one fixed kernel (--matmul_autotune=false)" };
        let conv = if opts.conv_full_autotune { "convolutions: Burn's full search (--conv_full_autotune)" } else { "convolutions: short search (--conv_full_autotune=false)" };
        let pool = if matches!(c.memory.persistent_memory, PersistentMemory::Enforced) { "memory pool: exact sizes (--gpu_memory_pool=exact)" } else { "memory pool: CubeCL's pages (--gpu_memory_pool=pages)" };
        format!("CubeCL caches: compiled kernels {kernels} (CUDA PTX; wgpu's WGSL kernels are not cached), autotune {}; {tune}; {matmul}; {conv}; {pool}", root(&c.autotune.cache))
    };
    vramlab_models::nn::cube::set_matmul_autotune(opts.matmul_autotune);
    vramlab_models::nn::cube::conv::set_full_search(opts.conv_full_autotune);
    if let Some(c) = CubeClRuntimeConfig::storage().lock().as_ref() {
        return Ok(describe(c));
    }
    let dir = opts.cache_dir();
    std::fs::create_dir_all(&dir).map_err(|e| WorkloadError::Backend(format!("kernel_cache_dir {}: cannot create: {e}", dir.display())))?;
    let mut c = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if opts.kernel_cache_dir.is_some() || c.compilation.cache.is_none() {
        c.compilation.cache = Some(CacheConfig::File(compiled_kernel_dir(&dir, &build_id())));
    }
    if opts.kernel_cache_dir.is_some() || matches!(c.autotune.cache, CacheConfig::Target) {
        c.autotune.cache = CacheConfig::File(dir);
    }
    let enforced = matches!(c.memory.persistent_memory, PersistentMemory::Enforced);
    let pool = opts.memory_pool.unwrap_or(if enforced { GpuMemoryPool::Exact } else { GpuMemoryPool::default_for(backend) });
    match pool {
        GpuMemoryPool::Exact => c.memory.persistent_memory = PersistentMemory::Enforced,
        GpuMemoryPool::Pages if enforced => c.memory.persistent_memory = PersistentMemory::Enabled,
        GpuMemoryPool::Pages => {}
    }
    if let Some(level) = opts.autotune {
        c.autotune.level = match level {
            AutotuneLevel::Minimal => L::Minimal,
            AutotuneLevel::Balanced => L::Balanced,
            AutotuneLevel::Extensive => L::Extensive,
            AutotuneLevel::Full => L::Full,
        };
    }
    let mut line = describe(&c);
    line.push_str(if cfg!(feature = "fusion") { "; Burn fusion on" } else { "; Burn fusion off" });
    line.push_str(&kernel_accounting(&mut c));
    CubeClRuntimeConfig::set(c);
    Ok(line)
}

/// Whether CubeCL's loggers were pointed at [`vramlab_probe::kernels`]'s counter (set once, when
/// CubeCL's configuration is set).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
static KERNEL_ACCOUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Kernel accounting: install the counting `log` logger and give CubeCL's profiling logger (at
/// level `minimal`, one line per launch, no timing and no sync) and autotune logger the `log`
/// crate as a sink; compile messages reach it without any setting (trace level). A profiling
/// level set in `cubecl.toml`/`CUBECL_*` is kept (its timed lines are counted as well).
/// `VRAMLAB_KERNEL_ACCOUNTING=time` sets level `basic` instead: CubeCL times every kernel alone
/// (a flush or sync around each, [`vramlab_probe::kernels`] says how) and the counter sums the
/// times per kernel. Returns the note for the configuration line.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn kernel_accounting(c: &mut burn::cubecl::config::CubeClRuntimeConfig) -> String {
    use burn::cubecl::config::profiling::ProfilingLogLevel;
    if std::env::var("VRAMLAB_KERNEL_ACCOUNTING").is_ok_and(|v| v == "off" || v == "0") {
        return "; kernel accounting off (VRAMLAB_KERNEL_ACCOUNTING)".into();
    }
    if let Err(e) = vramlab_probe::kernels::install() {
        return format!("; {e}");
    }
    let timed = std::env::var("VRAMLAB_KERNEL_ACCOUNTING").is_ok_and(|v| v == "time");
    if timed {
        c.profiling.logger.level = ProfilingLogLevel::Basic;
    } else if matches!(c.profiling.logger.level, ProfilingLogLevel::Disabled) {
        c.profiling.logger.level = ProfilingLogLevel::Minimal;
    }
    // CubeCL's `LogCrateLevel` is not re-exported: name it by its serde name.
    let info = || serde_json::from_value(serde_json::json!("info")).ok();
    c.profiling.logger.log = info();
    c.autotune.logger.log = info();
    KERNEL_ACCOUNTING.store(true, std::sync::atomic::Ordering::Relaxed);
    if timed {
        return "; kernels counted (launches, compilations, autotune searches) and timed one by one (VRAMLAB_KERNEL_ACCOUNTING=time: CubeCL's profiling level `basic`, a flush or sync around every kernel: the steps are slower than untimed ones)".into();
    }
    "; kernels counted (launches, compilations, autotune searches)".into()
}

/// A backend a job trains on: Burn's autodiff over an inner backend, both with vramlab's lean
/// autodiff nodes (`vramlab_models::nn::lean`), the inner one with the optimizer's kernels
/// (`vramlab_train::optim_kernels`).
pub trait TrainBackend: AutodiffBackend<InnerBackend: LeanBackend + OptimKernels> + LeanBackend {}
impl<B> TrainBackend for B where B: AutodiffBackend<InnerBackend: LeanBackend + OptimKernels> + LeanBackend {}

/// Work to run on whichever backend the user picked.
pub trait Job {
    type Output;
    fn run<B: TrainBackend>(self, device: B::Device, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<Self::Output>;
}

/// Facts about the backend in use, for reports.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    pub backend: BackendKind,
    pub probe: String,
    pub peak_kind: vramlab_probe::PeakKind,
    /// How the reserved peak relates to the true one.
    pub reserved_kind: vramlab_probe::PeakKind,
    /// cuda: the driver's view of device memory (NVML), or why it is not available.
    pub device_memory: Option<String>,
    /// wgpu/cuda: where CubeCL keeps compiled kernels and autotune results, and its level.
    pub kernel_cache: Option<String>,
}

impl BackendInfo {
    fn new(backend: BackendKind, probe: &dyn MemoryProbe, kernel_cache: Option<String>, device_memory: Option<String>) -> Self {
        Self { backend, probe: probe.name(), peak_kind: probe.peak_kind(), reserved_kind: probe.reserved_kind(), device_memory, kernel_cache }
    }

    /// One line for reports: what the allocated and reserved figures are.
    pub fn memory_note(&self) -> String {
        use vramlab_probe::PeakKind::{Exact, Sampled};
        match (self.peak_kind, self.reserved_kind) {
            (Exact, _) => "allocated: exact (counting allocator, model account); reserved: process RSS sampled at the probe points (a lower bound of the RSS peak)".into(),
            (Sampled, Exact) => "allocated: max of CubeCL's `bytes_in_use` at the probe points, a lower bound; the true peak lies between it and reserved. Reserved: exact (CubeCL's pools give no page back during a run, so the value at the end of each phase is its peak)".into(),
            (Sampled, Sampled) => "allocated and reserved: maxima over samples at the probe points (lower bounds)".into(),
        }
    }
}

/// Fails with a clear message when the device cannot compute in `precision`.
pub fn check_precision<B: Backend>(device: &B::Device, backend: BackendKind, precision: Precision) -> Result<()> {
    let dt: DType = precision.dtype().into();
    if B::supports_dtype(device, dt) {
        return Ok(());
    }
    let supported: Vec<&str> = [Precision::F32, Precision::Bf16, Precision::F16]
        .into_iter()
        .filter(|p| B::supports_dtype(device, p.dtype().into()))
        .map(|p| p.name())
        .collect();
    Err(WorkloadError::Backend(format!(
        "--precision={}: the {backend} device does not support {} (this adapter supports: {})",
        precision.name(),
        precision.name(),
        supported.join(", ")
    )))
}

fn run_with<I, J>(job: J, device: I::Device, mode: CheckpointMode, probe: &dyn MemoryProbe, info: &BackendInfo) -> Result<J::Output>
where
    I: LeanBackend + OptimKernels,
    J: Job,
{
    if mode == CheckpointMode::Balanced {
        job.run::<Autodiff<I, BalancedCheckpointing>>(device, probe, info)
    } else {
        job.run::<Autodiff<I>>(device, probe, info)
    }
}

/// Run `job` on backend `kind` (device index `index` for GPUs; `gpu`: CubeCL's caches).
pub fn dispatch<J: Job>(kind: BackendKind, index: usize, gpu: &GpuOptions, mode: CheckpointMode, precision: Precision, job: J) -> Result<J::Output> {
    match kind.compiled()? {
        #[cfg(feature = "flex")]
        BackendKind::Flex => {
            use burn::backend::Flex;
            let _ = (index, gpu);
            let device = burn::backend::flex::FlexDevice;
            check_precision::<Flex>(&device, kind, precision)?;
            let probe = vramlab_probe::CpuProbe::new().map_err(|e| WorkloadError::Backend(e.to_string()))?;
            let info = BackendInfo::new(kind, &probe, None, None);
            run_with::<Flex, J>(job, device, mode, &probe, &info)
        }
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => {
            use burn::backend::Wgpu;
            use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
            wgpu_adapter()?;
            let cache = configure_cubecl(gpu, kind)?;
            eprintln!("vramlab: {cache}");
            let device = if index == 0 { WgpuDevice::DefaultDevice } else { WgpuDevice::DiscreteGpu(index) };
            check_precision::<Wgpu>(&device, kind, precision)?;
            let probe = cubecl_probe::<WgpuRuntime, Wgpu>("cubecl-wgpu", device.clone(), None);
            let info = BackendInfo::new(kind, &probe, Some(cache), None);
            run_with::<Wgpu, J>(job, device, mode, &probe, &info)
        }
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            use burn::backend::Cuda;
            use burn::backend::cuda::CudaDevice;
            use burn::cubecl::cuda::CudaRuntime;
            cuda_driver()?;
            let cache = configure_cubecl(gpu, kind)?;
            eprintln!("vramlab: {cache}");
            let device = CudaDevice::new(index);
            check_precision::<Cuda>(&device, kind, precision)?;
            let nvml = vramlab_probe::nvml::NvmlDevice::open(index);
            let note = match &nvml {
                Ok(d) => format!("NVML device {index} ({}): `peak_device_used_bytes` is the whole device's used memory (what nvidia-smi shows), sampled at the probe points", d.name().unwrap_or_default()),
                Err(e) => format!("{e}: no device-level figure (nvidia-smi's number) in this run"),
            };
            eprintln!("vramlab: {note}");
            let probe = cubecl_probe::<CudaRuntime, Cuda>("cubecl-cuda", device.clone(), nvml.ok());
            let info = BackendInfo::new(kind, &probe, Some(cache), Some(note));
            run_with::<Cuda, J>(job, device, mode, &probe, &info)
        }
        #[allow(unreachable_patterns)]
        other => other.compiled().map(|_| unreachable!("every compiled backend has its arm")),
    }
}

/// An error unless the graphics API CubeCL's wgpu runtime asks for (`AutoGraphicsApi`: Vulkan on
/// Linux) has an adapter. Without one CubeCL panics on its device thread at the first tensor ("No
/// possible adapter available"); this says so before, with what to install (as [`cuda_driver`]).
#[cfg(feature = "wgpu")]
fn wgpu_adapter() -> Result<()> {
    use burn::backend::wgpu::WgpuRuntime;
    use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
    use burn::cubecl::Runtime;
    let api = AutoGraphicsApi::backend();
    if WgpuRuntime::enumerate_all_devices(&api).is_empty() {
        let icd = std::env::var("VK_ICD_FILENAMES").map(|v| format!(" (VK_ICD_FILENAMES={v})")).unwrap_or_default();
        return Err(WorkloadError::Backend(format!(
            "--backend=wgpu: no {api:?} adapter found{icd}; install a GPU driver, or Mesa's CPU driver lavapipe (Debian: \
             apt-get install mesa-vulkan-drivers libvulkan1) and set VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
        )));
    }
    Ok(())
}

/// The CUDA driver's library, by the names cudarc tries first on Linux.
const CUDA_DRIVER: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Whether one of `names` loads as a shared library (`dlopen`, then closed again).
#[cfg(unix)]
fn loadable(names: &[&str]) -> bool {
    names.iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else { return false };
        // SAFETY: `c` is a valid C string; a handle dlopen returns is closed once.
        unsafe {
            let handle = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            !handle.is_null() && libc::dlclose(handle) == 0
        }
    })
}

#[cfg(not(unix))]
fn loadable(_: &[&str]) -> bool {
    true
}

/// `--backend=cuda` on a machine whose CUDA driver cannot be loaded: an error that says so.
/// Without this check cubecl-cuda's device thread panics in cudarc's loader and the main thread
/// after it (`RecvError`), in the middle of the run's start.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn cuda_driver() -> Result<()> {
    if loadable(&CUDA_DRIVER) {
        return Ok(());
    }
    Err(WorkloadError::Backend(format!(
        "--backend=cuda: the NVIDIA driver's CUDA library ({}) cannot be loaded: this machine has no NVIDIA driver, or its folder is not on LD_LIBRARY_PATH; --backend=flex runs on the CPU",
        CUDA_DRIVER.join(" or ")
    )))
}

/// CubeCL keeps usage per stream (the calling thread's) and no byte high-water mark: the probe
/// synchronises the device and reads `bytes_in_use` (allocated) and `bytes_reserved` (pool
/// pages) at each probe point of the trainer (before/after forward, after backward, after the
/// optimizer), and NVML's device-wide used memory where given.
///
/// `bytes_reserved` is exact as a peak: CubeCL 0.10's default pools (`SubSlices`, no
/// `dealloc_period`) and its persistent pool (`--gpu_memory_pool=exact`) return memory only on
/// an explicit `memory_cleanup`, which vramlab never calls during training, so reserved never
/// decreases and its value when a phase ends is the phase's peak. `bytes_in_use` is the sum of the requested sizes of live buffers (CUDA pads
/// rows to 512-byte pitches): its maximum over the probe points is a lower bound.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn cubecl_probe<R, B>(name: &str, device: R::Device, nvml: Option<vramlab_probe::nvml::NvmlDevice>) -> vramlab_probe::SampledProbe
where
    R: burn::cubecl::Runtime,
    B: Backend<Device = R::Device>,
{
    if KERNEL_ACCOUNTING.load(std::sync::atomic::Ordering::Relaxed) && std::env::var("VRAMLAB_KERNEL_ACCOUNTING").is_ok_and(|v| v == "time") {
        let how = match R::client(&device).properties().timing_method {
            burn::cubecl::profile::TimingMethod::Device => "the device's timestamps around each kernel (TimingMethod::Device)",
            burn::cubecl::profile::TimingMethod::System => "host wall time from a device sync before each kernel to one after it (TimingMethod::System)",
        };
        eprintln!("vramlab: kernels timed by {how}");
    }
    let probe = vramlab_probe::SampledProbe::new(name, move || {
        let _ = B::sync(&device);
        let client = R::client(&device);
        let device_used = nvml.and_then(|d| d.memory()).map(|m| m.used);
        match client.memory_usage() {
            Ok(u) => vramlab_probe::MemSample { allocated: u.bytes_in_use, reserved: u.bytes_reserved, device_used },
            Err(_) => vramlab_probe::MemSample { device_used, ..Default::default() },
        }
    })
    .reserved_never_decreases();
    if KERNEL_ACCOUNTING.load(std::sync::atomic::Ordering::Relaxed) { probe.with_kernel_counts() } else { probe }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `--backend`, a job runs on a backend this binary has: flex in a build with it, the
    /// GPU backend in a build without it.
    #[test]
    fn the_default_backend_is_compiled_in() {
        let default = BackendKind::default();
        assert!(default.compiled().is_ok(), "default {default} not among {:?}", compiled());
        assert_eq!(default == BackendKind::Flex, cfg!(feature = "flex"), "flex is the default wherever it is built");
    }

    /// The CUDA driver check: a library every Linux process has loads, a missing one does not;
    /// on this machine the check's answer agrees with whether libcuda loads.
    #[cfg(unix)]
    #[test]
    fn cuda_driver_check_says_why_instead_of_panicking() {
        assert!(loadable(&["libc.so.6"]), "libc.so.6 loads");
        assert!(!loadable(&["libvramlab-no-such-library.so"]));
        match cuda_driver() {
            Ok(()) => assert!(loadable(&CUDA_DRIVER)),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.starts_with("--backend=cuda") && msg.contains("libcuda.so.1"), "{msg}");
            }
        }
    }

    #[test]
    fn kernel_cache_dir_is_the_flag_else_a_per_user_default() {
        let flag = GpuOptions { kernel_cache_dir: Some("/srv/kernels".into()), autotune: Some(AutotuneLevel::Minimal), matmul_autotune: false, conv_full_autotune: false, memory_pool: None };
        assert_eq!(flag.cache_dir(), std::path::PathBuf::from("/srv/kernels"));
        let default = GpuOptions::default().cache_dir();
        assert!(std::env::var_os("VRAMLAB_CACHE_DIR").is_some() || default.ends_with("vramlab/cubecl"), "{}", default.display());
    }

    #[test]
    fn compiled_kernels_are_cached_per_build() {
        let id = build_id();
        assert_eq!(id, build_id(), "the id is computed once per process");
        assert!(id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        let root = std::path::Path::new("/srv/kernels");
        assert_eq!(compiled_kernel_dir(root, &id), root.join("kernels").join(&id));
        assert_ne!(compiled_kernel_dir(root, &id), compiled_kernel_dir(root, "0123456789abcdef"));
    }

    #[test]
    fn autotune_levels_are_cubecls_names() {
        for (level, name) in [(AutotuneLevel::Minimal, "minimal"), (AutotuneLevel::Balanced, "balanced"), (AutotuneLevel::Extensive, "extensive"), (AutotuneLevel::Full, "full")] {
            assert_eq!(serde_json::to_value(level).unwrap(), name);
            assert_eq!(level.name(), name);
        }
        assert!(serde_json::from_value::<AutotuneLevel>(serde_json::json!("fast")).is_err());
    }
}

//! Inserted by `benches/nvrtc_check.sh` into a scratch copy of cubecl-wgpu (never built into
//! vramlab): every kernel this runtime compiles is also lowered to CUDA C++ by cubecl-cpp, with
//! the options cubecl-cuda 0.10 gives an sm_90 device (warp 32, fast math, fast tanh, grid
//! constants, clusters, elect_sync), and written to `$VRAMLAB_CUDA_DUMP/<kernel>-<hash>.cu`
//! (`.err` / `.panic` where the lowering itself fails). The first line records the cube's
//! dimensions and the shared memory the kernel declares, which cubecl-cuda checks before a launch.

use cubecl_core::prelude::KernelDefinition;
use cubecl_cpp::cuda::{CudaDialect, mma::CudaWmmaCompiler};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};
use cubecl_ir::StorageType;
use cubecl_runtime::{compiler::Compiler, server::ExecutionMode};
use std::hash::{Hash, Hasher};

/// Called by the patched `KernelTask::compile` with a fresh definition (its own `define()`, so
/// the lowering cannot touch the one the wgpu compiler gets).
pub fn dump(kernel: KernelDefinition, mode: ExecutionMode, addr_type: StorageType) {
    let Ok(dir) = std::env::var("VRAMLAB_CUDA_DUMP") else { return };
    let name = kernel.options.kernel_name.clone();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    format!("{kernel:?}").hash(&mut hasher);
    let id = hasher.finish();
    let features = CppSupportedFeatures { grid_constants: true, clusters: true, fast_math: true, fast_tanh: true, elect_sync: true };
    let options = CompilationOptions { warp_size: 32, supports_features: features };
    let lowered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let mut compiler = CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default();
        compiler.compile(kernel, &options, mode, addr_type).map(|k| {
            let d = k.cube_dim;
            format!("// vramlab-dump cube_dim {} {} {} shared_bytes {}\n{k}", d.x, d.y, d.z, k.shared_memory_size())
        })
    }));
    let (ext, text) = match lowered {
        Ok(Ok(source)) => ("cu", source),
        Ok(Err(e)) => ("err", e.to_string()),
        Err(p) => ("panic", p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()),
    };
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(format!("{dir}/{name}-{id:016x}.{ext}"), text);
}

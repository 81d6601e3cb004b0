//! Inserted by `benches/nvrtc_check.sh` into a scratch copy of cubecl-wgpu (never built into
//! vramlab): every kernel this runtime compiles is also lowered to CUDA C++ by cubecl-cpp, with
//! the options cubecl-cuda 0.10 gives an sm_90 device (warp 32, fast math, fast tanh, grid
//! constants, clusters, elect_sync), and written to `$VRAMLAB_CUDA_DUMP/<kernel>-<hash>.cu`
//! (`.err` / `.panic` where the lowering itself fails). The first line records the cube's
//! dimensions and the shared memory the kernel declares, which cubecl-cuda checks before a launch.
//!
//! With `VRAMLAB_CUDA_DUMP_BF16` set too, every kernel whose IR has f16 in it is also written
//! there, as `<kernel>_as_bf16-<hash>.cu`, with each f16 made bf16 (lavapipe has no bf16, so a
//! bf16 training run's kernels are never compiled here; the f16 tests' kernels are the same IR
//! with the other 16-bit float).
//! The retyping goes through CubeCL's own serde form of the IR (CBOR values, every `F16` type
//! name made `BF16`, read back); the same round trip without the swap must lower to the source
//! the original lowers to (the same lines in any order, shared memory placement aside: both
//! follow hash order in cubecl-cpp), or the kernel is written as `.err` saying so.

use cubecl_core::prelude::KernelDefinition;
use cubecl_cpp::cuda::{CudaDialect, mma::CudaWmmaCompiler};
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};
use cubecl_ir::StorageType;
use cubecl_runtime::{compiler::Compiler, server::ExecutionMode};
use std::hash::{Hash, Hasher};

/// Called by the patched `KernelTask::compile` with the kernel's `define()`: each lowering takes
/// a fresh definition (a definition's scopes share state that lowering changes, so one lowered
/// twice, or a clone lowered after it, gives another source), and none is the one the wgpu
/// compiler gets.
pub fn dump(define: &dyn Fn() -> KernelDefinition, mode: ExecutionMode, addr_type: StorageType) {
    let Ok(dir) = std::env::var("VRAMLAB_CUDA_DUMP") else { return };
    let kernel = define();
    let name = kernel.options.kernel_name.clone();
    let (ext, text) = lower(kernel, mode, addr_type);
    if let Ok(bf16_dir) = std::env::var("VRAMLAB_CUDA_DUMP_BF16") {
        if let Some((ext, text16)) = as_bf16(define, &text, mode, addr_type) {
            write(&bf16_dir, &format!("{name}_as_bf16"), ext, &text16);
        }
    }
    write(&dir, &name, ext, &text);
}

/// Writes `<dir>/<name>-<hash>.<ext>`, the hash of the text's [`canonical`] form: one file per
/// distinct source, however often and in whatever hash order it was lowered.
fn write(dir: &str, name: &str, ext: &str, text: &str) {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    canonical(text).hash(&mut hasher);
    let id = hasher.finish();
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(format!("{dir}/{name}-{id:016x}.{ext}"), text);
}

/// A source's lines, sorted, with shared memory offsets and the total left out: cubecl-cpp
/// writes its vector type declarations in hash-set order and packs shared memories in hash-map
/// order (cubecl-opt's `SharedLiveness`), which differ between two lowerings of one definition,
/// the packing's total too (one matmul: 288 or 384 bytes).
fn canonical(source: &str) -> Vec<String> {
    let placement_free = |l: &str| match (l.find("dynamic_shared_mem["), l.rfind(']')) {
        _ if l.starts_with("// vramlab-dump ") => l.split(" shared_bytes ").next().unwrap_or(l).to_string(),
        (Some(a), Some(b)) if b > a => format!("{}{}", &l[..a + 19], &l[b..]),
        _ => l.to_string(),
    };
    let mut lines: Vec<String> = source.lines().map(placement_free).collect();
    lines.sort();
    lines
}

/// The kernel as CUDA C++ (`"cu"`), or why cubecl-cpp could not lower it (`"err"`, `"panic"`).
fn lower(kernel: KernelDefinition, mode: ExecutionMode, addr_type: StorageType) -> (&'static str, String) {
    let features = CppSupportedFeatures { grid_constants: true, clusters: true, fast_math: true, fast_tanh: true, elect_sync: true };
    let options = CompilationOptions { warp_size: 32, supports_features: features };
    let lowered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let mut compiler = CppCompiler::<CudaDialect<CudaWmmaCompiler>>::default();
        compiler.compile(kernel, &options, mode, addr_type).map(|k| {
            let d = k.cube_dim;
            format!("// vramlab-dump cube_dim {} {} {} shared_bytes {}\n{k}", d.x, d.y, d.z, k.shared_memory_size())
        })
    }));
    match lowered {
        Ok(Ok(source)) => ("cu", source),
        Ok(Err(e)) => ("err", e.to_string()),
        Err(p) => ("panic", p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()),
    }
}

/// The kernel with every f16 made bf16, lowered: (extension, text); `None` when it has no
/// f16. The identity round trip of another fresh definition must lower to `original` (the
/// original's lowering, as [`canonical`] forms) for the swapped one to count.
fn as_bf16(define: &dyn Fn() -> KernelDefinition, original: &str, mode: ExecutionMode, addr_type: StorageType) -> Option<(&'static str, String)> {
    let kernel = define();
    let (swapped, count) = match retyped(&kernel, "F16", "BF16") {
        Ok(x) => x,
        Err(e) => return Some(("err", format!("vramlab bf16 retyping: the IR's serde round trip failed: {e}"))),
    };
    if count == 0 {
        return None;
    }
    let identity = match retyped(&define(), "F16", "F16") {
        Ok((identity, _)) => lower(identity, mode, addr_type).1,
        Err(e) => e,
    };
    let (a, b) = (canonical(original), canonical(&identity));
    if a != b {
        let only = |x: &[String], y: &[String]| x.iter().filter(|l| !y.contains(l)).take(12).cloned().collect::<Vec<_>>().join("\n");
        return Some(("err", format!(
            "vramlab bf16 retyping: the IR's serde round trip without the swap lowers to another source than the original, so the bf16 variant would not be faithful.\n--- lines only in the original\n{}\n--- lines only in the round trip\n{}",
            only(&a, &b), only(&b, &a))));
    }
    Some(lower(swapped, mode, addr_type))
}

/// A copy of `kernel` whose IR parts went through serde as CBOR values with every text `from`
/// made `to` (the type names are enum variants: `F16`, `BF16`), and how many were.
/// The scope's fields serde skips are the original's (its type and size maps, the device's
/// properties) or rebuilt ([`allocator`]). Takes the mutable locals out of `kernel`'s allocator.
fn retyped(kernel: &KernelDefinition, from: &str, to: &str) -> Result<(KernelDefinition, usize), String> {
    let mut count = 0;
    let mut body: cubecl_ir::Scope = swap(&kernel.body, from, to, &mut count)?;
    let alloc = allocator(&kernel.body.allocator, from, to, &mut count)?;
    restore(&mut body, &kernel.body, &alloc);
    let out = KernelDefinition {
        buffers: swap(&kernel.buffers, from, to, &mut count)?,
        tensor_maps: swap(&kernel.tensor_maps, from, to, &mut count)?,
        scalars: swap(&kernel.scalars, from, to, &mut count)?,
        cube_dim: kernel.cube_dim,
        body,
        options: kernel.options.clone(),
    };
    Ok((out, count))
}

/// `x` through serde as a CBOR value, every text `from` in it made `to` (counted in `count`).
fn swap<T: serde::Serialize + serde::de::DeserializeOwned>(x: &T, from: &str, to: &str, count: &mut usize) -> Result<T, String> {
    fn walk(v: &mut ciborium::Value, from: &str, to: &str, count: &mut usize) {
        use ciborium::Value as V;
        match v {
            V::Text(s) if s == from => {
                *s = to.to_string();
                *count += 1;
            }
            V::Array(items) => items.iter_mut().for_each(|x| walk(x, from, to, count)),
            V::Map(entries) => entries.iter_mut().for_each(|(k, x)| {
                walk(k, from, to, count);
                walk(x, from, to, count);
            }),
            V::Tag(_, inner) => walk(inner, from, to, count),
            _ => {}
        }
    }
    let mut v = ciborium::Value::serialized(x).map_err(|e| e.to_string())?;
    walk(&mut v, from, to, count);
    v.deserialized().map_err(|e| e.to_string())
}

/// Puts back what serde skips in `scope` and in every scope nested in its branches: the type
/// and size maps and the device's properties of `root` (a child scope starts with its parent's),
/// and one shared allocator, as `define()` leaves them.
fn restore(scope: &mut cubecl_ir::Scope, root: &cubecl_ir::Scope, alloc: &cubecl_ir::Allocator) {
    use cubecl_ir::{Branch, Operation};
    scope.typemap = root.typemap.clone();
    scope.sizemap = root.sizemap.clone();
    scope.properties = root.properties.clone();
    scope.allocator = alloc.clone();
    for inst in &mut scope.instructions {
        if let Operation::Branch(b) = &mut inst.operation {
            let nested: Vec<&mut cubecl_ir::Scope> = match b {
                Branch::If(x) => vec![&mut x.scope],
                Branch::IfElse(x) => vec![&mut x.scope_if, &mut x.scope_else],
                Branch::Switch(x) => std::iter::once(&mut x.scope_default).chain(x.cases.iter_mut().map(|(_, s)| s)).collect(),
                Branch::RangeLoop(x) => vec![&mut x.scope],
                Branch::Loop(x) => vec![&mut x.scope],
                _ => vec![],
            };
            for s in nested {
                restore(s, root, alloc);
            }
        }
    }
}

/// A new allocator holding `original`'s mutable locals, retyped, under their own ids, and
/// counting on from where `original` does. Its pool is not in serde's form, and the root
/// scope declares every mutable local from it (cubecl-ir's `Scope::process`); the public way in
/// is `add_local_mut`, which takes the next id, so the ids in between are drawn and dropped.
fn allocator(original: &cubecl_ir::Allocator, from: &str, to: &str, count: &mut usize) -> Result<cubecl_ir::Allocator, String> {
    let next = |a: &cubecl_ir::Allocator| -> Result<u32, String> {
        let v = ciborium::Value::serialized(a).map_err(|e| e.to_string())?;
        let field = v.as_map().and_then(|m| m.iter().find(|(k, _)| k.as_text() == Some("next_id"))).map(|(_, v)| v.clone());
        field.and_then(|v| v.as_integer()).and_then(|i| u32::try_from(i).ok()).ok_or_else(|| format!("no next_id in the allocator's serde form: {v:?}"))
    };
    let end = next(original)?;
    let mut locals: Vec<cubecl_ir::Variable> = swap(&original.take_variables(), from, to, count)?;
    let id = |v: &cubecl_ir::Variable| match v.kind {
        cubecl_ir::VariableKind::LocalMut { id } => Ok(id),
        other => Err(format!("a pooled local that is not LocalMut: {other:?}")),
    };
    locals.sort_by_key(|v| id(v).unwrap_or(u32::MAX));
    let fresh: cubecl_ir::Allocator = ciborium::Value::Map(vec![(ciborium::Value::Text("next_id".into()), ciborium::Value::Integer(0.into()))])
        .deserialized()
        .map_err(|e| e.to_string())?;
    // `at`: the id `fresh` hands out next.
    let mut at = 0;
    for v in &locals {
        let want = id(v)?;
        if want < at {
            return Err(format!("two pooled locals with id {want}"));
        }
        for _ in at..want {
            fresh.new_local_index();
        }
        fresh.add_local_mut(v.ty);
        at = want + 1;
    }
    for _ in at..end {
        fresh.new_local_index();
    }
    if next(&fresh)? != end.max(at) {
        return Err(format!("the rebuilt allocator counts on from {}, the original from {end}", next(&fresh)?));
    }
    Ok(fresh)
}

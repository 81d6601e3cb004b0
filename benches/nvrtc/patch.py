"""Make the scratch copies of cubecl-runtime and cubecl-wgpu that benches/nvrtc_check.sh builds
vramlab with: a hook in `KernelTask::compile` (handed the kernel's `define()`, so it can take a fresh
definition of every kernel compiled for each lowering),
set by the wgpu server to benches/nvrtc/cuda_dump.rs when VRAMLAB_CUDA_DUMP is set (unset, the
build compiles as CubeCL's own). Every edit checks its anchor first, so a
CubeCL whose source moved stops here with the file named, not with a silent no-op.

    python3 benches/nvrtc/patch.py REGISTRY_SRC_DIR CUBECL_VERSION OUT_DIR
"""
import pathlib, shutil, sys

src, version, out = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
here = pathlib.Path(__file__).parent
stage = out.with_name(out.name + ".new")
shutil.rmtree(stage, ignore_errors=True)


def copy(name):
    dst = stage / name
    shutil.copytree(src / f"{name}-{version}", dst)
    return dst


def sync(new, old):
    """Put `new` at `old`, rewriting only the files whose bytes differ: cargo rebuilds a path
    dependency whose files are newer than its last build, so a second run builds incrementally."""
    for f in old.rglob("*"):
        if f.is_file() and not (new / f.relative_to(old)).exists():
            f.unlink()
    for f in new.rglob("*"):
        if f.is_file():
            g = old / f.relative_to(new)
            if not g.exists() or g.read_bytes() != f.read_bytes():
                g.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, g)


def edit(path, old, new):
    text = path.read_text()
    if old not in text:
        sys.exit(f"patch.py: {path}: anchor not found (CubeCL {version} changed?):\n{old}")
    path.write_text(text.replace(old, new, 1))


runtime = copy("cubecl-runtime")
edit(runtime / "src/kernel.rs",
     "        let gpu_ir = self.kernel_definition.define();\n",
     "        if let Some(hook) = DUMP_HOOK.get() {\n"
     "            hook(&|| self.kernel_definition.define(), mode, addr_type);\n"
     "        }\n"
     "        let gpu_ir = self.kernel_definition.define();\n")
with open(runtime / "src/kernel.rs", "a") as f:
    f.write("\n/// vramlab's NVRTC check: handed `define()` of every kernel compiled (a fresh definition per call).\n"
            "pub static DUMP_HOOK: std::sync::OnceLock<fn(&dyn Fn() -> KernelDefinition, ExecutionMode, StorageType)> = std::sync::OnceLock::new();\n")

wgpu = copy("cubecl-wgpu")
edit(wgpu / "Cargo.toml", f'[dependencies.cubecl-cpp]\nversion = "{version}"\nfeatures = ["metal"]\noptional = true',
     f'[dependencies.cubecl-cpp]\nversion = "{version}"\nfeatures = ["metal", "cuda"]')
edit(wgpu / "Cargo.toml", 'msl = ["cubecl-cpp/metal"]', "msl = []")
# The bf16 variants (cuda_dump.rs) go through the IR's serde form as CBOR values.
with open(wgpu / "Cargo.toml", "a") as f:
    f.write('\n[dependencies.ciborium]\nversion = "0.2"\n\n[dependencies.serde]\nversion = "1"\n')
shutil.copy(here / "cuda_dump.rs", wgpu / "src/cuda_dump.rs")
edit(wgpu / "src/lib.rs", "\nmod compiler;", "\nmod compiler;\npub mod cuda_dump;")
edit(wgpu / "src/compute/server.rs",
     "    ) -> Self {\n        let backend_scheduler",
     "    ) -> Self {\n        if std::env::var_os(\"VRAMLAB_CUDA_DUMP\").is_some() {\n            let _ = cubecl_runtime::kernel::DUMP_HOOK.set(crate::cuda_dump::dump);\n        }\n        let backend_scheduler")
for name in ("cubecl-runtime", "cubecl-wgpu"):
    sync(stage / name, out / name)
shutil.rmtree(stage)
print(f"patched copies of cubecl-runtime and cubecl-wgpu {version} in {out}")

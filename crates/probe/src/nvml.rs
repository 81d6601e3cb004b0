//! The device's used memory as the NVIDIA driver reports it (NVML, what `nvidia-smi` shows).
//!
//! `libnvidia-ml.so.1` is loaded at run time (`nvml-wrapper` uses `dlopen`), so the binary
//! builds and runs on machines without an NVIDIA driver: opening then fails with a message that
//! reports put in place of the number.

use std::sync::OnceLock;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

/// Process-wide NVML handle, initialised on first use (NVML is shut down at exit).
fn nvml() -> Result<&'static Nvml, String> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| format!("NVML unavailable ({e})"))).as_ref().map_err(Clone::clone)
}

/// One NVIDIA device, by its CUDA index.
#[derive(Clone, Copy, Debug)]
pub struct NvmlDevice {
    index: u32,
}

/// What NVML says about one device at one instant, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvmlMemory {
    /// Used memory of the whole device (all processes, CUDA contexts included).
    pub used: u64,
    pub total: u64,
    /// This process's share, when the driver reports it (not inside some containers, where
    /// NVML sees host process ids).
    pub this_process: Option<u64>,
}

impl NvmlDevice {
    /// Opens device `index`; the error says why NVML cannot be used (no driver, no device).
    pub fn open(index: usize) -> Result<Self, String> {
        let nvml = nvml()?;
        let index = u32::try_from(index).map_err(|_| format!("NVML: no device {index}"))?;
        let device = nvml.device_by_index(index).map_err(|e| format!("NVML: device {index}: {e}"))?;
        device.memory_info().map_err(|e| format!("NVML: device {index} memory: {e}"))?;
        Ok(Self { index })
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> Option<String> {
        nvml().ok()?.device_by_index(self.index).ok()?.name().ok()
    }

    /// Memory now (`None` if the driver stops answering).
    pub fn memory(&self) -> Option<NvmlMemory> {
        let device = nvml().ok()?.device_by_index(self.index).ok()?;
        let info = device.memory_info().ok()?;
        let pid = std::process::id();
        let this_process = device.running_compute_processes().ok().and_then(|ps| {
            ps.into_iter().find(|p| p.pid == pid).and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
        });
        Some(NvmlMemory { used: info.used, total: info.total, this_process })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_opening_fails_with_a_message_not_a_panic() {
        match NvmlDevice::open(0) {
            // A machine with an NVIDIA driver: the figures are sane.
            Ok(d) => {
                let m = d.memory().expect("memory of an opened device");
                assert!(m.used <= m.total && m.total > 0, "{m:?}");
            }
            Err(e) => assert!(e.starts_with("NVML"), "{e}"),
        }
    }
}

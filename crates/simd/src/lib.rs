//! The instruction-set level vramlab's CPU kernels (the models' flex kernels, the optimizer's
//! update) run at ([`Isa`]): detected once at run time
//! (scalar < AVX2 + FMA < AVX-512 < AVX-512 + BF16 dot products), capped by the environment
//! variable `VRAMLAB_SIMD` (`avx512bf16`, `avx512`, `avx2` or `scalar`; `VRAMLAB_NO_SIMD` set =
//! `scalar`), so that a machine with AVX-512 runs, and tests, the narrower paths too. Kernels take the level as an argument
//! (tests pass each level the machine has); [`level`] is the process-wide one.

/// One level of vector instructions; ordered, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain loops (the compiler's baseline vectorisation: SSE2 on x86-64).
    Scalar,
    /// AVX2 + FMA: 8 f32 lanes.
    Avx2,
    /// AVX-512 F/BW/DQ/VL (x86-64-v4) + AVX2 + FMA: 16 f32 lanes, 32 vector registers.
    Avx512,
    /// [`Isa::Avx512`] + AVX512-BF16 (`vdpbf16ps`: pairs of bf16 multiplied and summed into
    /// f32 lanes), which bf16 kernels use; f32 kernels run as at [`Isa::Avx512`].
    Avx512Bf16,
}

/// The environment variable that caps the level.
pub const ENV: &str = "VRAMLAB_SIMD";

impl Isa {
    /// Every level, narrowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];

    /// The name `VRAMLAB_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512bf16",
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The widest level this CPU runs (detected once).
    pub fn detected() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if !(has!("avx2") && has!("fma")) {
                    return Isa::Scalar;
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                    return if has!("avx512bf16") { Isa::Avx512Bf16 } else { Isa::Avx512 };
                }
                Isa::Avx2
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Scalar
        })
    }

    /// Whether this CPU runs `self`'s instructions (what a test checks before running a level).
    pub fn supported(self) -> bool {
        self <= Isa::detected()
    }
}

/// The levels this CPU runs, narrowest first, for a test that runs every level: names each level
/// it leaves out (and why) on stderr, prefixed with `test`.
pub fn testable_levels(test: &str) -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| {
            let ok = isa.supported();
            if !ok {
                eprintln!("{test}: skipping {}: this CPU has only {}", isa.name(), Isa::detected().name());
            }
            ok
        })
        .collect()
}

/// The cap the environment sets, or why its value was ignored: `VRAMLAB_NO_SIMD` (any value)
/// means scalar; otherwise `VRAMLAB_SIMD`, when set.
fn env_cap(simd: Option<&str>, no_simd: bool) -> Result<Option<Isa>, String> {
    if no_simd {
        return Ok(Some(Isa::Scalar));
    }
    match simd {
        None => Ok(None),
        Some(v) => Isa::parse(v).map(Some).ok_or_else(|| format!("{ENV}={v:?} is not one of avx512bf16, avx512, avx2, scalar: ignored")),
    }
}

struct Chosen {
    level: Isa,
    cap: Option<Isa>,
}

fn chosen() -> &'static Chosen {
    static CHOSEN: std::sync::OnceLock<Chosen> = std::sync::OnceLock::new();
    CHOSEN.get_or_init(|| {
        let simd = std::env::var(ENV).ok();
        let cap = env_cap(simd.as_deref(), std::env::var_os("VRAMLAB_NO_SIMD").is_some()).unwrap_or_else(|why| {
            // A library cannot return an error from here: say it once, run at the detected level.
            eprintln!("vramlab: warning: {why} (running the flex kernels at {})", Isa::detected().name());
            None
        });
        Chosen { level: cap.map_or(Isa::detected(), |c| c.min(Isa::detected())), cap }
    })
}

/// The level the flex kernels run at in this process: the detected one, capped by the environment.
pub fn level() -> Isa {
    chosen().level
}

/// [`level`] for reports: e.g. `avx512`, or `avx2 (VRAMLAB_SIMD=avx2; the CPU has avx512)`.
pub fn describe() -> String {
    let c = chosen();
    let detected = Isa::detected();
    match c.cap {
        Some(cap) if cap < detected => {
            let var = if std::env::var_os("VRAMLAB_NO_SIMD").is_some() { "VRAMLAB_NO_SIMD".to_string() } else { format!("{ENV}={}", cap.name()) };
            format!("{} ({var}; the CPU has {})", c.level.name(), detected.name())
        }
        Some(cap) if cap > detected => format!("{} ({ENV}={}: the CPU has only {})", c.level.name(), cap.name(), detected.name()),
        _ => c.level.name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_parse_and_cap() {
        assert_eq!(env_cap(None, false), Ok(None));
        assert_eq!(env_cap(Some("AVX2"), false), Ok(Some(Isa::Avx2)));
        assert_eq!(env_cap(Some("avx512bf16"), false), Ok(Some(Isa::Avx512Bf16)));
        assert_eq!(env_cap(Some("avx512"), false), Ok(Some(Isa::Avx512)));
        assert_eq!(env_cap(Some(" scalar "), false), Ok(Some(Isa::Scalar)));
        assert_eq!(env_cap(Some("avx512"), true), Ok(Some(Isa::Scalar)), "VRAMLAB_NO_SIMD wins");
        let err = env_cap(Some("sse9"), false).unwrap_err();
        assert!(err.contains("VRAMLAB_SIMD") && err.contains("sse9"), "{err}");
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512 && Isa::Avx512 < Isa::Avx512Bf16);
        assert!(Isa::Scalar.supported() && level() <= Isa::detected());
        eprintln!("detected {:?}; this process runs {}", Isa::detected(), describe());
    }
}

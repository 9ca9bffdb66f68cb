//! Instruction-set levels for the quantized dot-product kernels, detected
//! at run time so that one binary runs on any x86-64 CPU.

use std::fmt;
use std::sync::OnceLock;

/// A kernel family. Each level implies the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust; the reference every other kernel is tested against.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd`), plus everything in `Avx2`.
    Avx512Vnni,
    /// AMX-INT8 tiles (`tdpbsud`) for batched K-quant products, plus
    /// everything in `Avx512Vnni`; only where the OS grants the tile state
    /// (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM)`, see `super::amx`).
    Amx,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Amx];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512Vnni.is_available() && super::amx::usable(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest level this CPU supports, capped by `RUSTORCH_QUANT_ISA`
    /// (scalar, avx2, avx512vnni, amx) when that is set; detected once.
    pub fn detected() -> Isa {
        static LEVEL: OnceLock<Isa> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            let best = Isa::ALL
                .into_iter()
                .rev()
                .find(|i| i.is_available())
                .unwrap_or(Isa::Scalar);
            match std::env::var("RUSTORCH_QUANT_ISA").ok().as_deref().and_then(Isa::parse) {
                Some(cap) => cap.min(best),
                None => best,
            }
        })
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

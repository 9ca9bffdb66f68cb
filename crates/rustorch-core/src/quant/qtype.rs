//! GGML tensor types: their on-disk ids, block sizes and names.

use std::fmt;

/// A GGML tensor type as stored in GGUF files. Plain types (F32, F16...)
/// have blocks of one element; quantized types pack `block_size()` values
/// into `type_size()` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl QType {
    pub const ALL: [QType; 32] = [
        QType::F32,
        QType::F16,
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q5_1,
        QType::Q8_0,
        QType::Q8_1,
        QType::Q2K,
        QType::Q3K,
        QType::Q4K,
        QType::Q5K,
        QType::Q6K,
        QType::Q8K,
        QType::IQ2XXS,
        QType::IQ2XS,
        QType::IQ3XXS,
        QType::IQ1S,
        QType::IQ4NL,
        QType::IQ3S,
        QType::IQ2S,
        QType::IQ4XS,
        QType::I8,
        QType::I16,
        QType::I32,
        QType::I64,
        QType::F64,
        QType::IQ1M,
        QType::BF16,
        QType::TQ1_0,
        QType::TQ2_0,
        QType::MXFP4,
    ];

    /// The `ggml_type` id used in GGUF tensor infos.
    pub fn ggml_id(self) -> u32 {
        match self {
            QType::F32 => 0,
            QType::F16 => 1,
            QType::Q4_0 => 2,
            QType::Q4_1 => 3,
            QType::Q5_0 => 6,
            QType::Q5_1 => 7,
            QType::Q8_0 => 8,
            QType::Q8_1 => 9,
            QType::Q2K => 10,
            QType::Q3K => 11,
            QType::Q4K => 12,
            QType::Q5K => 13,
            QType::Q6K => 14,
            QType::Q8K => 15,
            QType::IQ2XXS => 16,
            QType::IQ2XS => 17,
            QType::IQ3XXS => 18,
            QType::IQ1S => 19,
            QType::IQ4NL => 20,
            QType::IQ3S => 21,
            QType::IQ2S => 22,
            QType::IQ4XS => 23,
            QType::I8 => 24,
            QType::I16 => 25,
            QType::I32 => 26,
            QType::I64 => 27,
            QType::F64 => 28,
            QType::IQ1M => 29,
            QType::BF16 => 30,
            QType::TQ1_0 => 34,
            QType::TQ2_0 => 35,
            QType::MXFP4 => 39,
        }
    }

    pub fn from_ggml_id(id: u32) -> Option<QType> {
        QType::ALL.iter().copied().find(|t| t.ggml_id() == id)
    }

    /// Elements per block.
    pub const fn block_size(self) -> usize {
        match self {
            QType::F32 | QType::F16 | QType::BF16 | QType::F64 => 1,
            QType::I8 | QType::I16 | QType::I32 | QType::I64 => 1,
            QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0 | QType::Q8_1 => 32,
            QType::IQ4NL | QType::MXFP4 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> usize {
        match self {
            QType::F32 | QType::I32 => 4,
            QType::F16 | QType::BF16 | QType::I16 => 2,
            QType::F64 | QType::I64 => 8,
            QType::I8 => 1,
            QType::Q4_0 => 18,
            QType::Q4_1 => 20,
            QType::Q5_0 => 22,
            QType::Q5_1 => 24,
            QType::Q8_0 => 34,
            QType::Q8_1 => 36,
            QType::Q2K => 84,
            QType::Q3K => 110,
            QType::Q4K => 144,
            QType::Q5K => 176,
            QType::Q6K => 210,
            QType::Q8K => 292,
            QType::IQ2XXS => 66,
            QType::IQ2XS => 74,
            QType::IQ3XXS => 98,
            QType::IQ1S => 50,
            QType::IQ4NL => 18,
            QType::IQ3S => 110,
            QType::IQ2S => 82,
            QType::IQ4XS => 136,
            QType::IQ1M => 56,
            QType::TQ1_0 => 54,
            QType::TQ2_0 => 66,
            QType::MXFP4 => 17,
        }
    }

    /// Bytes needed for `n` elements, or `None` when `n` is not a whole
    /// number of blocks or the size overflows.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// The name llama.cpp and the `gguf` package print.
    pub fn name(self) -> &'static str {
        match self {
            QType::F32 => "F32",
            QType::F16 => "F16",
            QType::Q4_0 => "Q4_0",
            QType::Q4_1 => "Q4_1",
            QType::Q5_0 => "Q5_0",
            QType::Q5_1 => "Q5_1",
            QType::Q8_0 => "Q8_0",
            QType::Q8_1 => "Q8_1",
            QType::Q2K => "Q2_K",
            QType::Q3K => "Q3_K",
            QType::Q4K => "Q4_K",
            QType::Q5K => "Q5_K",
            QType::Q6K => "Q6_K",
            QType::Q8K => "Q8_K",
            QType::IQ2XXS => "IQ2_XXS",
            QType::IQ2XS => "IQ2_XS",
            QType::IQ3XXS => "IQ3_XXS",
            QType::IQ1S => "IQ1_S",
            QType::IQ4NL => "IQ4_NL",
            QType::IQ3S => "IQ3_S",
            QType::IQ2S => "IQ2_S",
            QType::IQ4XS => "IQ4_XS",
            QType::I8 => "I8",
            QType::I16 => "I16",
            QType::I32 => "I32",
            QType::I64 => "I64",
            QType::F64 => "F64",
            QType::IQ1M => "IQ1_M",
            QType::BF16 => "BF16",
            QType::TQ1_0 => "TQ1_0",
            QType::TQ2_0 => "TQ2_0",
            QType::MXFP4 => "MXFP4",
        }
    }

    pub fn parse(s: &str) -> Option<QType> {
        let up = s.to_ascii_uppercase();
        QType::ALL.iter().copied().find(|t| t.name() == up)
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
}

impl fmt::Display for QType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_are_consistent() {
        for t in QType::ALL {
            assert_eq!(QType::from_ggml_id(t.ggml_id()), Some(t));
            assert_eq!(QType::parse(t.name()), Some(t));
        }
        assert_eq!(QType::from_ggml_id(4), None, "ids 4 and 5 were removed from GGML");
        assert_eq!(QType::Q4K.bytes_for(512), Some(288));
        assert_eq!(QType::Q4_0.bytes_for(33), None);
    }
}

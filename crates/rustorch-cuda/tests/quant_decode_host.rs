//! The block decoders of kernels/quant.cu (the section between its
//! HOST-TESTABLE markers), compiled as plain C++ on the host with a shim
//! for the few CUDA intrinsics they use, against `quant::dequantize`: the
//! same f32 bits for every type, on quantized rows and on random bytes
//! (NaN, infinite and subnormal scales included). The GPU's embedding
//! lookup and its dequantization before cuBLAS call exactly these
//! decoders, so this checks their values on a machine without a GPU.
//! Needs a C++ compiler (`$CXX`, else `c++`); without one the test says so
//! in one line and passes, unless `RUSTORCH_REQUIRE_CXX` is set.

use rustorch_core::quant::{self, QType};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the decoders need from CUDA, in host C++. `-ffp-contract=off`
/// keeps the compiler from fusing what the kernels keep apart (the
/// `_rn` intrinsics are never fused on the device).
const SHIM: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
static inline float __uint_as_float(u32 u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline u32 __float_as_uint(float f) { u32 u; std::memcpy(&u, &f, 4); return u; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
"#;

/// Decodes `rows` rows of `k` values, chunk by chunk as the kernels do:
/// `decode TYPE ROWS K IN OUT`.
const MAIN: &str = r#"
template <class T> static void run(const std::vector<u8>& w, i64 rows, i64 k, std::vector<float>& out) {
    const i64 cpr = k / T::CH, row_bytes = k / T::QK * T::TS;
    for (i64 r = 0; r < rows; ++r)
        for (i64 c = 0; c < cpr; ++c) {
            float v[T::CH];
            q_row_chunk<T>(w.data() + r * row_bytes, c, v);
            for (int i = 0; i < T::CH; ++i) out[r * k + c * T::CH + i] = v[i];
        }
}
int main(int argc, char** argv) {
    if (argc != 6) return 2;
    i64 rows = atoll(argv[2]), k = atoll(argv[3]);
    FILE* f = fopen(argv[4], "rb");
    if (!f) return 3;
    std::vector<u8> w;
    int ch;
    while ((ch = fgetc(f)) != EOF) w.push_back((u8)ch);
    fclose(f);
    std::vector<float> out(rows * k);
#define DISPATCH(NAME, T) if (!strcmp(argv[1], #NAME)) run<T>(w, rows, k, out); else
    Q_TYPES(DISPATCH) { fprintf(stderr, "unknown type %s\n", argv[1]); return 4; }
    f = fopen(argv[5], "wb");
    if (!f) return 5;
    fwrite(out.data(), 4, out.size(), f);
    fclose(f);
    return 0;
}
"#;

fn quant_source() -> &'static str {
    rustorch_cuda::KERNEL_SOURCES
        .iter()
        .find(|(n, _)| *n == "quant")
        .map(|(_, s)| *s)
        .expect("a quant module")
}

/// The section of quant.cu between its markers.
fn decoders() -> &'static str {
    let src = quant_source();
    let begin = src.find("// ---- BEGIN HOST-TESTABLE DECODERS").expect("begin marker");
    let end = src.find("// ---- END HOST-TESTABLE DECODERS").expect("end marker");
    &src[begin..end]
}

/// The host decoder, built once per test run; `None` without a compiler.
fn build(dir: &Path) -> Option<PathBuf> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let src = dir.join("decode.cpp");
    std::fs::write(&src, format!("{SHIM}\n{}\n{MAIN}", decoders())).unwrap();
    let exe = dir.join("decode");
    let out = match Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("RUSTORCH_REQUIRE_CXX").is_none(),
                "no C++ compiler ({cxx}): {e}"
            );
            eprintln!("quant_decode_host: skipped: no C++ compiler ({cxx}: {e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "the decoders do not compile as host C++:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// xorshift64*: deterministic samples.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

const TYPES: [QType; 17] = [
    QType::F32,
    QType::F16,
    QType::BF16,
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
    QType::IQ4NL,
    QType::IQ4XS,
];

#[test]
fn the_kernel_decoders_give_the_dequantize_bits() {
    let dir = std::env::temp_dir().join(format!("rustorch-quant-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = build(&dir) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let mut failures = Vec::new();
    for qtype in TYPES {
        // Rows of 37 values for the plain types (not a multiple of 32),
        // two 256-value blocks' worth for the others.
        let (rows, k) = if qtype.is_quantized() { (5, 512) } else { (5, 37) };
        let n = rows * k;
        let len = qtype.bytes_for(n).unwrap();
        let quantized = quant::quantize(qtype, &(0..n).map(|_| 2.5 * rng.unit()).collect::<Vec<_>>()).unwrap();
        let random: Vec<u8> = (0..len).map(|_| (rng.next() >> 56) as u8).collect();
        for (what, bytes) in [("quantized", quantized), ("random bytes", random)] {
            let want = quant::dequantize(qtype, &bytes, n).unwrap();
            let (inp, outp) = (dir.join("in.bin"), dir.join("out.bin"));
            std::fs::write(&inp, &bytes).unwrap();
            let status = Command::new(&exe)
                .arg(qtype.name())
                .arg(rows.to_string())
                .arg(k.to_string())
                .arg(&inp)
                .arg(&outp)
                .status()
                .unwrap();
            assert!(status.success(), "{qtype}: the decoder failed: {status}");
            let got: Vec<f32> = std::fs::read(&outp)
                .unwrap()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(got.len(), n, "{qtype}");
            // NaN against NaN: the GPU's arithmetic makes canonical NaNs,
            // so payloads are not compared.
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            if let Some(i) = (0..n).find(|&i| !same(got[i], want[i])) {
                failures.push(format!(
                    "{qtype} ({what}): value {i} (row {}, column {}) is {:e} ({:#010x}), dequantize gives {:e} ({:#010x})",
                    i / k,
                    i % k,
                    got[i],
                    got[i].to_bits(),
                    want[i],
                    want[i].to_bits()
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kernels' copy of the IQ4 levels is rustorch-core's table, and each
/// type's block constants are `QType`'s.
#[test]
fn the_kernel_tables_and_sizes_are_rustorch_cores() {
    let src = decoders();
    let at = src.find("Q_KVALUES_IQ4NL[16] = {").expect("the IQ4 table");
    let body = &src[at..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    let table: Vec<i8> = body.split(',').map(|v| v.trim().parse().unwrap()).collect();
    assert_eq!(table, quant::blocks::KVALUES_IQ4NL.to_vec());
    for qtype in TYPES {
        let tag = format!("struct Q{} ", qtype.name());
        let at = src.find(&tag).unwrap_or_else(|| panic!("{qtype}: no {tag}"));
        let line = &src[at..at + src[at..].find('\n').unwrap()];
        let field = |name: &str| -> usize {
            let s = &line[line.find(&format!("{name} =")).unwrap() + name.len() + 2..];
            s.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(field("QK"), qtype.block_size(), "{qtype}");
        assert_eq!(field("TS"), qtype.type_size(), "{qtype}");
        assert_eq!(field("CH"), qtype.block_size().min(32), "{qtype}");
    }
}

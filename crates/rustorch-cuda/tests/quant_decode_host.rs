//! The block decoders of kernels/quant.cu (the section between its
//! HOST-TESTABLE markers), compiled as plain C++ on the host with a shim
//! for the few CUDA intrinsics they use, against `quant::dequantize`: the
//! same f32 bits for every type, on quantized rows and on random bytes
//! (NaN, infinite and subnormal scales included). The GPU's embedding
//! lookup and its dequantization before cuBLAS call exactly these
//! decoders, so this checks their values on a machine without a GPU. The
//! matvec's per-lane loop is compiled too, and its lanes summed as the
//! kernel's shuffles sum them must give the exact products within f32
//! rounding.
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
#include <math.h>
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

/// `decode TYPE ROWS K W OUT`: decodes `rows` rows of `k` values, chunk
/// by chunk as the kernels do. `matvec TYPE ROWS K M W X OUT`: the
/// matvec's products, each the 32 lanes' partial sums (`q_matvec_lane`)
/// added in the order of the kernel's shuffle butterfly.
const MAIN: &str = r#"
template <class T> static void decode(const std::vector<u8>& w, i64 rows, i64 k, std::vector<float>& out) {
    const i64 cpr = k / T::CH, row_bytes = k / T::QK * T::TS;
    for (i64 r = 0; r < rows; ++r)
        for (i64 c = 0; c < cpr; ++c) {
            float v[T::CH];
            q_row_chunk<T>(w.data() + r * row_bytes, c, v);
            for (int i = 0; i < T::CH; ++i) out[r * k + c * T::CH + i] = v[i];
        }
}
template <class T>
static void matvec(const std::vector<u8>& w, i64 n, i64 k, int m, const std::vector<float>& x, std::vector<float>& out) {
    const i64 row_bytes = k / T::QK * T::TS;
    for (i64 j = 0; j < n; ++j) {
        float lanes[32][QMV_MAX_ROWS];
        for (int l = 0; l < 32; ++l) q_matvec_lane<T>(w.data() + j * row_bytes, k, x.data(), m, l, lanes[l]);
        for (int r = 0; r < m; ++r) {
            float s[32];
            for (int l = 0; l < 32; ++l) s[l] = lanes[l][r];
            // __shfl_xor_sync butterfly: every lane adds its partner's value.
            for (int o = 16; o > 0; o >>= 1) {
                float t[32];
                for (int l = 0; l < 32; ++l) t[l] = s[l] + s[l ^ o];
                for (int l = 0; l < 32; ++l) s[l] = t[l];
            }
            out[r * n + j] = s[0];
        }
    }
}
template <class V> static bool slurp(const char* path, std::vector<V>& out) {
    FILE* f = fopen(path, "rb");
    if (!f) return false;
    V v;
    while (fread(&v, sizeof(V), 1, f) == 1) out.push_back(v);
    fclose(f);
    return true;
}
int main(int argc, char** argv) {
    bool mv = argc == 9 && !strcmp(argv[1], "matvec");
    if (!mv && !(argc == 7 && !strcmp(argv[1], "decode"))) return 2;
    i64 rows = atoll(argv[3]), k = atoll(argv[4]);
    int m = mv ? atoi(argv[5]) : 0;
    std::vector<u8> w;
    std::vector<float> x;
    if (!slurp(argv[mv ? 6 : 5], w) || (mv && !slurp(argv[7], x))) return 3;
    std::vector<float> out(mv ? rows * m : rows * k);
#define DISPATCH(NAME, T) \
    if (!strcmp(argv[2], #NAME)) { if (mv) matvec<T>(w, rows, k, m, x, out); else decode<T>(w, rows, k, out); } else
    Q_TYPES(DISPATCH) { fprintf(stderr, "unknown type %s\n", argv[2]); return 4; }
    FILE* f = fopen(argv[argc - 1], "wb");
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

/// The host build of the decoders in `dir`; `None` without a compiler.
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

/// Runs `f` with the host build of the decoders and a scratch directory;
/// without a C++ compiler, says so and returns.
fn with_host_build(test: &str, f: impl FnOnce(&Path, &Path)) {
    let dir = std::env::temp_dir().join(format!("rustorch-quant-host-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if let Some(exe) = build(&dir) {
        f(&exe, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn read_f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn the_kernel_decoders_give_the_dequantize_bits() {
    with_host_build("decode", |exe, dir| {
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
                let (inp, outp) = (dir.join("w.bin"), dir.join("out.bin"));
                std::fs::write(&inp, &bytes).unwrap();
                let status = Command::new(exe)
                    .arg("decode")
                    .arg(qtype.name())
                    .arg(rows.to_string())
                    .arg(k.to_string())
                    .arg(&inp)
                    .arg(&outp)
                    .status()
                    .unwrap();
                assert!(status.success(), "{qtype}: the decoder failed: {status}");
                let got = read_f32s(&outp);
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
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
}

/// The matvec's lanes, summed as its shuffles sum them, give the products
/// of the activations and the dequantized weights within f32 rounding
/// (`k * 2^-24 * sum |x_i w_i|`): each chunk is read once, at the right
/// place, for every activation row. Rows of fewer chunks than lanes and of
/// several chunks per lane, one to eight activation rows.
#[test]
fn the_matvec_lanes_sum_to_the_products() {
    with_host_build("matvec", |exe, dir| {
        let mut rng = Rng(0x0123_4567_89AB_CDEF);
        let mut failures = Vec::new();
        for qtype in TYPES {
            let shapes: &[(usize, usize, usize)] = if qtype.is_quantized() {
                &[(5, 512, 1), (4, 2048, 3), (3, 1024, 8)]
            } else {
                &[(5, 37, 1), (4, 100, 8)]
            };
            for &(n, k, m) in shapes {
                let wv: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
                let x: Vec<f32> = (0..m * k).map(|_| 3.0 * rng.unit()).collect();
                let bytes = quant::quantize(qtype, &wv).unwrap();
                let deq = quant::dequantize(qtype, &bytes, n * k).unwrap();
                let (wp, xp, outp) = (dir.join("w.bin"), dir.join("x.bin"), dir.join("out.bin"));
                std::fs::write(&wp, &bytes).unwrap();
                std::fs::write(&xp, x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
                let status = Command::new(exe)
                    .arg("matvec")
                    .arg(qtype.name())
                    .args([n.to_string(), k.to_string(), m.to_string()])
                    .arg(&wp)
                    .arg(&xp)
                    .arg(&outp)
                    .status()
                    .unwrap();
                assert!(status.success(), "{qtype}: the matvec failed: {status}");
                let got = read_f32s(&outp);
                assert_eq!(got.len(), m * n, "{qtype}");
                for r in 0..m {
                    for j in 0..n {
                        let (xr, wj) = (&x[r * k..(r + 1) * k], &deq[j * k..(j + 1) * k]);
                        let s: f64 = xr.iter().zip(wj).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let a: f64 = xr.iter().zip(wj).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        let bound = (k as f64 * a + s.abs()) / (1u64 << 24) as f64;
                        let g = got[r * n + j] as f64;
                        if (g - s).abs() > bound {
                            failures.push(format!(
                                "{qtype} [{m}x{k}] x [{n}x{k}]^T: ({r}, {j}) is {g:e}, the product {s:e} (bound {bound:e})"
                            ));
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    });
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

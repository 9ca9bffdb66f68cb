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
static inline float __fdiv_rn(float a, float b) { return a / b; }
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
struct uint4 { u32 x, y, z, w; };
// Four signed byte products added to c, as the GPU's dp4a.s32.s32.
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// The low word of hi:lo shifted right by s & 31 bits (funnelshift.r).
static inline u32 __funnelshift_r(u32 lo, u32 hi, u32 s) {
    s &= 31u;
    return s ? (lo >> s) | (hi << (32u - s)) : lo;
}
// Byte i of the result: byte (s >> 4i) & 7 of y:x (selectors up to 7 only;
// the kernels never set the sign-replicate bit).
static inline u32 __byte_perm(u32 x, u32 y, u32 s) {
    u64 v = ((u64)y << 32) | x;
    u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (u32)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
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
// The activation quantizers (kernels qact_q8_32 and qact_q8_k) one block
// at a time: the kernels' per-value steps (qa8_quant, qa8k_quant, ...); their
// warp reductions (max, first index of the max, integer sums) give the
// same result in any order, so a plain loop stands for them.
struct HostActs {
    std::vector<int> q;  // the int8 quants, four per int
    std::vector<float> d, s;
    std::vector<int> sum;
};
static void qact32(const float* x, i64 rows, i64 k, HostActs& a) {
    const i64 blocks = rows * k / 32;
    a.q.assign(rows * k / 4, 0);
    a.d.assign(blocks, 0.0f);
    a.sum.assign(blocks, 0);
    a.s.assign(blocks, 0.0f);
    signed char* q = (signed char*)a.q.data();
    for (i64 t = 0; t < blocks; ++t) {
        const float* v = x + 32 * t;
        float amax = fabsf(v[0]);
        for (int i = 1; i < 32; ++i) amax = qa_max(amax, fabsf(v[i]));
        float dd, id;
        qa8_scale(amax, &dd, &id);
        int total = 0;
        for (int i = 0; i < 32; ++i) {
            int qi = qa8_quant(v[i], id);
            q[32 * t + i] = (signed char)qi;
            total += qi;
        }
        a.d[t] = q_f16_round(dd);
        a.sum[t] = total;
        a.s[t] = q_f16_round(__fmul_rn(dd, (float)total));
    }
}
static void qactk(const float* x, i64 rows, i64 k, HostActs& a) {
    const i64 blocks = rows * k / 256;
    a.q.assign(rows * k / 4, 0);
    a.d.assign(blocks, 0.0f);
    a.sum.assign(blocks * 16, 0);
    a.s.assign(rows * k / 32, 0.0f);
    signed char* q = (signed char*)a.q.data();
    for (i64 t = 0; t < blocks; ++t) {
        const float* v = x + 256 * t;
        float amax = 0.0f;
        for (int i = 0; i < 256; ++i) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        if (amax == 0.0f) continue;
        int first = 0;
        while (fabsf(v[first]) != amax) ++first;
        float iscale = __fdiv_rn(-127.0f, v[first]);
        for (int i = 0; i < 256; ++i) {
            int qi = qa8k_quant(v[i], iscale);
            q[256 * t + i] = (signed char)qi;
            a.sum[16 * t + i / 16] += qi;
        }
        a.d[t] = __fdiv_rn(1.0f, iscale);
    }
}
// One pass of at most M activation rows, team by team: each team's
// 32 tw lanes (q_mmvq_lane, or for one row q_row_lane), summed per warp in
// the order of the kernel's shuffle butterfly, then over the team's warps
// in order (q_team_sum). tw as the launcher picks it (mmvq_team_warps in
// src/ops/quant.rs).
template <class T, int M>
static void mmvq_pass(const u8* w, i64 row_bytes, i64 n, const QActs& a, int m, float* y) {
    const int R = QMMVQ_R(M);
    const i64 units = a.k / QRowUnit<T>::V;
    const int tw = M == 1 ? (units >= 128 ? 4 : units >= 48 ? 2 : 1) : 1;
    for (i64 j0 = 0; j0 < n; j0 += R) {
        int rows = n - j0 < R ? (int)(n - j0) : R;
        static float lanes[128][M][R];
        for (int l = 0; l < 32 * tw; ++l) {
            if (M == 1) {
                lanes[l][0][0] = q_row_lane<T>(w + j0 * row_bytes, a, m > 0, l, 32 * tw);
                // The gated kernel's pass over two rows (this one and the
                // next, or this one twice) sums each as q_row_lane does.
                const i64 j1 = j0 + 1 < n ? j0 + 1 : j0;
                float s0, s1;
                q_row_lane2<T>(w + j0 * row_bytes, w + j1 * row_bytes, a, m > 0, l, 32 * tw, s0, s1);
                const float alone = q_row_lane<T>(w + j1 * row_bytes, a, m > 0, l, 32 * tw);
                if (__float_as_uint(s0) != __float_as_uint(lanes[l][0][0]) || __float_as_uint(s1) != __float_as_uint(alone)) {
                    fprintf(stderr, "q_row_lane2 differs from q_row_lane: row %lld lane %d\n", j0, l);
                    exit(7);
                }
            } else {
                q_mmvq_lane<T, M, R>(w + j0 * row_bytes, row_bytes, rows, a, m, l, 32 * tw, lanes[l]);
            }
        }
        for (int r = 0; r < m; ++r)
            for (int i = 0; i < rows; ++i) {
                float total = 0.0f;
                for (int wi = 0; wi < tw; ++wi) {
                    float s[32];
                    for (int l = 0; l < 32; ++l) s[l] = lanes[32 * wi + l][r][i];
                    for (int o = 16; o > 0; o >>= 1) {
                        float t[32];
                        for (int l = 0; l < 32; ++l) t[l] = s[l] + s[l ^ o];
                        for (int l = 0; l < 32; ++l) s[l] = t[l];
                    }
                    total = wi == 0 ? s[0] : total + s[0];
                }
                y[r * n + j0 + i] = total;
            }
    }
}
// The launcher's product: the activations quantized once, then passes of
// up to QMMVQ_MAX_ROWS rows, each with the smallest kernel (M = 1, 2, 4, 8)
// that holds it.
template <class T>
static void mmvq(const std::vector<u8>& w, i64 n, i64 k, int m, const std::vector<float>& x, std::vector<float>& out) {
    const i64 row_bytes = k / T::QK * T::TS;
    HostActs h;
    const bool kq = QV<T>::ACT == QA_K;
    if (kq) qactk(x.data(), m, k, h); else qact32(x.data(), m, k, h);
    const i64 per_d = kq ? k / 256 : k / 32, per_sum = kq ? k / 16 : k / 32;
    for (int r0 = 0; r0 < m; r0 += QMMVQ_MAX_ROWS) {
        int mr = m - r0 < QMMVQ_MAX_ROWS ? m - r0 : QMMVQ_MAX_ROWS;
        QActs a = {h.q.data() + r0 * (k / 4), h.d.data() + r0 * per_d, h.sum.data() + r0 * per_sum,
                   h.s.data() + r0 * (k / 32), k};
        float* y = out.data() + r0 * n;
        if (mr <= 1) mmvq_pass<T, 1>(w.data(), row_bytes, n, a, mr, y);
        else if (mr <= 2) mmvq_pass<T, 2>(w.data(), row_bytes, n, a, mr, y);
        else if (mr <= 4) mmvq_pass<T, 4>(w.data(), row_bytes, n, a, mr, y);
        else mmvq_pass<T, 8>(w.data(), row_bytes, n, a, mr, y);
    }
}
template <class V> static void dump(FILE* f, const std::vector<V>& v) { fwrite(v.data(), sizeof(V), v.size(), f); }
// `qact 32|K ROWS K X OUT`: the quantized activations, their arrays one
// after another (q, d, sum, then s for 32). `f16 IN OUT`: q_f32_to_f16 of
// each f32. `mmvq TYPE N K M W X OUT`: the products.
static int extra(int argc, char** argv) {
    if (argc == 7 && !strcmp(argv[1], "qact")) {
        i64 rows = atoll(argv[3]), k = atoll(argv[4]);
        std::vector<float> x;
        if (!slurp(argv[5], x)) return 3;
        HostActs h;
        bool kq = !strcmp(argv[2], "K");
        if (kq) qactk(x.data(), rows, k, h); else qact32(x.data(), rows, k, h);
        FILE* f = fopen(argv[6], "wb");
        if (!f) return 5;
        dump(f, h.q); dump(f, h.d); dump(f, h.sum);
        if (!kq) dump(f, h.s);
        fclose(f);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "f16")) {
        std::vector<float> x;
        if (!slurp(argv[2], x)) return 3;
        std::vector<u32> h;
        for (float v : x) h.push_back(q_f32_to_f16(v));
        FILE* f = fopen(argv[3], "wb");
        if (!f) return 5;
        dump(f, h);
        fclose(f);
        return 0;
    }
    if (argc == 9 && !strcmp(argv[1], "mmvq")) {
        i64 n = atoll(argv[3]), k = atoll(argv[4]);
        int m = atoi(argv[5]);
        std::vector<u8> w;
        std::vector<float> x;
        if (!slurp(argv[6], w) || !slurp(argv[7], x)) return 3;
        std::vector<float> out(n * m);
#define MMVQ_DISPATCH(NAME, T) if (!strcmp(argv[2], #NAME)) mmvq<T>(w, n, k, m, x, out); else
        Q_MMVQ_TYPES(MMVQ_DISPATCH) { fprintf(stderr, "no MMVQ for %s\n", argv[2]); return 4; }
        FILE* f = fopen(argv[8], "wb");
        if (!f) return 5;
        dump(f, out);
        fclose(f);
        return 0;
    }
    return -1;
}
int main(int argc, char** argv) {
    int e = extra(argc, argv);
    if (e >= 0) return e;
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
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-o"])
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

// ---- MMVQ: the activation quantizers and the integer products -----------

mod quant_tol;

use rustorch_core::quant::blocks::f32_to_f16;
use rustorch_core::{CpuStorage, Executor, ExecutorConfig, QWeight, Tensor};
use rustorch_cpu::qmatmul::QuantizedRows;
use std::sync::Arc;

/// The weight types with an MMVQ kernel (`Q_MMVQ_TYPES` in quant.cu).
const MMVQ_TYPES: [QType; 14] = [
    QType::Q4_0,
    QType::Q4_1,
    QType::Q5_0,
    QType::Q5_1,
    QType::Q8_0,
    QType::Q8_1,
    QType::IQ4NL,
    QType::Q2K,
    QType::Q3K,
    QType::Q4K,
    QType::Q5K,
    QType::Q6K,
    QType::Q8K,
    QType::IQ4XS,
];

fn write_f32s(path: &Path, v: &[f32]) {
    std::fs::write(path, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

fn run(exe: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let status = Command::new(exe)
        .args(args.iter().map(|a| a.as_ref()))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{:?}: {status}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>()
    );
}

/// `q_f32_to_f16` (the kernels' f16 rounding of activation scales) gives
/// the CPU's f16 bits: normal, subnormal, overflowing, tie and NaN inputs.
#[test]
fn the_kernel_f16_rounding_is_the_cpus() {
    with_host_build("f16", |exe, dir| {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        let mut x: Vec<f32> = (0..200_000)
            .map(|_| f32::from_bits((rng.next() >> 32) as u32))
            .collect();
        x.extend((0..100_000).map(|_| rng.unit() * 2f32.powi((rng.next() % 50) as i32 - 30)));
        // Ties between two f16 values (13 dropped bits exactly 0x1000), the
        // largest finite f16, the halfway point to infinity, subnormal ties.
        x.extend((0..20_000u32).map(|i| f32::from_bits(0x3800_0000 + (i << 13) + 0x1000)));
        x.extend([
            65504.0,
            65519.99,
            65520.0,
            5.96e-8,
            2.98e-8,
            8.94e-8,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NAN,
        ]);
        let (inp, outp) = (dir.join("x.bin"), dir.join("h.bin"));
        write_f32s(&inp, &x);
        run(exe, &[&"f16", &inp, &outp]);
        let got = std::fs::read(&outp).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let g = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap()) as u16;
            let w = u16::from_le_bytes(f32_to_f16(v));
            let nan = |h: u16| h & 0x7c00 == 0x7c00 && h & 0x3ff != 0;
            assert!(
                g == w || (nan(g) && nan(w)),
                "{v:e} ({:#010x}): {g:#06x}, the CPU {w:#06x}",
                v.to_bits()
            );
        }
    });
}

/// Activation rows for the quantizers: blocks at several scales, an
/// all-zero block, ties (values landing on .5 after scaling), and the
/// largest magnitude held by a negative value or by two values.
fn activation_rows(rng: &mut Rng, rows: usize, k: usize) -> Vec<f32> {
    let mut x: Vec<f32> = Vec::with_capacity(rows * k);
    for b in 0..rows * k / 32 {
        let scale = [1.0f32, 3.0, 1e-3, 40.0, 1e-20, 0.0, 7.0][b % 7];
        for i in 0..32 {
            x.push(match b % 11 {
                // 127 / amax = 1: every half-integer is a tie.
                3 => (i as f32 - 16.0) * 0.5 + if i == 5 { 127.0 } else { 0.0 },
                // The maximum negative, and again positive later.
                6 => {
                    if i == 2 {
                        -2.0
                    } else if i == 20 {
                        2.0
                    } else {
                        rng.unit()
                    }
                }
                _ => rng.unit() * scale,
            });
        }
    }
    x
}

/// The kernels' activation quantization (qact_q8_32, qact_q8_k) gives the
/// CPU's dot-type blocks (rustorch-cpu's `QuantizedRows`: Q8_0, Q8_1, Q8_K)
/// bit for bit: the same quants, the same scales, the same sums.
#[test]
fn the_activation_quantizers_are_the_cpus() {
    with_host_build("qact", |exe, dir| {
        let mut rng = Rng(0xA5A5_5A5A_0F0F_F0F0);
        let (rows, k) = (3usize, 1024usize);
        let x = activation_rows(&mut rng, rows, k);
        let (inp, outp) = (dir.join("x.bin"), dir.join("q.bin"));
        write_f32s(&inp, &x);
        let i32_at = |b: &[u8], i: usize| i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        let f32_at = |b: &[u8], i: usize| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());

        run(exe, &[&"qact", &"32", &rows.to_string(), &k.to_string(), &inp, &outp]);
        let got = std::fs::read(&outp).unwrap();
        let nb = rows * k / 32;
        let (q, rest) = got.split_at(rows * k);
        let (d, rest) = rest.split_at(4 * nb);
        let (sum, s) = rest.split_at(4 * nb);
        let q8_0 = QuantizedRows::quantize(QType::Q8_0, &x, k).unwrap();
        let q8_1 = QuantizedRows::quantize(QType::Q8_1, &x, k).unwrap();
        for b in 0..nb {
            let (c0, c1) = (&q8_0.bytes()[34 * b..34 * b + 34], &q8_1.bytes()[36 * b..36 * b + 36]);
            let what = format!("32-value block {b}: {:?}", &x[32 * b..32 * b + 32]);
            assert_eq!(&q[32 * b..32 * b + 32], &c0[2..], "Q8_0 quants, {what}");
            assert_eq!(&q[32 * b..32 * b + 32], &c1[4..], "Q8_1 quants, {what}");
            assert_eq!(f32_to_f16(f32_at(d, b)), [c0[0], c0[1]], "Q8_0 d, {what}");
            assert_eq!(f32_to_f16(f32_at(d, b)), [c1[0], c1[1]], "Q8_1 d, {what}");
            assert_eq!(f32_to_f16(f32_at(s, b)), [c1[2], c1[3]], "Q8_1 s, {what}");
            let qsum: i32 = c0[2..].iter().map(|&v| v as i8 as i32).sum();
            assert_eq!(i32_at(sum, b), qsum, "the sum of the quants, {what}");
        }

        run(exe, &[&"qact", &"K", &rows.to_string(), &k.to_string(), &inp, &outp]);
        let got = std::fs::read(&outp).unwrap();
        let nb = rows * k / 256;
        let (q, rest) = got.split_at(rows * k);
        let (d, sum) = rest.split_at(4 * nb);
        let q8k = QuantizedRows::quantize(QType::Q8K, &x, k).unwrap();
        for b in 0..nb {
            let c = &q8k.bytes()[292 * b..292 * b + 292];
            let what = format!("256-value block {b}");
            assert_eq!(f32_at(d, b).to_bits(), f32_at(c, 0).to_bits(), "Q8_K d, {what}");
            assert_eq!(&q[256 * b..256 * b + 256], &c[4..260], "Q8_K quants, {what}");
            for g in 0..16 {
                let bs = i16::from_le_bytes([c[260 + 2 * g], c[261 + 2 * g]]) as i32;
                assert_eq!(i32_at(sum, 16 * b + g), bs, "Q8_K bsums[{g}], {what}");
            }
        }
    });
}

fn cpu() -> Arc<Executor> {
    Arc::new(Executor::from_backends(
        ExecutorConfig {
            min_offload_elems: 0,
            ..ExecutorConfig::default()
        },
        vec![Arc::new(rustorch_cpu::CpuBackend::new())],
    ))
}

/// The MMVQ kernels' products (quantizer, lanes and shuffle sums as the
/// GPU runs them) of `m` rows `x` with a weight of `n` rows of `k` values.
fn host_mmvq(
    exe: &Path,
    dir: &Path,
    qtype: QType,
    bytes: &[u8],
    x: &[f32],
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let (wp, xp, outp) = (dir.join("w.bin"), dir.join("x.bin"), dir.join("y.bin"));
    std::fs::write(&wp, bytes).unwrap();
    write_f32s(&xp, x);
    run(
        exe,
        &[
            &"mmvq",
            &qtype.name(),
            &n.to_string(),
            &k.to_string(),
            &m.to_string(),
            &wp,
            &xp,
            &outp,
        ],
    );
    let y = read_f32s(&outp);
    assert_eq!(y.len(), m * n, "{qtype}");
    y
}

/// The largest distance of one weight type's products from the CPU's.
#[derive(Default)]
struct Dist {
    max: f64,
    /// Largest |CPU| seen.
    want: f64,
    /// The largest distance relative to sum_i |x_i w_i| of its product.
    rel: f64,
    count: usize,
    outside: Vec<String>,
}

impl Dist {
    fn add(&mut self, what: &str, tol: rustorch_conformance::Tol, got: f32, want: f32, mag: f64) {
        let d = (got as f64 - want as f64).abs();
        self.max = self.max.max(d);
        self.want = self.want.max((want as f64).abs());
        self.rel = self.rel.max(d / mag.max(f64::MIN_POSITIVE));
        self.count += 1;
        if !tol.accepts(got as f64, want as f64) && self.outside.len() < 3 {
            self.outside
                .push(format!("{what}: the MMVQ gives {got:e}, the CPU {want:e} ({tol:?})"));
        }
    }
}

/// sum_i |x_i w_i| for each product of `x [m, k]` and `w [n, k]`: the scale
/// of the f32 rounding both sides commit.
fn magnitudes(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for r in 0..m {
        for j in 0..n {
            out[r * n + j] = (0..k).map(|i| (x[r * k + i] as f64 * w[j * k + i] as f64).abs()).sum();
        }
    }
    out
}

/// The MMVQ kernels multiply the CPU's quantized activations with exact
/// integer sums, so their products are the CPU's but for the order and
/// grouping of the f32 scaling and summation: measured here, as the GPU
/// computes them, on the conformance suite's inputs (the random suite's,
/// quant_ops', the llama.cpp fixtures of ggml_matmul with up to 33 rows,
/// which take several 8-row passes), and all within `quant_tol`.
/// `--nocapture` prints the table quant_tol's numbers come from.
#[test]
fn the_mmvq_products_are_the_cpus_within_quant_tol() {
    with_host_build("mmvq", |exe, dir| {
        let exec = cpu();
        let mut rows: Vec<(QType, Dist)> = MMVQ_TYPES.iter().map(|&q| (q, Dist::default())).collect();
        for (qtype, dist) in rows.iter_mut() {
            let qtype = *qtype;
            let tol = quant_tol::qmatmul(&format!("qmatmul_{}", qtype.name().to_lowercase())).unwrap();
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ qtype.ggml_id() as u64);
            // (m, n, k, trials): the random suite's shape, many draws; a
            // batch of several passes (8 + 4 rows) over longer rows; one
            // row (a decode step's one-row kernels, q_row_lane) with one
            // and with two warps a column.
            for (m, n, k, trials) in [
                (3usize, 16usize, 256usize, 40usize),
                (12, 8, 1024, 3),
                (1, 24, 2048, 6),
                (1, 8, 5632, 2),
            ] {
                for trial in 0..trials {
                    let x: Vec<f32> = (0..m * k).map(|_| 3.0 * rng.unit()).collect();
                    let wv: Vec<f32> = (0..n * k).map(|_| rng.unit()).collect();
                    let bytes = quant::quantize(qtype, &wv).unwrap();
                    let deq = quant::dequantize(qtype, &bytes, n * k).unwrap();
                    let got = host_mmvq(exe, dir, qtype, &bytes, &x, (m, n, k));
                    let w = QWeight::from_bytes_in(&exec, qtype, n, k, bytes).unwrap();
                    let xt = Tensor::from_storage_in(&exec, CpuStorage::F32(x.clone()), [m, k]).unwrap();
                    let want = xt.qmatmul(&w).unwrap().to_vec::<f32>().unwrap();
                    let mag = magnitudes(&x, &deq, m, n, k);
                    for i in 0..m * n {
                        dist.add(
                            &format!("{qtype} [{m}x{k}] #{trial} ({i})"),
                            tol,
                            got[i],
                            want[i],
                            mag[i],
                        );
                    }
                }
            }
        }
        // ggml_matmul's fixtures: llama.cpp's own products.
        let fdir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rustorch-conformance/fixtures/ggml_matmul");
        let mut names: Vec<String> = std::fs::read_dir(&fdir)
            .expect("the ggml_matmul fixtures")
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".bin"))
            .collect();
        names.sort();
        for name in names {
            let (ty, shape) = name.strip_suffix(".bin").unwrap().rsplit_once('_').unwrap();
            let (n, k) = shape.split_once('x').unwrap();
            let (n, k): (usize, usize) = (n.parse().unwrap(), k.parse().unwrap());
            let qtype = QType::parse(ty).unwrap();
            let Some((_, dist)) = rows.iter_mut().find(|(q, _)| *q == qtype) else {
                continue;
            };
            let tol = quant_tol::qmatmul(&format!("qmatmul_{}", qtype.name().to_lowercase())).unwrap();
            let bytes = std::fs::read(fdir.join(&name)).unwrap();
            let x = read_f32s(&fdir.join(format!("x_{k}.f32")));
            let wlen = qtype.bytes_for(k).unwrap() * n;
            let w = &bytes[4..4 + wlen];
            let deq = quant::dequantize(qtype, w, n * k).unwrap();
            let mut at = 4 + wlen;
            for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 33] {
                let want: Vec<f32> = bytes[at..at + 4 * m * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                at += 4 * m * n;
                let got = host_mmvq(exe, dir, qtype, w, &x[..m * k], (m, n, k));
                let mag = magnitudes(&x[..m * k], &deq, m, n, k);
                for i in 0..m * n {
                    dist.add(&format!("{name} m = {m} ({i})"), tol, got[i], want[i], mag[i]);
                }
            }
        }
        eprintln!(
            "{:<8} {:>7} {:>12} {:>12} {:>14}",
            "type", "values", "max |d|", "max |cpu|", "max |d|/sum|xw|"
        );
        let mut outside = Vec::new();
        for (q, d) in &rows {
            eprintln!(
                "{:<8} {:>7} {:>12.3e} {:>12.3e} {:>14.3e}",
                q.name(),
                d.count,
                d.max,
                d.want,
                d.rel
            );
            outside.extend(d.outside.iter().cloned());
        }
        assert!(outside.is_empty(), "{}", outside.join("\n"));
    });
}

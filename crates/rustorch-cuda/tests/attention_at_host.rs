//! The `Op::AttentionAt` kernels of kernels/attention.cu (its sections
//! between HOST-TESTABLE markers), compiled as host C++ and run block by
//! block, each block's 128 threads as host threads (a barrier for
//! `__syncthreads`, one per warp for the shuffles), against the CPU
//! backend's `attention_at`: the split of each row's keys over S blocks,
//! the warps' online softmax, the merges and the error flag, checked on a
//! machine without a GPU. Each case fills the cache with NaN from
//! pos + T on (a key read there would show in the output) and the scratch
//! with NaN (an accumulator read where none was written would too). The
//! form that rotates its query and new key and writes the caches itself
//! (`attention_rope_at_joined_F16_pl*`'s blocks) runs against the CPU's RoPE,
//! cache write and attention, the caches compared bit for bit.
//! Needs a C++20 compiler (`$CXX`, else `c++`); without one the test says
//! so in one line and passes, unless `RUSTORCH_REQUIRE_CXX` is set.

use rustorch_core::{CpuStorage, DType, Layout, Op, RopeLayout, Shape, TensorMeta};
use rustorch_cpu::{CpuBackend, CpuInput};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the kernels need from CUDA, in host C++: thread and block indices,
/// `__syncthreads` and `__shfl_xor_sync` over host threads, the element
/// loads of common.cuh. `__shared__` arrays are statics: one block runs at
/// a time.
const SHIM: &str = r#"
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
// kernels/common.cuh's wait for the kernel before (one launch at a time here).
static inline void rt_kernel_entry() {}
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx;
static Dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* rt_block;
static std::barrier<>* rt_warp[32];
static double rt_lanes[32][32];
static inline void __syncthreads() { rt_block->arrive_and_wait(); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    rt_lanes[w][l] = (double)v;
    rt_warp[w]->arrive_and_wait();
    const T r = (T)rt_lanes[w][l ^ o];
    rt_warp[w]->arrive_and_wait();
    return r;
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
    const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
    rt_lanes[w][l] = (double)v;
    rt_warp[w]->arrive_and_wait();
    const T r = (T)rt_lanes[w][src & 31];
    rt_warp[w]->arrive_and_wait();
    return r;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
struct F32T { typedef float store; typedef float acc; };
struct F16T { typedef u16 store; typedef float acc; };
struct BF16T { typedef u16 store; typedef float acc; };
static inline u16 store(F16T, float x) { _Float16 h = (_Float16)x; u16 u; std::memcpy(&u, &h, 2); return u; }
static inline float load(F32T, float x) { return x; }
static inline float load(BF16T, u16 h) { u32 u = (u32)h << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline float load(F16T, u16 h) {
    const u32 sign = (u32)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) {
        f = std::ldexp((float)m, -24);
    } else if (e == 31) {
        u32 u = 0x7f800000u | (m << 13);
        std::memcpy(&f, &u, 4);
    } else {
        u32 u = ((e + 112) << 23) | (m << 13);
        std::memcpy(&f, &u, 4);
    }
    u32 u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
}
"#;

/// `attention_at Q KV h t d hkv n dv window pos_off pos64 splits
/// scale q.s1 q.s2 q.s3 q.off k.s1 .. v.s1 .. qfile kfile vfile posfile
/// out [half interleaved knew vnew cos sin]`: the grid (h*t, splits) of
/// `attention_at_<KV>`, then h*t blocks of `attention_at_combine`; writes y
/// (h*t*dv floats) and the flag (an i32). With the six RoPE arguments (f32
/// q, f16 caches, one query row): `attention_at_part<F16T, true>` (the
/// decode attention that rotates q and the new key at the tables' row and
/// writes the new key and values into the caches), then the caches too, to
/// `out.k` and `out.v`.
const MAIN: &str = r#"
template <class F> static void grid(unsigned gx, unsigned gy, unsigned nthreads, F body) {
    gridDim = {gx, gy, 1};
    blockDim = {nthreads, 1, 1};
    std::barrier<> block(nthreads);
    rt_block = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < nthreads / 32; ++w) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        rt_warp[w] = warps.back().get();
    }
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            blockIdx = {bx, by, 0};
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < nthreads; ++t)
                threads.emplace_back([t, &body] {
                    threadIdx = {t, 0, 0};
                    body();
                });
            for (auto& t : threads) t.join();
        }
}
static std::vector<u8> slurp(const char* path) {
    std::vector<u8> out;
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(3); }
    int c;
    while ((c = fgetc(f)) != EOF) out.push_back((u8)c);
    fclose(f);
    return out;
}
int main(int argc, char** argv) {
    if (argc != 31 && argc != 38) return 2;
    const bool roped = argc == 38;
    const char* qty = argv[1];
    const char* kty = argv[2];
    i64 a[10];
    for (int i = 0; i < 10; ++i) a[i] = atoll(argv[3 + i]);
    const i64 h = a[0], t = a[1], d = a[2], hkv = a[3], n = a[4], dv = a[5], window = a[6];
    const i64 pos_off = a[7];
    const int pos64 = (int)a[8];
    const i64 splits = a[9];
    const float scale = (float)atof(argv[13]);
    Str4 l[3];
    for (int o = 0; o < 3; ++o) {
        l[o].s[0] = 0;
        for (int i = 0; i < 3; ++i) l[o].s[1 + i] = atoll(argv[14 + 4 * o + i]);
        l[o].off = atoll(argv[17 + 4 * o]);
    }
    std::vector<u8> q = slurp(argv[26]), k = slurp(argv[27]), v = slurp(argv[28]), pos = slurp(argv[29]);
    const int qtype = !strcmp(qty, "F32") ? 0 : !strcmp(qty, "F16") ? 1 : 2;
    const i64 rows = h * t;
    std::vector<float> part(rows * splits * (dv + 2), NAN), y(rows * dv, -1.0f);
    int bad = 0;
    bool found = false;
#define AT_RUN(KTY)                                                                            \
    if (!strcmp(kty, #KTY)) {                                                                  \
        found = true;                                                                          \
        grid((unsigned)rows, (unsigned)splits, AT_THREADS, [&] {                               \
            attention_at_##KTY(q.data(), qtype, l[0], (const KTY##T::store*)k.data(),          \
                                         l[1], (const KTY##T::store*)v.data(), l[2], pos.data(), \
                                         pos_off, pos64, part.data(), t, n, d, dv,             \
                                         hkv ? h / hkv : 0, window, scale, &bad,               \
                                         AT_KEYS_PER_SPLIT, 0, 0);                             \
        });                                                                                    \
    }
    std::vector<u8> knew, vnew, cs, sn;
    if (roped) {
        if (strcmp(kty, "F16") || qtype != 0 || t != 1) return 6;
        knew = slurp(argv[33]);
        vnew = slurp(argv[34]);
        cs = slurp(argv[35]);
        sn = slurp(argv[36]);
        const AtRope rope = {(const float*)knew.data(), (const float*)vnew.data(), (const float*)cs.data(),
                             (const float*)sn.data(), atoll(argv[31]), atoi(argv[32]), atoll(argv[37])};
        found = true;
        grid((unsigned)rows, (unsigned)splits, AT_THREADS, [&] {
            attention_at_part<F16T, true>(q.data(), 0, l[0], (const u16*)k.data(), l[1], (const u16*)v.data(), l[2],
                                          pos.data(), pos_off, pos64, part.data(), t, n, d, dv, hkv ? h / hkv : 0,
                                          window, scale, &bad, nullptr, AT_KEYS_PER_SPLIT, 0, 0, rope);
        });
    } else {
        AT_RUN(F32) AT_RUN(F16) AT_RUN(BF16)
    }
    if (!found) return 4;
    grid((unsigned)rows, 1, AT_THREADS, [&] { attention_at_combine(part.data(), y.data(), splits, dv); });
    FILE* f = fopen(argv[30], "wb");
    if (!f) return 5;
    fwrite(y.data(), 4, y.size(), f);
    fwrite(&bad, 4, 1, f);
    fclose(f);
    if (roped) {
        for (auto [ext, buf] : {std::pair{".k", &k}, std::pair{".v", &v}}) {
            FILE* c = fopen((std::string(argv[30]) + ext).c_str(), "wb");
            if (!c) return 5;
            fwrite(buf->data(), 1, buf->size(), c);
            fclose(c);
        }
    }
    return 0;
}
"#;

fn section(src: &str, name: &str) -> String {
    let begin = format!("// ---- BEGIN HOST-TESTABLE {name}");
    let end = format!("// ---- END HOST-TESTABLE {name}");
    let b = src.find(&begin).unwrap_or_else(|| panic!("{begin}"));
    let e = src.find(&end).unwrap_or_else(|| panic!("{end}"));
    src[b..e].to_string()
}

/// The host build of the kernels in `dir`; `None` without a compiler.
fn build(dir: &Path) -> Option<PathBuf> {
    let src = rustorch_cuda::KERNEL_SOURCES
        .iter()
        .find(|(n, _)| *n == "attention")
        .map(|(_, s)| *s)
        .expect("an attention module");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let file = dir.join("attention_at.cpp");
    let code = format!(
        "{SHIM}\n{}\n{}\n{MAIN}",
        section(src, "HELPERS"),
        section(src, "ATTENTION_AT")
    );
    std::fs::write(&file, code).unwrap();
    let exe = dir.join("attention_at");
    let out = match Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-ffp-contract=off", "-pthread", "-o"])
        .arg(&exe)
        .arg(&file)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var_os("RUSTORCH_REQUIRE_CXX").is_none(),
                "no C++ compiler ({cxx}): {e}"
            );
            eprintln!("attention_at_host: skipped: no C++ compiler ({cxx}: {e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "the kernels do not compile as host C++:\n{}",
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
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    q: DType,
    kv: DType,
    h: usize,
    hkv: usize,
    t: usize,
    n: usize,
    d: usize,
    dv: usize,
    pos: i64,
    window: Option<usize>,
    splits: usize,
    /// q a transposed view of a [H, D, T] buffer; the keys of a
    /// [Hkv, D, N] buffer (feature stride N).
    q_transposed: bool,
    k_transposed: bool,
    pos_i32: bool,
}

/// An operand: host storage and the layout over it.
struct Operand {
    storage: CpuStorage,
    layout: Layout,
}

fn operand(dims: [usize; 3], dtype: DType, transposed: bool, values: impl Fn([usize; 3]) -> f64) -> Operand {
    let [a, b, c] = dims;
    // The buffer [a, c, b] when transposed, read as [a, b, c].
    let layout = if transposed {
        Layout::contiguous(Shape::from([a, c, b])).transpose("t", 1, 2).unwrap()
    } else {
        Layout::contiguous(Shape::from(dims))
    };
    let mut buf = vec![0.0; a * b * c];
    let s = layout.strides().to_vec();
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                buf[layout.offset() + i * s[0] + j * s[1] + k * s[2]] = values([i, j, k]);
            }
        }
    }
    Operand {
        storage: CpuStorage::from_f64_iter(dtype, buf.into_iter()),
        layout,
    }
}

fn suffix(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        _ => unreachable!("no kernel for {d}"),
    }
}

/// Runs a case on the host build and on the CPU backend; returns the
/// largest difference, or checks that both refuse a bad position.
fn run_case(exe: &Path, dir: &Path, c: Case, seed: u64) -> f64 {
    let mut rng = Rng(seed);
    let end = (c.pos.max(0) as usize + c.t).min(c.n);
    let mut q_vals = vec![0.0; c.h * c.t * c.d];
    q_vals.iter_mut().for_each(|x| *x = rng.unit());
    let mut k_vals = vec![0.0; c.hkv * c.n * c.d];
    k_vals.iter_mut().for_each(|x| *x = rng.unit());
    let mut v_vals = vec![0.0; c.hkv * c.n * c.dv];
    v_vals.iter_mut().for_each(|x| *x = rng.unit());
    let q = operand([c.h, c.t, c.d], c.q, c.q_transposed, |[i, j, k]| {
        q_vals[(i * c.t + j) * c.d + k]
    });
    let hidden = |j: usize, x: f64| if j >= end { f64::NAN } else { x };
    let k = operand([c.hkv, c.n, c.d], c.kv, c.k_transposed, |[i, j, k]| {
        hidden(j, k_vals[(i * c.n + j) * c.d + k])
    });
    let v = operand([c.hkv, c.n, c.dv], c.kv, false, |[i, j, k]| {
        hidden(j, v_vals[(i * c.n + j) * c.dv + k])
    });
    // The position at offset 1 of a buffer of 2, as a view would put it.
    let pos_dtype = if c.pos_i32 { DType::I32 } else { DType::I64 };
    let pos = Operand {
        storage: CpuStorage::from_f64_iter(pos_dtype, [-7.0, c.pos as f64].into_iter()),
        layout: Layout::contiguous_with_offset(Shape::from([1]), 1),
    };
    let scale = 1.0 / (c.d as f32).sqrt();
    let op = Op::AttentionAt {
        scale,
        window: c.window,
    };
    let inputs: Vec<CpuInput<'_>> = [&q, &k, &v, &pos]
        .iter()
        .map(|o| CpuInput {
            storage: &o.storage,
            layout: &o.layout,
        })
        .collect();
    let want = CpuBackend::run(&op, &inputs, &[TensorMeta::new([c.h, c.t, c.dv], DType::F32)]);

    let files: Vec<PathBuf> = ["q", "k", "v", "pos"]
        .iter()
        .zip([&q, &k, &v, &pos])
        .map(|(name, o)| {
            let p = dir.join(format!("{name}.bin"));
            std::fs::write(&p, o.storage.as_host().as_bytes()).unwrap();
            p
        })
        .collect();
    let out = dir.join("y.bin");
    let strides = |o: &Operand| {
        let s = o.layout.strides();
        [s[0], s[1], s[2], o.layout.offset()].map(|x| x.to_string())
    };
    let mut args: Vec<String> = vec![suffix(c.q).into(), suffix(c.kv).into()];
    let window = c.window.map_or(0, |w| w as i64);
    for x in [
        c.h as i64,
        c.t as i64,
        c.d as i64,
        c.hkv as i64,
        c.n as i64,
        c.dv as i64,
        window,
        1,
        (!c.pos_i32) as i64,
        c.splits as i64,
    ] {
        args.push(x.to_string());
    }
    args.push(format!("{scale:e}"));
    for o in [&q, &k, &v] {
        args.extend(strides(o));
    }
    args.extend(files.iter().map(|p| p.display().to_string()));
    args.push(out.display().to_string());
    let status = Command::new(exe).args(&args).status().unwrap();
    assert!(status.success(), "{c:?}: the host run failed ({status})");
    let bytes = std::fs::read(&out).unwrap();
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (y, flag) = floats.split_at(floats.len() - 1);
    let bad = flag[0].to_bits() != 0;
    match want {
        Err(e) => {
            assert!(bad, "{c:?}: the CPU refuses it ({e}) but the kernel set no flag");
            0.0
        }
        Ok(want) => {
            assert!(!bad, "{c:?}: the kernel flagged a position the CPU takes");
            let want = want[0].to_f64_vec();
            assert_eq!(y.len(), want.len(), "{c:?}");
            let mut worst = 0.0f64;
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                let err = (g as f64 - w).abs();
                assert!(
                    err <= 2e-5 + 2e-5 * w.abs(),
                    "{c:?}: element {i} is {g}, the CPU gives {w}"
                );
                worst = worst.max(err);
            }
            worst
        }
    }
}

/// A case of the decode attention that rotates its inputs and writes the
/// caches itself (`attention_at_part<F16T, true>`): f32 q of one row a
/// head, f16 caches of `n` positions, RoPE tables of `n` rows of `half`.
#[derive(Clone, Copy, Debug)]
struct RopeCase {
    h: usize,
    hkv: usize,
    n: usize,
    d: usize,
    dv: usize,
    half: usize,
    pos: i64,
    /// The position the kernel read before its wait (in the cache), which
    /// it checks: `None`, the position itself (clamped into the cache).
    guess: Option<i64>,
    window: Option<usize>,
    splits: usize,
    layout: RopeLayout,
}

fn f32_storage(v: &[f64]) -> CpuStorage {
    CpuStorage::from_f64_iter(DType::F32, v.iter().copied())
}

fn cpu_run(op: &Op, inputs: &[(&CpuStorage, Layout)], out: TensorMeta) -> Result<CpuStorage, String> {
    let inputs: Vec<CpuInput<'_>> = inputs
        .iter()
        .map(|(storage, layout)| CpuInput { storage, layout })
        .collect();
    CpuBackend::run(op, &inputs, &[out])
        .map(|mut v| v.remove(0))
        .map_err(|e| e.to_string())
}

/// Runs a RoPE case on the host build and on the CPU backend (the row of
/// the tables at the position, `Op::Rope` of q and of the new key, both
/// caches written, `Op::AttentionAt`): the output to the attention's
/// tolerance and both caches' bits, or both refusing a bad position. The
/// caches hold NaN at the position before the kernel writes it (a read
/// before the write would show) and from the position on.
fn run_rope_case(exe: &Path, dir: &Path, c: RopeCase, seed: u64) -> f64 {
    let mut rng = Rng(seed);
    let mut draw = |n: usize| (0..n).map(|_| rng.unit()).collect::<Vec<f64>>();
    let (q_vals, k_new, v_new) = (draw(c.h * c.d), draw(c.hkv * c.d), draw(c.hkv * c.dv));
    let (k_vals, v_vals) = (draw(c.hkv * c.n * c.d), draw(c.hkv * c.n * c.dv));
    let (cs, sn) = (draw(c.n * c.half), draw(c.n * c.half));
    let contiguous = |dims: &[usize]| Layout::contiguous(Shape::from(dims.to_vec()));
    let p = c.pos;
    let valid = p >= 0 && (p as usize) < c.n;
    // The caches as the kernel gets them: NaN at the position and past it.
    let cache = |vals: &[f64], w: usize, row: Option<&[f64]>| {
        let mut out = Vec::with_capacity(vals.len());
        for hk in 0..c.hkv {
            for j in 0..c.n {
                for f in 0..w {
                    let at = j as i64 == p;
                    out.push(match row {
                        Some(r) if at => r[hk * w + f],
                        _ if j as i64 >= p => f64::NAN,
                        _ => vals[(hk * c.n + j) * w + f],
                    });
                }
            }
        }
        CpuStorage::from_f64_iter(DType::F16, out.into_iter())
    };
    let (k_in, v_in) = (cache(&k_vals, c.d, None), cache(&v_vals, c.dv, None));
    let q = f32_storage(&q_vals);
    let pos = CpuStorage::from_f64_iter(DType::I64, [-7.0, p as f64].into_iter());
    let pos_layout = Layout::contiguous_with_offset(Shape::from([1]), 1);
    let scale = 1.0 / (c.d as f32).sqrt();
    let want = if valid {
        let at = p as usize;
        let row = |t: &[f64]| f32_storage(&t[at * c.half..(at + 1) * c.half]);
        let (cos, sin) = (row(&cs), row(&sn));
        let rope = Op::Rope { layout: c.layout };
        let rotate = |x: &CpuStorage, heads: usize| {
            cpu_run(
                &rope,
                &[
                    (x, contiguous(&[heads, 1, c.d])),
                    (&cos, contiguous(&[1, c.half])),
                    (&sin, contiguous(&[1, c.half])),
                ],
                TensorMeta::new([heads, 1, c.d], DType::F32),
            )
            .unwrap()
            .to_f64_vec()
        };
        let (q_rot, k_rot) = (rotate(&q, c.h), rotate(&f32_storage(&k_new), c.hkv));
        let (k_want, v_want) = (cache(&k_vals, c.d, Some(&k_rot)), cache(&v_vals, c.dv, Some(&v_new)));
        let y = cpu_run(
            &Op::AttentionAt {
                scale,
                window: c.window,
            },
            &[
                (&f32_storage(&q_rot), contiguous(&[c.h, 1, c.d])),
                (&k_want, contiguous(&[c.hkv, c.n, c.d])),
                (&v_want, contiguous(&[c.hkv, c.n, c.dv])),
                (&pos, pos_layout.clone()),
            ],
            TensorMeta::new([c.h, 1, c.dv], DType::F32),
        )
        .unwrap();
        Some((y.to_f64_vec(), k_want, v_want))
    } else {
        None
    };

    let write = |name: &str, st: &CpuStorage| {
        let path = dir.join(format!("{name}.bin"));
        std::fs::write(&path, st.as_host().as_bytes()).unwrap();
        path.display().to_string()
    };
    let out = dir.join("y.bin");
    let mut args: Vec<String> = vec!["F32".into(), "F16".into()];
    let window = c.window.map_or(0, |w| w as i64);
    for x in [c.h, 1, c.d, c.hkv, c.n, c.dv]
        .map(|x| x as i64)
        .into_iter()
        .chain([window, 1, 1, c.splits as i64])
    {
        args.push(x.to_string());
    }
    args.push(format!("{scale:e}"));
    for (dims, w) in [([c.h, 1], c.d), ([c.hkv, c.n], c.d), ([c.hkv, c.n], c.dv)] {
        let l = contiguous(&[dims[0], dims[1], w]);
        let st = l.strides();
        args.extend([st[0], st[1], st[2], 0].map(|x| x.to_string()));
    }
    args.extend([write("q", &q), write("k", &k_in), write("v", &v_in), write("pos", &pos)]);
    args.push(out.display().to_string());
    args.push(c.half.to_string());
    args.push((matches!(c.layout, RopeLayout::Interleaved) as i32).to_string());
    args.extend([
        write("knew", &f32_storage(&k_new)),
        write("vnew", &f32_storage(&v_new)),
        write("cs", &f32_storage(&cs)),
        write("sn", &f32_storage(&sn)),
    ]);
    args.push(c.guess.unwrap_or(p.clamp(0, c.n as i64 - 1)).to_string());
    let status = Command::new(exe).args(&args).status().unwrap();
    assert!(status.success(), "{c:?}: the host run failed ({status})");
    let floats: Vec<f32> = std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (y, flag) = floats.split_at(floats.len() - 1);
    let bad = flag[0].to_bits() != 0;
    let Some((want, k_want, v_want)) = want else {
        assert!(bad, "{c:?}: a position outside the cache, but the kernel set no flag");
        return 0.0;
    };
    assert!(!bad, "{c:?}: the kernel flagged a position the CPU takes");
    let read = |ext: &str| std::fs::read(format!("{}{ext}", out.display())).unwrap();
    assert_eq!(read(".k"), k_want.as_host().as_bytes(), "{c:?}: the key cache");
    assert_eq!(read(".v"), v_want.as_host().as_bytes(), "{c:?}: the value cache");
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= 2e-5 + 2e-5 * w.abs(),
            "{c:?}: element {i} is {g}, the CPU gives {w}"
        );
        worst = worst.max(err);
    }
    worst
}

#[test]
fn the_kernels_match_the_cpu() {
    let dir = std::env::temp_dir().join(format!("rustorch-attention-at-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = build(&dir) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let base = Case {
        q: DType::F32,
        kv: DType::F16,
        h: 6,
        hkv: 2,
        t: 3,
        n: 40,
        d: 64,
        dv: 32,
        pos: 17,
        window: None,
        splits: 1,
        q_transposed: false,
        k_transposed: false,
        pos_i32: false,
    };
    let cases = [
        base,
        Case { t: 1, ..base },
        Case { pos: 0, ..base },
        Case {
            pos: 37,
            splits: 3,
            ..base
        },
        // More splits than keys (empty blocks), and uneven shares.
        Case {
            pos: 0,
            t: 2,
            splits: 32,
            ..base
        },
        Case {
            pos: 30,
            splits: 7,
            ..base
        },
        Case {
            window: Some(5),
            pos: 30,
            splits: 2,
            ..base
        },
        Case {
            window: Some(1),
            t: 1,
            pos: 39,
            splits: 4,
            ..base
        },
        Case {
            window: Some(64),
            pos: 20,
            ..base
        },
        Case {
            q: DType::BF16,
            kv: DType::F32,
            pos_i32: true,
            splits: 2,
            ..base
        },
        Case {
            q: DType::F16,
            kv: DType::BF16,
            q_transposed: true,
            k_transposed: true,
            ..base
        },
        Case {
            h: 2,
            hkv: 1,
            t: 1,
            n: 600,
            d: 256,
            dv: 256,
            pos: 599,
            splits: 3,
            ..base
        },
        Case {
            h: 4,
            hkv: 4,
            t: 2,
            n: 300,
            d: 128,
            dv: 64,
            pos: 200,
            window: Some(100),
            splits: 2,
            ..base
        },
        // Large groups; a chunk of keys past 32 (two batches of values).
        Case {
            splits: 3,
            pos: 37,
            ..base
        },
        Case {
            h: 24,
            hkv: 2,
            pos: 30,
            splits: 2,
            ..base
        },
        Case {
            h: 16,
            hkv: 2,
            n: 300,
            d: 128,
            dv: 128,
            pos: 290,
            splits: 5,
            ..base
        },
        // Refused: past the end, negative, far past (the kernel reads no key).
        Case { pos: 38, ..base },
        Case {
            pos: -1,
            pos_i32: true,
            splits: 3,
            ..base
        },
        Case {
            pos: 1 << 40,
            t: 1,
            ..base
        },
    ];
    let mut worst = 0.0f64;
    for (i, c) in cases.iter().enumerate() {
        worst = worst.max(run_case(&exe, &dir, *c, 0x5EED + i as u64));
    }
    // The attention that rotates its inputs and writes the caches itself:
    // both layouts, partial rotation, the first and last positions, a
    // window, several splits (the new key in the last one's share), and a
    // position past the cache.
    let rope = RopeCase {
        h: 6,
        hkv: 2,
        n: 40,
        d: 64,
        dv: 32,
        half: 32,
        pos: 17,
        guess: None,
        window: None,
        splits: 1,
        layout: RopeLayout::NeoX,
    };
    let rope_cases = [
        rope,
        RopeCase {
            layout: RopeLayout::Interleaved,
            half: 24,
            pos: 0,
            ..rope
        },
        RopeCase {
            pos: 39,
            splits: 3,
            window: Some(7),
            ..rope
        },
        RopeCase {
            layout: RopeLayout::Interleaved,
            pos: 30,
            splits: 5,
            ..rope
        },
        RopeCase { pos: 40, ..rope },
        // A wrong guess of the position before the wait: the kernel reads
        // the new row again at the position.
        RopeCase { guess: Some(3), ..rope },
        RopeCase {
            pos: 39,
            guess: Some(0),
            splits: 3,
            window: Some(7),
            ..rope
        },
        RopeCase {
            guess: Some(39),
            ..rope
        },
        // Heads wider than the block (two features a thread), with a right
        // and a wrong guess.
        RopeCase {
            d: 256,
            dv: 160,
            half: 64,
            ..rope
        },
        RopeCase {
            d: 256,
            dv: 160,
            half: 64,
            guess: Some(5),
            ..rope
        },
    ];
    for (i, c) in rope_cases.iter().enumerate() {
        worst = worst.max(run_rope_case(&exe, &dir, *c, 0xA0BE + i as u64));
    }
    eprintln!(
        "attention_at_host: {} cases and {} with the RoPE and cache write, largest difference from the CPU {worst:.2e}",
        cases.len(),
        rope_cases.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

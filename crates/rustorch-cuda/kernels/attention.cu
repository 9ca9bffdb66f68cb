// Attention: Op::Sdpa (any float dtype, masks, grouped-query heads),
// Op::CachedAttention and Op::FlashAttention (f32 queries over an f16
// key/value cache, llama.cpp's layouts).
//
// One block of ATT_THREADS threads per query row. Keys go in tiles of
// ATT_TILE: each warp takes whole keys of the tile (its lanes split the head
// dimension, so a key row is read coalesced), the scores land in shared
// memory, and an online softmax (running max `m`, running sum `l`, the
// accumulator rescaled by exp(m_old - m_new) when the max grows) folds the
// tile into the output. Nothing is sized by the key count, so caches of any
// length work; shared memory holds the query row, the output accumulator
// and two tiles (the launcher declines head dims that would not fit).
//
// Masked scores are -inf and add exact zeros; a tile whose every score is
// -inf is skipped, so a row that sees no key keeps m = -inf and l = 0 and
// each op then writes what its CPU reference writes for such rows. NaN
// propagates (the max below keeps NaN), as on the CPU.
#include "common.cuh"

// ---- BEGIN HOST-TESTABLE HELPERS (tests/attention_at_host.rs) -----------
#define ATT_THREADS 128
#define ATT_TILE 64
#define NEG_INF (-__int_as_float(0x7f800000))

// An operand of up to 4 dims (leading dims of smaller ones have stride 0):
// element (a, b, c, d) sits at off + a*s[0] + b*s[1] + c*s[2] + d*s[3].
// Mirrors `Str4` in src/ops/attention.rs.
struct Str4 {
    i64 s[4];
    i64 off;
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// max that keeps NaN (the CPU's row max is NaN when any element is).
template <typename A> __device__ __forceinline__ A nan_max(A a, A b) {
    if (a != a) return a;
    if (b != b) return b;
    return b > a ? b : a;
}
// nan_max over the warp, in every lane.
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float a_exp(float x) { return expf(x); }
__device__ __forceinline__ double a_exp(double x) { return exp(x); }
// Products rounded on their own: NVRTC would otherwise contract
// `dot * scale + mask` into one FMA, which the CPU does not do.
__device__ __forceinline__ float a_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double a_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float a_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double a_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float a_neg_inf(float) { return NEG_INF; }
__device__ __forceinline__ double a_neg_inf(double) { return (double)NEG_INF; }

// ---- END HOST-TESTABLE HELPERS ---------------------------------------------

// The online-softmax state of one row; every thread of the block holds the
// same copy (each computes it from shared memory in the same order).
template <typename A> struct Online {
    A m;
    A l;
};

// Folds one tile of scores `ss[0..n]` into the row: sets `sp[0..n]` to the
// weights exp(s - m_new) and returns the factor the accumulator must be
// multiplied by first, or sets *skip when the tile holds no visible key
// (every score -inf; the tile then changes nothing). Ends with a barrier
// after writing `sp`; the caller's next barrier must follow its reads of
// `sp` and `ss`.
template <typename A>
__device__ A fold_tile(Online<A>& st, const A* ss, A* sp, int n, bool* skip) {
    A tmax = a_neg_inf(A());
    for (int j = 0; j < n; ++j) tmax = nan_max(tmax, ss[j]);
    A mnew = nan_max(st.m, tmax);
    *skip = mnew == a_neg_inf(A());
    if (*skip) return (A)1;
    // exp(-inf) = 0 for a row that saw nothing before; NaN stays NaN.
    A corr = a_exp(st.m - mnew);
    for (int j = threadIdx.x; j < n; j += blockDim.x) sp[j] = a_exp(ss[j] - mnew);
    __syncthreads();
    A tsum = 0;
    for (int j = 0; j < n; ++j) tsum += sp[j];
    st.l = st.l * corr + tsum;
    st.m = mnew;
    return corr;
}

// ---- Op::Sdpa ------------------------------------------------------------
// q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], each through its
// own strides; y [B, Hq, Tq, Dv] contiguous. causal: 0 none (or explicit),
// 1 Causal (query i sees keys 0..=i), 2 CausalFromEnd (0..=i + Tk - Tq).
// mask_kind: 0 none, 1 bool (u8, true keeps), 2 float of the query's dtype
// (added to the scaled scores); the mask's strides are broadcast to
// [B, Hq, Tq, Tk]. Rows that see no key are zeros, as on the CPU. The
// output is acc * (1 / l), the CPU's rounding.
template <typename TT>
__device__ void sdpa_row(const typename TT::store* q, Str4 lq, const typename TT::store* k, Str4 lk,
                         const typename TT::store* v, Str4 lv, const void* mask, Str4 lm, int mask_kind,
                         int causal, typename TT::store* y, i64 hq, i64 tq, i64 tk, i64 d, i64 dv,
                         i64 group, double scale_d) {
    typedef typename TT::acc A;
    typedef typename TT::store S;
    extern __shared__ __align__(16) unsigned char att_smem[];
    A* sq = (A*)att_smem;  // d
    A* sacc = sq + d;      // dv
    A* ss = sacc + dv;     // ATT_TILE scores
    A* sp = ss + ATT_TILE; // ATT_TILE weights
    const i64 row = blockIdx.x;
    const i64 i = row % tq, bh = row / tq;
    const i64 h = bh % hq, b = bh / hq;
    const i64 hk = h / group;
    const A scale = (A)scale_d;
    const i64 qbase = lq.off + b * lq.s[0] + h * lq.s[1] + i * lq.s[2];
    for (i64 c = threadIdx.x; c < d; c += blockDim.x) sq[c] = load(TT(), q[qbase + c * lq.s[3]]);
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) sacc[c] = 0;
    i64 end = tk;
    if (causal == 1) {
        end = i + 1 < tk ? i + 1 : tk;
    } else if (causal == 2) {
        i64 e = i + 1 + tk - tq;
        end = e < 0 ? 0 : (e < tk ? e : tk);
    }
    __syncthreads();
    const i64 kbase = lk.off + b * lk.s[0] + hk * lk.s[1];
    const i64 vbase = lv.off + b * lv.s[0] + hk * lv.s[1];
    const i64 mbase = lm.off + b * lm.s[0] + h * lm.s[1] + i * lm.s[2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    Online<A> st;
    st.m = a_neg_inf(A());
    st.l = 0;
    for (i64 j0 = 0; j0 < end; j0 += ATT_TILE) {
        const int n = (int)(end - j0 < ATT_TILE ? end - j0 : ATT_TILE);
        for (int jj = warp; jj < n; jj += nw) {
            const i64 j = j0 + jj;
            const S* kr = k + kbase + j * lk.s[2];
            A s = 0;
            for (i64 c = lane; c < d; c += 32) s += sq[c] * load(TT(), kr[c * lk.s[3]]);
            s = warp_sum(s);
            if (lane == 0) {
                s = a_mul(s, scale);
                if (mask_kind == 1) {
                    if (!((const u8*)mask)[mbase + j * lm.s[3]]) s = a_neg_inf(A());
                } else if (mask_kind == 2) {
                    s = a_add(s, load(TT(), ((const S*)mask)[mbase + j * lm.s[3]]));
                }
                ss[jj] = s;
            }
        }
        __syncthreads();
        bool skip;
        A corr = fold_tile(st, ss, sp, n, &skip);
        if (!skip) {
            for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
                A a = sacc[c] * corr;
                for (int jj = 0; jj < n; ++jj) {
                    // Zero weights (masked keys) are skipped, as on the CPU.
                    A p = sp[jj];
                    if (p != (A)0) a += p * load(TT(), v[vbase + (j0 + jj) * lv.s[2] + c * lv.s[3]]);
                }
                sacc[c] = a;
            }
        }
        __syncthreads();
    }
    const A inv = st.l == (A)0 ? (A)0 : (A)1 / st.l;
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
        A o = st.l == (A)0 ? (A)0 : sacc[c] * inv;
        y[row * dv + c] = store(TT(), o);
    }
}

#define SDPA(TY)                                                                             \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) sdpa_##TY(                     \
        const TY##T::store* q, Str4 lq, const TY##T::store* k, Str4 lk, const TY##T::store* v, \
        Str4 lv, const void* mask, Str4 lm, int mask_kind, int causal, TY##T::store* y, i64 hq, \
        i64 tq, i64 tk, i64 d, i64 dv, i64 group, double scale) { rt_kernel_entry();                            \
        sdpa_row<TY##T>(q, lq, k, lk, v, lv, mask, lm, mask_kind, causal, y, hq, tq, tk, d, dv, \
                        group, scale);                                                       \
    }
SDPA(F32) SDPA(F16) SDPA(BF16) SDPA(F64)

// ---- llama.cpp caches: q f32 [Hq, T, D], k f16 [Hkv, L, D], mask f32 [T, L]
// (Str4 with the leading dim unused); y f32 [Hq, T, Dv] contiguous. Query
// head h reads key/value head h / group, as GGML's broadcast does.

__device__ __forceinline__ float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// The scaled, masked scores of keys j0..j0+n of one row into ss: a key the
// mask hides (-inf) is -inf without its product, as on the CPU (a NaN key
// there stays hidden).
__device__ void cache_scores(const float* sq, const u16* k, i64 kbase, Str4 lk, const float* mask,
                             i64 mbase, Str4 lm, i64 j0, int n, i64 d, float scale, float* ss) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int jj = warp; jj < n; jj += nw) {
        const i64 j = j0 + jj;
        const float mk = mask[mbase + j * lm.s[3]];
        if (mk == NEG_INF) {
            if (lane == 0) ss[jj] = NEG_INF;
            continue;
        }
        const u16* kr = k + kbase + j * lk.s[2];
        float s = 0.0f;
        for (i64 c = lane; c < d; c += 32) s += sq[c] * f16_to_f32(kr[c * lk.s[3]]);
        s = warp_sum(s);
        if (lane == 0) ss[jj] = __fadd_rn(__fmul_rn(s, scale), mk);
    }
}

// Op::CachedAttention: llama.cpp's attention without flash attention,
// softmax(scale * q k^T + mask) vt^T, with its roundings of the query and of
// the probabilities to f16 (both products then multiply f16 values exactly
// in f32; only the order of the sums differs from the CPU's). The
// probabilities are normalized before the value product, as GGML's
// soft_max does, so the keys take two passes: the first finds the row's max
// and sum (online), the second recomputes each tile's scores and adds
// round_f16(exp(s - max) / sum) * vt. vt [Hkv, Dv, L]: warp w takes output
// features w, w + 4, ..., its lanes the tile's keys (a vt row is contiguous
// over keys). A row whose mask hides every key is NaN (GGML's soft_max of
// an all -inf row); no keys at all (L = 0) gives zeros.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    cached_attention(const float* q, Str4 lq, const u16* k, Str4 lk, const u16* vt, Str4 lv,
                     const float* mask, Str4 lm, float* y, i64 t, i64 l, i64 d, i64 dv, i64 group,
                     float scale) { rt_kernel_entry();
    extern __shared__ __align__(16) unsigned char att_smem[];
    float* sq = (float*)att_smem;
    float* sacc = sq + d;
    float* ss = sacc + dv;
    float* sp = ss + ATT_TILE;
    const i64 row = blockIdx.x;
    const i64 i = row % t, h = row / t, hk = h / group;
    const i64 qbase = lq.off + h * lq.s[1] + i * lq.s[2];
    for (i64 c = threadIdx.x; c < d; c += blockDim.x) sq[c] = round_f16(q[qbase + c * lq.s[3]]);
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) sacc[c] = 0.0f;
    __syncthreads();
    const i64 kbase = lk.off + hk * lk.s[1];
    const i64 vbase = lv.off + hk * lv.s[1];
    const i64 mbase = lm.off + i * lm.s[2];
    // Pass 1: max and sum (the sum in f64, as GGML's).
    float m = NEG_INF;
    double sum = 0.0;
    for (i64 j0 = 0; j0 < l; j0 += ATT_TILE) {
        const int n = (int)(l - j0 < ATT_TILE ? l - j0 : ATT_TILE);
        cache_scores(sq, k, kbase, lk, mask, mbase, lm, j0, n, d, scale, ss);
        __syncthreads();
        float tmax = NEG_INF;
        for (int j = 0; j < n; ++j) tmax = nan_max(tmax, ss[j]);
        const float mnew = nan_max(m, tmax);
        if (mnew != NEG_INF) {
            double tsum = 0.0;
            for (int j = 0; j < n; ++j) tsum += (double)expf(ss[j] - mnew);
            sum = sum * exp((double)m - (double)mnew) + tsum;
            m = mnew;
        }
        __syncthreads();
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l > 0 && m == NEG_INF) {
        for (i64 c = threadIdx.x; c < dv; c += blockDim.x) y[row * dv + c] = __int_as_float(0x7fc00000);
        return;
    }
    const float inv = (float)(1.0 / sum);
    // Pass 2: the probabilities, rounded to f16, times the values.
    for (i64 j0 = 0; j0 < l; j0 += ATT_TILE) {
        const int n = (int)(l - j0 < ATT_TILE ? l - j0 : ATT_TILE);
        cache_scores(sq, k, kbase, lk, mask, mbase, lm, j0, n, d, scale, ss);
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += blockDim.x) sp[j] = round_f16(expf(ss[j] - m) * inv);
        __syncthreads();
        for (i64 c = warp; c < dv; c += nw) {
            const u16* vr = vt + vbase + c * lv.s[2] + j0 * lv.s[3];
            float a = 0.0f;
            for (int jj = lane; jj < n; jj += 32) {
                const float p = sp[jj];
                if (p != 0.0f) a += p * f16_to_f32(vr[jj * lv.s[3]]);
            }
            a = warp_sum(a);
            if (lane == 0) sacc[c] += a;
        }
        __syncthreads();
    }
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) y[row * dv + c] = sacc[c];
}

// Op::FlashAttention: llama.cpp's flash attention, computed in f32 from the
// f16 cache with one online softmax (as its CUDA build computes it), v
// [Hkv, L, Dv] as rows. The query is rounded to f16 where the CPU's path
// rounds it (rows at or past `tiled_rows`, its one-row path); the CPU's
// f16 accumulator of that path is not reproduced (hence its tolerance). A
// row that sees no key is zeros, as on the CPU (1 / S taken as 0).
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    flash_attention(const float* q, Str4 lq, const u16* k, Str4 lk, const u16* v, Str4 lv,
                    const float* mask, Str4 lm, float* y, i64 t, i64 l, i64 d, i64 dv, i64 group,
                    float scale, i64 tiled_rows) { rt_kernel_entry();
    extern __shared__ __align__(16) unsigned char att_smem[];
    float* sq = (float*)att_smem;
    float* sacc = sq + d;
    float* ss = sacc + dv;
    float* sp = ss + ATT_TILE;
    const i64 row = blockIdx.x;
    const i64 i = row % t, h = row / t, hk = h / group;
    const i64 qbase = lq.off + h * lq.s[1] + i * lq.s[2];
    const bool half_q = i >= tiled_rows;
    for (i64 c = threadIdx.x; c < d; c += blockDim.x) {
        const float x = q[qbase + c * lq.s[3]];
        sq[c] = half_q ? round_f16(x) : x;
    }
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) sacc[c] = 0.0f;
    __syncthreads();
    const i64 kbase = lk.off + hk * lk.s[1];
    const i64 vbase = lv.off + hk * lv.s[1];
    const i64 mbase = lm.off + i * lm.s[2];
    Online<float> st;
    st.m = NEG_INF;
    st.l = 0.0f;
    for (i64 j0 = 0; j0 < l; j0 += ATT_TILE) {
        const int n = (int)(l - j0 < ATT_TILE ? l - j0 : ATT_TILE);
        cache_scores(sq, k, kbase, lk, mask, mbase, lm, j0, n, d, scale, ss);
        __syncthreads();
        bool skip;
        const float corr = fold_tile(st, ss, sp, n, &skip);
        if (!skip) {
            for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
                float a = sacc[c] * corr;
                for (int jj = 0; jj < n; ++jj) {
                    const float p = sp[jj];
                    if (p != 0.0f) a += p * f16_to_f32(v[vbase + (j0 + jj) * lv.s[2] + c * lv.s[3]]);
                }
                sacc[c] = a;
            }
        }
        __syncthreads();
    }
    const float inv = st.l == 0.0f ? 0.0f : 1.0f / st.l;
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) y[row * dv + c] = sacc[c] * inv;
}

// ---- Op::AttentionAt: flash decoding with the position on the device ----
// q [H, T, D] (f32/f16/bf16), k [Hkv, N, D] and v [Hkv, N, Dv] (the cache at
// its capacity N, f32/f16/bf16), each through its own strides (Str4, the
// leading dim unused); pos one i32 or i64 element. Query row i sits at
// p = pos + i and sees keys lo..=p, lo = max(0, p + 1 - window) (window 0:
// none). Nothing here depends on a host value that changes per step: the
// grid is fixed by the shapes and the capacity N, and every block reads pos
// itself, so a CUDA graph can replay the launch for every token.
//
// attention_at_<KV>: block (row, s) takes the s-th of S equal shares of the
// row's visible keys (S = gridDim.y), in chunks of 32 keys a warp (warp w:
// chunks w, w + AT_WARPS, ...), a key a lane. A short context gives each
// block only a few such chunks, so what a chunk costs is its chain of
// waits: the lane reads its key row whole (64 features in flight at once)
// and scores it against the query row (shared memory, f32); one warp max is
// the only exchange before the values, which were loaded together with the
// keys (a lane owns Dv / 32 adjacent features of each value row) and are
// added weighted by each key's probability, taken from its lane by a
// shuffle. Each warp keeps its own online softmax (running max m, the
// lanes' sums l, accumulators rescaled by exp(m_old - m_new) when the max
// grows). The block then merges its warps and writes its partial
// (m, l, acc[Dv]) to the scratch `part`: m [rows, S], then l [rows, S], then
// acc [rows, S, Dv]. A block without keys writes m = -inf, l = 0 (acc
// unwritten, never read). attention_at_combine merges the S partials of a
// row (log-sum-exp: each weighted by exp(m_s - max_s m_s)) and writes
// y [H, T, Dv] f32.
//
// A position outside 0..=N-T sets *bad (the launcher returns the CPU's
// InvalidInput) and reads no key: every block then writes the empty marker.
// NaN propagates (nan_max keeps it), as on the CPU; a row whose every score
// is -inf is NaN, as the CPU's exp(-inf - -inf).

// ---- BEGIN HOST-TESTABLE ATTENTION_AT (tests/attention_at_host.rs) ------
#define AT_THREADS 128
#define AT_WARPS (AT_THREADS / 32)
// Largest head dim (D and Dv, multiples of 32; the launcher declines
// others).
#define AT_MAX_DIM 256
// Keys a split takes at least (AT_KEYS_PER_SPLIT in src/ops/attention.rs).
#define AT_KEYS_PER_SPLIT 64

__device__ __forceinline__ i64 at_pos(const void* pos, i64 off, int is64) {
    return is64 ? ((const i64*)pos)[off] : (i64)((const int*)pos)[off];
}

// Query element i as f32; qtype 0 f32, 1 f16, 2 bf16.
__device__ __forceinline__ float at_load_q(const void* q, i64 i, int qtype) {
    if (qtype == 0) return load(F32T(), ((const float*)q)[i]);
    if (qtype == 1) return load(F16T(), ((const u16*)q)[i]);
    return load(BF16T(), ((const u16*)q)[i]);
}

// Cache rows are held in registers as they were stored, converted to f32
// where used: a word is one f32, or two f16/bf16 halves (low half first).
template <typename KT> struct AtWords {
    typedef u32 word;
    static constexpr int per = 2;
};
template <> struct AtWords<F32T> {
    typedef float word;
    static constexpr int per = 1;
};

// Elements 0..N of a row (N in 2, 4, 8), `stride` apart, as N / per words;
// `vec`: stride 1 and the row aligned to N elements, read as one vector (two
// for f32 with N = 8); otherwise element by element, only the first `count`
// (the rest zero).
template <int N>
__device__ __forceinline__ void at_words(F32T, const float* p, i64 stride, bool vec, int count, float* w) {
#ifdef __CUDA_ARCH__
    if (vec && N >= 4) {
#pragma unroll
        for (int e = 0; e < N; e += 4) {
            const float4 x = *reinterpret_cast<const float4*>(p + e);
            w[e] = x.x; w[e + 1] = x.y; w[e + 2] = x.z; w[e + 3] = x.w;
        }
        return;
    }
    if (vec && N == 2) {
        const float2 x = *reinterpret_cast<const float2*>(p);
        w[0] = x.x; w[1] = x.y;
        return;
    }
#endif
#pragma unroll
    for (int e = 0; e < N; ++e) w[e] = e < count ? p[e * stride] : 0.0f;
}
template <int N, typename KT>
__device__ __forceinline__ void at_words(KT, const u16* p, i64 stride, bool vec, int count, u32* w) {
#ifdef __CUDA_ARCH__
    if (vec && N == 8) {
        const uint4 x = *reinterpret_cast<const uint4*>(p);
        w[0] = x.x; w[1] = x.y; w[2] = x.z; w[3] = x.w;
        return;
    }
    if (vec && N == 4) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        w[0] = x.x; w[1] = x.y;
        return;
    }
    if (vec && N == 2) {
        w[0] = *reinterpret_cast<const u32*>(p);
        return;
    }
#endif
#pragma unroll
    for (int e = 0; e < N; e += 2) {
        const u32 lo = e < count ? p[e * stride] : 0, hi = e + 1 < count ? p[(e + 1) * stride] : 0;
        w[e / 2] = lo | (hi << 16);
    }
}
// Element e of words read by at_words, as f32.
__device__ __forceinline__ float at_elem(F32T, const float* w, int e) { return w[e]; }
template <typename KT> __device__ __forceinline__ float at_elem(KT, const u32* w, int e) {
    return load(KT(), (u16)((e & 1) ? w[e >> 1] >> 16 : w[e >> 1] & 0xffffu));
}


// A decode step's RoPE and cache write done by the attention kernel itself
// (attention_rope_at_joined_*, Backend::rope_attention_at): the new
// position's raw keys k_new [Hkv, D] and values v_new [Hkv, Dv] (f32,
// contiguous), the RoPE tables cs / sn [rows, half] (f32, contiguous; the
// position's row is read here), the rotation's layout, and `p`, the
// position as the kernel read it before its wait (at_pos_early: in
// [0, N), a guess that is checked).
struct AtRope {
    const float* k_new;
    const float* v_new;
    const float* cs;
    const float* sn;
    i64 half;
    int interleaved;
    i64 p;
};
// Feature f of the row x (element e at x[e * stride]) rotated by the table
// rows cs / sn, as rope_kv_at_F32_F16 rotates it (the same products and
// fused adds, so the same bits).
__device__ __forceinline__ float at_rope_feature(const float* x, i64 stride, int f, const float* cs, const float* sn,
                                                 int half, int interleaved) {
    if (f >= 2 * half) return x[f * stride];
    int kk, j0, j1;
    bool second;
    if (interleaved) {
        kk = f >> 1; j0 = 2 * kk; j1 = j0 + 1; second = (f & 1) != 0;
    } else {
        second = f >= half; kk = second ? f - half : f; j0 = kk; j1 = kk + half;
    }
    const float c = cs[kk], s = sn[kk], x0 = x[j0 * stride], x1 = x[j1 * stride];
    return second ? __fmaf_rn(x0, s, __fmul_rn(x1, c)) : __fmaf_rn(x0, c, -__fmul_rn(x1, s));
}

// Thread c's features of a decode step's new row at position p (in the
// tables): its query feature rotated, and its key feature (rotated) and
// value for the caches of key/value head hk (as rope_kv_at_F32_F16 writes
// them). Loads only, so that a block's loads of them are in flight at once.
struct AtNewRow {
    float q, k, v;
};
__device__ __forceinline__ AtNewRow at_rope_new_row(const AtRope& rope, const float* qr, i64 qs, u32 hk, i64 p,
                                                    i64 d, i64 dv, u32 c) {
    AtNewRow r = {0.0f, 0.0f, 0.0f};
    const float* cs = rope.cs + p * rope.half;
    const float* sn = rope.sn + p * rope.half;
    if (c < (u32)d) {
        r.q = at_rope_feature(qr, qs, (int)c, cs, sn, (int)rope.half, rope.interleaved);
        r.k = at_rope_feature(rope.k_new + hk * d, 1, (int)c, cs, sn, (int)rope.half, rope.interleaved);
    }
    if (c < (u32)dv) r.v = rope.v_new[hk * dv + c];
    return r;
}
// Feature c of the new row into the query (shared) and, where the block
// holds the position (`writes`), into the caches. Every query head of the
// key/value head writes the same bits, so blocks that do so at once agree.
template <typename KT>
__device__ __forceinline__ void at_rope_store(const AtNewRow& r, float* sq, bool writes, const typename KT::store* k,
                                              const Str4& lk, const typename KT::store* v, const Str4& lv, u32 hk,
                                              i64 p, i64 d, i64 dv, u32 c) {
    typedef typename KT::store KS;
    if (c < (u32)d) sq[c] = r.q;
    if (!writes) return;
    if (c < (u32)d) const_cast<KS*>(k)[lk.off + hk * lk.s[1] + p * lk.s[2] + c * lk.s[3]] = store(KT(), r.k);
    if (c < (u32)dv) const_cast<KS*>(v)[lv.off + hk * lv.s[1] + p * lv.s[2] + c * lv.s[3]] = store(KT(), r.v);
}

// The keys [lo, hi) of split `split` of `splits` for the query row at
// position p (it sees keys first..=p, first by the window), and how many
// splits have keys (`used`, the first ones). Shares of at least min_share
// keys: a short row is one block's work, and only the blocks it reaches
// have partials to merge.
struct AtShare {
    int lo, hi, used;
};
__device__ __forceinline__ AtShare at_share(int p, i64 window, u32 split, u32 splits, i64 min_share) {
    const int first = (window > 0 && p + 1 > window) ? p + 1 - (int)window : 0;
    const u32 seen = (u32)(p + 1 - first);
    const u32 even = (seen + splits - 1) / splits;
    const u32 share = even > (u32)min_share ? even : (u32)min_share;
    AtShare r;
    r.lo = first + (int)(split * share);
    r.hi = r.lo + (int)share < p + 1 ? r.lo + (int)share : p + 1;
    r.used = (int)((seen + share - 1) / share);
    return r;
}

// What a block keeps in shared memory.
struct AtShared {
    float q[AT_MAX_DIM];
    float m[AT_WARPS];
    float l[AT_WARPS];
    float acc[AT_WARPS][AT_MAX_DIM];
};

// The block's part of attention_at (see above). Returns the splits of the
// row that have keys (the first `used` ones; every block of the row computes
// the same number): the one-launch form merges only those. PL: the value
// features a lane owns, Dv / 32 rounded up to 2, 4 or 8.
template <typename KT, int PL, bool VEC, bool ROPE>
__device__ i64 attention_at_block(const void* q, int qtype, Str4 lq, const typename KT::store* k, Str4 lk,
                                  const typename KT::store* v, Str4 lv, const void* pos, i64 pos_off, int pos64,
                                  float* part, i64 t, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale,
                                  int* bad, float* y1, i64 min_share, int prefetch, const AtRope& rope,
                                  AtShared& sh) {
    typedef typename KT::store KS;
    // Index arithmetic in 32 bits (the launcher keeps rows, heads and the
    // capacity below 2^31): a 64-bit division is a long subroutine, and a
    // short row's block is a chain of dependent steps.
    const u32 row = blockIdx.x, rows = gridDim.x, splits = gridDim.y;
    const i64 slot = (i64)row * splits + blockIdx.y;
    float* pm = part;
    float* pl = part + (i64)rows * splits;
    float* pacc = part + 2 * (i64)rows * splits + slot * dv;
    const u32 t32 = (u32)t, h = t32 == 1 ? row : row / t32, i = row - h * t32, hk = h / (u32)group;
    // The query row into shared memory (as f32) while the position loads:
    // it does not depend on it. With ROPE it does (f32 queries, one row,
    // rotated at the position's row of the tables).
    if constexpr (!ROPE) {
        for (u32 c = threadIdx.x; c < (u32)d; c += blockDim.x)
            sh.q[c] = at_load_q(q, lq.off + h * lq.s[1] + i * lq.s[2] + c * lq.s[3], qtype);
    }
    // With ROPE, a thread's loads of its first feature of the new row at
    // the position read before the wait (rope.p) are issued with the
    // position's read after it, one round trip for all, and made again in
    // the (never seen) case where the guess was wrong.
    const float* qr = (const float*)q + lq.off + h * lq.s[1];
    AtNewRow guess = {0.0f, 0.0f, 0.0f};
    if constexpr (ROPE) guess = at_rope_new_row(rope, qr, lq.s[3], hk, rope.p, d, dv, threadIdx.x);
    const i64 p0 = at_pos(pos, pos_off, pos64);
    int lo = 0, hi = 0, used = 0;
    if (p0 < 0 || p0 > n - t) {
        if (threadIdx.x == 0) *bad = 1;
    } else {
        const AtShare keys = at_share((int)p0 + (int)i, window, blockIdx.y, splits, min_share);
        lo = keys.lo;
        hi = keys.hi;
        used = keys.used;
    }
    if (lo >= hi) {
        if (threadIdx.x == 0) {
            pm[slot] = NEG_INF;
            pl[slot] = 0.0f;
        }
        return used;
    }
    // With ROPE: the query rotated at the position's row of the tables into
    // shared memory, and where this block holds the new position, its key
    // (rotated) and values into the caches, read back below after the
    // barrier.
    if constexpr (ROPE) {
        const bool writes = hi == (int)p0 + 1;
        const u32 width = (u32)(d > dv ? d : dv);
        for (u32 c = threadIdx.x; c < width; c += blockDim.x) {
            const AtNewRow r =
                c == threadIdx.x && p0 == rope.p ? guess : at_rope_new_row(rope, qr, lq.s[3], hk, p0, d, dv, c);
            at_rope_store<KT>(r, sh.q, writes, k, lk, v, lv, hk, p0, d, dv, c);
        }
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int ndv = (int)(dv >> 5);
    const bool vec_v = VEC && ndv == PL;
    typedef typename AtWords<KT>::word W;
    constexpr int PER = AtWords<KT>::per;
    const i64 kbase = lk.off + hk * lk.s[1], vbase = lv.off + hk * lv.s[1] + (i64)lane * ndv * lv.s[3];
    // Keys whose values a lane holds at once (64 elements).
    constexpr int VB = 64 / PL;
    float m = NEG_INF, l = 0.0f, acc[PL];
#pragma unroll
    for (int r = 0; r < PL; ++r) acc[r] = 0.0f;
    // Row steps of the caches, and rows read past the chunk's keys: the
    // last key's (every load is then unconditional, with no branch; what
    // such a row gives is discarded: a score of -inf, values set to 0).
    const i64 ks = lk.s[2], vs = lv.s[2];
    for (int c0 = lo + 32 * warp; c0 < hi; c0 += 32 * AT_WARPS) {
        const int j = c0 + lane;
        const bool valid = j < hi;
        const int nk = hi - c0 < 32 ? hi - c0 : 32;
#ifdef __CUDA_ARCH__
        // The lane's key and value rows of the warp's next chunk into L2
        // (128-byte lines) while this one is used.
        const int jn = j + 32 * AT_WARPS;
        if ((prefetch & 1) && jn < hi && lk.s[3] == 1 && lv.s[3] == 1) {
            const char* kr = reinterpret_cast<const char*>(k + kbase + jn * ks);
            const char* vr = reinterpret_cast<const char*>(v + lv.off + hk * lv.s[1] + jn * vs);
            for (i64 b = 0; b < d * (i64)sizeof(KS); b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(kr + b));
            for (i64 b = 0; b < dv * (i64)sizeof(KS); b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + b));
        }
#endif
        // The first VB keys' values, loaded with the key rows: they do not
        // wait for the scores, so the chunk waits for memory about once.
        W vx[VB][PL / PER];
        const KS* vr = v + vbase + (i64)c0 * vs;
        const i64 vlast = (i64)(nk - 1) * vs;
        // Keys kb.. kb + VB's values into vx.
        auto load_values = [&](int kb) {
#pragma unroll
            for (int kk = 0; kk < VB; ++kk) {
                const bool in = kb + kk < nk;
                at_words<PL>(KT(), vr + (in ? (kb + kk) * vs : vlast), lv.s[3], vec_v, ndv, vx[kk]);
#pragma unroll
                for (int r = 0; r < PL / PER; ++r) vx[kk][r] = in ? vx[kk][r] : 0;
            }
        };
        load_values(0);
        // The lane's key row, 64 features at a time (all their loads in
        // flight together), summed in 8 partial sums.
        float s = 0.0f;
        {
            const KS* kr = k + kbase + (i64)(valid ? j : hi - 1) * ks;
            for (int e0 = 0; e0 < (int)d; e0 += 64) {
                W kx[8][8 / PER];
                float part8[8];
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    if (e0 + 8 * u < d) at_words<8>(KT(), kr + (e0 + 8 * u) * lk.s[3], lk.s[3], VEC, 8, kx[u]);
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    part8[u] = 0.0f;
                    if (e0 + 8 * u < d) {
#pragma unroll
                        for (int e = 0; e < 8; ++e)
                            part8[u] = fmaf(sh.q[e0 + 8 * u + e], at_elem(KT(), kx[u], e), part8[u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) s += part8[u];
            }
        }
        const float sg = valid ? __fmul_rn(scale, s) : NEG_INF;
        const float mnew = nan_max(m, warp_max(sg));
        float pg = 0.0f;
        // No finite score yet (mnew is the same in every lane): the chunk
        // adds nothing, and m stays -inf (no exp(-inf - -inf)).
        if (mnew != NEG_INF) {
            const float corr = expf(m - mnew);
            pg = expf(sg - mnew);
            l = l * corr + pg;
#pragma unroll
            for (int r = 0; r < PL; ++r) acc[r] *= corr;
            m = mnew;
        }
        // Each key's probability from its lane, times its value row (a
        // lane past the chunk's keys holds probability 0, or NaN where
        // every probability is).
        for (int kb = 0; kb < nk; kb += VB) {
            if (kb > 0) load_values(kb);
#pragma unroll
            for (int kk = 0; kk < VB; ++kk) {
                const float pk = __shfl_sync(0xffffffffu, pg, (kb + kk) & 31);
#pragma unroll
                for (int r = 0; r < PL; ++r) acc[r] = fmaf(pk, at_elem(KT(), vx[kk], r), acc[r]);
            }
        }
    }
    l = warp_sum(l);
    if (lane == 0) {
        sh.m[warp] = m;
        sh.l[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < PL; ++r)
        if (r < ndv) sh.acc[warp][lane * ndv + r] = acc[r];
    __syncthreads();
    // The block's max; warps that saw no key (m = -inf) are left out.
    float bm = NEG_INF;
#pragma unroll
    for (int w = 0; w < AT_WARPS; ++w) bm = nan_max(bm, sh.m[w]);
    // A row whose keys this one block holds (a short row) is written here,
    // with at_combine_row's bits for one partial (weight exp(0) = 1,
    // y = acc * (1 / l), NaN where l = 0), and nothing is merged.
    const bool alone = y1 != nullptr && used == 1;
    if (bm == NEG_INF) {
        if (alone) {
            for (i64 c = threadIdx.x; c < dv; c += blockDim.x) y1[row * dv + c] = __int_as_float(0x7fc00000);
        } else if (threadIdx.x == 0) {
            pm[slot] = NEG_INF;
            pl[slot] = 0.0f;
        }
        return used;
    }
    float e[AT_WARPS], bl = 0.0f;
#pragma unroll
    for (int w = 0; w < AT_WARPS; ++w) {
        e[w] = sh.m[w] == NEG_INF ? 0.0f : expf(sh.m[w] - bm);
        if (sh.m[w] != NEG_INF) bl += sh.l[w] * e[w];
    }
    const float inv = bl == 0.0f ? __int_as_float(0x7fc00000) : 1.0f / bl;
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < AT_WARPS; ++w)
            if (sh.m[w] != NEG_INF) a += sh.acc[w][c] * e[w];
        if (alone) {
            y1[row * dv + c] = a * inv;
        } else {
            pacc[c] = a;
        }
    }
    if (!alone && threadIdx.x == 0) {
        pm[slot] = bm;
        pl[slot] = bl;
    }
    return used;
}

// attention_at_block with its register shape picked from Dv (PLF = 0), or
// fixed (PLF: 2, 4 or 8, the kernels of one shape each), and its loads as
// vectors where VEC.
template <typename KT, bool VEC, bool ROPE, int PLF>
__device__ i64 attention_at_pl(const void* q, int qtype, Str4 lq, const typename KT::store* k, Str4 lk,
                               const typename KT::store* v, Str4 lv, const void* pos, i64 pos_off, int pos64,
                               float* part, i64 t, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale,
                               int* bad, float* y1, i64 min_share, int prefetch, const AtRope& rope, AtShared& sh) {
    if constexpr (PLF != 0) {
        return attention_at_block<KT, PLF, VEC, ROPE>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n, d,
                                                      dv, group, window, scale, bad, y1, min_share, prefetch, rope,
                                                      sh);
    } else {
        if (dv <= 64)
            return attention_at_block<KT, 2, VEC, ROPE>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n,
                                                        d, dv, group, window, scale, bad, y1, min_share, prefetch,
                                                        rope, sh);
        if (dv <= 128)
            return attention_at_block<KT, 4, VEC, ROPE>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n,
                                                        d, dv, group, window, scale, bad, y1, min_share, prefetch,
                                                        rope, sh);
        return attention_at_block<KT, 8, VEC, ROPE>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n, d,
                                                    dv, group, window, scale, bad, y1, min_share, prefetch, rope, sh);
    }
}

template <typename KT, bool ROPE = false, int PLF = 0>
__device__ i64 attention_at_part(const void* q, int qtype, Str4 lq, const typename KT::store* k, Str4 lk,
                                 const typename KT::store* v, Str4 lv, const void* pos, i64 pos_off, int pos64,
                                 float* part, i64 t, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale,
                                 int* bad, float* y1, i64 min_share, int vec, int prefetch,
                                 const AtRope& rope = AtRope{}) {
    __shared__ AtShared sh;
    if (vec)
        return attention_at_pl<KT, true, ROPE, PLF>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n, d,
                                                    dv, group, window, scale, bad, y1, min_share, prefetch, rope, sh);
    return attention_at_pl<KT, false, ROPE, PLF>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n, d, dv,
                                                 group, window, scale, bad, y1, min_share, prefetch, rope, sh);
}

// attention_at_<KV>: a key a lane, AT_THREADS threads a block. (Four
// lanes a key, 8 keys a warp in blocks of four times the warps, was no
// faster on the H200 at short rows and 7% slower after 1024 positions.)
#define ATTENTION_AT(KTY)                                                                        \
    extern "C" __global__ void __launch_bounds__(AT_THREADS) attention_at_##KTY(                 \
        const void* q, int qtype, Str4 lq, const KTY##T::store* k, Str4 lk,                      \
        const KTY##T::store* v, Str4 lv, const void* pos, i64 pos_off, int pos64, float* part,  \
        i64 t, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale, int* bad,               \
        i64 min_share, int vec, int prefetch) {                                                  \
        rt_kernel_entry();                                                                       \
        attention_at_part<KTY##T>(q, qtype, lq, k, lk, v, lv, pos, pos_off, pos64, part, t, n, d, \
                                  dv, group, window, scale, bad, nullptr, min_share, vec,        \
                                  prefetch);                                                     \
    }
ATTENTION_AT(F32) ATTENTION_AT(F16) ATTENTION_AT(BF16)

// One block per row: the S partials of attention_at_* merged, y = acc / l.
// S <= AT_MAX_SPLITS (the launcher's bound).
#define AT_MAX_SPLITS 64
// Partials are read past L1 (another block of the same launch may have
// written them: attention_at_joined_*).
__device__ __forceinline__ float at_load_cg(const float* p) {
#ifdef __CUDA_ARCH__
    return __ldcg(p);
#else
    return *p;
#endif
}
// Merges the first `used` of the row's `splits` partials (the others have
// no keys).
__device__ void at_combine_row(const float* part, float* y, i64 splits, i64 used, i64 dv, i64 row, i64 rows) {
    __shared__ float s_w[AT_MAX_SPLITS];
    __shared__ float s_m[AT_MAX_SPLITS];
    __shared__ float s_l[AT_MAX_SPLITS];
    const float* pm = part + row * splits;
    const float* pl = part + rows * splits + row * splits;
    const float* pacc = part + 2 * rows * splits + row * splits * dv;
    // Each split's m and l read once, all at the same time (a thread each;
    // every thread reading them in turn from L2 cost the H200 ~10 us at 64
    // splits), then summed in the same order as before from shared memory.
    for (i64 s = threadIdx.x; s < used; s += blockDim.x) {
        s_m[s] = at_load_cg(pm + s);
        s_l[s] = at_load_cg(pl + s);
    }
    __syncthreads();
    float m = NEG_INF;
#pragma unroll 8
    for (i64 s = 0; s < used; ++s) m = nan_max(m, s_m[s]);
    // Each split's weight exp(m_s - m); empty splits (m_s = -inf) weigh 0
    // and their accumulators, never written, are not read.
    if (threadIdx.x < used) {
        const float ms = s_m[threadIdx.x];
        s_w[threadIdx.x] = ms == NEG_INF ? 0.0f : expf(ms - m);
    }
    __syncthreads();
    float l = 0.0f;
#pragma unroll 8
    for (i64 s = 0; s < used; ++s)
        if (s_w[s] != 0.0f) l += s_l[s] * s_w[s];
    // l = 0: every score was -inf (or the position was refused): NaN, as
    // the CPU's softmax of such a row.
    const float inv = l == 0.0f ? __int_as_float(0x7fc00000) : 1.0f / l;
    for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {
        float a = 0.0f;
        for (i64 s = 0; s < used; ++s)
            if (s_w[s] != 0.0f) a += at_load_cg(pacc + s * dv + c) * s_w[s];
        y[row * dv + c] = a * inv;
    }
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_at_combine(const float* part, float* y, i64 splits, i64 dv) { rt_kernel_entry();
    at_combine_row(part, y, splits, splits, dv, blockIdx.x, gridDim.x);
}
// ---- END HOST-TESTABLE ATTENTION_AT ---------------------------------------

// attention_at_joined_<KV>: the split kernel and the merge in one launch (a
// decode step's attention is then one kernel): each block writes its
// partial as attention_at_* does, and the last block of its row to finish
// (a per-row counter, which that block sets back to 0 for the next launch)
// merges the row's partials with attention_at_combine's code.
// Only the `used` blocks with keys count (a short row in a large cache
// leaves most of its blocks without: they neither wait on the counter's
// atomics nor get merged). A row whose keys fit one block (a decode step's
// early positions) is written by that block directly, with no partial.
__device__ void at_join_row(const float* part, float* y, unsigned int* counters, i64 dv, i64 used) {
    if ((i64)blockIdx.y >= used) return;
    __shared__ int last;
    // Every thread's partial writes are visible before the block counts.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == (unsigned int)(used - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    at_combine_row(part, y, gridDim.y, used, dv, blockIdx.x, gridDim.x);
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}
// One kernel per cache type and register shape (_pl2, _pl4, _pl8: Dv up
// to 64, 128, 256; the launcher picks it): a kernel holding all three took
// the largest's registers (255, with spills) for every head size, and on
// the H200 a decode step's attention of 64-value heads ran in 6-7 us
// instead of 8-13 once it had its own.
#define ATTENTION_AT_JOINED(KTY, PL)                                                                 \
    extern "C" __global__ void __launch_bounds__(AT_THREADS) attention_at_joined_##KTY##_pl##PL(     \
        const void* q, int qtype, Str4 lq, const KTY##T::store* k, Str4 lk,                           \
        const KTY##T::store* v, Str4 lv, const void* pos, i64 pos_off, int pos64, float* part,       \
        i64 t, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale, int* bad,                    \
        i64 min_share, int vec, int prefetch, float* y, unsigned int* counters) {                     \
        rt_kernel_entry();                                                                            \
        const i64 used = attention_at_part<KTY##T, false, PL>(q, qtype, lq, k, lk, v, lv, pos, pos_off, \
                                                              pos64, part, t, n, d, dv, group, window,  \
                                                              scale, bad, y, min_share, vec, prefetch); \
        if (used > 1) at_join_row(part, y, counters, dv, used);                                      \
    }
#define ATTENTION_AT_JOINED_SHAPES(KTY) ATTENTION_AT_JOINED(KTY, 2) ATTENTION_AT_JOINED(KTY, 4) ATTENTION_AT_JOINED(KTY, 8)
ATTENTION_AT_JOINED_SHAPES(F32) ATTENTION_AT_JOINED_SHAPES(F16) ATTENTION_AT_JOINED_SHAPES(BF16)

// attention_rope_at_joined_F16_pl* (Backend::rope_attention_at): a decode
// step's RoPE and key/value cache write inside its attention, one launch
// instead of two (and no gather of the tables' rows): q the raw f32 query
// row of each head ([H, 1, D]), k_new / v_new the raw keys and values, the
// caches f16; each block rotates its query at the position's table row,
// and the block holding the new position writes that position's key and
// values before it reads them (AtRope).
// The position read before the kernel's wait, clamped into the cache
// [0, n): a guess (a decode step's position is written by the step's first
// kernel, long finished by then, but the kernel before might be writing
// it), which the block checks against its read after the wait
// (attention_at_block). Read through L2 only (ld.global.cg: nothing of it
// stays in L1 for the read after the wait).
__device__ __forceinline__ i64 at_pos_early(const void* pos, i64 pos_off, int pos64, i64 n) {
    i64 p = 0;
#ifdef __CUDA_ARCH__
    if (pos64) {
        asm volatile("ld.global.cg.s64 %0, [%1];" : "=l"(p) : "l"((const i64*)pos + pos_off));
    } else {
        int p32;
        asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(p32) : "l"((const int*)pos + pos_off));
        p = p32;
    }
#endif
    return p < 0 ? 0 : (p >= n ? n - 1 : p);
}
// Before the wait (prefetch bit 2, Backend::rope_attention_at): the lines
// the block reads after it, into L2: the position's RoPE table rows and the
// key and value rows of the block's share of the cache, from DRAM while the
// kernel before (the Q/K/V product) ends, instead of after the wait, where
// they are the chain's longest steps. Only prefetches, which cannot give a
// stale value (L2 is where every write lands), aimed with at_pos_early's
// guess p: a wrong one would only aim them wrong.
__device__ __forceinline__ void at_prefetch_early(const u16* k, const Str4& lk, const u16* v, const Str4& lv, i64 p,
                                                  i64 d, i64 dv, i64 group, i64 window, i64 min_share,
                                                  const float* cs, const float* sn, i64 half) {
#ifdef __CUDA_ARCH__
    const u32 tid = threadIdx.x;
    if (tid * 32 < (u32)half) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(cs + p * half + tid * 32));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(sn + p * half + tid * 32));
    }
    if (lk.s[3] != 1 || lv.s[3] != 1) return;
    // The block's share, as attention_at_block takes it.
    const AtShare keys = at_share((int)p, window, blockIdx.y, gridDim.y, min_share);
    const u32 lo = (u32)keys.lo, hi = (u32)keys.hi;
    const u32 hk = blockIdx.x / (u32)group;
    const char* kr = reinterpret_cast<const char*>(k + lk.off + hk * lk.s[1]);
    const char* vr = reinterpret_cast<const char*>(v + lv.off + hk * lv.s[1]);
    for (u32 j = lo + tid; j < hi; j += blockDim.x) {
        for (i64 b = 0; b < 2 * d; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(kr + 2 * j * lk.s[2] + b));
        for (i64 b = 0; b < 2 * dv; b += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(vr + 2 * j * lv.s[2] + b));
    }
#endif
}

// One kernel per register shape, as attention_at_joined_*_pl*.
#define ATTENTION_ROPE_AT_JOINED(PL)                                                                          \
    extern "C" __global__ void __launch_bounds__(AT_THREADS) attention_rope_at_joined_F16_pl##PL(             \
        const float* q, Str4 lq, const u16* k, Str4 lk, const u16* v, Str4 lv, const void* pos, i64 pos_off,   \
        int pos64, float* part, i64 n, i64 d, i64 dv, i64 group, i64 window, float scale, int* bad,             \
        i64 min_share, int vec, int prefetch, float* y, unsigned int* counters, const float* k_new,             \
        const float* v_new, const float* cs, const float* sn, i64 half, int interleaved) {                      \
        const i64 p_early = at_pos_early(pos, pos_off, pos64, n);                                              \
        if (prefetch & 2)                                                                                      \
            at_prefetch_early(k, lk, v, lv, p_early, d, dv, group, window, min_share, cs, sn, half);           \
        rt_kernel_entry();                                                                                     \
        const AtRope rope = {k_new, v_new, cs, sn, half, interleaved, p_early};                                \
        const i64 used = attention_at_part<F16T, true, PL>(q, 0, lq, k, lk, v, lv, pos, pos_off, pos64, part, 1, \
                                                           n, d, dv, group, window, scale, bad, y, min_share,    \
                                                           vec, prefetch, rope);                                \
        if (used > 1) at_join_row(part, y, counters, dv, used);                                                \
    }
ATTENTION_ROPE_AT_JOINED(2) ATTENTION_ROPE_AT_JOINED(4) ATTENTION_ROPE_AT_JOINED(8)

// ---- Op::FlashAttention for long batches: cuBLAS on the tensor cores -----
// The launcher (attention.rs, flash_gemm) multiplies S = Q K^T per key/value
// head with cuBLAS (Q and the f16 cache in f16, f32 accumulation), then
// att_softmax_rows turns each row of S into probabilities P (f16, as
// llama.cpp's CUDA flash attention rounds them), then cuBLAS multiplies
// O = P V. Q's rows of the heads that share a key/value head are adjacent
// in Q's contiguous f16 copy ([Hq, T, D], made by the cast op's kernel).

// One block per row of S [rows, L] (row r is query row r % T of its head):
// x_j = S[r, j] * scale + mask[r % T, j]; P[r, j] = exp(x_j - max) / sum,
// rounded to f16. A row that sees no key (max -inf) is zeros, as the
// kernel above writes it.
extern "C" __global__ void __launch_bounds__(256)
    att_softmax_rows(const float* s, i64 l, i64 t, const float* mask, Str4 lm, float scale, u16* p) { rt_kernel_entry();
    __shared__ float red[32];
    const i64 r = blockIdx.x;
    const float* sr = s + r * l;
    const i64 mbase = lm.off + (r % t) * lm.s[2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mx = NEG_INF;
    for (i64 j = threadIdx.x; j < l; j += blockDim.x) {
        const float x = __fadd_rn(__fmul_rn(sr[j], scale), mask[mbase + j * lm.s[3]]);
        mx = nan_max(mx, x);
    }
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < nw; ++w) mx = nan_max(mx, red[w]);
    __syncthreads();
    u16* pr = p + r * l;
    if (mx == NEG_INF) {
        for (i64 j = threadIdx.x; j < l; j += blockDim.x) pr[j] = 0;
        return;
    }
    float sum = 0.0f;
    for (i64 j = threadIdx.x; j < l; j += blockDim.x) {
        const float x = __fadd_rn(__fmul_rn(sr[j], scale), mask[mbase + j * lm.s[3]]);
        sum += expf(x - mx);
    }
    sum = warp_sum(sum);
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    sum = 0.0f;
    for (int w = 0; w < nw; ++w) sum += red[w];
    const float inv = 1.0f / sum;
    for (i64 j = threadIdx.x; j < l; j += blockDim.x) {
        const float x = __fadd_rn(__fmul_rn(sr[j], scale), mask[mbase + j * lm.s[3]]);
        pr[j] = f32_to_f16(expf(x - mx) * inv);
    }
}

// ---- Prompt attention on the tensor cores ----------------------------------
// Op::FlashAttention for a prompt's batch in one launch, FlashAttention-2's
// scheme: a block of 4 warps per FA_ROWS query rows of one head (16 rows a
// warp); tiles of KEYS keys and their values copied to shared memory by
// cp.async, the next tile's copy (and its mask values, into registers) in
// flight while the current one is used; S = Q K^T on the tensor cores
// (mma.sync m16n8k16, f16 operands, f32 accumulation) in registers; the
// scale and the mask applied in f32 as att_softmax_rows does; an online
// softmax per row (running max m and sum l, the accumulator rescaled by
// exp(m_old - m_new) when the max grows); P rounded to f16 (as llama.cpp's
// CUDA kernels round it) and O += P V on the tensor cores; O / l at the end.
// Q is rounded to f16 as it is loaded, as the cuBLAS path's cast does. A
// warp whose 16 rows see no key of a tile (a causal prompt's tiles past the
// diagonal) skips it. A row that sees no key at all is zeros, as
// att_softmax_rows makes it.
//
// Fragments (PTX ISA, mma.m16n8k16 .f16): with g = lane / 4 and
// c = 2 * (lane % 4), A (16 x 16, row-major) is {rows g, g+8} x {cols c,
// c+1, c+8, c+9} in registers (g, c), (g+8, c), (g, c+8), (g+8, c+8); B
// (16 x 8, column-major) is rows {c, c+1} and {c+8, c+9} of column g; C
// (16 x 8, f32) is rows g and g+8 of columns c, c+1. So B = K^T is a key
// row's pairs of halves, read from shared memory as they lie; B = V comes
// from ldmatrix .trans (V stays row-major); and S's C fragments of two
// adjacent 8-key tiles are, rounded to f16, P's A fragment for 16 keys.
// Shared rows are padded by 8 halves: the 8 rows of one read then start 4
// banks apart.
#define FA_ROWS 64
#define FA_PAD 8

__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// The instructions below exist from compute capability 8.0 on; the launcher
// takes this kernel there only (kernels_compile builds it for 8.0 and 9.0).
__device__ __forceinline__ void fa_mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}
// 16 bytes from global to shared memory, or zeros where !valid.
__device__ __forceinline__ void fa_copy16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(rt_smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void fa_copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
__device__ __forceinline__ void fa_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}
// B fragments of two adjacent 8-column tiles of a row-major 16 x 16 block
// (rows 0..15 from `block`, `ks` halves apart): {b0, b1} of the first tile
// and of the second.
__device__ __forceinline__ void fa_ldmatrix_t(u32 (&r)[4], const u16* block, int ks, int lane) {
    const int mi = lane >> 3, rr = lane & 7;
    const u16* p = block + ((mi & 1) * 8 + rr) * ks + (mi >> 1) * 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(rt_smem_addr(p)));
#else
    __trap();
#endif
}

// q f32 [Hq, T, D] (any strides), k and v f16 [Hkv, L, D] (rows contiguous,
// each row 16-byte aligned: the launcher checks), mask f32 [T, L], y f32
// [Hq, T, D] contiguous. Grid (ceil(T / FA_ROWS), Hq), FA_ROWS * 2 threads.
template <int D, int KEYS>
__device__ __forceinline__ void flash_mma(const float* q, Str4 lq, const u16* k, Str4 lk, const u16* v, Str4 lv,
                                          const float* mask, Str4 lm, float* y, i64 t, i64 l, i64 group,
                                          float scale) {
    constexpr int KS = D + FA_PAD;  // a staged key or value row, in halves
    __shared__ __align__(16) u16 ks[2][KEYS * KS];
    __shared__ __align__(16) u16 vs[2][KEYS * KS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = (lane & 3) * 2;
    const i64 h = blockIdx.y, kvh = h / group;
    const i64 ra = (i64)blockIdx.x * FA_ROWS + warp * 16 + g, rb = ra + 8;
    const u16* kh = k + lk.off + kvh * lk.s[1];
    const u16* vh = v + lv.off + kvh * lv.s[1];

    // Tile j0's keys and values into buffer `buf` (zeros past L).
    auto copy_tile = [&](int buf, i64 j0) {
        for (int i = threadIdx.x; i < KEYS * D / 8; i += blockDim.x) {
            const int r = i / (D / 8), c8 = (i % (D / 8)) * 8;
            const bool in = j0 + r < l;
            const i64 j = in ? j0 + r : 0;
            fa_copy16(&ks[buf][r * KS + c8], kh + j * lk.s[2] + c8, in);
            fa_copy16(&vs[buf][r * KS + c8], vh + j * lv.s[2] + c8, in);
        }
        fa_copy_commit();
    };
    // This thread's mask values of tile j0 (-inf past T or L).
    auto load_mask = [&](float (&mk)[KEYS / 8][4], i64 j0) {
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 row = (e & 2) ? rb : ra, key = j0 + n * 8 + c + (e & 1);
                mk[n][e] = (row < t && key < l) ? mask[lm.off + row * lm.s[2] + key * lm.s[3]] : NEG_INF;
            }
    };
    copy_tile(0, 0);
    float mk[KEYS / 8][4];
    load_mask(mk, 0);

    u32 qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const i64 row = (i & 1) ? rb : ra;
            const int col = kk * 16 + c + ((i & 2) ? 8 : 0);
            float x0 = 0.0f, x1 = 0.0f;
            if (row < t) {
                const float* qp = q + lq.off + h * lq.s[1] + row * lq.s[2] + col * lq.s[3];
                x0 = qp[0];
                x1 = qp[lq.s[3]];
            }
            qa[kk][i] = fa_pack(x0, x1);
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, lsum[2] = {0.0f, 0.0f};

    int buf = 0;
    for (i64 j0 = 0; j0 < l; j0 += KEYS, buf ^= 1) {
        // This tile's copy has landed for every thread, and every warp is
        // done with the other buffer (the tile before), which the next
        // tile's copy then fills.
        fa_copy_wait();
        __syncthreads();
        const bool more = j0 + KEYS < l;
        if (more) copy_tile(buf ^ 1, j0 + KEYS);
        float s[KEYS / 8][4];
        bool any = false;
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = mk[n][e];
                any |= mk[n][e] != NEG_INF;
            }
        if (more) load_mask(mk, j0 + KEYS);
        if (!__any_sync(0xffffffffu, any)) continue;

        float acc[KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n) {
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const u16* kr = &ks[buf][(n * 8 + g) * KS + kk * 16 + c];
                fa_mma(acc[n], qa[kk], *(const u32*)kr, *(const u32*)(kr + 8));
            }
        }
        // x = S * scale + mask, rounded as att_softmax_rows rounds it.
        float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = __fadd_rn(__fmul_rn(acc[n][e], scale), s[n][e]);
                s[n][e] = x;
                tmax[e >> 1] = nan_max(tmax[e >> 1], x);
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tmax[r] = nan_max(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
            tmax[r] = nan_max(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float mnew = nan_max(m[r], tmax[r]);
            // A row with nothing visible yet keeps m = -inf, l = 0, o = 0.
            alpha[r] = mnew == NEG_INF ? 1.0f : expf(m[r] - mnew);
            m[r] = mnew;
        }
        float psum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const float p = m[r] == NEG_INF ? 0.0f : expf(s[n][e] - m[r]);
                s[n][e] = p;
                psum[r] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) lsum[r] = lsum[r] * alpha[r] + psum[r];
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk) {
            const u32 pa[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),
                               fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < D / 8; n += 2) {
                u32 b[4];
                fa_ldmatrix_t(b, &vs[buf][kk * 16 * KS + n * 8], KS, lane);
                fa_mma(o[n], pa, b[0], b[1]);
                fa_mma(o[n + 1], pa, b[2], b[3]);
            }
        }
    }
    // Each row's sum over its 4 lanes; a row that saw no key is zeros.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 1);
        lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], 2);
    }
    const float inv[2] = {lsum[0] == 0.0f ? 0.0f : 1.0f / lsum[0], lsum[1] == 0.0f ? 0.0f : 1.0f / lsum[1]};
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
        const int col = n * 8 + c;
        if (ra < t) *(float2*)(y + (h * t + ra) * D + col) = make_float2(o[n][0] * inv[0], o[n][1] * inv[0]);
        if (rb < t) *(float2*)(y + (h * t + rb) * D + col) = make_float2(o[n][2] * inv[1], o[n][3] * inv[1]);
    }
}

// Keys a tile: 64 for head dim 64, 32 for 128 (two buffers of keys and
// values then take 36 and 34 KiB of the 48 a block has without opting in).
#define FLASH_MMA(D, KEYS)                                                                                \
    extern "C" __global__ void __launch_bounds__(FA_ROWS * 2) flash_attention_mma_##D(                 \
        const float* q, Str4 lq, const u16* k, Str4 lk, const u16* v, Str4 lv, const float* mask, Str4 lm, \
        float* y, i64 t, i64 l, i64 group, float scale) {                                                 \
        rt_kernel_entry();                                                                                \
        flash_mma<D, KEYS>(q, lq, k, lk, v, lv, mask, lm, y, t, l, group, scale);                         \
    }
FLASH_MMA(64, 64)
FLASH_MMA(128, 32)

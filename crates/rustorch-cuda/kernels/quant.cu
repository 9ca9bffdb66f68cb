// GGML-typed weights (Op::QMatMul, QMatMuls, QMatMulGated, QEmbedding).
//
// Weights arrive as raw blocks, row after row: row r starts at byte
// r * row_stride of `w` (the launcher adds the layout's offset to the
// pointer). Blocks have no alignment (an 18-byte Q4_0 block starts at any
// byte), so every field is read byte by byte and assembled little-endian.
//
// Each type decodes in "chunks": 32 consecutive values of a row (one value
// for the plain F32/F16/BF16 types, whose rows need not be a multiple of
// 32 long). A chunk never straddles a block, and within a K-quant block
// every chunk has its scales at hand (two 16-value groups or one 32-value
// group). `q_chunk` is the only decoder: the embedding lookup, the
// dequantization before cuBLAS and the matvec all call it, so they agree
// with each other bit for bit.
//
// The values are those of rustorch-core's `quant::dequantize` bit for bit
// (itself bit-identical to llama.cpp and the gguf package): the same float
// operations in the same order, each written as an explicit round-to-
// nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn) because NVRTC would
// otherwise contract `q * d + m` into one fused multiply-add, whose single
// rounding differs from Rust's two. f16 scales are converted by the same
// integer-and-multiply routine as Rust's (`f16_bits_to_f32`), which keeps
// NaN payloads.
#include "common.cuh"

// ---- BEGIN HOST-TESTABLE DECODERS ----------------------------------------
// Everything up to the END marker (the decoders and the matvec's per-lane
// loop) is also compiled as plain C++ on the host by
// tests/quant_decode_host.rs (with a shim for the CUDA intrinsics): the
// decoders are checked against `quant::dequantize` bit for bit, the
// matvec's lanes (summed as the shuffles sum them) against exact products.

__device__ __forceinline__ u32 q_u16le(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
__device__ __forceinline__ u32 q_u32le(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Exact f16 -> f32, as Rust's `f16_bits_to_f32`: the exponent and mantissa
// moved into f32 position are the value times 2^-112 (subnormal halves
// included), so one exact product by 2^112 gives the value; infinities and
// NaN (payload kept) are assembled directly.
__device__ __forceinline__ float q_f16(const u8* p) {
    u32 h = q_u16le(p);
    u32 sign = (h & 0x8000u) << 16;
    u32 em = h & 0x7fffu;
    u32 finite = __float_as_uint(__fmul_rn(__uint_as_float(em << 13), __uint_as_float(0x77800000u)));
    u32 special = 0x7f800000u | ((em & 0x3ffu) << 13);
    return __uint_as_float(sign | (em >= 0x7c00u ? special : finite));
}
__device__ __forceinline__ float q_bf16(const u8* p) { return __uint_as_float(q_u16le(p) << 16); }
__device__ __forceinline__ float q_f32(const u8* p) { return __uint_as_float(q_u32le(p)); }

// The 16 non-linear levels of IQ4_NL and IQ4_XS (KVALUES_IQ4NL in
// rustorch-core's quant/blocks.rs; tests/quant_decode_host.rs checks that
// this copy equals it). In global memory, not __constant__: the lanes of a
// warp index it with different nibbles, which the constant cache would
// serve one address at a time; these 16 bytes stay in L1.
__device__ const signed char Q_KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};

// One tag type per GGML type: QK values per block, TS bytes per block, CH
// values per chunk.
struct QF32   { enum { QK = 1,   TS = 4,   CH = 1 }; };
struct QF16   { enum { QK = 1,   TS = 2,   CH = 1 }; };
struct QBF16  { enum { QK = 1,   TS = 2,   CH = 1 }; };
struct QQ4_0  { enum { QK = 32,  TS = 18,  CH = 32 }; };
struct QQ4_1  { enum { QK = 32,  TS = 20,  CH = 32 }; };
struct QQ5_0  { enum { QK = 32,  TS = 22,  CH = 32 }; };
struct QQ5_1  { enum { QK = 32,  TS = 24,  CH = 32 }; };
struct QQ8_0  { enum { QK = 32,  TS = 34,  CH = 32 }; };
struct QQ8_1  { enum { QK = 32,  TS = 36,  CH = 32 }; };
struct QQ2_K  { enum { QK = 256, TS = 84,  CH = 32 }; };
struct QQ3_K  { enum { QK = 256, TS = 110, CH = 32 }; };
struct QQ4_K  { enum { QK = 256, TS = 144, CH = 32 }; };
struct QQ5_K  { enum { QK = 256, TS = 176, CH = 32 }; };
struct QQ6_K  { enum { QK = 256, TS = 210, CH = 32 }; };
struct QQ8_K  { enum { QK = 256, TS = 292, CH = 32 }; };
struct QIQ4_NL { enum { QK = 32, TS = 18,  CH = 32 }; };
struct QIQ4_XS { enum { QK = 256, TS = 136, CH = 32 }; };

// q_chunk(tag, block, s, v): values 32*s .. 32*s + CH of the block at `b`
// into v[0..CH].

__device__ __forceinline__ void q_chunk(QF32, const u8* b, int, float* v) { v[0] = q_f32(b); }
__device__ __forceinline__ void q_chunk(QF16, const u8* b, int, float* v) { v[0] = q_f16(b); }
__device__ __forceinline__ void q_chunk(QBF16, const u8* b, int, float* v) { v[0] = q_bf16(b); }

// Q4_0 {d: f16, qs[16]}: d * (q - 8); byte l holds values l (low nibble)
// and l + 16 (high nibble).
__device__ __forceinline__ void q_chunk(QQ4_0, const u8* b, int, float* v) {
    float d = q_f16(b);
    const u8* qs = b + 2;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        v[l] = __fmul_rn((float)((int)(q & 15u) - 8), d);
        v[l + 16] = __fmul_rn((float)((int)(q >> 4) - 8), d);
    }
}

// Q4_1 {d, m: f16, qs[16]}: d * q + m.
__device__ __forceinline__ void q_chunk(QQ4_1, const u8* b, int, float* v) {
    float d = q_f16(b), m = q_f16(b + 2);
    const u8* qs = b + 4;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        v[l] = __fadd_rn(__fmul_rn((float)(q & 15u), d), m);
        v[l + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
    }
}

// Q5_0 {d: f16, qh: u32, qs[16]}: d * (q - 16); bit j of qh is the fifth
// bit of value j.
__device__ __forceinline__ void q_chunk(QQ5_0, const u8* b, int, float* v) {
    float d = q_f16(b);
    u32 qh = q_u32le(b + 2);
    const u8* qs = b + 6;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        u32 lo = (q & 15u) | (((qh >> l) & 1u) << 4);
        u32 hi = (q >> 4) | (((qh >> (l + 16)) & 1u) << 4);
        v[l] = __fmul_rn((float)((int)lo - 16), d);
        v[l + 16] = __fmul_rn((float)((int)hi - 16), d);
    }
}

// Q5_1 {d, m: f16, qh: u32, qs[16]}: d * q + m.
__device__ __forceinline__ void q_chunk(QQ5_1, const u8* b, int, float* v) {
    float d = q_f16(b), m = q_f16(b + 2);
    u32 qh = q_u32le(b + 4);
    const u8* qs = b + 8;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        u32 lo = (q & 15u) | (((qh >> l) & 1u) << 4);
        u32 hi = (q >> 4) | (((qh >> (l + 16)) & 1u) << 4);
        v[l] = __fadd_rn(__fmul_rn((float)lo, d), m);
        v[l + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
    }
}

// Q8_0 {d: f16, qs: i8[32]}: d * q.
__device__ __forceinline__ void q_chunk(QQ8_0, const u8* b, int, float* v) {
    float d = q_f16(b);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = __fmul_rn((float)(signed char)b[2 + l], d);
}

// Q8_1 {d, s: f16, qs: i8[32]}: d * q (the stored sum is not a value).
__device__ __forceinline__ void q_chunk(QQ8_1, const u8* b, int, float* v) {
    float d = q_f16(b);
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = __fmul_rn((float)(signed char)b[4 + l], d);
}

// Q2_K {scales[16], qs[64], d, dmin: f16}: value 128 * half + 32 * shift + l
// is bits 2 * shift of qs[32 * half + l], in group 8 * half + 2 * shift +
// l / 16, whose scale byte holds sc (low nibble) and m (high):
// (d * sc) * q - (dmin * m). Chunk s is half s / 4, shift s % 4.
__device__ __forceinline__ void q_chunk(QQ2_K, const u8* b, int s, float* v) {
    const u8* scales = b;
    const u8* qs = b + 16;
    float d = q_f16(b + 80), dmin = q_f16(b + 82);
    int half = s >> 2, shift = s & 3;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        u32 sc = scales[8 * half + 2 * shift + g];
        float dl = __fmul_rn(d, (float)(sc & 15u));
        float ml = __fmul_rn(dmin, (float)(sc >> 4));
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            u32 q = (qs[32 * half + 16 * g + l] >> (2 * shift)) & 3u;
            v[16 * g + l] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
    }
}

// The signed 6-bit scale of group j (0..16) of a Q3_K block (rustorch-core's
// `q3k_scales`): low nibble in byte j (j < 8) or the high nibble of byte
// j - 8, top two bits in byte 8 + j % 4 at bit 2 * (j / 4).
__device__ __forceinline__ int q3k_scale(const u8* s, int j) {
    u32 low = j < 8 ? (s[j] & 15u) : (u32)(s[j - 8] >> 4);
    u32 high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3u;
    return (int)(low | (high << 4)) - 32;
}

// Q3_K {hmask[32], qs[64], scales[12], d: f16}: the low two bits as Q2_K;
// the high bit of value 32 * s + l is bit s of hmask[l], and a clear bit
// means minus 4: (d * sc) * (low - 4 * !hbit).
__device__ __forceinline__ void q_chunk(QQ3_K, const u8* b, int s, float* v) {
    const u8* hmask = b;
    const u8* qs = b + 32;
    const u8* scales = b + 96;
    float d = q_f16(b + 108);
    int half = s >> 2, shift = s & 3;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        float dl = __fmul_rn(d, (float)q3k_scale(scales, 8 * half + 2 * shift + g));
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            int low = (int)((qs[32 * half + 16 * g + l] >> (2 * shift)) & 3u);
            int minus = (int)(((hmask[16 * g + l] >> s) & 1u) ^ 1u) * 4;
            v[16 * g + l] = __fmul_rn(dl, (float)(low - minus));
        }
    }
}

// The 6-bit scale and min of group j (0..8) of a Q4_K/Q5_K block
// (rustorch-core's `scale_min_k4`).
__device__ __forceinline__ void q_scale_min_k4(int j, const u8* q, u32* sc, u32* m) {
    if (j < 4) {
        *sc = q[j] & 63u;
        *m = q[j + 4] & 63u;
    } else {
        *sc = (q[j + 4] & 15u) | ((u32)(q[j - 4] >> 6) << 4);
        *m = (u32)(q[j + 4] >> 4) | ((u32)(q[j] >> 6) << 4);
    }
}

// Q4_K {d, dmin: f16, scales[12], qs[128]}: 32-value group s takes the low
// (s even) or high (s odd) nibbles of qs[32 * (s / 2) ..]:
// (d * sc) * q - (dmin * m).
__device__ __forceinline__ void q_chunk(QQ4_K, const u8* b, int s, float* v) {
    float d = q_f16(b), dmin = q_f16(b + 2);
    u32 sc, m;
    q_scale_min_k4(s, b + 4, &sc, &m);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const u8* qs = b + 16 + 32 * (s >> 1);
    int nib = 4 * (s & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        u32 q = (qs[l] >> nib) & 15u;
        v[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

// Q5_K {d, dmin: f16, scales[12], qh[32], qs[128]}: as Q4_K with bit s of
// qh[l] as the fifth bit of value 32 * s + l.
__device__ __forceinline__ void q_chunk(QQ5_K, const u8* b, int s, float* v) {
    float d = q_f16(b), dmin = q_f16(b + 2);
    u32 sc, m;
    q_scale_min_k4(s, b + 4, &sc, &m);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (s >> 1);
    int nib = 4 * (s & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        u32 q = ((qs[l] >> nib) & 15u) | (((qh[l] >> s) & 1u) << 4);
        v[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

// Q6_K {ql[128], qh[64], scales: i8[16], d: f16}: chunk s is quarter k = s % 4
// of half n = s / 4: the low (k even) or high (k odd) nibbles of
// ql[64n + 32 * (k % 2) + l] and bits 2k of qh[32n + l]; group
// 8n + 2k + l / 16: (d * sc) * (q - 32).
__device__ __forceinline__ void q_chunk(QQ6_K, const u8* b, int s, float* v) {
    int n = s >> 2, k = s & 3;
    const u8* ql = b + 64 * n + 32 * (k & 1);
    const u8* qh = b + 128 + 32 * n;
    const u8* scales = b + 192;
    float d = q_f16(b + 208);
    int nib = 4 * (k >> 1);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        float dl = __fmul_rn(d, (float)(signed char)scales[8 * n + 2 * k + g]);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            int t = 16 * g + l;
            u32 q = ((ql[t] >> nib) & 15u) | (((qh[t] >> (2 * k)) & 3u) << 4);
            v[t] = __fmul_rn(dl, (float)((int)q - 32));
        }
    }
}

// Q8_K {d: f32, qs: i8[256], bsums: i16[16]}: d * q.
__device__ __forceinline__ void q_chunk(QQ8_K, const u8* b, int s, float* v) {
    float d = q_f32(b);
    const u8* qs = b + 4 + 32 * s;
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = __fmul_rn(d, (float)(signed char)qs[l]);
}

// IQ4_NL {d: f16, qs[16]}: d * KVALUES[q], nibbles as Q4_0.
__device__ __forceinline__ void q_chunk(QIQ4_NL, const u8* b, int, float* v) {
    float d = q_f16(b);
    const u8* qs = b + 2;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        v[l] = __fmul_rn(d, (float)Q_KVALUES_IQ4NL[q & 15u]);
        v[l + 16] = __fmul_rn(d, (float)Q_KVALUES_IQ4NL[q >> 4]);
    }
}

// IQ4_XS {d: f16, scales_h: u16, scales_l[4], qs[128]}: group s has the
// 6-bit scale ls (4 bits in scales_l, 2 in scales_h):
// (d * (ls - 32)) * KVALUES[q], nibbles of qs[16 * s ..] as Q4_0.
__device__ __forceinline__ void q_chunk(QIQ4_XS, const u8* b, int s, float* v) {
    float d = q_f16(b);
    u32 scales_h = q_u16le(b + 2);
    u32 ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15u) | (((scales_h >> (2 * s)) & 3u) << 4);
    float dl = __fmul_rn(d, (float)((int)ls - 32));
    const u8* qs = b + 8 + 16 * s;
#pragma unroll
    for (int l = 0; l < 16; ++l) {
        u32 q = qs[l];
        v[l] = __fmul_rn(dl, (float)Q_KVALUES_IQ4NL[q & 15u]);
        v[l + 16] = __fmul_rn(dl, (float)Q_KVALUES_IQ4NL[q >> 4]);
    }
}

// Chunk c of the row starting at `row`: block c / (QK / CH), chunk c % (QK / CH) in it.
template <class T> __device__ __forceinline__ void q_row_chunk(const u8* row, i64 c, float* v) {
    const i64 per_block = T::QK / T::CH;
    i64 blk = c / per_block;
    q_chunk(T(), row + blk * T::TS, (int)(c - blk * per_block), v);
}

// One lane's share of a matvec row (kernels' q_matvec): lane l decodes
// chunks l, l + 32, ... of the weight row once each and multiplies each by
// all m activation rows (x contiguous [m, k]), in f32 with fused
// multiply-adds, into acc[0..m].
#define QMV_MAX_ROWS 8
#define QMV_WARPS 4
template <class T>
__device__ __forceinline__ void q_matvec_lane(const u8* row, i64 k, const float* x, int m, int lane, float* acc) {
    const i64 cpr = k / T::CH;
#pragma unroll
    for (int r = 0; r < QMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    for (i64 c = lane; c < cpr; c += 32) {
        float v[T::CH];
        q_row_chunk<T>(row, c, v);
        const float* xc = x + c * T::CH;
#pragma unroll
        for (int r = 0; r < QMV_MAX_ROWS; ++r) {
            if (r < m) {
                const float* xr = xc + (i64)r * k;
                float s = acc[r];
#pragma unroll
                for (int i = 0; i < T::CH; ++i) s = fmaf(v[i], xr[i], s);
                acc[r] = s;
            }
        }
    }
}

// Every type once, as X(kernel name suffix, tag): the suffix is
// `QType::name()`, which the launcher formats into the kernel's name.
#define Q_TYPES(X)                                                                           \
    X(F32, QF32) X(F16, QF16) X(BF16, QBF16) X(Q4_0, QQ4_0) X(Q4_1, QQ4_1) X(Q5_0, QQ5_0)    \
    X(Q5_1, QQ5_1) X(Q8_0, QQ8_0) X(Q8_1, QQ8_1) X(Q2_K, QQ2_K) X(Q3_K, QQ3_K)               \
    X(Q4_K, QQ4_K) X(Q5_K, QQ5_K) X(Q6_K, QQ6_K) X(Q8_K, QQ8_K) X(IQ4_NL, QIQ4_NL)           \
    X(IQ4_XS, QIQ4_XS)
// ---- END HOST-TESTABLE DECODERS ------------------------------------------

// ---- dequantization: `rows` rows of `cpr` chunks into y[rows, cpr * CH] ---
// One thread per chunk (cuBLAS then multiplies the f32 rows).
template <class T>
__device__ __forceinline__ void q_dequant_rows(const u8* w, i64 row_stride, i64 rows, i64 cpr, float* y) {
    RT_GRID_STRIDE(t, rows * cpr) {
        i64 r = t / cpr;
        float v[T::CH];
        q_row_chunk<T>(w + r * row_stride, t - r * cpr, v);
        float* o = y + t * T::CH;
#pragma unroll
        for (int i = 0; i < T::CH; ++i) o[i] = v[i];
    }
}

// ---- embedding: row ids[p] of `vocab` rows, dequantized, into y[p, :] -----
// One thread per output chunk. An id outside 0..vocab is never read
// through: its chunk is written as zeros and `bad` is set, which the
// launcher reports as the CPU's InvalidInput (as kernels/index.cu does).
template <class T, class I>
__device__ __forceinline__ void q_embed(const u8* w, i64 row_stride, i64 vocab, const I* ids, const Strided& li,
                                        i64 n_ids, i64 cpr, float* y, int* bad) {
    RT_GRID_STRIDE(t, n_ids * cpr) {
        i64 p = t / cpr;
        i64 id = (i64)ids[strided_at(li, p)];
        float v[T::CH];
        if (id < 0 || id >= vocab) {
            *bad = 1;
#pragma unroll
            for (int i = 0; i < T::CH; ++i) v[i] = 0.0f;
        } else {
            q_row_chunk<T>(w + id * row_stride, t - p * cpr, v);
        }
        float* o = y + t * T::CH;
#pragma unroll
        for (int i = 0; i < T::CH; ++i) o[i] = v[i];
    }
}

// ---- matvec: y[r, j] = sum_i x[r, i] * W[j, i] for m <= QMV_MAX_ROWS ------
// The decode path: the weight is read once, straight from its blocks. One
// warp per output column j (weight row j), QMV_WARPS warps per block; the
// lanes take the row's chunks in turn (q_matvec_lane), then a butterfly
// of shuffles sums the 32 lanes' partial sums. x is contiguous [m, k].
template <class T>
__device__ __forceinline__ void q_matvec(const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int m,
                                         float* y) {
    i64 j = (i64)blockIdx.x * QMV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    // The same j for the whole warp: whole warps leave, so the shuffles
    // below always have their 32 lanes.
    if (j >= n) return;
    float acc[QMV_MAX_ROWS];
    q_matvec_lane<T>(w + j * row_stride, k, x, m, lane, acc);
#pragma unroll
    for (int r = 0; r < QMV_MAX_ROWS; ++r) {
        if (r < m) {
            float s = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (lane == 0) y[(i64)r * n + j] = s;
        }
    }
}

#define Q_KERNELS(NAME, T)                                                                   \
    extern "C" __global__ void qdequant_##NAME(const u8* w, i64 row_stride, i64 rows, i64 cpr, \
                                               float* y) {                                   \
        q_dequant_rows<T>(w, row_stride, rows, cpr, y);                                      \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * QMV_WARPS) qmatvec_##NAME(             \
        const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int m, float* y) {        \
        q_matvec<T>(w, row_stride, n, k, x, m, y);                                           \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_I32(const u8* w, i64 row_stride, i64 vocab,   \
                                                   const int* ids, Strided li, i64 n_ids,    \
                                                   i64 cpr, float* y, int* bad) {            \
        q_embed<T, int>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                  \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_I64(const u8* w, i64 row_stride, i64 vocab,   \
                                                   const i64* ids, Strided li, i64 n_ids,    \
                                                   i64 cpr, float* y, int* bad) {            \
        q_embed<T, i64>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                  \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_U8(const u8* w, i64 row_stride, i64 vocab,    \
                                                  const u8* ids, Strided li, i64 n_ids,      \
                                                  i64 cpr, float* y, int* bad) {             \
        q_embed<T, u8>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                   \
    }
Q_TYPES(Q_KERNELS)

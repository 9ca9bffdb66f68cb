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
// ---- MMVQ: integer dot products against quantized activations -----------
// The decode products (`qmmvq_T_M*` kernels), as llama.cpp computes them on
// the CPU: the activation rows are quantized once per product to the
// weight type's dot type (`vec_dot_type` in rustorch-cpu's qmatmul), with
// the CPU's scale and rounding rules, so both sides see the same int8
// quants and scales; each 32-value piece of a weight row then gives an
// exact integer dot product (__dp4a over four bytes at a time), scaled in
// f32. Results differ from the CPU's only in the order and grouping of the
// f32 scaling and summation (tests/quant_tol/mod.rs has the numbers).
//
// Two activation layouts, each row of k values:
// - QA_32 (Q8_0 and Q8_1 dot types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
//   IQ4_NL): per 32 values, the int8 quants, the f16-rounded scale d (as
//   f32), the sum of the quants (for the weights' offsets: -8 for Q4_0) and
//   Q8_1's s = f16(d * sum) (for the weights' minimum: Q4_1, Q5_1).
// - QA_K (the Q8_K dot type: the K-quants, IQ4_XS, Q8_K): per 256 values
//   the f32 scale d, per 16 values the sum of the quants (Q8_K's bsums).
// Quants: q[r * k + i] (int8, read as ints four at a time); scales
// d[r * (k / 32 or 256) + b]; sums sum[r * (k / 32 or 16) + g]; s[r * k / 32 + b].
#define QA_32 0
#define QA_K 1
#define QMMVQ_MAX_ROWS 8
#define QMMVQ_WARPS 4
// Weight rows (output columns) per warp for at most M activation rows:
// with several activation rows, two weight rows share each activation
// load (L1 traffic per weight byte halves), at twice the accumulators.
#define QMMVQ_R(M) ((M) >= 4 ? 2 : 1)

// Exact f32 value of an f16 bit pattern (as q_f16).
__device__ __forceinline__ float q_f16_bits(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 em = h & 0x7fffu;
    u32 finite = __float_as_uint(__fmul_rn(__uint_as_float(em << 13), __uint_as_float(0x77800000u)));
    u32 special = 0x7f800000u | ((em & 0x3ffu) << 13);
    return __uint_as_float(sign | (em >= 0x7c00u ? special : finite));
}

// f32 -> f16 bits, rounded to nearest even (the CPU's `f32_to_f16`):
// integer steps only, so the host build checks the very code the GPU runs.
__device__ __forceinline__ u32 q_f32_to_f16(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);  // NaN, quiet
    if (ax >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
    if (ax >= 0x38800000u) {
        // Normal: rebias the exponent (-112) and round the 13 dropped bits
        // to nearest even in one add.
        return sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13);
    }
    // Subnormal (or zero): the value in units of 2^-24, exact before
    // rounding (a power-of-two scale), rounded to nearest even.
    return sign | (u32)rintf(__fmul_rn(__uint_as_float(ax), 16777216.0f));
}
__device__ __forceinline__ float q_f16_round(float f) { return q_f16_bits(q_f32_to_f16(f)); }

// ---- activation quantization (the per-value rules; the reductions over a
// block, max and sums, are exact in any order) --------------------------
// NaN-propagating max (a NaN activation makes its block's scale NaN, and so
// the products NaN, where a plain fmaxf would drop it).
__device__ __forceinline__ float qa_max(float a, float b) { return (a > b || a != a) ? a : b; }

// Q8_0/Q8_1 (llama.cpp's x86 `quantize_row_q8_0/1`, rustorch-cpu's
// activations.rs): d = amax / 127, values times 127 / amax (not 1 / d),
// rounded half to even, saturated to i8.
__device__ __forceinline__ void qa8_scale(float amax, float* d, float* id) {
    *d = __fdiv_rn(amax, 127.0f);
    *id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
}
__device__ __forceinline__ int qa8_quant(float v, float id) {
    float r = rintf(__fmul_rn(v, id));
    return r >= 127.0f ? 127 : (r <= -128.0f ? -128 : (int)r);
}

// Q8_K (`quantize_row_q8_K_ref`): iscale = -127 / (the first value of
// largest magnitude), quants nearest_int(iscale * v) capped at 127,
// d = 1 / iscale.
__device__ __forceinline__ int qa_nearest_int(float x) {
    // rustorch-core's `nearest_int`: the magic-number round (half to even).
    return (int)(__float_as_uint(__fadd_rn(x, 12582912.0f)) & 0x007fffffu) - 0x00400000;
}
__device__ __forceinline__ int qa8k_quant(float v, float iscale) {
    int q = qa_nearest_int(__fmul_rn(iscale, v));
    return q < 127 ? q : 127;
}

// ---- weight pieces --------------------------------------------------------
// Aligned little-endian loads: A = 4 for types whose block size is a
// multiple of 4 bytes, else 2 (every block size is even); the launcher
// guarantees the weight's address and row stride are multiples of A.
template <int A> __device__ __forceinline__ u32 q_ld32(const u8* p);
template <> __device__ __forceinline__ u32 q_ld32<4>(const u8* p) { return *(const u32*)p; }
template <> __device__ __forceinline__ u32 q_ld32<2>(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}
__device__ __forceinline__ u32 q_ld16(const u8* p) { return *(const u16*)p; }

// 32 values of a weight row (one lane's piece): 8 ints of 4 int8-range
// bytes, in value order, for __dp4a against the activations' ints, and
// the piece's scales.
struct QWU {
    u32 q[8];
    float d, dm;
    int sc0, sc1, m0, m1;
};
// The same 32 values of one activation row.
struct QAC {
    int q[8];
    float d;   // the block's scale
    int sum;   // the sum of these 32 quants
    float s;   // QA_32: Q8_1's s of the block
    int bs0, bs1;  // QA_K: the sums of the two 16-value halves
};

__device__ __forceinline__ int q_dot4(const u32* w, const int* a) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) s = __dp4a((int)w[i], a[i], s);
    return s;
}

// Bytes 0..15 in each byte of x -> the IQ4 levels, four at a time: the
// 16-byte table as four words, two __byte_perm lookups (levels 0..7 and
// 8..15 at the index's low three bits), then per byte the half the index's
// bit 3 picks.
__device__ __forceinline__ u32 q_iq4_levels(u32 x) {
    // Q_KVALUES_IQ4NL as little-endian words (tests/quant_decode_host.rs
    // checks the products, and so these words, against the CPU).
    const u32 t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
    u32 sel = (x & 7u) | ((x >> 4) & 0x70u) | ((x >> 8) & 0x700u) | ((x >> 12) & 0x7000u);
    u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    u32 msk = ((x >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~msk) | (hi & msk);
}

// Q5_0/Q5_1: bits 0..3 of h as bit 4 of bytes 0..3.
__device__ __forceinline__ u32 q5_high(u32 h) {
    return ((h << 4) & 0x10u) | ((h << 11) & 0x1000u) | ((h << 18) & 0x100000u) | ((h << 25) & 0x10000000u);
}

// q_unit(tag, block, s, u): piece s (values 32 s .. 32 s + 32) of the block.
// q_unit_dot(tag, u, a, acc): acc plus the piece's product with the
// activations' piece: f32 scale products times exact integer sums, each
// added with one fused multiply-add (written out, so the host build
// rounds as the GPU does).

// Q4_0: d * (q - 8) . (da * a) = (d * da) * (sum q a - 8 sum a).
__device__ __forceinline__ void q_unit(QQ4_0, const u8* b, int, QWU& u) {
    u.d = q_f16_bits(q_ld16(b));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<2>(b + 2 + 4 * i);
        u.q[i] = w & 0x0f0f0f0fu;
        u.q[i + 4] = (w >> 4) & 0x0f0f0f0fu;
    }
}
__device__ __forceinline__ float q_unit_dot(QQ4_0, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)(s - 8 * a.sum), acc);
}

// Q4_1: (d * q + m) . (da * a) = (d * da) * sum q a + m * s.
__device__ __forceinline__ void q_unit(QQ4_1, const u8* b, int, QWU& u) {
    u32 dm = q_ld32<4>(b);
    u.d = q_f16_bits(dm & 0xffffu);
    u.dm = q_f16_bits(dm >> 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<4>(b + 4 + 4 * i);
        u.q[i] = w & 0x0f0f0f0fu;
        u.q[i + 4] = (w >> 4) & 0x0f0f0f0fu;
    }
}
__device__ __forceinline__ float q_unit_dot(QQ4_1, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(u.dm, a.s, fmaf(__fmul_rn(u.d, a.d), (float)s, acc));
}

// Q5_0: (d * da) * (sum q a - 16 sum a).
__device__ __forceinline__ void q_unit(QQ5_0, const u8* b, int, QWU& u) {
    u.d = q_f16_bits(q_ld16(b));
    u32 qh = q_ld32<2>(b + 2);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<2>(b + 6 + 4 * i);
        u.q[i] = (w & 0x0f0f0f0fu) | q5_high(qh >> (4 * i));
        u.q[i + 4] = ((w >> 4) & 0x0f0f0f0fu) | q5_high(qh >> (16 + 4 * i));
    }
}
__device__ __forceinline__ float q_unit_dot(QQ5_0, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)(s - 16 * a.sum), acc);
}

// Q5_1: as Q4_1.
__device__ __forceinline__ void q_unit(QQ5_1, const u8* b, int, QWU& u) {
    u32 dm = q_ld32<4>(b);
    u.d = q_f16_bits(dm & 0xffffu);
    u.dm = q_f16_bits(dm >> 16);
    u32 qh = q_ld32<4>(b + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<4>(b + 8 + 4 * i);
        u.q[i] = (w & 0x0f0f0f0fu) | q5_high(qh >> (4 * i));
        u.q[i + 4] = ((w >> 4) & 0x0f0f0f0fu) | q5_high(qh >> (16 + 4 * i));
    }
}
__device__ __forceinline__ float q_unit_dot(QQ5_1, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(u.dm, a.s, fmaf(__fmul_rn(u.d, a.d), (float)s, acc));
}

// Q8_0: (d * da) * sum q a.
__device__ __forceinline__ void q_unit(QQ8_0, const u8* b, int, QWU& u) {
    u.d = q_f16_bits(q_ld16(b));
#pragma unroll
    for (int i = 0; i < 8; ++i) u.q[i] = q_ld32<2>(b + 2 + 4 * i);
}
__device__ __forceinline__ float q_unit_dot(QQ8_0, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// Q8_1 weights (Q8_0 activations; the weight's s unused): as Q8_0.
__device__ __forceinline__ void q_unit(QQ8_1, const u8* b, int, QWU& u) {
    u.d = q_f16_bits(q_ld32<4>(b) & 0xffffu);
#pragma unroll
    for (int i = 0; i < 8; ++i) u.q[i] = q_ld32<4>(b + 4 + 4 * i);
}
__device__ __forceinline__ float q_unit_dot(QQ8_1, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// IQ4_NL: (d * da) * sum level(q) a.
__device__ __forceinline__ void q_unit(QIQ4_NL, const u8* b, int, QWU& u) {
    u.d = q_f16_bits(q_ld16(b));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<2>(b + 2 + 4 * i);
        u.q[i] = q_iq4_levels(w & 0x0f0f0f0fu);
        u.q[i + 4] = q_iq4_levels((w >> 4) & 0x0f0f0f0fu);
    }
}
__device__ __forceinline__ float q_unit_dot(QIQ4_NL, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// The K-quants against Q8_K activations: d = d_w * da and dmin = dmin_w * da
// rounded once each, as the CPU rounds them (per 256-value block), then
// per piece d * (scale * sum q a) - dmin * (min * sum a).

// Q2_K: piece s is shift s % 4 of half s / 4; two 16-value groups.
__device__ __forceinline__ void q_unit(QQ2_K, const u8* b, int s, QWU& u) {
    int half = s >> 2, shift = 2 * (s & 3);
    u32 dm = q_ld32<4>(b + 80);
    u.d = q_f16_bits(dm & 0xffffu);
    u.dm = q_f16_bits(dm >> 16);
    u32 sc0 = b[8 * half + (s & 3) * 2], sc1 = b[8 * half + (s & 3) * 2 + 1];
    u.sc0 = (int)(sc0 & 15u);
    u.m0 = (int)(sc0 >> 4);
    u.sc1 = (int)(sc1 & 15u);
    u.m1 = (int)(sc1 >> 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) u.q[i] = (q_ld32<4>(b + 16 + 32 * half + 4 * i) >> shift) & 0x03030303u;
}
__device__ __forceinline__ float q_unit_dot(QQ2_K, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * q_dot4(u.q, a.q) + u.sc1 * q_dot4(u.q + 4, a.q + 4);
    int mn = u.m0 * a.bs0 + u.m1 * a.bs1;
    return fmaf(-__fmul_rn(u.dm, a.d), (float)mn, fmaf(__fmul_rn(u.d, a.d), (float)s, acc));
}

// Q3_K: low two bits as Q2_K, the high bit from hmask; value q - 4 with
// q = low | hbit << 2, so sum (q - 4) a = sum q a - 4 sum a.
__device__ __forceinline__ void q_unit(QQ3_K, const u8* b, int s, QWU& u) {
    int half = s >> 2, shift = 2 * (s & 3);
    u.d = q_f16_bits(q_ld16(b + 108));
    u.sc0 = q3k_scale(b + 96, 8 * half + (s & 3) * 2);
    u.sc1 = q3k_scale(b + 96, 8 * half + (s & 3) * 2 + 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 low = (q_ld32<2>(b + 32 + 32 * half + 4 * i) >> shift) & 0x03030303u;
        u32 hb = (q_ld32<2>(b + 4 * i) >> s) & 0x01010101u;
        u.q[i] = low | (hb << 2);
    }
}
__device__ __forceinline__ float q_unit_dot(QQ3_K, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * (q_dot4(u.q, a.q) - 4 * a.bs0) + u.sc1 * (q_dot4(u.q + 4, a.q + 4) - 4 * a.bs1);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// Q4_K: piece s is the low (s even) or high nibbles of 32 bytes; one
// 6-bit scale and min.
__device__ __forceinline__ void q_unit(QQ4_K, const u8* b, int s, QWU& u) {
    u32 dm = q_ld32<4>(b);
    u.d = q_f16_bits(dm & 0xffffu);
    u.dm = q_f16_bits(dm >> 16);
    u32 sc, m;
    q_scale_min_k4(s, b + 4, &sc, &m);
    u.sc0 = (int)sc;
    u.m0 = (int)m;
    int nib = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) u.q[i] = (q_ld32<4>(b + 16 + 32 * (s >> 1) + 4 * i) >> nib) & 0x0f0f0f0fu;
}
__device__ __forceinline__ float q_unit_dot(QQ4_K, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * (q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4));
    return fmaf(-__fmul_rn(u.dm, a.d), (float)(u.m0 * a.sum), fmaf(__fmul_rn(u.d, a.d), (float)s, acc));
}

// Q5_K: Q4_K plus bit s of qh[l] as the fifth bit.
__device__ __forceinline__ void q_unit(QQ5_K, const u8* b, int s, QWU& u) {
    u32 dm = q_ld32<4>(b);
    u.d = q_f16_bits(dm & 0xffffu);
    u.dm = q_f16_bits(dm >> 16);
    u32 sc, m;
    q_scale_min_k4(s, b + 4, &sc, &m);
    u.sc0 = (int)sc;
    u.m0 = (int)m;
    int nib = 4 * (s & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 lo = (q_ld32<4>(b + 48 + 32 * (s >> 1) + 4 * i) >> nib) & 0x0f0f0f0fu;
        u32 hb = (q_ld32<4>(b + 16 + 4 * i) >> s) & 0x01010101u;
        u.q[i] = lo | (hb << 4);
    }
}
__device__ __forceinline__ float q_unit_dot(QQ5_K, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * (q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4));
    return fmaf(-__fmul_rn(u.dm, a.d), (float)(u.m0 * a.sum), fmaf(__fmul_rn(u.d, a.d), (float)s, acc));
}

// Q6_K: q in 0..63 from ql's nibbles and qh's bit pairs; value q - 32, two
// signed 8-bit scales.
__device__ __forceinline__ void q_unit(QQ6_K, const u8* b, int s, QWU& u) {
    int n = s >> 2, k = s & 3;
    const u8* ql = b + 64 * n + 32 * (k & 1);
    const u8* qh = b + 128 + 32 * n;
    int nib = 4 * (k >> 1);
    u.d = q_f16_bits(q_ld16(b + 208));
    u.sc0 = (int)(signed char)b[192 + 8 * n + 2 * k];
    u.sc1 = (int)(signed char)b[192 + 8 * n + 2 * k + 1];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 lo = (q_ld32<2>(ql + 4 * i) >> nib) & 0x0f0f0f0fu;
        u32 hi = (q_ld32<2>(qh + 4 * i) >> (2 * k)) & 0x03030303u;
        u.q[i] = lo | (hi << 4);
    }
}
__device__ __forceinline__ float q_unit_dot(QQ6_K, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * (q_dot4(u.q, a.q) - 32 * a.bs0) + u.sc1 * (q_dot4(u.q + 4, a.q + 4) - 32 * a.bs1);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// IQ4_XS: the levels of IQ4_NL, one 6-bit scale ls - 32 per piece.
__device__ __forceinline__ void q_unit(QIQ4_XS, const u8* b, int s, QWU& u) {
    u32 head = q_ld32<4>(b);
    u.d = q_f16_bits(head & 0xffffu);
    u32 ls = ((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15u) | (((head >> (16 + 2 * s)) & 3u) << 4);
    u.sc0 = (int)ls - 32;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = q_ld32<4>(b + 8 + 16 * s + 4 * i);
        u.q[i] = q_iq4_levels(w & 0x0f0f0f0fu);
        u.q[i + 4] = q_iq4_levels((w >> 4) & 0x0f0f0f0fu);
    }
}
__device__ __forceinline__ float q_unit_dot(QIQ4_XS, const QWU& u, const QAC& a, float acc) {
    int s = u.sc0 * (q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4));
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// Q8_K weights (f32 d): (d * da) * sum q a.
__device__ __forceinline__ void q_unit(QQ8_K, const u8* b, int s, QWU& u) {
    u.d = __uint_as_float(q_ld32<4>(b));
#pragma unroll
    for (int i = 0; i < 8; ++i) u.q[i] = q_ld32<4>(b + 4 + 32 * s + 4 * i);
}
__device__ __forceinline__ float q_unit_dot(QQ8_K, const QWU& u, const QAC& a, float acc) {
    int s = q_dot4(u.q, a.q) + q_dot4(u.q + 4, a.q + 4);
    return fmaf(__fmul_rn(u.d, a.d), (float)s, acc);
}

// Per weight type: its activation layout and load alignment.
template <class T> struct QV;
template <> struct QV<QQ4_0> { enum { ACT = QA_32, AL = 2 }; };
template <> struct QV<QQ4_1> { enum { ACT = QA_32, AL = 4 }; };
template <> struct QV<QQ5_0> { enum { ACT = QA_32, AL = 2 }; };
template <> struct QV<QQ5_1> { enum { ACT = QA_32, AL = 4 }; };
template <> struct QV<QQ8_0> { enum { ACT = QA_32, AL = 2 }; };
template <> struct QV<QQ8_1> { enum { ACT = QA_32, AL = 4 }; };
template <> struct QV<QIQ4_NL> { enum { ACT = QA_32, AL = 2 }; };
template <> struct QV<QQ2_K> { enum { ACT = QA_K, AL = 4 }; };
template <> struct QV<QQ3_K> { enum { ACT = QA_K, AL = 2 }; };
template <> struct QV<QQ4_K> { enum { ACT = QA_K, AL = 16 }; };
template <> struct QV<QQ5_K> { enum { ACT = QA_K, AL = 4 }; };
template <> struct QV<QQ6_K> { enum { ACT = QA_K, AL = 2 }; };
template <> struct QV<QQ8_K> { enum { ACT = QA_K, AL = 4 }; };
template <> struct QV<QIQ4_XS> { enum { ACT = QA_K, AL = 4 }; };

// The quantized activations of a product (see the layouts above).
struct QActs {
    const int* q;
    const float* d;
    const int* sum;
    const float* s;
    i64 k;
};

// Piece c (values 32 c ..) of activation row r: two 16-byte loads of
// quants (rows are multiples of 32 bytes, so aligned) and its block's
// scale and sums.
template <int ACT> __device__ __forceinline__ void q_act_piece(const QActs& a, int r, i64 c, QAC& x) {
    const int* p = a.q + (i64)r * (a.k >> 2) + 8 * c;
    int4 v0 = *(const int4*)p, v1 = *(const int4*)(p + 4);
    x.q[0] = v0.x; x.q[1] = v0.y; x.q[2] = v0.z; x.q[3] = v0.w;
    x.q[4] = v1.x; x.q[5] = v1.y; x.q[6] = v1.z; x.q[7] = v1.w;
    if (ACT == QA_32) {
        i64 i = (i64)r * (a.k >> 5) + c;
        x.d = a.d[i];
        x.sum = a.sum[i];
        x.s = a.s[i];
        x.bs0 = x.bs1 = 0;
    } else {
        x.d = a.d[(i64)r * (a.k >> 8) + (c >> 3)];
        i64 i = (i64)r * (a.k >> 4) + 2 * c;
        x.bs0 = a.sum[i];
        x.bs1 = a.sum[i + 1];
        x.sum = x.bs0 + x.bs1;
        x.s = 0.0f;
    }
}

// One lane's share of a warp's MMVQ: weight rows w, w + row_stride, ..
// (`rows` of them, at most R) against activation rows 0..m (m <= M). The
// lane takes the 32-value pieces first, first + step, ... of the rows
// (step: the lanes of its team, 32 per warp): each weight piece is decoded
// once and multiplied by every activation row, each activation piece
// loaded once for all R weight rows. acc[r][i] is then the lane's part of
// output (r, i), to be summed over the team's lanes (q_team_sum).
template <class T, int M, int R>
__device__ __forceinline__ void q_mmvq_lane(const u8* w, i64 row_stride, int rows, const QActs& a, int m, int first,
                                            int step, float (&acc)[M][R]) {
    const int per_block = T::QK / 32;
    const i64 pieces = a.k >> 5;
#pragma unroll
    for (int r = 0; r < M; ++r)
#pragma unroll
        for (int i = 0; i < R; ++i) acc[r][i] = 0.0f;
    for (i64 c = first; c < pieces; c += step) {
        const i64 blk = c / per_block;
        const int s = (int)(c - blk * per_block);
        QWU u[R];
#pragma unroll
        for (int i = 0; i < R; ++i)
            if (i < rows) q_unit(T(), w + i * row_stride + blk * T::TS, s, u[i]);
#pragma unroll
        for (int r = 0; r < M; ++r) {
            if (r < m) {
                QAC x;
                q_act_piece<QV<T>::ACT>(a, r, c, x);
#pragma unroll
                for (int i = 0; i < R; ++i)
                    if (i < rows) acc[r][i] = q_unit_dot(T(), u[i], x, acc[r][i]);
            }
        }
    }
}

// ---- one-row products (a decode step's) ------------------------------------
// A lane's part of one weight row's product with activation row 0, over
// the row's units first, first + step, ...: the same for the plain,
// grouped and gated one-row kernels, so that they give the same bits. A
// unit is 32 values (one piece, q_unit) for most types; 64 for the types
// with a wide unit (QWide<T>, where the row is whole 64-value units), read
// in fewer and wider loads: a decode step's products were bound by
// instructions, not memory (ncu on the H200: 8 instructions a weight).
//   Q4_K: a quarter block, whose 32 quant bytes hold two pieces in their
//         two nibbles: three 16-byte loads with the block's header (instead
//         of a piece's eight 4-byte loads, twice); the activations' two
//         pieces and their four 16-value sums in 16-byte loads too.
//   Q8_0, Q4_0: two blocks (68 or 36 bytes, 4-aligned when the row holds
//         an even number of blocks): 4-byte loads instead of 2-byte ones,
//         the first block's quants realigned with __byte_perm.
//   Q6_K: the two pieces that share their quant bytes (below).
template <class T> struct QWide {
    enum { ON = 0 };
    static __device__ __forceinline__ float dot(const u8*, i64, const QActs&, float acc) { return acc; }
};

template <> struct QWide<QQ4_K> {
    enum { ON = 1 };
    static __device__ __forceinline__ float dot(const u8* row, i64 u, const QActs& a, float acc) {
        const i64 blk = u >> 2;
        const int g = (int)(u & 3);
        const u8* b = row + blk * QQ4_K::TS;
        const int* p = a.q + 16 * u;
        const uint4 h = *(const uint4*)b;
        const uint4 q0 = *(const uint4*)(b + 16 + 32 * g), q1 = *(const uint4*)(b + 32 + 32 * g);
        const int4 a0 = *(const int4*)p, a1 = *(const int4*)(p + 4), a2 = *(const int4*)(p + 8),
                   a3 = *(const int4*)(p + 12);
        const int4 sums = *(const int4*)(a.sum + 4 * u);
        const float da = a.d[blk];
        // The 6-bit scales and mins of groups 2g and 2g + 1 (q_scale_min_k4),
        // as the two bytes of a 16-bit pair: scales[0..12] are h.y, h.z, h.w.
        const int t = 16 * (g & 1);
        u32 scp, mp;
        if (g < 2) {
            scp = (h.y >> t) & 0x3f3fu;
            mp = (h.z >> t) & 0x3f3fu;
        } else {
            scp = ((h.w >> t) & 0x0f0fu) | (((h.y >> t) >> 2) & 0x3030u);
            mp = (((h.w >> t) >> 4) & 0x0f0fu) | (((h.z >> t) >> 2) & 0x3030u);
        }
        const u32 w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        const int x0[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const int x1[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
        int lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            lo = __dp4a((int)(w[i] & 0x0f0f0f0fu), x0[i], lo);
            hi = __dp4a((int)((w[i] >> 4) & 0x0f0f0f0fu), x1[i], hi);
        }
        const float d = q_f16_bits(h.x & 0xffffu), dm = q_f16_bits(h.x >> 16);
        const int sm = (int)(scp & 0xffu) * lo + (int)(scp >> 8) * hi;
        const int mm = (int)(mp & 0xffu) * (sums.x + sums.y) + (int)(mp >> 8) * (sums.z + sums.w);
        return fmaf(-__fmul_rn(dm, da), (float)mm, fmaf(__fmul_rn(d, da), (float)sm, acc));
    }
};

// The activations' 64 quants of unit u (pieces 2u, 2u + 1) as 16 ints.
__device__ __forceinline__ void q_act64(const QActs& a, i64 u, int* x) {
    const int4* p = (const int4*)(a.q + 16 * u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int4 v = p[i];
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
    }
}

template <> struct QWide<QQ8_0> {
    enum { ON = 1 };
    static __device__ __forceinline__ float dot(const u8* row, i64 u, const QActs& a, float acc) {
        const u32* b = (const u32*)(row + u * (2 * QQ8_0::TS));
        u32 w[17];
#pragma unroll
        for (int i = 0; i < 17; ++i) w[i] = b[i];
        int x[16];
        q_act64(a, u, x);
        // Block 0: d in bytes 0..1, quants in bytes 2..33; block 1: d in
        // bytes 34..35, quants in bytes 36..67 (words 9..16).
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s0 = __dp4a((int)__byte_perm(w[i], w[i + 1], 0x5432), x[i], s0);
            s1 = __dp4a((int)w[9 + i], x[8 + i], s1);
        }
        acc = fmaf(__fmul_rn(q_f16_bits(w[0] & 0xffffu), a.d[2 * u]), (float)s0, acc);
        return fmaf(__fmul_rn(q_f16_bits(w[8] >> 16), a.d[2 * u + 1]), (float)s1, acc);
    }
};

template <> struct QWide<QQ4_0> {
    enum { ON = 1 };
    static __device__ __forceinline__ float dot(const u8* row, i64 u, const QActs& a, float acc) {
        const u32* b = (const u32*)(row + u * (2 * QQ4_0::TS));
        u32 w[9];
#pragma unroll
        for (int i = 0; i < 9; ++i) w[i] = b[i];
        int x[16];
        q_act64(a, u, x);
        // Block 0: d in bytes 0..1, quants in bytes 2..17; block 1: d in
        // bytes 18..19, quants in bytes 20..35 (words 5..8). Low nibbles are
        // values 0..15 of a block, high nibbles 16..31.
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q0 = __byte_perm(w[i], w[i + 1], 0x5432), q1 = w[5 + i];
            s0 = __dp4a((int)(q0 & 0x0f0f0f0fu), x[i], s0);
            s1 = __dp4a((int)(q1 & 0x0f0f0f0fu), x[8 + i], s1);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 q0 = __byte_perm(w[i], w[i + 1], 0x5432), q1 = w[5 + i];
            s0 = __dp4a((int)((q0 >> 4) & 0x0f0f0f0fu), x[4 + i], s0);
            s1 = __dp4a((int)((q1 >> 4) & 0x0f0f0f0fu), x[12 + i], s1);
        }
        acc = fmaf(__fmul_rn(q_f16_bits(w[0] & 0xffffu), a.d[2 * u]), (float)(s0 - 8 * a.sum[2 * u]), acc);
        return fmaf(__fmul_rn(q_f16_bits(w[4] >> 16), a.d[2 * u + 1]), (float)(s1 - 8 * a.sum[2 * u + 1]), acc);
    }
};

// Eight little-endian words from a 2-aligned address (inside a block, so
// the aligned word after the last is readable): nine aligned 4-byte loads,
// each pair joined by a funnel shift of 0 or 16 bits.
__device__ __forceinline__ void q_ld32x8_al2(const u8* p, u32* out) {
    const u32* a = (const u32*)((u64)p & ~(u64)3);
    const u32 shift = 8u * (u32)((u64)p & 3u);
    u32 w[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) w[i] = a[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], shift);
}

// Q6_K: the two pieces k and k + 2 of a 128-value half n (unit u = 2 n + k
// of its block, values 32 k .. and 32 k + 64 ..), which share their 32 ql
// bytes (low and high nibbles) and 32 qh bytes (bit pairs 2 k and 2 k + 4):
// 2 x 9 aligned loads instead of 2 x 16 two-byte ones; blocks are 210
// bytes, so 2-aligned. The four 16-value groups' integer sums are scaled
// and added as integers, then once by d * da.
template <> struct QWide<QQ6_K> {
    enum { ON = 1 };
    static __device__ __forceinline__ float dot(const u8* row, i64 u, const QActs& a, float acc) {
        const i64 blk = u >> 2;
        const int n = (int)((u >> 1) & 1), k = (int)(u & 1);
        const u8* b = row + blk * QQ6_K::TS;
        u32 ql[8], qh[8];
        q_ld32x8_al2(b + 64 * n + 32 * k, ql);
        q_ld32x8_al2(b + 128 + 32 * n, qh);
        const u8* sc = b + 192 + 8 * n + 2 * k;
        const int sc0 = (signed char)sc[0], sc1 = (signed char)sc[1], sc2 = (signed char)sc[4],
                  sc3 = (signed char)sc[5];
        // Pieces c0 = 8 blk + 4 n + k and c0 + 2 of the activations.
        const i64 c0 = 8 * blk + 4 * n + k;
        const int4* p0 = (const int4*)(a.q + 8 * c0);
        const int4* p1 = (const int4*)(a.q + 8 * (c0 + 2));
        const int4 a0 = p0[0], a1 = p0[1], a2 = p1[0], a3 = p1[1];
        const int x0[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const int x1[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
        const int2 bs0 = *(const int2*)(a.sum + 2 * c0), bs1 = *(const int2*)(a.sum + 2 * (c0 + 2));
        const int sl = 2 * k, sh = 2 * k + 4;
        int lo0 = 0, lo1 = 0, hi0 = 0, hi1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo0 = __dp4a((int)((ql[i] & 0x0f0f0f0fu) | (((qh[i] >> sl) & 0x03030303u) << 4)), x0[i], lo0);
            hi0 = __dp4a((int)(((ql[i] >> 4) & 0x0f0f0f0fu) | (((qh[i] >> sh) & 0x03030303u) << 4)), x1[i], hi0);
        }
#pragma unroll
        for (int i = 4; i < 8; ++i) {
            lo1 = __dp4a((int)((ql[i] & 0x0f0f0f0fu) | (((qh[i] >> sl) & 0x03030303u) << 4)), x0[i], lo1);
            hi1 = __dp4a((int)(((ql[i] >> 4) & 0x0f0f0f0fu) | (((qh[i] >> sh) & 0x03030303u) << 4)), x1[i], hi1);
        }
        const int s = sc0 * (lo0 - 32 * bs0.x) + sc1 * (lo1 - 32 * bs0.y) + sc2 * (hi0 - 32 * bs1.x) +
                      sc3 * (hi1 - 32 * bs1.y);
        const float d = q_f16_bits(q_ld16(b + 208));
        return fmaf(__fmul_rn(d, a.d[blk]), (float)s, acc);
    }
};

// Values of a one-row unit (the launcher's mmvq_row_unit): 64 for the
// types with a wide unit, else 32.
template <class T> struct QRowUnit { enum { V = QWide<T>::ON ? 64 : 32 }; };

template <class T>
__device__ __forceinline__ float q_row_lane(const u8* w, const QActs& a, int live, int first, int step) {
    if (QWide<T>::ON && (a.k & 63) == 0) {
        float acc = 0.0f;
        if (!live) return acc;
        const i64 units = a.k >> 6;
        // Two units' loads in flight at once where a lane has two.
#pragma unroll 2
        for (i64 u = first; u < units; u += step) acc = QWide<T>::dot(w, u, a, acc);
        return acc;
    }
    float acc[1][1];
    q_mmvq_lane<T, 1, 1>(w, 0, live, a, live, first, step, acc);
    return acc[0][0];
}

// Two weight rows (a gated product's gate and up rows) against activation
// row 0 in one pass, each summed exactly as q_row_lane sums it alone, with
// both rows' loads in flight together.
template <class T>
__device__ __forceinline__ void q_row_lane2(const u8* w0, const u8* w1, const QActs& a, int live, int first, int step,
                                            float& s0, float& s1) {
    if (QWide<T>::ON && (a.k & 63) == 0) {
        s0 = 0.0f;
        s1 = 0.0f;
        if (!live) return;
        const i64 units = a.k >> 6;
        for (i64 u = first; u < units; u += step) {
            s0 = QWide<T>::dot(w0, u, a, s0);
            s1 = QWide<T>::dot(w1, u, a, s1);
        }
        return;
    }
    float acc[1][2];
    // The second row as the first's neighbour at the distance between them.
    q_mmvq_lane<T, 1, 2>(w0, (i64)(w1 - w0), live ? 2 : 0, a, live, first, step, acc);
    s0 = acc[0][0];
    s1 = acc[0][1];
}

// The types with an MMVQ kernel, as X(name, tag).
#define Q_MMVQ_TYPES(X)                                                                        \
    X(Q4_0, QQ4_0) X(Q4_1, QQ4_1) X(Q5_0, QQ5_0) X(Q5_1, QQ5_1) X(Q8_0, QQ8_0) X(Q8_1, QQ8_1)  \
    X(IQ4_NL, QIQ4_NL) X(Q2_K, QQ2_K) X(Q3_K, QQ3_K) X(Q4_K, QQ4_K) X(Q5_K, QQ5_K)           \
    X(Q6_K, QQ6_K) X(Q8_K, QQ8_K) X(IQ4_XS, QIQ4_XS)
// ---- END HOST-TESTABLE DECODERS ------------------------------------------
#include "rows.cuh"

// ---- dequantization: `rows` rows of `cpr` chunks into y[rows, cpr * CH] ---
// One thread per chunk; cuBLAS then multiplies the rows: f32 ones, or f16
// ones (as bits) for the tensor-core GEMM of long prompts, which reads
// half the bytes and accumulates in f32 (llama.cpp's cuBLAS path rounds
// its operands alike). A chunk's values go out in 16-byte stores where the
// chunk is a whole number of them (its bytes then start 16-byte aligned: y
// is an allocation's start): a warp's scalar stores, a chunk apart, each
// touched its own memory sector (ncu on the H200: 0.3 TB/s).
__device__ __forceinline__ void q_store16(float* o, const float* v) {
    *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void q_store16(u16* o, const float* v) {
    u32 h[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) h[p] = (u32)f32_to_f16(v[2 * p]) | ((u32)f32_to_f16(v[2 * p + 1]) << 16);
    *reinterpret_cast<uint4*>(o) = make_uint4(h[0], h[1], h[2], h[3]);
}
__device__ __forceinline__ void q_store1(float* o, float v) { *o = v; }
__device__ __forceinline__ void q_store1(u16* o, float v) { *o = f32_to_f16(v); }

template <class T, class O>
__device__ __forceinline__ void q_dequant_rows(const u8* w, i64 row_stride, i64 rows, i64 cpr, O* y) {
    constexpr int PER_STORE = 16 / (int)sizeof(O);
    RT_GRID_STRIDE(t, rows * cpr) {
        i64 r = t / cpr;
        float v[T::CH];
        q_row_chunk<T>(w + r * row_stride, t - r * cpr, v);
        O* o = y + t * T::CH;
        if constexpr (T::CH % PER_STORE == 0) {
#pragma unroll
            for (int i = 0; i < T::CH / PER_STORE; ++i) q_store16(o + PER_STORE * i, v + PER_STORE * i);
        } else {
#pragma unroll
            for (int i = 0; i < T::CH; ++i) q_store1(o + i, v[i]);
        }
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

// The float weights' matvec with 16-byte loads (8 f16/bf16 or 4 f32 values
// a lane and step, rows and x 16-byte aligned, k a multiple of 8): one
// warp per output column as q_matvec, but each load fills a lane instead
// of two bytes of it, so a decode step reads F16 weights near the memory's
// speed. The launcher takes q_matvec where the alignment does not hold.
// WK: 0 f16, 1 bf16, 2 f32.
template <int WK>
__device__ __forceinline__ void w_matvec(const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int m, float* y) {
    const int V = WK == 2 ? 4 : 8;
    i64 j = (i64)blockIdx.x * QMV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (j >= n) return;  // whole warps
    const uint4* row = reinterpret_cast<const uint4*>(w + j * row_stride);
    float acc[QMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < QMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    const i64 chunks = k / V;
    // W_UNROLL of the lane's chunks are loaded before any is used, so that
    // many 16-byte loads are in flight a lane (one at a time, a decode
    // step's F16 products ran at a fifth of the memory's speed); each lane
    // still adds its chunks in increasing order, as one at a time would.
    const int W_UNROLL = 4;
    for (i64 c0 = lane; c0 < chunks; c0 += 32 * W_UNROLL) {
        uint4 un[W_UNROLL];
#pragma unroll
        for (int t = 0; t < W_UNROLL; ++t) {
            const i64 c = c0 + 32 * t;
            un[t] = c < chunks ? row[c] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int t = 0; t < W_UNROLL; ++t) {
            const i64 c = c0 + 32 * t;
            if (c >= chunks) break;
            const uint4 u = un[t];
            const u32 parts[4] = {u.x, u.y, u.z, u.w};
            float v[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (WK == 0) {
                    v[2 * i] = f16_to_f32((u16)(parts[i] & 0xffffu));
                    v[2 * i + 1] = f16_to_f32((u16)(parts[i] >> 16));
                } else if (WK == 1) {
                    v[2 * i] = __uint_as_float(parts[i] << 16);
                    v[2 * i + 1] = __uint_as_float(parts[i] & 0xffff0000u);
                } else {
                    v[i] = __uint_as_float(parts[i]);
                }
            }
#pragma unroll
            for (int r = 0; r < QMV_MAX_ROWS; ++r) {
                if (r < m) {
                    const float4* xr = reinterpret_cast<const float4*>(x + (i64)r * k + c * V);
                    float s = acc[r];
#pragma unroll
                    for (int h = 0; h < V / 4; ++h) {
                        const float4 q = xr[h];
                        s = fmaf(v[4 * h], q.x, s);
                        s = fmaf(v[4 * h + 1], q.y, s);
                        s = fmaf(v[4 * h + 2], q.z, s);
                        s = fmaf(v[4 * h + 3], q.w, s);
                    }
                    acc[r] = s;
                }
            }
        }
    }
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
// Whether a quantized product prefetches its weights' lines into L2
// before its wait, while the kernel before it runs: it helps them (their
// lanes keep few loads in flight; TinyLlama Q4_K_M tg128 1072 -> 1105 t/s
// on the H200). The float products (w_row_lanes: eight 16-byte loads in
// flight a lane) do not prefetch: theirs only doubled the requests (F16
// 700 -> 751 t/s without it, whether capped at 8 MB a launch or not).
__device__ __forceinline__ bool q_prefetch_wanted() { return !rt_weight_prefetch_off; }
// The one-row MMVQ kernels' `tw` argument: the team's warps (1, 2 or 4)
// in its low QMMVQ_TW_BITS, above them the number of blocks (the first
// ones) that prefetch their rows: the launcher's choice (ops/quant.rs
// mmvq_tw; a product of more bytes than RUSTORCH_CUDA_PREFETCH_MAX_MB
// prefetches only its first RUSTORCH_CUDA_PREFETCH_PART_MB: TinyLlama
// Q8_0's large products, whose requests otherwise competed with the kernel
// before).
#define QMMVQ_TW_BITS 8
__device__ __forceinline__ bool q_prefetch_wanted(int tw) {
    return !rt_weight_prefetch_off && (int)blockIdx.x < (tw >> QMMVQ_TW_BITS);
}

// A team's weight rows, fetched into L2 before rt_kernel_entry: the
// weights are written by no kernel, so while the kernel before this one
// (the activations' quantization) still runs, the product's memory reads
// are already under way (src/launch.rs). One 128-byte line per lane and step.
__device__ __forceinline__ void q_prefetch_rows(const u8* w, i64 row_stride, i64 n, i64 j0, int r, int first,
                                                int step) {
    if (j0 >= n) return;
    const i64 bytes = (n - j0 < r ? n - j0 : r) * row_stride;
    const u64 line0 = (u64)(w + j0 * row_stride) & ~(u64)127;
    const i64 span = (i64)((u64)(w + j0 * row_stride) - line0) + bytes;
    for (i64 o = (i64)first * 128; o < span; o += (i64)step * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line0 + o));
}

#define W_MATVEC(NAME, WK)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * QMV_WARPS) wmatvec_##NAME(             \
        const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int m, float* y) {        \
        rt_kernel_entry();                                                                   \
        w_matvec<WK>(w, row_stride, n, k, x, m, y);                                          \
    }
W_MATVEC(F16, 0) W_MATVEC(BF16, 1) W_MATVEC(F32, 2)

#define Q_KERNELS(NAME, T)                                                                   \
    extern "C" __global__ void qdequant_##NAME(const u8* w, i64 row_stride, i64 rows, i64 cpr, \
                                               float* y) { rt_kernel_entry();                                   \
        q_dequant_rows<T, float>(w, row_stride, rows, cpr, y);                               \
    }                                                                                        \
    extern "C" __global__ void qdequant_h_##NAME(const u8* w, i64 row_stride, i64 rows,      \
                                                 i64 cpr, u16* y) { rt_kernel_entry();                          \
        q_dequant_rows<T, u16>(w, row_stride, rows, cpr, y);                                 \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * QMV_WARPS) qmatvec_##NAME(             \
        const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int m, float* y) {        \
        if (q_prefetch_wanted())                                               \
            q_prefetch_rows(w, row_stride, n, (i64)blockIdx.x * QMV_WARPS + (threadIdx.x >> 5), 1, threadIdx.x & 31, 32); \
        rt_kernel_entry();                                                                   \
        q_matvec<T>(w, row_stride, n, k, x, m, y);                                           \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_I32(const u8* w, i64 row_stride, i64 vocab,   \
                                                   const int* ids, Strided li, i64 n_ids,    \
                                                   i64 cpr, float* y, int* bad) { rt_kernel_entry();            \
        q_embed<T, int>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                  \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_I64(const u8* w, i64 row_stride, i64 vocab,   \
                                                   const i64* ids, Strided li, i64 n_ids,    \
                                                   i64 cpr, float* y, int* bad) { rt_kernel_entry();            \
        q_embed<T, i64>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                  \
    }                                                                                        \
    extern "C" __global__ void qembed_##NAME##_U8(const u8* w, i64 row_stride, i64 vocab,    \
                                                  const u8* ids, Strided li, i64 n_ids,      \
                                                  i64 cpr, float* y, int* bad) { rt_kernel_entry();             \
        q_embed<T, u8>(w, row_stride, vocab, ids, li, n_ids, cpr, y, bad);                   \
    }
Q_TYPES(Q_KERNELS)

// ---- activation quantization for the MMVQ kernels -------------------------
// x contiguous [m, k] (k a multiple of 32, or of 256 for QA_K), rows of
// blocks one after another, so block t covers x[32 t ..] (x[256 t ..]).
__device__ __forceinline__ float q_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = qa_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int q_warp_sum(int v, int width) {
    for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// QA_32: one warp per 32-value block, lane i quantizes value i.
__device__ __forceinline__ void qact_value_32(float v, i64 t, int lane, signed char* q, float* d, int* sum, float* s) {
    float amax = q_warp_max(fabsf(v));
    float dd, id;
    qa8_scale(amax, &dd, &id);
    int qi = qa8_quant(v, id);
    q[32 * t + lane] = (signed char)qi;
    int total = q_warp_sum(qi, 32);
    if (lane == 0) {
        d[t] = q_f16_round(dd);
        sum[t] = total;
        // Q8_1's s: the unrounded d times the sum, then rounded to f16.
        s[t] = q_f16_round(__fmul_rn(dd, (float)total));
    }
}
__device__ __forceinline__ void qact_block_32(const float* xb, i64 t, int lane, signed char* q, float* d, int* sum,
                                              float* s) {
    qact_value_32(xb[lane], t, lane, q, d, sum, s);
}
extern "C" __global__ void qact_q8_32(const float* x, i64 blocks, signed char* q, float* d, int* sum, float* s) { rt_kernel_entry();
    i64 t = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= blocks) return;  // whole warps
    qact_block_32(x + 32 * t, t, threadIdx.x & 31, q, d, sum, s);
}

// QA_K: one warp per 256-value block; lane l quantizes values l + 32 j
// (coalesced loads), so value l + 32 j lies in 16-value group 2 j + l / 16.
__device__ __forceinline__ void qact_block_k(const float* xb, i64 t, int lane, signed char* q, float* d, int* bsum) {
    float v[8];
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        v[j] = xb[lane + 32 * j];
        // As the CPU: `a > max` never takes a NaN.
        a = fabsf(v[j]) > a ? fabsf(v[j]) : a;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float b = __shfl_xor_sync(0xffffffffu, a, o);
        a = b > a ? b : a;
    }
    signed char* qb = q + 256 * t;
    if (a == 0.0f) {
        // The CPU's all-zero block: d = 0, zero quants and sums.
#pragma unroll
        for (int j = 0; j < 8; ++j) qb[lane + 32 * j] = 0;
        if (lane < 16) bsum[16 * t + lane] = 0;
        if (lane == 0) d[t] = 0.0f;
        return;
    }
    // The first value (lowest index) whose magnitude is the maximum.
    int first = 256;
    float fv = 0.0f;
#pragma unroll
    for (int j = 7; j >= 0; --j) {
        if (fabsf(v[j]) == a) {
            first = lane + 32 * j;
            fv = v[j];
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
    float max = __shfl_sync(0xffffffffu, fv, first & 31);
    float iscale = __fdiv_rn(-127.0f, max);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int qi = qa8k_quant(v[j], iscale);
        qb[lane + 32 * j] = (signed char)qi;
        // Lanes 0..15 hold group 2 j, lanes 16..31 group 2 j + 1.
        int g = q_warp_sum(qi, 16);
        if ((lane & 15) == 0) bsum[16 * t + 2 * j + (lane >> 4)] = g;
    }
    if (lane == 0) d[t] = __fdiv_rn(1.0f, iscale);
}
extern "C" __global__ void qact_q8_k(const float* x, i64 blocks, signed char* q, float* d, int* bsum) { rt_kernel_entry();
    i64 t = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (t >= blocks) return;  // whole warps
    qact_block_k(x + 256 * t, t, threadIdx.x & 31, q, d, bsum);
}

// Op::AddRmsNorm of one contiguous row of n <= 1024 ROW_PER values (a
// decode step's residual add and the norm after it; the host checks), and
// that row quantized for the products that follow in each layout whose
// pointers are not null, in a fraction of the instructions of a general
// norm (ncu on the H200: the f64 kernel this replaced ran 845 instructions
// a warp, a chain of 2.9 us, for 2048 values). Block g of n / nt loads the
// whole row (thread t values t + k nt) to sum its squares in f32, as
// llama.cpp's CUDA norm does (rsqrtf too), and keeps value g nt + t, which
// it writes to s and y; a warp's 32 values are a Q8_0 block, quantized from
// registers (qact_value_32), and the slice's 256-value blocks (nt a
// multiple of 256) go through shared memory to qact_block_k.
extern "C" __global__ void add_rms_norm_q_lean_F32(const float* x, const float* a, const float* w, float* s, float* y,
                                                   int n, double eps, signed char* q32, float* d32, int* sum32,
                                                   float* s32, signed char* qk, float* dk, int* bsumk) {
    const int nt = blockDim.x, t = threadIdx.x, g = blockIdx.x;
    const int i = g * nt + t;
    const bool mine = i < n;
    // The weight, which no kernel writes, before the wait.
    const float wv = mine ? __ldg(w + i) : 0.0f;
    rt_kernel_entry();
    float v[ROW_PER];
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        const int r = t + k * nt;
        v[k] = r < n ? __fadd_rn(x[r], a[r]) : 0.0f;
    }
    float sv = v[0];
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        sq = fmaf(v[k], v[k], sq);
        if (k == g) sv = v[k];
    }
    __shared__ float part[32];
    // The warps' sums in one order in every thread and block: one scale.
    const float total = block_sum_f32(sq, part);
    const int warp = t >> 5, lane = t & 31, warps = nt >> 5;
    const float scale = rsqrtf(__fdiv_rn(total, (float)n) + (float)eps);
    const float z = sv * scale * wv;
    if (mine) {
        s[i] = sv;
        y[i] = z;
    }
    if (q32 && g * nt + warp * 32 < n) qact_value_32(z, (i64)(g * nt + warp * 32) / 32, lane, q32, d32, sum32, s32);
    if (qk) {
        __shared__ float slice[1024];
        slice[t] = z;
        __syncthreads();
        for (int b = warp; b < nt / 256; b += warps) {
            const i64 tb = (i64)(g * nt) / 256 + b;
            if (tb * 256 < n) qact_block_k(slice + 256 * b, tb, lane, qk, dk, bsumk);
        }
    }
}

// ---- MMVQ: y[r, j] = sum_i x[r, i] W[j, i] for m <= M activation rows ----
// QMMVQ_WARPS warps per block, in teams of `tw` warps (1, 2 or 4; the
// launcher's choice, from the row length): a team takes QMMVQ_R(M) output
// columns, its 32 tw lanes a share of the pieces each (q_mmvq_lane), so a
// long row (a decode step's feed-forward down product) is read by more
// lanes at once. The lanes' parts are summed by a butterfly of shuffles in
// each warp, then the team's warps in order through shared memory: the
// same k gives the same team and so the same bits in every MMVQ kernel.
struct QTeam {
    int warp, lane, tw, first, step;
    i64 index;  // the team's index in the grid
};
__device__ __forceinline__ QTeam q_team(int tw) {
    tw &= (1 << QMMVQ_TW_BITS) - 1;
    QTeam t;
    t.warp = threadIdx.x >> 5;
    t.lane = threadIdx.x & 31;
    t.tw = tw;
    // tw is 1, 2 or 4: shifts and masks, not divisions.
    const int shift = tw >> 1;
    t.first = (t.warp & (tw - 1)) * 32 + t.lane;
    t.step = 32 * tw;
    t.index = (i64)blockIdx.x * (QMMVQ_WARPS >> shift) + (t.warp >> shift);
    return t;
}
// v summed over the team's lanes, in every lane of the team's first warp.
// Every thread of the block calls it (a barrier where tw > 1); slot: one
// of N values being summed at once.
template <int N>
__device__ __forceinline__ float q_team_sum(const QTeam& t, float v, int slot, float (&part)[QMMVQ_WARPS][N]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (t.tw == 1) return v;
    if (t.lane == 0) part[t.warp][slot] = v;
    __syncthreads();
    const int w0 = t.warp - t.warp % t.tw;
    float s = part[w0][slot];
    for (int w = 1; w < t.tw; ++w) s += part[w0 + w][slot];
    return s;
}

template <class T, int M>
__device__ __forceinline__ void q_mmvq(const u8* w, i64 row_stride, i64 n, const QActs& a, int m, const QTeam& t,
                                       float* y) {
    const int R = QMMVQ_R(M);
    const i64 j0 = t.index * R;
    // Teams past the last column still take part in the barriers.
    const int rows = j0 >= n ? 0 : (n - j0 < R ? (int)(n - j0) : R);
    float acc[M][R];
    if (M == 1) {
        acc[0][0] = q_row_lane<T>(w + (rows > 0 ? j0 * row_stride : 0), a, rows > 0 && m > 0, t.first, t.step);
    } else {
        q_mmvq_lane<T, M, R>(w + (rows > 0 ? j0 * row_stride : 0), row_stride, rows, a, rows > 0 ? m : 0, t.first,
                             t.step, acc);
    }
    __shared__ float part[QMMVQ_WARPS][M * R];
#pragma unroll
    for (int r = 0; r < M; ++r) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            float s = q_team_sum(t, acc[r][i], r * R + i, part);
            if (t.first == 0 && r < m && i < rows) y[(i64)r * n + j0 + i] = s;
        }
    }
}

// One activation row through both weights of a gated feed-forward: the
// team of output column j takes gate row j and up row j (each exactly as
// q_mmvq takes it, so the two sums are q_mmvq's bit for bit) and writes
// act(gate) * up as Op::SwiGlu / Op::GeGlu compute it: one launch instead
// of two products and the activation's kernel (a decode step's).
// Columns t.index * cols .. + cols of a gated product, one after another
// (cols 1 or 2: with one, a decode step's 5632 columns took 1.2 waves of
// 4-warp blocks on the H200, whose registers hold 9 such blocks an SM).
template <class T>
__device__ __forceinline__ void q_mmvq_gated(const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, const QActs& a,
                                             int act, int cols, const QTeam& t, float* y) {
    __shared__ float part[QMMVQ_WARPS][2];
    for (int c = 0; c < cols; ++c) {
        const i64 j = t.index * cols + c;
        const int live = j < n;
        float ag, au;
        q_row_lane2<T>(wg + (live ? j * sg : 0), wu + (live ? j * su : 0), a, live, t.first, t.step, ag, au);
        // part is reused by the next column: every warp has read this
        // column's gate sums before the up sums' barrier, and its up sums
        // before the next column's first barrier.
        const float g = q_team_sum(t, ag, 0, part);
        const float u = q_team_sum(t, au, 1, part);
        if (t.first == 0 && live) y[j] = act == 0 ? op_swiglu(g, u) : op_gelu_tanh(g) * u;
    }
}

// One activation row through up to three weights of one type (the query,
// key and value projections of a decode step) in one launch: blocks
// 0..b0 take weight 0, the next b1 weight 1, the rest weight 2; each
// column exactly as q_mmvq computes it for m = 1.
struct QMulti {
    const u8* w[3];
    i64 stride[3];
    i64 n[3];
    float* y[3];
    i64 first_block[3];
};
// The weight a block of a multi launch takes, picked with constant indices
// only: indexing the kernel's QMulti parameter by a runtime index copied it
// to a 120-byte stack frame.
struct QOne {
    const u8* w;
    i64 stride;
    i64 n;
    float* y;
    i64 first_block;
    int index;
};
__device__ __forceinline__ QOne q_multi_pick(const QMulti& p, int count) {
    const i64 b = blockIdx.x;
    const int i = (count > 2 && b >= p.first_block[2]) ? 2 : (count > 1 && b >= p.first_block[1]) ? 1 : 0;
    QOne o;
    o.w = i == 2 ? p.w[2] : i == 1 ? p.w[1] : p.w[0];
    o.stride = i == 2 ? p.stride[2] : i == 1 ? p.stride[1] : p.stride[0];
    o.n = i == 2 ? p.n[2] : i == 1 ? p.n[1] : p.n[0];
    o.y = i == 2 ? p.y[2] : i == 1 ? p.y[1] : p.y[0];
    o.first_block = i == 2 ? p.first_block[2] : i == 1 ? p.first_block[1] : p.first_block[0];
    o.index = i;
    return o;
}
// The column of the picked weight that team t takes.
__device__ __forceinline__ i64 q_multi_column(const QOne& o, const QTeam& t) {
    return t.index - o.first_block * (QMMVQ_WARPS / t.tw);
}
template <class T>
__device__ __forceinline__ void q_mmvq_multi(const QOne& o, const QActs& a, const QTeam& t) {
    const i64 j = q_multi_column(o, t);
    const int live = j < o.n;
    const float acc = q_row_lane<T>(o.w + (live ? j * o.stride : 0), a, live, t.first, t.step);
    __shared__ float part[QMMVQ_WARPS][1];
    const float s = q_team_sum(t, acc, 0, part);
    if (t.first == 0 && live) o.y[j] = s;
}

#define Q_MMVQ_KERNEL(NAME, T, M)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) qmmvq_##NAME##_m##M(      \
        const u8* w, i64 row_stride, i64 n, i64 k, const int* aq, const float* ad,           \
        const int* asum, const float* as, int m, int tw, float* y) {                         \
        const QTeam t = q_team(tw);                                                          \
        if (q_prefetch_wanted(tw))                                               \
            q_prefetch_rows(w, row_stride, n, t.index * QMMVQ_R(M), QMMVQ_R(M), t.first, t.step); \
        rt_kernel_entry();                                                                   \
        QActs a = {aq, ad, asum, as, k};                                                     \
        q_mmvq<T, M>(w, row_stride, n, a, m, t, y);                                          \
    }
#define Q_MMVQ_KERNELS(NAME, T)                                                              \
    Q_MMVQ_KERNEL(NAME, T, 1) Q_MMVQ_KERNEL(NAME, T, 2) Q_MMVQ_KERNEL(NAME, T, 4) Q_MMVQ_KERNEL(NAME, T, 8) \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) qmmvq_gated_##NAME(       \
        const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, i64 k, const int* aq, const float* ad, \
        const int* asum, const float* as, int act, int cols, int tw, float* y) {             \
        const QTeam t = q_team(tw);                                                          \
        if (q_prefetch_wanted(tw)) {                                              \
            q_prefetch_rows(wg, sg, n, t.index * cols, cols, t.first, t.step);               \
            q_prefetch_rows(wu, su, n, t.index * cols, cols, t.first, t.step);               \
        }                                                                                    \
        rt_kernel_entry();                                                                   \
        QActs a = {aq, ad, asum, as, k};                                                     \
        q_mmvq_gated<T>(wg, sg, wu, su, n, a, act, cols, t, y);                              \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) qmmvq_multi_##NAME(       \
        QMulti p, int count, i64 k, const int* aq, const float* ad, const int* asum,         \
        const float* as, int tw) {                                                           \
        const QOne o = q_multi_pick(p, count);                                               \
        const QTeam t = q_team(tw);                                                          \
        if (q_prefetch_wanted(tw))                                      \
            q_prefetch_rows(o.w, o.stride, o.n, q_multi_column(o, t), 1, t.first, t.step);   \
        rt_kernel_entry();                                                                   \
        QActs a = {aq, ad, asum, as, k};                                                     \
        q_mmvq_multi<T>(o, a, t);                                                            \
    }
Q_MMVQ_TYPES(Q_MMVQ_KERNELS)
// A multi launch whose weights from `first_b` on are of a second type (a
// Q4_K_M step's value projection in Q6_K next to Q4_K query and key; both
// types read the same quantized activations): MIXED_MULTI in
// src/ops/quant.rs.
#define Q_MMVQ_MULTI2(NA, TA, NB, TB)                                                         \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) qmmvq_multi_##NA##_##NB(  \
        QMulti p, int count, int first_b, i64 k, const int* aq, const float* ad,              \
        const int* asum, const float* as, int tw) {                                           \
        const QOne o = q_multi_pick(p, count);                                                \
        const QTeam t = q_team(tw);                                                           \
        if (q_prefetch_wanted(tw))                                       \
            q_prefetch_rows(o.w, o.stride, o.n, q_multi_column(o, t), 1, t.first, t.step);    \
        rt_kernel_entry();                                                                    \
        QActs a = {aq, ad, asum, as, k};                                                      \
        if (o.index < first_b) q_mmvq_multi<TA>(o, a, t);                                     \
        else q_mmvq_multi<TB>(o, a, t);                                                       \
    }
Q_MMVQ_MULTI2(Q4_K, QQ4_K, Q6_K, QQ6_K) Q_MMVQ_MULTI2(Q5_K, QQ5_K, Q6_K, QQ6_K)

// ---- one-row float products (F16, BF16, F32 weights; a decode step's) ----
// As the one-row MMVQ kernels, for the float types: a team of tw warps a
// column (the launcher's choice from the row length, so that a lane has at
// most W_ROW_LOADS of the row's 16-byte chunks), each lane its chunks
// first, first + step, ..., all of them loaded before any is used (w_matvec,
// one warp a column with four loads in flight, read a decode step's F16
// weights at a third of the memory's speed); x f32, 16-byte aligned, as
// w_matvec takes it. Rows are summed alike by the plain, gated and grouped
// kernels, which so give the same bits.
#define W_ROW_LOADS 8
template <int WK> __device__ __forceinline__ void w_decode(const uint4 u, float* v) {
    const u32 parts[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (WK == 0) {
            v[2 * i] = f16_to_f32((u16)(parts[i] & 0xffffu));
            v[2 * i + 1] = f16_to_f32((u16)(parts[i] >> 16));
        } else if (WK == 1) {
            v[2 * i] = __uint_as_float(parts[i] << 16);
            v[2 * i + 1] = __uint_as_float(parts[i] & 0xffff0000u);
        } else {
            v[i] = __uint_as_float(parts[i]);
        }
    }
}
// Values of a 16-byte chunk of a float row: f32 (WK 2) 4, f16 and bf16 8.
template <int WK> __device__ __forceinline__ constexpr int w_chunk_values() { return WK == 2 ? 4 : 8; }
// One pass of w_row_lanes over R rows (1, or a gated product's gate and
// up rows): the lane's W_ROW_LOADS / R chunks of each row from chunk c0,
// `step` apart (zeros past the row's end), all loaded before any is used,
// through the read-only path (weights: no kernel writes them, so these
// loads may come before the kernel's wait)...
template <int R>
__device__ __forceinline__ void w_row_load(const u8* const (&rows)[R], i64 chunks, i64 c0, int step,
                                           uint4 (&un)[R][W_ROW_LOADS / R]) {
#pragma unroll
    for (int t = 0; t < W_ROW_LOADS / R; ++t) {
        const i64 c = c0 + (i64)step * t;
#pragma unroll
        for (int i = 0; i < R; ++i)
            un[i][t] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(rows[i]) + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}
// ... then summed against x into acc.
template <int WK, int R>
__device__ __forceinline__ void w_row_use(const uint4 (&un)[R][W_ROW_LOADS / R], const float* x, i64 chunks, i64 c0,
                                          int step, float (&acc)[R]) {
    const int V = w_chunk_values<WK>();
#pragma unroll
    for (int t = 0; t < W_ROW_LOADS / R; ++t) {
        const i64 c = c0 + (i64)step * t;
        if (c >= chunks) break;
        const float4* xr = reinterpret_cast<const float4*>(x + c * V);
        float xs[8];
#pragma unroll
        for (int h = 0; h < V / 4; ++h) {
            const float4 q = xr[h];
            xs[4 * h] = q.x; xs[4 * h + 1] = q.y; xs[4 * h + 2] = q.z; xs[4 * h + 3] = q.w;
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
            float v[8];
            w_decode<WK>(un[i][t], v);
            float s = acc[i];
#pragma unroll
            for (int e = 0; e < V; ++e) s = fmaf(v[e], xs[e], s);
            acc[i] = s;
        }
    }
}
// R rows against x: acc[i] is the lane's part of row i's product, the same
// sum for R = 1 and R = 2. ENTRY: the kernel's rt_kernel_entry is made
// here, after the lane's first loads are issued (no kernel writes the
// weights; x, which the kernel before writes, is read after it): the
// loads' latency overlaps the end of the kernel before instead of
// following it (TinyLlama F16 tg128 751 -> 825 t/s on the H200).
template <int WK, int R, bool ENTRY = false>
__device__ __forceinline__ void w_row_lanes(const u8* const (&rows)[R], i64 k, const float* x, int live, int first,
                                            int step, float (&acc)[R]) {
    const int V = w_chunk_values<WK>();
    const int U = W_ROW_LOADS / R;
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    if (!live) {
        if (ENTRY) rt_kernel_entry();
        return;
    }
    const i64 chunks = k / V;
    bool waited = !ENTRY;
    for (i64 c0 = first; c0 < chunks; c0 += (i64)step * U) {
        uint4 un[R][U];
        w_row_load<R>(rows, chunks, c0, step, un);
        if (!waited) {
            rt_kernel_entry();
            waited = true;
        }
        w_row_use<WK, R>(un, x, chunks, c0, step, acc);
    }
    if (!waited) rt_kernel_entry();
}
// w_row_lanes with its first pass's loads already made (`un`, by
// w_row_load from chunk `first`), the same sums.
template <int WK, int R>
__device__ __forceinline__ void w_row_lanes_after(const u8* const (&rows)[R], i64 k, const float* x, int first, int step,
                                                  const uint4 (&un)[R][W_ROW_LOADS / R], float (&acc)[R]) {
    const int V = w_chunk_values<WK>();
    const int U = W_ROW_LOADS / R;
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    const i64 chunks = k / V;
    if (first < chunks) w_row_use<WK, R>(un, x, chunks, first, step, acc);
    for (i64 c0 = first + (i64)step * U; c0 < chunks; c0 += (i64)step * U) {
        uint4 next[R][U];
        w_row_load<R>(rows, chunks, c0, step, next);
        w_row_use<WK, R>(next, x, chunks, c0, step, acc);
    }
}

#define W_ROW_KERNELS(NAME, WK)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) wrow_##NAME(                \
        const u8* w, i64 row_stride, i64 n, i64 k, const float* x, int tw, float* y) {         \
        const QTeam t = q_team(tw);                                                            \
        const i64 j = t.index;                                                                 \
        const int live = j < n;                                                                \
        const u8* rows[1] = {w + (live ? j * row_stride : 0)};                                 \
        float acc[1];                                                                          \
        w_row_lanes<WK, 1, true>(rows, k, x, live, t.first, t.step, acc);                      \
        __shared__ float part[QMMVQ_WARPS][1];                                                 \
        const float s = q_team_sum(t, acc[0], 0, part);                                        \
        if (t.first == 0 && live) y[j] = s;                                                    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) wrow_gated_##NAME(          \
        const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, i64 k, const float* x, int act,     \
        int tw, float* y) {                                                                    \
        const QTeam t = q_team(tw);                                                            \
        const i64 j = t.index;                                                                 \
        const int live = j < n;                                                                \
        const u8* rows[2] = {wg + (live ? j * sg : 0), wu + (live ? j * su : 0)};              \
        float acc[2];                                                                          \
        w_row_lanes<WK, 2, true>(rows, k, x, live, t.first, t.step, acc);                      \
        __shared__ float part[QMMVQ_WARPS][2];                                                 \
        const float g = q_team_sum(t, acc[0], 0, part);                                        \
        const float u = q_team_sum(t, acc[1], 1, part);                                        \
        if (t.first == 0 && live) y[j] = act == 0 ? op_swiglu(g, u) : op_gelu_tanh(g) * u;     \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * QMMVQ_WARPS) wrow_multi_##NAME(          \
        QMulti p, int count, i64 k, const float* x, int tw) {                                  \
        const QOne o = q_multi_pick(p, count);                                                 \
        const QTeam t = q_team(tw);                                                            \
        const i64 j = q_multi_column(o, t);                                                    \
        const int live = j < o.n;                                                              \
        const u8* rows[1] = {o.w + (live ? j * o.stride : 0)};                                 \
        float acc[1];                                                                          \
        w_row_lanes<WK, 1, true>(rows, k, x, live, t.first, t.step, acc);                      \
        __shared__ float part[QMMVQ_WARPS][1];                                                 \
        const float s = q_team_sum(t, acc[0], 0, part);                                        \
        if (t.first == 0 && live) o.y[j] = s;                                                  \
    }
W_ROW_KERNELS(F16, 0) W_ROW_KERNELS(BF16, 1) W_ROW_KERNELS(F32, 2)

#include "norm_products.cuh"
#include "mmq.cuh"

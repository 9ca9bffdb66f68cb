// Prompt-sized products of GGML-typed weights with int8 tensor cores, in
// the arithmetic of llama.cpp's CUDA MMQ path (ggml-cuda/mmq.cuh); off by
// default, src/ops/mmq.rs says why and what it measured.
//
// The activations are quantized once per product to q8_1 blocks of 32
// values as llama.cpp's `quantize_mmq_q8_1` does it: its build runs with
// -use_fast_math, so the scale's inverse is `div.approx` and the scale
// `rcp.approx` of it (written out below, as this module compiles with
// IEEE division), values rounded half away from zero. Two layouts, as the
// weight type wants them: D4 keeps the f32 scale d, DS4 the f16-rounded
// d and the f16-rounded sum of the block's f32 values (for the weight
// types with an offset or a minimum).
//
// Each 32-value piece of a weight row becomes 32 int8 values and its
// scales; each piece pair gives an exact integer sum (mma.sync s8, so the
// instruction shape never changes a bit), then the f32 steps of llama.cpp's
// `vec_dot_*_q8_1_mma` for that type, in the same association (NVRTC and
// nvcc contract `s += a * b * c` into fma(a * b, c, s) alike), piece after
// piece in row order:
// - D  (Q4_0, Q5_0, Q8_0): s += C * dw * da
// - DM (Q4_1, Q5_1, Q4_K, Q5_K): s += dw * da * C; s += mw * sa, where
//   Q4_K/Q5_K's dw = f16(d * sc) and mw = f16(-dmin * m) (f16 products);
// - Q6_K: per 128 values t += (C0 * sc0 + C1 * sc1) * da over the four
//   pieces (two 16-value sums each), then s += t * d.
// Only llama.cpp's split of long sums over blocks (stream-k) and its
// fast-math flush of subnormals differ.
//
// Included by quant.cu, whose block readers (q_ld32, q_f16, q_f16_round,
// q_scale_min_k4) it uses.
#pragma once

typedef signed char i8;

// ---- activation quantization ---------------------------------------------
__device__ __forceinline__ float mmq_div_approx(float a, float b) {
    float r;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float mmq_rcp_approx(float a) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
// roundf as fast math compiles it: add 0.5 (sign of v) rounding to zero,
// then truncate; a NaN (an all-zero block: 0 * inf) gives 0.
__device__ __forceinline__ int mmq_round(float v) {
    float r;
    asm("{ .reg .f32 h; copysign.f32 h, %1, 0f3F000000; add.rz.ftz.f32 h, %1, h; cvt.rzi.f32.f32 %0, h; }"
        : "=f"(r)
        : "f"(v));
    int q;
    asm("cvt.rzi.ftz.s32.f32 %0, %1;" : "=r"(q) : "f"(r));
    return q;
}
// x: n4 groups of 4 contiguous f32 (rows of k values, k a multiple of 32);
// q: the int8 values, same order; d[b], s[b] per 32-value block b. One
// thread per 4 values, 8 lanes a block: max and sum by the same shuffles
// as llama.cpp (the sum's order is its order).
template <bool DS4>
__device__ __forceinline__ void mmq_quantize(const float* x, i64 n4, int* q, float* d, float* s) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n4) v = ((const float4*)x)[i];
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float sum = 0.0f;
    if (DS4) {
        sum = v.x + v.y + v.z + v.w;
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (i >= n4) return;
    const float d_inv = mmq_div_approx(127.0f, amax);
    const int q0 = mmq_round(v.x * d_inv), q1 = mmq_round(v.y * d_inv);
    const int q2 = mmq_round(v.z * d_inv), q3 = mmq_round(v.w * d_inv);
    q[i] = (q0 & 0xff) | ((q1 & 0xff) << 8) | ((q2 & 0xff) << 16) | ((q3 & 0xff) << 24);
    if ((threadIdx.x & 7) == 0) {
        const float dv = mmq_rcp_approx(d_inv);
        d[i >> 3] = DS4 ? q_f16_round(dv) : dv;
        if (DS4) s[i >> 3] = q_f16_round(sum);
    }
}

extern "C" __global__ void mmq_quantize_d4(const float* x, i64 n4, int* q, float* d, float* s) {
    rt_kernel_entry();
    mmq_quantize<false>(x, n4, q, d, s);
}
extern "C" __global__ void mmq_quantize_ds4(const float* x, i64 n4, int* q, float* d, float* s) {
    rt_kernel_entry();
    mmq_quantize<true>(x, n4, q, d, s);
}

// ---- weight pieces ---------------------------------------------------------
// One tag per weight type; `piece` decodes the 32 values of piece p of a
// row (starting at `row`, 2-byte aligned) into 8 ints of 4 int8 values in
// value order, and its scales: d (dw), m (mw for DM types; for Q6_K the
// two 16-value scales packed as i16 pairs).
#define MMQ_D 0
#define MMQ_DM 1
#define MMQ_Q6K 2
struct MQ4_0 { enum { KIND = MMQ_D, DS4 = 1 }; };
struct MQ4_1 { enum { KIND = MMQ_DM, DS4 = 1 }; };
struct MQ5_0 { enum { KIND = MMQ_D, DS4 = 0 }; };
struct MQ5_1 { enum { KIND = MMQ_DM, DS4 = 1 }; };
struct MQ8_0 { enum { KIND = MMQ_D, DS4 = 0 }; };
struct MQ4_K { enum { KIND = MMQ_DM, DS4 = 1 }; };
struct MQ5_K { enum { KIND = MMQ_DM, DS4 = 1 }; };
struct MQ6_K { enum { KIND = MMQ_Q6K, DS4 = 0 }; };

// Bytes minus c, each (values stay in int8 range).
__device__ __forceinline__ u32 mmq_sub(u32 x, u32 c) { return __vsub4(x, c * 0x01010101u); }

// 16 bytes of nibbles -> values 0..15 (low nibbles) and 16..31 (high).
__device__ __forceinline__ void mmq_nibbles(const u8* qs, u32* q, u32 off) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 w = q_ld32<2>(qs + 4 * j);
        q[j] = mmq_sub(w & 0x0f0f0f0fu, off);
        q[j + 4] = mmq_sub((w >> 4) & 0x0f0f0f0fu, off);
    }
}
// The fifth bits of values 0..31 from qh, added to the nibble values.
__device__ __forceinline__ void mmq_fifth_bits(u32 qh, u32* q, u32 off) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const u32 h = qh >> (4 * j);
        const u32 b = ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
        q[j] = mmq_sub(q[j] | b, off);
    }
}

__device__ __forceinline__ void piece(MQ4_0, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 18 * p;
    d = q_f16(b);
    m = 0.0f;
    mmq_nibbles(b + 2, q, 8);
}
__device__ __forceinline__ void piece(MQ4_1, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 20 * p;
    d = q_f16(b);
    m = q_f16(b + 2);
    mmq_nibbles(b + 4, q, 0);
}
__device__ __forceinline__ void piece(MQ5_0, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 22 * p;
    d = q_f16(b);
    m = 0.0f;
    mmq_nibbles(b + 6, q, 0);
    mmq_fifth_bits(q_ld32<2>(b + 2), q, 16);
}
__device__ __forceinline__ void piece(MQ5_1, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 24 * p;
    d = q_f16(b);
    m = q_f16(b + 2);
    mmq_nibbles(b + 8, q, 0);
    mmq_fifth_bits(q_ld32<2>(b + 4), q, 0);
}
__device__ __forceinline__ void piece(MQ8_0, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 34 * p;
    d = q_f16(b);
    m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = q_ld32<2>(b + 2 + 4 * j);
}

// f16(d * sc) and f16(-dmin * m): llama.cpp's half2 product.
__device__ __forceinline__ void mmq_k_scales(const u8* b, int j, float& d, float& m) {
    u32 s, mi;
    q_scale_min_k4(j, b + 4, &s, &mi);
    d = q_f16_round(q_f16(b) * (float)s);
    m = q_f16_round(-q_f16(b + 2) * (float)mi);
}
__device__ __forceinline__ void piece(MQ4_K, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 144 * (p >> 3);
    const int j = p & 7;
    mmq_k_scales(b, j, d, m);
    const u8* qs = b + 16 + 32 * (j >> 1);
    const int sh = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (q_ld32<2>(qs + 4 * i) >> sh) & 0x0f0f0f0fu;
}
__device__ __forceinline__ void piece(MQ5_K, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 176 * (p >> 3);
    const int j = p & 7;
    mmq_k_scales(b, j, d, m);
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (j >> 1);
    const int sh = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 lo = (q_ld32<2>(qs + 4 * i) >> sh) & 0x0f0f0f0fu;
        const u32 hi = ((q_ld32<2>(qh + 4 * i) >> j) & 0x01010101u) << 4;
        q[i] = lo | hi;
    }
}
__device__ __forceinline__ void piece(MQ6_K, const u8* row, int p, u32* q, float& d, float& m) {
    const u8* b = row + 210 * (p >> 3);
    const int j = p & 7, h = j >> 2, c = j & 3;
    const u8* ql = b + 64 * h + 32 * (c & 1);
    const u8* qh = b + 128 + 32 * h;
    const int lsh = 4 * (c >> 1), hsh = 2 * c;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 lo = (q_ld32<2>(ql + 4 * i) >> lsh) & 0x0f0f0f0fu;
        const u32 hi = ((q_ld32<2>(qh + 4 * i) >> hsh) & 0x03030303u) << 4;
        q[i] = mmq_sub(lo | hi, 32);
    }
    const int sc0 = (int)(i8)b[192 + 8 * h + 2 * c], sc1 = (int)(i8)b[192 + 8 * h + 2 * c + 1];
    d = q_f16(b + 208);
    m = __int_as_float((sc0 & 0xffff) | (sc1 << 16));
}

// ---- the product -----------------------------------------------------------
// y[t, r] = sum_k x[t, k] w[r, k] for a block's tile of MMQ_BM weight rows
// by MMQ_BN activation rows, over k in stages of MMQ_BK values. 8 warps:
// warp w takes rows 32 (w % 4).. and activation rows 32 (w / 4)..: two
// 16-row by four 8-column tiles of C, 32 accumulators a thread.
#define MMQ_BM 128
#define MMQ_BN 64
#define MMQ_BK 128
#define MMQ_PIECES (MMQ_BK / 32)
// Row stride of the int8 tiles in shared memory: 144 bytes = 36 words, so
// the 8 rows x 4 words a fragment load touches fall in 32 distinct banks.
#define MMQ_LD (MMQ_BK + 16)

__device__ __forceinline__ void mmq_mma32(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mmq_mma16(int (&c)[4], u32 a0, u32 a1, u32 b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

template <class T>
__device__ __forceinline__ void mmq_product(const u8* w, i64 row_stride, int n, const int* xq, const float* xd,
                                            const float* xs, int m, int k, float* y) {
    __shared__ __align__(16) u8 sa[MMQ_BM * MMQ_LD];
    __shared__ __align__(16) u8 sb[MMQ_BN * MMQ_LD];
    __shared__ float sad[MMQ_BM * MMQ_PIECES], sam[MMQ_BM * MMQ_PIECES];
    __shared__ float sbd[MMQ_BN * MMQ_PIECES], sbs[MMQ_BN * MMQ_PIECES];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * MMQ_BM, c0 = blockIdx.y * MMQ_BN;
    const int wr = 32 * (warp & 3), wc = 32 * (warp >> 2);
    const int pieces = k / 32;

    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[a][b][e] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += MMQ_BK) {
        const int p0 = k0 / 32;
        // Weights: 128 rows x 4 pieces, two a thread; rows past n repeat
        // the last (their sums are never written).
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int unit = tid + 256 * u, r = unit >> 2, pc = unit & 3;
            const int row = min(r0 + r, n - 1);
            u32 q[8];
            float d = 0.0f, mm = 0.0f;
            if (p0 + pc < pieces) {
                piece(T(), w + row * row_stride, p0 + pc, q, d, mm);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) q[i] = 0;
            }
            uint4* dst = (uint4*)(sa + r * MMQ_LD + 32 * pc);
            dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
            dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
            sad[r * MMQ_PIECES + pc] = d;
            sam[r * MMQ_PIECES + pc] = mm;
        }
        // Activations: 64 rows x 128 bytes, two 16-byte parts a thread;
        // rows past m repeat the last, pieces past k are zero.
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int part = tid + 256 * u, c = part >> 3, o = part & 7;
            const int col = min(c0 + c, m - 1);
            uint4 v = make_uint4(0, 0, 0, 0);
            if (p0 + (o >> 1) < pieces) v = *(const uint4*)((const u8*)xq + (i64)col * k + k0 + 16 * o);
            *(uint4*)(sb + c * MMQ_LD + 16 * o) = v;
        }
        {
            const int c = tid >> 2, pc = tid & 3;
            const int col = min(c0 + c, m - 1);
            const bool in = p0 + pc < pieces;
            sbd[c * MMQ_PIECES + pc] = in ? xd[(i64)col * pieces + p0 + pc] : 0.0f;
            sbs[c * MMQ_PIECES + pc] = in && T::KIND == MMQ_DM ? xs[(i64)col * pieces + p0 + pc] : 0.0f;
        }
        __syncthreads();

        float tmp[2][4][4];
        if (T::KIND == MMQ_Q6K) {
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b)
#pragma unroll
                    for (int e = 0; e < 4; ++e) tmp[a][b][e] = 0.0f;
        }
#pragma unroll
        for (int pc = 0; pc < MMQ_PIECES; ++pc) {
            u32 af[2][4];
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const u8* base = sa + (wr + 16 * a + g) * MMQ_LD + 32 * pc + 4 * t;
                af[a][0] = *(const u32*)base;
                af[a][1] = *(const u32*)(base + 8 * MMQ_LD);
                af[a][2] = *(const u32*)(base + 16);
                af[a][3] = *(const u32*)(base + 8 * MMQ_LD + 16);
            }
            float wd[2][2], wm[2][2];
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wr + 16 * a + g + 8 * h;
                    wd[a][h] = sad[r * MMQ_PIECES + pc];
                    wm[a][h] = sam[r * MMQ_PIECES + pc];
                }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const u8* bb = sb + (wc + 8 * b + g) * MMQ_LD + 32 * pc + 4 * t;
                const u32 b0 = *(const u32*)bb, b1 = *(const u32*)(bb + 16);
                float ad[2], as[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = wc + 8 * b + 2 * t + e;
                    ad[e] = sbd[c * MMQ_PIECES + pc];
                    as[e] = sbs[c * MMQ_PIECES + pc];
                }
#pragma unroll
                for (int a = 0; a < 2; ++a) {
                    if (T::KIND == MMQ_Q6K) {
                        int s0[4] = {0, 0, 0, 0}, s1[4] = {0, 0, 0, 0};
                        mmq_mma16(s0, af[a][0], af[a][1], b0);
                        mmq_mma16(s1, af[a][2], af[a][3], b1);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int sc = __float_as_int(wm[a][e >> 1]);
                            const int isum = s0[e] * (int)(short)(sc & 0xffff) + s1[e] * (sc >> 16);
                            tmp[a][b][e] += (float)isum * ad[e & 1];
                        }
                    } else {
                        int cs[4] = {0, 0, 0, 0};
                        mmq_mma32(cs, af[a], b0, b1);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float dw = wd[a][e >> 1];
                            if (T::KIND == MMQ_D) {
                                acc[a][b][e] += (float)cs[e] * dw * ad[e & 1];
                            } else {
                                acc[a][b][e] += dw * ad[e & 1] * (float)cs[e];
                                acc[a][b][e] += wm[a][e >> 1] * as[e & 1];
                            }
                        }
                    }
                }
            }
        }
        if (T::KIND == MMQ_Q6K) {
            // One super-block's d for the whole stage (128 values, half a
            // 256-value block).
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float d = sad[(wr + 16 * a + g + 8 * (e >> 1)) * MMQ_PIECES];
#pragma unroll
                    for (int b = 0; b < 4; ++b) acc[a][b][e] += tmp[a][b][e] * d;
                }
        }
        __syncthreads();
    }

#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + wr + 16 * a + g + 8 * (e >> 1);
                const int c = c0 + wc + 8 * b + 2 * t + (e & 1);
                if (r < n && c < m) y[(i64)c * n + r] = acc[a][b][e];
            }
}

// mmq_T(w, row_stride, n, xq, xd, xs, m, k, y): y [m, n] f32 = x [m, k]
// (quantized by mmq_quantize_*: the layout T::DS4 names) times the n rows
// of w (row r at w + r * row_stride bytes, 2-byte aligned), k a multiple
// of 32 (of 256 for the K-quants). Grid (ceil(n / 128), ceil(m / 64)),
// 256 threads.
#define MMQ_KERNEL(T)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, 2) mmq_##T(const u8* w, i64 row_stride, int n, const int* xq,  \
                                                              const float* xd, const float* xs, int m, int k,     \
                                                              float* y) {                                         \
        rt_kernel_entry();                                                                                       \
        mmq_product<M##T>(w, row_stride, n, xq, xd, xs, m, k, y);                                                \
    }
MMQ_KERNEL(Q4_0)
MMQ_KERNEL(Q4_1)
MMQ_KERNEL(Q5_0)
MMQ_KERNEL(Q5_1)
MMQ_KERNEL(Q8_0)
MMQ_KERNEL(Q4_K)
MMQ_KERNEL(Q5_K)
MMQ_KERNEL(Q6_K)

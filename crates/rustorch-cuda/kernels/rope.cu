// Rotary position embeddings: x [.., T, D] viewed as rows of D features;
// row r sits at position r % T, and its first R = 2 * half features rotate
// by that position's angles (cos/sin [T, half]); the rest are copied. One
// thread per output element (contiguous output): each reads its pair and
// computes only its own half of the rotation.
//
// The arithmetic is the CPU backend's (`Real::rotate`, GGML's):
// (fma(x0, c, -(x1 s)), fma(x0, s, x1 c)) with the products x1 s and x1 c
// rounded first. The explicit __fmul_rn / __fma_rn keep NVRTC from
// contracting them differently, so f32 matches the CPU's FMA path bit for
// bit. Half types compute in f32, as on the CPU.
#include "common.cuh"

__device__ __forceinline__ float rt_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rt_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float rt_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double rt_fma(double a, double b, double c) { return __fma_rn(a, b, c); }

// interleaved: 0 NeoX (feature i pairs with i + half), 1 Interleaved
// (2i pairs with 2i + 1).
#define ROPE(TY)                                                                             \
    extern "C" __global__ void rope_##TY(const TY##T::store* x, Strided lx,                \
                                         const TY##T::store* cs, Strided lc,               \
                                         const TY##T::store* sn, Strided ls,               \
                                         TY##T::store* y, i64 n, i64 t, i64 d, i64 half,  \
                                         int interleaved) { rt_kernel_entry();                                \
        RT_GRID_STRIDE(i, n) {                                                               \
            i64 r = i / d, f = i - r * d;                                                    \
            if (f >= 2 * half) {                                                             \
                y[i] = x[strided_at(lx, i)];                                                 \
                continue;                                                                    \
            }                                                                                \
            i64 k, j0, j1;                                                                   \
            bool second;                                                                     \
            if (interleaved) {                                                               \
                k = f >> 1; j0 = 2 * k; j1 = j0 + 1; second = (f & 1) != 0;                 \
            } else {                                                                         \
                second = f >= half; k = second ? f - half : f; j0 = k; j1 = k + half;        \
            }                                                                                \
            i64 p = (r % t) * half + k;                                                      \
            TY##T::acc c = load(TY##T(), cs[strided_at(lc, p)]);                             \
            TY##T::acc s = load(TY##T(), sn[strided_at(ls, p)]);                             \
            TY##T::acc x0 = load(TY##T(), x[strided_at(lx, r * d + j0)]);                    \
            TY##T::acc x1 = load(TY##T(), x[strided_at(lx, r * d + j1)]);                    \
            TY##T::acc v = second ? rt_fma(x0, s, rt_mul(x1, c)) : rt_fma(x0, c, -rt_mul(x1, s)); \
            y[i] = store(TY##T(), v);                                                        \
        }                                                                                    \
    }

ROPE(F32) ROPE(F16) ROPE(BF16) ROPE(F64)

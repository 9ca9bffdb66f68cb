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

// A decode step's attention inputs in one launch (Backend::rope_write_kv_at):
// q [nq / d rows of d] and k [nk / d rows] rotated as rope_F32 rotates them
// (one position: cos/sin hold `half` values), q into qo, k converted to f16
// into the key cache and v (nk elements) into the value cache where lk / lv
// and the shared position put them (cast_into_F32_F16's write). One thread
// per output element; every thread reads the same position, so either all
// write or none (a bad position sets *atk.bad). Indices in 32 bits (the
// launcher keeps nq + 2 nk below 2^31): the kernel is one link of a decode
// step's chain, and 64-bit divisions made it several times longer.
extern "C" __global__ void rope_kv_at_F32_F16(const float* q, const float* k, const float* v, const float* cs,
                                               const float* sn, float* qo, u16* kc, Strided lk, u16* vc, Strided lv,
                                               i64 nq, i64 nk, i64 d, i64 half, int interleaved, WriteAt atk,
                                               WriteAt atv) {
    rt_kernel_entry();
    const i64 sk = write_shift(atk), sv = write_shift(atv);
    if (sk < 0 || sv < 0) return;
    const u32 uq = (u32)nq, uk = (u32)nk, ud = (u32)d, uh = (u32)half;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < uq + 2 * uk; i += blockDim.x * gridDim.x) {
        if (i >= uq + uk) {
            const u32 j = i - uq - uk;
            vc[strided_at32(lv, j) + sv] = f32_to_f16(v[j]);
            continue;
        }
        const bool is_q = i < uq;
        const float* x = is_q ? q : k;
        const u32 e = is_q ? i : i - uq;
        const u32 r = e / ud, f = e - r * ud;
        float out;
        if (f >= 2 * uh) {
            out = x[e];
        } else {
            u32 kk, j0, j1;
            bool second;
            if (interleaved) {
                kk = f >> 1; j0 = 2 * kk; j1 = j0 + 1; second = (f & 1) != 0;
            } else {
                second = f >= uh; kk = second ? f - uh : f; j0 = kk; j1 = kk + uh;
            }
            const float c = cs[kk], s = sn[kk];
            const float x0 = x[r * ud + j0], x1 = x[r * ud + j1];
            out = second ? rt_fma(x0, s, rt_mul(x1, c)) : rt_fma(x0, c, -rt_mul(x1, s));
        }
        if (is_q) qo[e] = out;
        else kc[strided_at32(lk, e) + sk] = f32_to_f16(out);
    }
}

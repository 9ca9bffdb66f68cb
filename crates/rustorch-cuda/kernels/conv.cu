// Inference batch norm, convolutions (1-D as 2-D over a height-1 image,
// transposed 2-D) and 2-D pooling: direct kernels, one thread per output
// element (contiguous outputs), inputs read through their own strides.
// Half types compute in f32, f64 in f64, rounding once on store, as the CPU
// backend does.
//
// Where the CPU's arithmetic is a fixed sequence the kernels repeat it
// exactly (batch norm's folded scale and shift, the pools' tap order), with
// explicit _rn intrinsics so NVRTC does not contract products into FMAs the
// CPU does not use. Convolutions sum their products in another order than
// the CPU's gemm.
#include "common.cuh"

// A 4-D operand: element (a, b, c, d) at off + a*s[0] + b*s[1] + c*s[2] +
// d*s[3]; 1-D parameters use s[3] only. Mirrors `Str4` in
// src/ops/attention.rs.
struct Str4 {
    i64 s[4];
    i64 off;
};
__device__ __forceinline__ i64 at4(const Str4& l, i64 a, i64 b, i64 c, i64 d) {
    return l.off + a * l.s[0] + b * l.s[1] + c * l.s[2] + d * l.s[3];
}

// Sizes of a convolution: input [N, C, H, W], weight taps KH x KW, output
// [N, O, OH, OW]. Mirrors `ConvGeom` in src/ops/conv.rs.
struct ConvGeom {
    i64 c, h, w, o, kh, kw, oh, ow, groups, sh, sw, ph, pw, dh, dw;
};

__device__ __forceinline__ float r_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double r_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float r_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double r_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float r_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double r_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float r_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double r_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float r_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double r_sqrt(double a) { return __dsqrt_rn(a); }

// ---- batch norm (inference) ----------------------------------------------
// The CPU's (PyTorch's) folding per channel: a = w / sqrt(var + eps),
// shift = b - mean * a, then y = x * a + shift; absent weight 1, bias 0.
// x is read through `lx` (its layout over the output's shape), the
// channel of element i is (i / inner) % c.
#define BATCH_NORM(TY)                                                                       \
    extern "C" __global__ void batch_norm_##TY(                                              \
        const TY##T::store* x, Strided lx, const TY##T::store* mean, Str4 lmean,             \
        const TY##T::store* var, Str4 lvar, const TY##T::store* wt, Str4 lw,                 \
        const TY##T::store* bias, Str4 lb, TY##T::store* y, i64 n, i64 c, i64 inner,         \
        double eps) { rt_kernel_entry();                                                                        \
        typedef TY##T::acc A;                                                                \
        RT_GRID_STRIDE(i, n) {                                                               \
            const i64 ch = (i / inner) % c;                                                  \
            const A m = load(TY##T(), mean[lmean.off + ch * lmean.s[3]]);                    \
            const A v = load(TY##T(), var[lvar.off + ch * lvar.s[3]]);                       \
            const A g = wt ? load(TY##T(), wt[lw.off + ch * lw.s[3]]) : (A)1;                \
            const A beta = bias ? load(TY##T(), bias[lb.off + ch * lb.s[3]]) : (A)0;         \
            const A a = r_div(g, r_sqrt(r_add(v, (A)eps)));                                  \
            const A shift = r_sub(beta, r_mul(m, a));                                        \
            const A xv = load(TY##T(), x[strided_at(lx, i)]);                                \
            y[i] = store(TY##T(), r_add(r_mul(xv, a), shift));                               \
        }                                                                                    \
    }

// ---- convolution ----------------------------------------------------------
// y[n, o, oh, ow] = sum over the group's channels c and taps (i, j) of
// w[o, c, i, j] * x[n, g*cg + c, oh*sh + i*dh - ph, ow*sw + j*dw - pw]
// (taps in the padding add nothing), plus bias[o].
#define CONV2D(TY)                                                                           \
    extern "C" __global__ void conv2d_##TY(const TY##T::store* x, Str4 lx,                   \
                                           const TY##T::store* wt, Str4 lw,                  \
                                           const TY##T::store* bias, Str4 lb,                \
                                           TY##T::store* y, i64 total, ConvGeom g) { rt_kernel_entry();         \
        typedef TY##T::acc A;                                                                \
        const i64 og = g.o / g.groups, cg = g.c / g.groups;                                  \
        RT_GRID_STRIDE(t, total) {                                                           \
            i64 r = t;                                                                       \
            const i64 ow = r % g.ow; r /= g.ow;                                              \
            const i64 oh = r % g.oh; r /= g.oh;                                              \
            const i64 o = r % g.o;                                                           \
            const i64 n = r / g.o;                                                           \
            const i64 c0 = (o / og) * cg;                                                    \
            A acc = 0;                                                                       \
            for (i64 c = 0; c < cg; ++c) {                                                   \
                for (i64 i = 0; i < g.kh; ++i) {                                             \
                    const i64 ih = oh * g.sh + i * g.dh - g.ph;                              \
                    if (ih < 0 || ih >= g.h) continue;                                       \
                    for (i64 j = 0; j < g.kw; ++j) {                                         \
                        const i64 iw = ow * g.sw + j * g.dw - g.pw;                          \
                        if (iw < 0 || iw >= g.w) continue;                                   \
                        acc += load(TY##T(), wt[at4(lw, o, c, i, j)]) *                      \
                               load(TY##T(), x[at4(lx, n, c0 + c, ih, iw)]);                 \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            if (bias) acc = load(TY##T(), bias[lb.off + o * lb.s[3]]) + acc;                 \
            y[t] = store(TY##T(), acc);                                                      \
        }                                                                                    \
    }

// Transposed: weight [C, O/groups, KH, KW]; input position (ih, iw)
// reaches output (ih*sh + i*dh - ph, iw*sw + j*dw - pw), so each output
// gathers the taps whose offsets divide by the stride.
#define CONV_T2D(TY)                                                                         \
    extern "C" __global__ void conv_transpose2d_##TY(const TY##T::store* x, Str4 lx,         \
                                                     const TY##T::store* wt, Str4 lw,        \
                                                     const TY##T::store* bias, Str4 lb,      \
                                                     TY##T::store* y, i64 total,             \
                                                     ConvGeom g) { rt_kernel_entry();                           \
        typedef TY##T::acc A;                                                                \
        const i64 og = g.o / g.groups, cg = g.c / g.groups;                                  \
        RT_GRID_STRIDE(t, total) {                                                           \
            i64 r = t;                                                                       \
            const i64 ow = r % g.ow; r /= g.ow;                                              \
            const i64 oh = r % g.oh; r /= g.oh;                                              \
            const i64 o = r % g.o;                                                           \
            const i64 n = r / g.o;                                                           \
            const i64 c0 = (o / og) * cg, oo = o % og;                                       \
            A acc = 0;                                                                       \
            for (i64 c = 0; c < cg; ++c) {                                                   \
                for (i64 i = 0; i < g.kh; ++i) {                                             \
                    const i64 th = oh + g.ph - i * g.dh;                                     \
                    if (th < 0 || th % g.sh != 0) continue;                                  \
                    const i64 ih = th / g.sh;                                                \
                    if (ih >= g.h) continue;                                                 \
                    for (i64 j = 0; j < g.kw; ++j) {                                         \
                        const i64 tw = ow + g.pw - j * g.dw;                                 \
                        if (tw < 0 || tw % g.sw != 0) continue;                              \
                        const i64 iw = tw / g.sw;                                            \
                        if (iw >= g.w) continue;                                             \
                        acc += load(TY##T(), x[at4(lx, n, c0 + c, ih, iw)]) *                \
                               load(TY##T(), wt[at4(lw, c0 + c, oo, i, j)]);                 \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            if (bias) acc = load(TY##T(), bias[lb.off + o * lb.s[3]]) + acc;                 \
            y[t] = store(TY##T(), acc);                                                      \
        }                                                                                    \
    }

// ---- pooling (no dilation; the geometry's o is the channel count) --------
// Max: taps in the CPU's order (rows, then columns), a NaN kept once seen.
#define MAX_POOL(TY)                                                                         \
    extern "C" __global__ void max_pool2d_##TY(const TY##T::store* x, Str4 lx,               \
                                               TY##T::store* y, i64 total, ConvGeom g) { rt_kernel_entry();     \
        typedef TY##T::acc A;                                                                \
        RT_GRID_STRIDE(t, total) {                                                           \
            i64 r = t;                                                                       \
            const i64 ow = r % g.ow; r /= g.ow;                                              \
            const i64 oh = r % g.oh; r /= g.oh;                                              \
            const i64 ch = r % g.c;                                                          \
            const i64 n = r / g.c;                                                           \
            A m = -(A)__int_as_float(0x7f800000);                                            \
            for (i64 i = 0; i < g.kh; ++i) {                                                 \
                const i64 ih = oh * g.sh + i - g.ph;                                         \
                if (ih < 0 || ih >= g.h) continue;                                           \
                for (i64 j = 0; j < g.kw; ++j) {                                             \
                    const i64 iw = ow * g.sw + j - g.pw;                                     \
                    if (iw < 0 || iw >= g.w) continue;                                       \
                    const A s = load(TY##T(), x[at4(lx, n, ch, ih, iw)]);                    \
                    if (s > m || s != s) m = s;                                              \
                }                                                                            \
            }                                                                                \
            y[t] = store(TY##T(), m);                                                        \
        }                                                                                    \
    }

// Average: the in-bounds taps summed from zero in the CPU's order, divided
// by PyTorch's count (rows * cols; with count_include_pad the window is
// clipped only at the far edge of the padded input, without it to the
// input).
#define AVG_POOL(TY)                                                                         \
    extern "C" __global__ void avg_pool2d_##TY(const TY##T::store* x, Str4 lx,               \
                                               TY##T::store* y, i64 total, ConvGeom g,       \
                                               int count_pad) { rt_kernel_entry();                              \
        typedef TY##T::acc A;                                                                \
        RT_GRID_STRIDE(t, total) {                                                           \
            i64 r = t;                                                                       \
            const i64 ow = r % g.ow; r /= g.ow;                                              \
            const i64 oh = r % g.oh; r /= g.oh;                                              \
            const i64 ch = r % g.c;                                                          \
            const i64 n = r / g.c;                                                           \
            A s = 0;                                                                         \
            for (i64 i = 0; i < g.kh; ++i) {                                                 \
                const i64 ih = oh * g.sh + i - g.ph;                                         \
                if (ih < 0 || ih >= g.h) continue;                                           \
                for (i64 j = 0; j < g.kw; ++j) {                                             \
                    const i64 iw = ow * g.sw + j - g.pw;                                     \
                    if (iw < 0 || iw >= g.w) continue;                                       \
                    s = r_add(s, load(TY##T(), x[at4(lx, n, ch, ih, iw)]));                  \
                }                                                                            \
            }                                                                                \
            i64 h0 = oh * g.sh - g.ph, h1 = h0 + g.kh;                                       \
            if (h1 > g.h + g.ph) h1 = g.h + g.ph;                                            \
            i64 w0 = ow * g.sw - g.pw, w1 = w0 + g.kw;                                       \
            if (w1 > g.w + g.pw) w1 = g.w + g.pw;                                            \
            i64 rows = h1 - h0, cols = w1 - w0;                                              \
            if (!count_pad) {                                                                \
                rows = (h1 < g.h ? h1 : g.h) - (h0 > 0 ? h0 : 0);                            \
                cols = (w1 < g.w ? w1 : g.w) - (w0 > 0 ? w0 : 0);                            \
            }                                                                                \
            y[t] = store(TY##T(), r_div(s, r_mul((A)rows, (A)cols)));                        \
        }                                                                                    \
    }

#define ALL(M) M(F32) M(F16) M(BF16) M(F64)
ALL(BATCH_NORM)
ALL(CONV2D)
ALL(CONV_T2D)
ALL(MAX_POOL)
ALL(AVG_POOL)

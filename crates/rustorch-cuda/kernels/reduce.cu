// Reductions over some dims, softmax over one, RMS norm over the last: one
// block per output row. A row's element (o, r) sits at
// strided_at(outer, o) + strided_at(inner, r) - inner.offset: `outer`
// spans the kept dims, `inner` the reduced ones (offset 0), both with the
// input's strides; outputs are contiguous (softmax's through `yo`/`yi`,
// the same split of the output's contiguous strides). Sums accumulate in
// f64 (exact enough that the order of terms, which differs from the CPU's,
// stays far below the output type's rounding).
#include "common.cuh"

#define RT_BLOCK 256

// Block-wide sum / max of one double per thread (all threads take part).
__device__ double block_sum(double v, double* smem) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? smem[threadIdx.x] : 0.0;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) smem[0] = v;
    __syncthreads();
    v = smem[0];
    __syncthreads();
    return v;
}

// NaN-propagating max (NaN wins; on ties the earlier index, as the CPU and
// PyTorch do for argmax).
struct Best { double v; i64 i; };
__device__ __forceinline__ bool better_max(double x, i64 xi, Best b) {
    bool xn = x != x, bn = b.v != b.v;
    if (xn || bn) return xn && (!bn || xi < b.i);
    return x > b.v || (x == b.v && xi < b.i);
}
__device__ __forceinline__ bool better_min(double x, i64 xi, Best b) {
    bool xn = x != x, bn = b.v != b.v;
    if (xn || bn) return xn && (!bn || xi < b.i);
    return x < b.v || (x == b.v && xi < b.i);
}
template <bool MAX> __device__ Best block_best(Best b, double* sv, i64* si) {
    for (int o = 16; o > 0; o >>= 1) {
        Best c;
        c.v = __shfl_down_sync(0xffffffffu, b.v, o);
        c.i = __shfl_down_sync(0xffffffffu, b.i, o);
        if (c.i >= 0 && (b.i < 0 || (MAX ? better_max(c.v, c.i, b) : better_min(c.v, c.i, b)))) b = c;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = b.v; si[warp] = b.i; }
    __syncthreads();
    if (warp == 0) {
        if (threadIdx.x < (blockDim.x >> 5)) { b.v = sv[threadIdx.x]; b.i = si[threadIdx.x]; }
        else { b.i = -1; }
        for (int o = 16; o > 0; o >>= 1) {
            Best c;
            c.v = __shfl_down_sync(0xffffffffu, b.v, o);
            c.i = __shfl_down_sync(0xffffffffu, b.i, o);
            if (c.i >= 0 && (b.i < 0 || (MAX ? better_max(c.v, c.i, b) : better_min(c.v, c.i, b)))) b = c;
        }
        if (threadIdx.x == 0) { sv[0] = b.v; si[0] = b.i; }
    }
    __syncthreads();
    b.v = sv[0]; b.i = si[0];
    __syncthreads();
    return b;
}

#define AT(x, lo, li, o, r) x[strided_at(lo, o) + strided_at(li, r)]

// kind: 0 sum, 1 mean, 2 prod, 3 var, 4 std (with `correction`)
#define REDUCE_MOMENTS(TY)                                                                   \
    extern "C" __global__ void reduce_moments_##TY(const TY##T::store* x, Strided lo, Strided li, \
                                                   TY##T::store* y, i64 n_inner, int kind,  \
                                                   int correction) {                        \
        __shared__ double smem[32];                                                          \
        i64 o = blockIdx.x;                                                                  \
        if (kind == 2) {                                                                     \
            /* Products in order on one thread: a product's rounding depends on it. */       \
            if (threadIdx.x == 0) {                                                          \
                double p = 1.0;                                                              \
                for (i64 r = 0; r < n_inner; ++r) p *= (double)load(TY##T(), AT(x, lo, li, o, r)); \
                y[o] = store(TY##T(), (TY##T::acc)p);                                        \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        double s = 0.0;                                                                      \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) s += (double)load(TY##T(), AT(x, lo, li, o, r)); \
        s = block_sum(s, smem);                                                              \
        double out;                                                                          \
        if (kind == 0) out = s;                                                              \
        else if (kind == 1) out = s / (double)n_inner;                                       \
        else {                                                                               \
            double mean = s / (double)n_inner, q = 0.0;                                      \
            for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                        \
                double d = (double)load(TY##T(), AT(x, lo, li, o, r)) - mean;                \
                q += d * d;                                                                  \
            }                                                                                \
            q = block_sum(q, smem);                                                          \
            i64 div = n_inner - correction;                                                  \
            out = q / (double)(div > 0 ? div : 0);                                           \
            if (kind == 4) out = sqrt(out);                                                  \
        }                                                                                    \
        if (threadIdx.x == 0) y[o] = store(TY##T(), (TY##T::acc)out);                        \
    }

// Max/min values (`y`, the input's dtype) or arg indices (`yi`, i64).
#define REDUCE_BEST(TY)                                                                      \
    extern "C" __global__ void reduce_best_##TY(const TY##T::store* x, Strided lo, Strided li, \
                                                TY##T::store* y, i64* yi, i64 n_inner,      \
                                                int is_max) {                                \
        __shared__ double sv[32];                                                            \
        __shared__ i64 si[32];                                                               \
        i64 o = blockIdx.x;                                                                  \
        Best b; b.v = 0.0; b.i = -1;                                                         \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double v = (double)load(TY##T(), AT(x, lo, li, o, r));                           \
            if (b.i < 0 || (is_max ? better_max(v, r, b) : better_min(v, r, b))) { b.v = v; b.i = r; } \
        }                                                                                    \
        b = is_max ? block_best<true>(b, sv, si) : block_best<false>(b, sv, si);            \
        if (threadIdx.x == 0) {                                                              \
            if (y) y[o] = store(TY##T(), (TY##T::acc)b.v);                                   \
            if (yi) yi[o] = b.i;                                                             \
        }                                                                                    \
    }

// Softmax / log-softmax of one row (the reduced dim), written through the
// output's split strides.
#define SOFTMAX(TY)                                                                          \
    extern "C" __global__ void softmax_##TY(const TY##T::store* x, Strided lo, Strided li,  \
                                            TY##T::store* y, Strided yo, Strided yi,        \
                                            i64 n_inner, int log_out) {                     \
        __shared__ double sv[32];                                                            \
        __shared__ i64 si[32];                                                               \
        i64 o = blockIdx.x;                                                                  \
        Best b; b.v = 0.0; b.i = -1;                                                         \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double v = (double)load(TY##T(), AT(x, lo, li, o, r));                           \
            if (b.i < 0 || better_max(v, r, b)) { b.v = v; b.i = r; }                        \
        }                                                                                    \
        double m = block_best<true>(b, sv, si).v;                                            \
        double s = 0.0;                                                                      \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x)                              \
            s += exp((double)load(TY##T(), AT(x, lo, li, o, r)) - m);                        \
        s = block_sum(s, sv);                                                                \
        double ls = log(s);                                                                  \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double d = (double)load(TY##T(), AT(x, lo, li, o, r)) - m;                       \
            double v = log_out ? d - ls : exp(d) / s;                                        \
            AT(y, yo, yi, o, r) = store(TY##T(), (TY##T::acc)v);                             \
        }                                                                                    \
    }

// RMS norm over the last dim (rows contiguous in the output), with an
// optional weight `w` (contiguous, one per column; null when absent).
#define RMS_NORM(TY)                                                                         \
    extern "C" __global__ void rms_norm_##TY(const TY##T::store* x, Strided lo, Strided li, \
                                             const TY##T::store* w, Strided lw,             \
                                             TY##T::store* y, i64 n_inner, double eps) {    \
        __shared__ double smem[32];                                                          \
        i64 o = blockIdx.x;                                                                  \
        double q = 0.0;                                                                      \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double v = (double)load(TY##T(), AT(x, lo, li, o, r));                           \
            q += v * v;                                                                      \
        }                                                                                    \
        q = block_sum(q, smem);                                                              \
        TY##T::acc scale = (TY##T::acc)(1.0 / sqrt(q / (double)n_inner + eps));              \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            TY##T::acc v = load(TY##T(), AT(x, lo, li, o, r)) * scale;                       \
            if (w) v = v * load(TY##T(), w[strided_at(lw, r)]);                              \
            y[o * n_inner + r] = store(TY##T(), v);                                          \
        }                                                                                    \
    }

// Layer norm over the trailing dims (the row; output rows contiguous),
// with optional weight `w` and bias `bb` (null when absent), each addressed
// through its own layout by the row-major position in the row. As on the
// CPU, the statistics are taken relative to the row's first element
// (`shift`), so a large common offset costs no precision, and the variance
// is a second pass over squared deviations; here both sums run in f64 and
// the affine step too, rounding once into the output type.
#define LAYER_NORM(TY)                                                                       \
    extern "C" __global__ void layer_norm_##TY(const TY##T::store* x, Strided lo, Strided li, \
                                               const TY##T::store* w, Strided lw,           \
                                               const TY##T::store* bb, Strided lb,          \
                                               TY##T::store* y, i64 n_inner, double eps) {  \
        __shared__ double smem[32];                                                          \
        i64 o = blockIdx.x;                                                                  \
        double shift = (double)load(TY##T(), AT(x, lo, li, o, 0));                           \
        double s = 0.0;                                                                      \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x)                              \
            s += (double)load(TY##T(), AT(x, lo, li, o, r)) - shift;                         \
        double dev = block_sum(s, smem) / (double)n_inner;                                   \
        double q = 0.0;                                                                      \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double d = ((double)load(TY##T(), AT(x, lo, li, o, r)) - shift) - dev;           \
            q += d * d;                                                                      \
        }                                                                                    \
        q = block_sum(q, smem);                                                              \
        double rstd = 1.0 / sqrt(q / (double)n_inner + eps);                                 \
        for (i64 r = threadIdx.x; r < n_inner; r += blockDim.x) {                            \
            double v = (((double)load(TY##T(), AT(x, lo, li, o, r)) - shift) - dev) * rstd;  \
            if (w) v = v * (double)load(TY##T(), w[strided_at(lw, r)]);                      \
            if (bb) v = v + (double)load(TY##T(), bb[strided_at(lb, r)]);                    \
            y[o * n_inner + r] = store(TY##T(), (TY##T::acc)v);                              \
        }                                                                                    \
    }

// Running sums along one dim: one thread per row, in order. A first
// version, correct before fast (a long row is one thread's serial loop; a
// block-wide scan would be the next step). Sequential order and the CPU's
// accumulator types (f64 for f32/f64, f32 for f16/bf16, as PyTorch's
// acc_type) make the result match the CPU's exactly. Rows are addressed as
// in softmax: input through lo/li, output through yo/yi.
#define CUMSUM(TY, ACC)                                                                      \
    extern "C" __global__ void cumsum_##TY(const TY##T::store* x, Strided lo, Strided li,   \
                                           TY##T::store* y, Strided yo, Strided yi,         \
                                           i64 rows, i64 len) {                             \
        RT_GRID_STRIDE(o, rows) {                                                            \
            ACC a = 0;                                                                       \
            for (i64 r = 0; r < len; ++r) {                                                  \
                a += (ACC)load(TY##T(), AT(x, lo, li, o, r));                                \
                AT(y, yo, yi, o, r) = store(TY##T(), (TY##T::acc)a);                         \
            }                                                                                \
        }                                                                                    \
    }
CUMSUM(F32, double) CUMSUM(F16, float) CUMSUM(BF16, float) CUMSUM(F64, double)

// Integers and bools: i64 output, wrapping sums (through u64, where C's
// signed overflow would be undefined), as the CPU computes them.
#define CUMSUM_INT(NAME, T)                                                                  \
    extern "C" __global__ void cumsum_##NAME(const T* x, Strided lo, Strided li, i64* y,    \
                                             Strided yo, Strided yi, i64 rows, i64 len) {   \
        RT_GRID_STRIDE(o, rows) {                                                            \
            u64 a = 0;                                                                       \
            for (i64 r = 0; r < len; ++r) {                                                  \
                a += (u64)(i64)AT(x, lo, li, o, r);                                          \
                AT(y, yo, yi, o, r) = (i64)a;                                                \
            }                                                                                \
        }                                                                                    \
    }
CUMSUM_INT(I32, int) CUMSUM_INT(I64, i64) CUMSUM_INT(U8, u8) CUMSUM_INT(BOOL, u8)

#define ALL_FLOATS(M) M(F32) M(F16) M(BF16) M(F64)
ALL_FLOATS(REDUCE_MOMENTS)
ALL_FLOATS(REDUCE_BEST)
ALL_FLOATS(SOFTMAX)
ALL_FLOATS(RMS_NORM)
ALL_FLOATS(LAYER_NORM)

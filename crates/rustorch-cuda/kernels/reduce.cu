// Reductions over some dims, softmax over one, RMS norm over the last: one
// block per output row. A row's element (o, r) sits at
// strided_at(outer, o) + strided_at(inner, r) - inner.offset: `outer`
// spans the kept dims, `inner` the reduced ones (offset 0), both with the
// input's strides; outputs are contiguous (softmax's through `yo`/`yi`,
// the same split of the output's contiguous strides). Sums accumulate in
// f64 (exact enough that the order of terms, which differs from the CPU's,
// stays far below the output type's rounding).
#include "common.cuh"
#include "rows.cuh"

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
                                                   int correction) { rt_kernel_entry();                        \
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
                                                int is_max) { rt_kernel_entry();                                \
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
                                            i64 n_inner, int log_out) { rt_kernel_entry();                     \
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
                                             TY##T::store* y, i64 n_inner, double eps) { rt_kernel_entry();    \
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
                                               TY##T::store* y, i64 n_inner, double eps) { rt_kernel_entry();  \
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
                                           i64 rows, i64 len) { rt_kernel_entry();                             \
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
                                             Strided yo, Strided yi, i64 rows, i64 len) { rt_kernel_entry();   \
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

// ---- rows held in registers ----------------------------------------------
// Softmax and RMS norm of rows that are contiguous in the input and the
// output, ROW_PER values per thread: the row is read from memory once,
// kept in registers, and written once (the kernels above read it two or
// three times). One warp per row for rows up to 32 * ROW_PER elements
// (`_warp`, 8 rows per block of 256); one block per row up to 1024 *
// ROW_PER (`_block`, the host sizes the block to the row). ROW_PER stays
// small so that registers leave room for many blocks per SM (at 32 values
// a thread, ptxas needed 150 registers: one block per SM). Indices within
// a row are 32-bit. Sums still accumulate in f64; exponentials are f32
// (`expf`, within 2 ulp) for f32 and the half types. ROW_PER, row_of,
// row_sum and the RMS norm's rms_norm_rows are in kernels/rows.cuh.
#define RT_NEG_INF __int_as_float(0xff800000)

// The NaN-propagating max of one value per thread over the threads of a
// row (as row_sum: the warp or the whole block, in one fixed order).
__device__ __forceinline__ float max_nan(float a, float b) { return (b != b || b > a) ? b : a; }
template <bool WARP> __device__ __forceinline__ float row_max(float v, float* smem) {
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (WARP) return v;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < warps; ++w) v = max_nan(v, smem[w]);
    __syncthreads();
    return v;
}

template <typename TY, bool WARP>
__device__ void softmax_rows(const typename TY::store* x, const Strided& lo, typename TY::store* y,
                             const Strided& yo, i64 n64, int log_out, i64 rows) {
    __shared__ double ssum[32];
    __shared__ float smax[32];
    i64 o; int t, nt;
    // Warps past the last row leave (only in warp mode, which has no
    // block-wide barriers; in block mode every block has a row).
    if (!row_of<WARP>(rows, o, t, nt)) return;
    const int n = (int)n64;
    const typename TY::store* xr = x + strided_at(lo, o);
    typename TY::store* yr = y + strided_at(yo, o);
    float v[ROW_PER];
    float m = RT_NEG_INF;
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        int r = t + k * nt;
        v[k] = r < n ? (float)load(TY(), xr[r]) : RT_NEG_INF;
        m = max_nan(m, v[k]);
    }
    m = row_max<WARP>(m, smax);
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        if (t + k * nt < n) {
            v[k] = v[k] - m;
            float e = expf(v[k]);
            s += (double)e;
            if (!log_out) v[k] = e;
        }
    }
    s = row_sum<WARP>(s, ssum);
    float ls = (float)log(s);
    float inv = (float)(1.0 / s);
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        int r = t + k * nt;
        if (r < n) yr[r] = store(TY(), log_out ? v[k] - ls : v[k] * inv);
    }
}

#define ROWS_IN_REGISTERS(TY)                                                                \
    extern "C" __global__ void softmax_warp_##TY(const TY##T::store* x, Strided lo, TY##T::store* y, \
                                                 Strided yo, i64 n, int log_out, i64 rows) { rt_kernel_entry(); \
        softmax_rows<TY##T, true>(x, lo, y, yo, n, log_out, rows);                          \
    }                                                                                        \
    extern "C" __global__ void softmax_block_##TY(const TY##T::store* x, Strided lo, TY##T::store* y, \
                                                  Strided yo, i64 n, int log_out, i64 rows) { rt_kernel_entry(); \
        softmax_rows<TY##T, false>(x, lo, y, yo, n, log_out, rows);                         \
    }                                                                                        \
    extern "C" __global__ void rms_norm_warp_##TY(const TY##T::store* x, Strided lo,        \
                                                  const TY##T::store* w, Strided lw,        \
                                                  TY##T::store* y, i64 n, double eps, i64 rows) { rt_kernel_entry(); \
        rms_norm_rows<TY##T, true, false>(x, lo, 0, w, lw, 0, y, n, eps, rows);             \
    }                                                                                        \
    extern "C" __global__ void rms_norm_block_##TY(const TY##T::store* x, Strided lo,       \
                                                   const TY##T::store* w, Strided lw,       \
                                                   TY##T::store* y, i64 n, double eps, i64 rows) { rt_kernel_entry(); \
        rms_norm_rows<TY##T, false, false>(x, lo, 0, w, lw, 0, y, n, eps, rows);            \
    }
ROWS_IN_REGISTERS(F32) ROWS_IN_REGISTERS(F16) ROWS_IN_REGISTERS(BF16)

// Op::AddRmsNorm: s = x + a and y = rms_norm(s) * w, x and a contiguous
// rows at the offsets lo gives.
extern "C" __global__ void add_rms_norm_warp_F32(const float* x, Strided lo, const float* a, const float* w,
                                                 Strided lw, float* s, float* y, i64 n, double eps, i64 rows) {
    rt_kernel_entry();
    rms_norm_rows<F32T, true, true>(x, lo, a, w, lw, s, y, n, eps, rows);
}
extern "C" __global__ void add_rms_norm_block_F32(const float* x, Strided lo, const float* a, const float* w,
                                                  Strided lw, float* s, float* y, i64 n, double eps, i64 rows) {
    rt_kernel_entry();
    rms_norm_rows<F32T, false, true>(x, lo, a, w, lw, s, y, n, eps, rows);
}

// ---- rows split over several blocks --------------------------------------
// Few long rows (a sum over a whole tensor) would leave all but a few SMs
// idle with one block per row: such rows are cut into `chunks` pieces of
// `chunk` elements, one block each (grid chunks x rows), whose partial
// results a second kernel joins in chunk order (one thread per row), so the
// result does not depend on scheduling. Moments keep (count, sum, squared
// deviations from the piece's own mean), joined with Chan et al.'s formula
// in f64; max/min keep the piece's best value and its index.
// The sum, over this block's threads (each its share; combine with
// block_sum), of `len` contiguous elements from `p`: 16-byte loads, eight
// in flight per thread, after the elements before the first 16-byte
// boundary.
template <typename TY>
__device__ __forceinline__ double contiguous_sum(const typename TY::store* p, i64 len) {
    typedef typename TY::store S;
    const int V = 16 / sizeof(S);
    const i64 bd = blockDim.x;
    double s = 0.0;
    i64 head = (i64)(((16 - ((u64)p & 15)) & 15) / sizeof(S));
    if (head > len) head = len;
    for (i64 i = threadIdx.x; i < head; i += bd) s += (double)load(TY(), p[i]);
    const Pack<S>* q = reinterpret_cast<const Pack<S>*>(p + head);
    const i64 packs = (len - head) / V;
    i64 j = threadIdx.x;
    for (; j + 7 * bd < packs; j += 8 * bd) {
        Pack<S> a[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) a[u] = q[j + u * bd];
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int k = 0; k < V; ++k) s += (double)load(TY(), a[u].v[k]);
    }
    for (; j < packs; j += bd) {
        Pack<S> a = q[j];
#pragma unroll
        for (int k = 0; k < V; ++k) s += (double)load(TY(), a.v[k]);
    }
    for (i64 i = head + packs * V + threadIdx.x; i < len; i += bd) s += (double)load(TY(), p[i]);
    return s;
}

// Joins the moments (count, sum, squared deviations) of a piece into
// another's (Chan et al.); an empty side changes nothing.
__device__ __forceinline__ void moments_join(double& n, double& s, double& m2, double nb, double sb, double m2b) {
    if (nb == 0.0) return;
    if (n == 0.0) { n = nb; s = sb; m2 = m2b; return; }
    double delta = sb / nb - s / n;
    m2 += m2b + delta * delta * (n * nb / (n + nb));
    n += nb;
    s += sb;
}

#define REDUCE_SPLIT(TY)                                                                     \
    extern "C" __global__ void reduce_moments_part_##TY(const TY##T::store* x, Strided lo,  \
                                                        Strided li, double* part, i64 n_inner, \
                                                        i64 chunk, int need_m2) { rt_kernel_entry();            \
        __shared__ double smem[32];                                                          \
        i64 o = blockIdx.y, c = blockIdx.x;                                                  \
        i64 lo_r = c * chunk, hi_r = lo_r + chunk < n_inner ? lo_r + chunk : n_inner;        \
        double s = 0.0;                                                                      \
        i64 r = lo_r + threadIdx.x;                                                          \
        if (li.ndim == 1 && li.stride[0] == 1) {                                             \
            s = contiguous_sum<TY##T>(x + strided_at(lo, o) + lo_r, hi_r - lo_r);            \
            r = hi_r;                                                                        \
        } else if (li.ndim == 1) {                                                           \
            /* One stride over the row: eight loads in flight per thread, */                 \
            /* with no branch between them (strided_at's has one), since */                  \
            /* the few blocks of a split row must keep the memory busy. */                   \
            const TY##T::store* xr = x + strided_at(lo, o);                                  \
            const i64 st = li.stride[0], bd = blockDim.x;                                    \
            for (; r + 7 * bd < hi_r; r += 8 * bd) {                                         \
                double u[8];                                                                 \
                _Pragma("unroll") for (int k = 0; k < 8; ++k)                                \
                    u[k] = (double)load(TY##T(), xr[(r + k * bd) * st]);                     \
                _Pragma("unroll") for (int k = 0; k < 8; ++k) s += u[k];                     \
            }                                                                                \
        }                                                                                    \
        for (; r < hi_r; r += blockDim.x) s += (double)load(TY##T(), AT(x, lo, li, o, r));   \
        s = block_sum(s, smem);                                                              \
        double cnt = (double)(hi_r - lo_r), q = 0.0;                                         \
        if (need_m2) {                                                                       \
            double mean = s / cnt;                                                           \
            for (i64 r = lo_r + threadIdx.x; r < hi_r; r += blockDim.x) {                    \
                double d = (double)load(TY##T(), AT(x, lo, li, o, r)) - mean;                \
                q += d * d;                                                                  \
            }                                                                                \
            q = block_sum(q, smem);                                                          \
        }                                                                                    \
        if (threadIdx.x == 0) {                                                              \
            double* p = part + (o * gridDim.x + c) * 3;                                      \
            p[0] = cnt; p[1] = s; p[2] = q;                                                  \
        }                                                                                    \
    }                                                                                        \
    extern "C" __global__ void reduce_moments_join_##TY(const double* part, TY##T::store* y, \
                                                        i64 rows, i64 chunks, int kind,     \
                                                        int correction) { rt_kernel_entry();                   \
        /* One warp per row: lane l joins chunks l, l+32, ... in order, */                   \
        /* then the lanes join in a fixed tree (same bits every run). */                     \
        i64 o = blockIdx.x;                                                                  \
        int lane = threadIdx.x;                                                              \
        if (o >= rows) return;                                                               \
        const double* p = part + o * chunks * 3;                                             \
        double n = 0.0, s = 0.0, m2 = 0.0;                                                   \
        for (i64 c = lane; c < chunks; c += 32)                                              \
            moments_join(n, s, m2, p[c * 3], p[c * 3 + 1], p[c * 3 + 2]);                   \
        for (int off = 16; off > 0; off >>= 1) {                                             \
            double nb = __shfl_down_sync(0xffffffffu, n, off);                               \
            double sb = __shfl_down_sync(0xffffffffu, s, off);                               \
            double m2b = __shfl_down_sync(0xffffffffu, m2, off);                             \
            if (lane < off) moments_join(n, s, m2, nb, sb, m2b);                             \
        }                                                                                    \
        if (lane != 0) return;                                                               \
        double out;                                                                          \
        if (kind == 0) out = s;                                                              \
        else if (kind == 1) out = s / n;                                                     \
        else {                                                                               \
            double div = n - (double)correction;                                             \
            out = m2 / (div > 0.0 ? div : 0.0);                                              \
            if (kind == 4) out = sqrt(out);                                                  \
        }                                                                                    \
        y[o] = store(TY##T(), (TY##T::acc)out);                                              \
    }                                                                                        \
    extern "C" __global__ void reduce_best_part_##TY(const TY##T::store* x, Strided lo,     \
                                                     Strided li, double* pv, i64* pi,       \
                                                     i64 n_inner, i64 chunk, int is_max) { rt_kernel_entry();  \
        __shared__ double sv[32];                                                            \
        __shared__ i64 si[32];                                                               \
        i64 o = blockIdx.y, c = blockIdx.x;                                                  \
        i64 lo_r = c * chunk, hi_r = lo_r + chunk < n_inner ? lo_r + chunk : n_inner;        \
        Best b; b.v = 0.0; b.i = -1;                                                         \
        for (i64 r = lo_r + threadIdx.x; r < hi_r; r += blockDim.x) {                        \
            double v = (double)load(TY##T(), AT(x, lo, li, o, r));                           \
            if (b.i < 0 || (is_max ? better_max(v, r, b) : better_min(v, r, b))) { b.v = v; b.i = r; } \
        }                                                                                    \
        b = is_max ? block_best<true>(b, sv, si) : block_best<false>(b, sv, si);            \
        if (threadIdx.x == 0) { pv[o * gridDim.x + c] = b.v; pi[o * gridDim.x + c] = b.i; }  \
    }                                                                                        \
    extern "C" __global__ void reduce_best_join_##TY(const double* pv, const i64* pi,       \
                                                     TY##T::store* y, i64* yi, i64 rows,    \
                                                     i64 chunks, int is_max) { rt_kernel_entry();              \
        i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                  \
        if (o >= rows) return;                                                               \
        Best b; b.v = pv[o * chunks]; b.i = pi[o * chunks];                                  \
        for (i64 c = 1; c < chunks; ++c) {                                                   \
            double v = pv[o * chunks + c]; i64 i = pi[o * chunks + c];                       \
            if (is_max ? better_max(v, i, b) : better_min(v, i, b)) { b.v = v; b.i = i; }    \
        }                                                                                    \
        if (y) y[o] = store(TY##T(), (TY##T::acc)b.v);                                       \
        if (yi) yi[o] = b.i;                                                                 \
    }
ALL_FLOATS(REDUCE_SPLIT)

// ---- integers and bools ----------------------------------------------------
// Exact, as the CPU reduces them: every element widens to i64 (bools as
// 0/1, u8 zero-extended, i32 sign-extended) and sums and products wrap in
// 64 bits, computed in u64 where C's signed overflow would be undefined.
// Wrapping addition and multiplication are associative and commutative
// (arithmetic mod 2^64), so any order of terms (threads, warps, chunks)
// gives the CPU's result bit for bit; products may therefore be split over
// blocks too, unlike float ones. Max/min compare the widened values, ties
// keep the first index (the CPU's and PyTorch's argmax), and the value is
// stored back in the input's dtype (always in range: it is an element).
struct IntI32  { typedef int store; };
struct IntI64  { typedef i64 store; };
struct IntU8   { typedef u8  store; };
struct IntBOOL { typedef u8  store; };
__device__ __forceinline__ i64 iload(IntI32, int x) { return (i64)x; }
__device__ __forceinline__ i64 iload(IntI64, i64 x) { return x; }
__device__ __forceinline__ i64 iload(IntU8, u8 x)   { return (i64)x; }
__device__ __forceinline__ i64 iload(IntBOOL, u8 x) { return x != 0 ? 1 : 0; }
__device__ __forceinline__ int istore(IntI32, i64 v) { return (int)v; }
__device__ __forceinline__ i64 istore(IntI64, i64 v) { return v; }
__device__ __forceinline__ u8  istore(IntU8, i64 v)   { return (u8)v; }
__device__ __forceinline__ u8  istore(IntBOOL, i64 v) { return v != 0 ? 1 : 0; }

template <bool PROD> __device__ __forceinline__ u64 ifold(u64 a, u64 b) { return PROD ? a * b : a + b; }

// Block-wide wrapping sum / product of one u64 per thread (all threads
// take part); every thread gets the result.
template <bool PROD> __device__ u64 block_fold(u64 v, u64* smem) {
    for (int o = 16; o > 0; o >>= 1) v = ifold<PROD>(v, __shfl_down_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = threadIdx.x < (blockDim.x >> 5) ? smem[threadIdx.x] : (PROD ? 1ull : 0ull);
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v = ifold<PROD>(v, __shfl_down_sync(0xffffffffu, v, o));
    if (threadIdx.x == 0) smem[0] = v;
    __syncthreads();
    v = smem[0];
    __syncthreads();
    return v;
}

// An integer max/min candidate: the widened value and its index in the row
// (-1: none yet, for threads that saw no element).
struct IBest { i64 v; i64 i; };
template <bool MAX> __device__ __forceinline__ bool ibetter(i64 x, i64 xi, IBest b) {
    return (MAX ? x > b.v : x < b.v) || (x == b.v && xi < b.i);
}
template <bool MAX> __device__ __forceinline__ IBest ibest_take(IBest b, IBest c) {
    return (c.i >= 0 && (b.i < 0 || ibetter<MAX>(c.v, c.i, b))) ? c : b;
}
template <bool MAX> __device__ IBest block_ibest(IBest b, i64* sv, i64* si) {
    for (int o = 16; o > 0; o >>= 1) {
        IBest c;
        c.v = __shfl_down_sync(0xffffffffu, b.v, o);
        c.i = __shfl_down_sync(0xffffffffu, b.i, o);
        b = ibest_take<MAX>(b, c);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = b.v; si[warp] = b.i; }
    __syncthreads();
    if (warp == 0) {
        if (threadIdx.x < (blockDim.x >> 5)) { b.v = sv[threadIdx.x]; b.i = si[threadIdx.x]; }
        else { b.v = 0; b.i = -1; }
        for (int o = 16; o > 0; o >>= 1) {
            IBest c;
            c.v = __shfl_down_sync(0xffffffffu, b.v, o);
            c.i = __shfl_down_sync(0xffffffffu, b.i, o);
            b = ibest_take<MAX>(b, c);
        }
        if (threadIdx.x == 0) { sv[0] = b.v; si[0] = b.i; }
    }
    __syncthreads();
    b.v = sv[0]; b.i = si[0];
    __syncthreads();
    return b;
}

// The best of elements [lo_r, hi_r) of row `o`, over the block.
template <typename K, bool MAX>
__device__ IBest ibest_range(const typename K::store* x, const Strided& lo, const Strided& li, i64 o, i64 lo_r,
                             i64 hi_r) {
    __shared__ i64 sv[32];
    __shared__ i64 si[32];
    IBest b; b.v = 0; b.i = -1;
    for (i64 r = lo_r + threadIdx.x; r < hi_r; r += blockDim.x) {
        // Indices only grow within a thread: strictly better replaces.
        i64 v = iload(K(), AT(x, lo, li, o, r));
        if (b.i < 0 || (MAX ? v > b.v : v < b.v)) { b.v = v; b.i = r; }
    }
    return block_ibest<MAX>(b, sv, si);
}

// The wrapping fold, over this block's threads (each its share; combine
// with block_fold), of `len` contiguous elements from `p`: 16-byte loads,
// four in flight per thread, after the elements before the first 16-byte
// boundary (as contiguous_sum above).
template <typename K, bool PROD>
__device__ __forceinline__ u64 contiguous_fold(const typename K::store* p, i64 len) {
    typedef typename K::store S;
    const int V = 16 / sizeof(S);
    const i64 bd = blockDim.x;
    u64 a = PROD ? 1ull : 0ull;
    i64 head = (i64)(((16 - ((u64)p & 15)) & 15) / sizeof(S));
    if (head > len) head = len;
    for (i64 i = threadIdx.x; i < head; i += bd) a = ifold<PROD>(a, (u64)iload(K(), p[i]));
    const Pack<S>* q = reinterpret_cast<const Pack<S>*>(p + head);
    const i64 packs = (len - head) / V;
    i64 j = threadIdx.x;
    for (; j + 3 * bd < packs; j += 4 * bd) {
        Pack<S> w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) w[u] = q[j + u * bd];
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int k = 0; k < V; ++k) a = ifold<PROD>(a, (u64)iload(K(), w[u].v[k]));
    }
    for (; j < packs; j += bd) {
        Pack<S> w = q[j];
#pragma unroll
        for (int k = 0; k < V; ++k) a = ifold<PROD>(a, (u64)iload(K(), w.v[k]));
    }
    for (i64 i = head + packs * V + threadIdx.x; i < len; i += bd) a = ifold<PROD>(a, (u64)iload(K(), p[i]));
    return a;
}

// The wrapping fold of elements [lo_r, hi_r) of row `o`, over the block.
// Contiguous rows take 16-byte loads, rows of one stride eight loads in
// flight per thread (no branch between them), others strided_at.
template <typename K, bool PROD>
__device__ u64 fold_range(const typename K::store* x, const Strided& lo, const Strided& li, i64 o, i64 lo_r,
                          i64 hi_r) {
    __shared__ u64 smem[32];
    u64 a = PROD ? 1ull : 0ull;
    i64 r = lo_r + threadIdx.x;
    if (li.ndim == 1 && li.stride[0] == 1) {
        a = contiguous_fold<K, PROD>(x + strided_at(lo, o) + lo_r, hi_r - lo_r);
        r = hi_r;
    } else if (li.ndim == 1) {
        const typename K::store* xr = x + strided_at(lo, o);
        const i64 st = li.stride[0], bd = blockDim.x;
        for (; r + 7 * bd < hi_r; r += 8 * bd) {
            i64 u[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) u[k] = iload(K(), xr[(r + k * bd) * st]);
#pragma unroll
            for (int k = 0; k < 8; ++k) a = ifold<PROD>(a, (u64)u[k]);
        }
    }
    for (; r < hi_r; r += blockDim.x) a = ifold<PROD>(a, (u64)iload(K(), AT(x, lo, li, o, r)));
    return block_fold<PROD>(a, smem);
}

// One block per output row: `reduce_fold_*` sums (prod 0) or multiplies
// (prod 1) into i64 (the output dtype of both for every integer and bool
// input); `reduce_best_*` as the float kernels: max/min values in the
// input's dtype (`y`) or arg indices (`yi`), the other pointer null. An
// empty row folds to the identity (0 or 1); the host rejects empty rows
// for max/min.
// Rows split over blocks (grid chunks x rows, as the float kernels): each
// `_part` block folds or picks over its chunk into `part` / `pv`, `pi`
// (u64 / i64, one per block), and one thread per row joins them in chunk
// order (`reduce_fold_join`, `reduce_best_join_*`).
#define REDUCE_INT(TY)                                                                       \
    extern "C" __global__ void reduce_fold_##TY(const Int##TY::store* x, Strided lo, Strided li, \
                                                i64* y, i64 n_inner, int prod) { rt_kernel_entry();            \
        i64 o = blockIdx.x;                                                                  \
        u64 a = prod ? fold_range<Int##TY, true>(x, lo, li, o, 0, n_inner)                   \
                     : fold_range<Int##TY, false>(x, lo, li, o, 0, n_inner);                 \
        if (threadIdx.x == 0) y[o] = (i64)a;                                                 \
    }                                                                                        \
    extern "C" __global__ void reduce_best_##TY(const Int##TY::store* x, Strided lo, Strided li, \
                                                Int##TY::store* y, i64* yi, i64 n_inner,    \
                                                int is_max) { rt_kernel_entry();                                \
        i64 o = blockIdx.x;                                                                  \
        IBest b = is_max ? ibest_range<Int##TY, true>(x, lo, li, o, 0, n_inner)              \
                         : ibest_range<Int##TY, false>(x, lo, li, o, 0, n_inner);            \
        if (threadIdx.x == 0) {                                                              \
            if (y) y[o] = istore(Int##TY(), b.v);                                            \
            if (yi) yi[o] = b.i;                                                             \
        }                                                                                    \
    }                                                                                        \
    extern "C" __global__ void reduce_fold_part_##TY(const Int##TY::store* x, Strided lo,   \
                                                     Strided li, u64* part, i64 n_inner,    \
                                                     i64 chunk, int prod) { rt_kernel_entry();                  \
        i64 o = blockIdx.y, c = blockIdx.x;                                                  \
        i64 lo_r = c * chunk, hi_r = lo_r + chunk < n_inner ? lo_r + chunk : n_inner;        \
        u64 a = prod ? fold_range<Int##TY, true>(x, lo, li, o, lo_r, hi_r)                   \
                     : fold_range<Int##TY, false>(x, lo, li, o, lo_r, hi_r);                 \
        if (threadIdx.x == 0) part[o * gridDim.x + c] = a;                                   \
    }                                                                                        \
    extern "C" __global__ void reduce_best_part_##TY(const Int##TY::store* x, Strided lo,   \
                                                     Strided li, i64* pv, i64* pi,          \
                                                     i64 n_inner, i64 chunk, int is_max) { rt_kernel_entry();  \
        i64 o = blockIdx.y, c = blockIdx.x;                                                  \
        i64 lo_r = c * chunk, hi_r = lo_r + chunk < n_inner ? lo_r + chunk : n_inner;        \
        IBest b = is_max ? ibest_range<Int##TY, true>(x, lo, li, o, lo_r, hi_r)              \
                         : ibest_range<Int##TY, false>(x, lo, li, o, lo_r, hi_r);            \
        if (threadIdx.x == 0) { pv[o * gridDim.x + c] = b.v; pi[o * gridDim.x + c] = b.i; }  \
    }                                                                                        \
    extern "C" __global__ void reduce_best_join_##TY(const i64* pv, const i64* pi,          \
                                                     Int##TY::store* y, i64* yi, i64 rows,  \
                                                     i64 chunks, int is_max) { rt_kernel_entry();              \
        i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;                                  \
        if (o >= rows) return;                                                               \
        IBest b; b.v = pv[o * chunks]; b.i = pi[o * chunks];                                 \
        for (i64 c = 1; c < chunks; ++c) {                                                   \
            IBest n; n.v = pv[o * chunks + c]; n.i = pi[o * chunks + c];                     \
            b = is_max ? ibest_take<true>(b, n) : ibest_take<false>(b, n);                   \
        }                                                                                    \
        if (y) y[o] = istore(Int##TY(), b.v);                                                \
        if (yi) yi[o] = b.i;                                                                 \
    }
REDUCE_INT(I32) REDUCE_INT(I64) REDUCE_INT(U8) REDUCE_INT(BOOL)

extern "C" __global__ void reduce_fold_join(const u64* part, i64* y, i64 rows, i64 chunks, int prod) { rt_kernel_entry();
    i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= rows) return;
    u64 a = part[o * chunks];
    for (i64 c = 1; c < chunks; ++c) a = prod ? a * part[o * chunks + c] : a + part[o * chunks + c];
    y[o] = (i64)a;
}

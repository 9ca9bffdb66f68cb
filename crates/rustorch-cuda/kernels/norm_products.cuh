// Op::AddRmsNormThen for one activation row (a decode step's block
// boundary): the residual add and RMS norm computed by every block of the
// products' launch, into shared memory, instead of by a launch of its own
// whose output the products then wait for. Included at the end of
// quant.cu (it uses the MMVQ and float-row routines there).
//
// Each block: s = x + a (block 0 writes it out, where s is not null), the
// sum of squares in f32 in a fixed order (the same bits in every block, and
// as the decode step's own norm kernel, add_rms_norm_q_lean_F32), y = s *
// scale * w, then y quantized into shared memory by
// qact_block_32 / qact_block_k (the qact kernels' code), or kept in f32
// for the float weights. The blocks are few (a grid the GPU holds at
// once): each takes columns gridDim.x * QN_WARPS apart, one warp a column
// (two at once: both rows' loads in flight), so the row is normed once a
// block rather than once per column group.
#define QN_WARPS 8
// Blocks an SM must hold at once: the launcher's grid is this many times
// the SMs (RUSTORCH_CUDA_NORM_PRODUCTS, default 2), so more registers than
// that allows would make the grid two waves.
#define QN_BLOCKS_PER_SM 2
#define QN_PER 16  // values of the row a thread holds: rows up to 32 * QN_WARPS * QN_PER = 4096

struct QNormIn {
    const float* x;
    const float* a;
    const float* w;
    float* s;
    i64 k;
    double eps;
};

// The block's normed row: y (f32, k values) at the start of `sm`, the
// dynamic shared memory. Every thread of the block calls it. The sum of
// squares in f32 and rsqrtf, as add_rms_norm_q_lean_F32 (and llama.cpp's
// CUDA norm).
// PER: values a thread holds (rows up to 32 * QN_WARPS * PER).
template <int PER = QN_PER>
__device__ __forceinline__ float* qn_norm_row(const QNormIn& in, u8* sm) {
    __shared__ float part[QN_WARPS];
    float* y = reinterpret_cast<float*>(sm);
    const int t = threadIdx.x, nt = blockDim.x;
    const int n = (int)in.k;
    float v[PER], wv[PER];
    float q = 0.0f;
    // Every load before any store (see rms_norm_rows).
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int r = t + i * nt;
        v[i] = r < n ? in.x[r] + in.a[r] : 0.0f;
        wv[i] = r < n ? in.w[r] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) q = fmaf(v[i], v[i], q);
    const float sum = block_sum_f32(q, part);
    if (blockIdx.x == 0 && in.s) {
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int r = t + i * nt;
            if (r < n) in.s[r] = v[i];
        }
    }
    const float scale = rsqrtf(__fdiv_rn(sum, (float)n) + (float)in.eps);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int r = t + i * nt;
        if (r < n) y[r] = v[i] * scale * wv[i];
    }
    __syncthreads();
    return y;
}

// Byte offsets of the quantized row after y in shared memory (host:
// `norm_products_smem` in src/ops/quant.rs, the same arithmetic).
__device__ __forceinline__ i64 qn_pad(i64 v) { return (v + 15) & ~(i64)15; }

// The normed row quantized to the layout ACT in shared memory after y.
template <int ACT>
__device__ __forceinline__ QActs qn_norm_quantized(const QNormIn& in, u8* sm) {
    const float* y = qn_norm_row(in, sm);
    const i64 k = in.k;
    signed char* q = reinterpret_cast<signed char*>(sm + 4 * k);
    const i64 nd = ACT == QA_32 ? k / 32 : k / 256, ns = ACT == QA_32 ? k / 32 : k / 16;
    float* d = reinterpret_cast<float*>(sm + 5 * k);
    int* sum = reinterpret_cast<int*>(sm + 5 * k + qn_pad(4 * nd));
    float* s = reinterpret_cast<float*>(sm + 5 * k + qn_pad(4 * nd) + qn_pad(4 * ns));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    if (ACT == QA_32)
        for (i64 b = warp; b < nd; b += warps) qact_block_32(y + 32 * b, b, lane, q, d, sum, s);
    else
        for (i64 b = warp; b < nd; b += warps) qact_block_k(y + 256 * b, b, lane, q, d, sum);
    __syncthreads();
    QActs a = {reinterpret_cast<const int*>(q), d, sum, s, k};
    return a;
}

// Column c of the weights of a multi launch, one after another: its row
// and output, picked with constant indices (see q_multi_pick).
struct QnCol {
    const u8* row;
    float* y;
};
__device__ __forceinline__ QnCol qn_column(const QMulti& p, int count, i64 c) {
    const i64 n01 = p.n[0] + (count > 1 ? p.n[1] : 0);
    QnCol o;
    if (count > 2 && c >= n01) {
        o.row = p.w[2] + (c - n01) * p.stride[2];
        o.y = p.y[2] + (c - n01);
    } else if (count > 1 && c >= p.n[0]) {
        o.row = p.w[1] + (c - p.n[0]) * p.stride[1];
        o.y = p.y[1] + (c - p.n[0]);
    } else {
        o.row = p.w[0] + c * p.stride[0];
        o.y = p.y[0] + c;
    }
    return o;
}
__device__ __forceinline__ i64 qn_columns(const QMulti& p, int count) {
    return p.n[0] + (count > 1 ? p.n[1] : 0) + (count > 2 ? p.n[2] : 0);
}
// The lines of the block's columns (c0, c0 + step, ...), into L2 before
// the wait: no kernel writes the weights.
__device__ __forceinline__ void qn_prefetch_multi(const QMulti& p, int count, i64 row_bytes) {
    if (!q_prefetch_wanted()) return;
    const i64 total = qn_columns(p, count), step = (i64)gridDim.x * QN_WARPS;
    for (i64 c = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5); c < total; c += step) {
        // The column's row alone: one row of row_bytes from its start.
        q_prefetch_rows(qn_column(p, count, c).row, row_bytes, 1, 0, 1, threadIdx.x & 31, 32);
    }
}

// Products of the normed row with up to three weights of type T: warp w
// of block b takes columns (b QN_WARPS + w) + i step, two at a time.
template <class T>
__device__ __forceinline__ void qn_multi(const QMulti& p, int count, const QActs& a) {
    const int lane = threadIdx.x & 31;
    const i64 total = qn_columns(p, count), step = (i64)gridDim.x * QN_WARPS;
    for (i64 c = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5); c < total; c += 2 * step) {
        const QnCol o0 = qn_column(p, count, c);
        const bool two = c + step < total;
        const QnCol o1 = two ? qn_column(p, count, c + step) : o0;
        float s0, s1;
        q_row_lane2<T>(o0.row, o1.row, a, 1, lane, 32, s0, s1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, o);
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (lane == 0) {
            *o0.y = s0;
            if (two) *o1.y = s1;
        }
    }
}

// A gated product of the normed row: warp w of block b takes columns
// (b QN_WARPS + w) + i step, gate and up rows together.
template <class T>
__device__ __forceinline__ void qn_gated(const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, const QActs& a, int act,
                                         float* y) {
    const int lane = threadIdx.x & 31;
    const i64 step = (i64)gridDim.x * QN_WARPS;
    for (i64 j = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5); j < n; j += step) {
        float g, u;
        q_row_lane2<T>(wg + j * sg, wu + j * su, a, 1, lane, 32, g, u);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            g += __shfl_xor_sync(0xffffffffu, g, o);
            u += __shfl_xor_sync(0xffffffffu, u, o);
        }
        if (lane == 0) y[j] = act == 0 ? op_swiglu(g, u) : op_gelu_tanh(g) * u;
    }
}
__device__ __forceinline__ void qn_prefetch_gated(const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, i64 row_bytes) {
    if (!q_prefetch_wanted()) return;
    const i64 step = (i64)gridDim.x * QN_WARPS;
    for (i64 j = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5); j < n; j += step) {
        q_prefetch_rows(wg, sg, n, j, 1, threadIdx.x & 31, 32);
        q_prefetch_rows(wu, su, n, j, 1, threadIdx.x & 31, 32);
    }
}

// The kernels' entries, the same for every weight type. QUANT (the
// quantized types): the weights' lines into L2 before the wait (see
// q_prefetch_wanted), then MULTI / GATED (the type's norm and products,
// below); the float types' MULTI / GATED make the wait themselves, after
// their first weight loads (see w_row_lanes).
#define QN_ENTRIES(NAME, MULTI, GATED, QUANT)                                                     \
    extern "C" __global__ void __launch_bounds__(32 * QN_WARPS, QN_BLOCKS_PER_SM) qnorm_multi_##NAME( \
        QNormIn in, QMulti p, int count, i64 row_bytes) {                                         \
        extern __shared__ __align__(16) u8 qn_sm[];                                               \
        if (QUANT) {                                                                              \
            qn_prefetch_multi(p, count, row_bytes);                                               \
            rt_kernel_entry();                                                                    \
        }                                                                                         \
        MULTI(in, p, count, qn_sm);                                                               \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * QN_WARPS, QN_BLOCKS_PER_SM) qnorm_gated_##NAME( \
        QNormIn in, const u8* wg, i64 sg, const u8* wu, i64 su, i64 n, i64 row_bytes, int act,   \
        float* y) {                                                                               \
        extern __shared__ __align__(16) u8 qn_sm[];                                               \
        if (QUANT) {                                                                              \
            qn_prefetch_gated(wg, sg, wu, su, n, row_bytes);                                      \
            rt_kernel_entry();                                                                    \
        }                                                                                         \
        GATED(in, wg, sg, wu, su, n, act, y, qn_sm);                                              \
    }

// The quantized types: the normed row quantized in shared memory.
template <class T>
__device__ __forceinline__ void qn_multi_q(const QNormIn& in, const QMulti& p, int count, u8* sm) {
    const QActs a = qn_norm_quantized<QV<T>::ACT>(in, sm);
    qn_multi<T>(p, count, a);
}
template <class T>
__device__ __forceinline__ void qn_gated_q(const QNormIn& in, const u8* wg, i64 sg, const u8* wu, i64 su, i64 n,
                                           int act, float* y, u8* sm) {
    const QActs a = qn_norm_quantized<QV<T>::ACT>(in, sm);
    qn_gated<T>(wg, sg, wu, su, n, a, act, y);
}
#define QN_KERNELS(NAME, T) QN_ENTRIES(NAME, qn_multi_q<T>, qn_gated_q<T>, true)
Q_MMVQ_TYPES(QN_KERNELS)

// The float weights (F16, BF16, F32): the normed row stays f32 in shared
// memory and the columns are summed as w_row_lanes sums them. The warp's
// first column (pair) is loaded before the wait and the norm, whose
// latency the loads then overlap (as the one-row float products').
template <int WK>
__device__ __forceinline__ void qn_multi_w(const QNormIn& in, const QMulti& p, int count, u8* sm) {
    const int lane = threadIdx.x & 31;
    const i64 total = qn_columns(p, count), step = (i64)gridDim.x * QN_WARPS, k = in.k;
    const i64 c_first = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5);
    const i64 chunks = k / w_chunk_values<WK>();
    uint4 un[2][W_ROW_LOADS / 2];
    if (c_first < total) {
        const QnCol o0 = qn_column(p, count, c_first);
        const QnCol o1 = c_first + step < total ? qn_column(p, count, c_first + step) : o0;
        const u8* rows[2] = {o0.row, o1.row};
        w_row_load<2>(rows, chunks, lane, 32, un);
    }
    rt_kernel_entry();
    const float* y = qn_norm_row(in, sm);
    for (i64 c = c_first; c < total; c += 2 * step) {
        const QnCol o0 = qn_column(p, count, c);
        const bool two = c + step < total;
        const QnCol o1 = two ? qn_column(p, count, c + step) : o0;
        const u8* rows[2] = {o0.row, o1.row};
        float acc[2];
        if (c == c_first) w_row_lanes_after<WK, 2>(rows, k, y, lane, 32, un, acc);
        else w_row_lanes<WK, 2>(rows, k, y, 1, lane, 32, acc);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
            acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], o);
        }
        if (lane == 0) {
            *o0.y = acc[0];
            if (two) *o1.y = acc[1];
        }
    }
}
template <int WK>
__device__ __forceinline__ void qn_gated_w(const QNormIn& in, const u8* wg, i64 sg, const u8* wu, i64 su, i64 n,
                                           int act, float* out, u8* sm) {
    const int lane = threadIdx.x & 31;
    const i64 step = (i64)gridDim.x * QN_WARPS, k = in.k;
    const i64 j_first = (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5);
    const i64 chunks = k / w_chunk_values<WK>();
    uint4 un[2][W_ROW_LOADS / 2];
    if (j_first < n) {
        const u8* rows[2] = {wg + j_first * sg, wu + j_first * su};
        w_row_load<2>(rows, chunks, lane, 32, un);
    }
    rt_kernel_entry();
    const float* y = qn_norm_row(in, sm);
    for (i64 j = j_first; j < n; j += step) {
        const u8* rows[2] = {wg + j * sg, wu + j * su};
        float acc[2];
        if (j == j_first) w_row_lanes_after<WK, 2>(rows, k, y, lane, 32, un, acc);
        else w_row_lanes<WK, 2>(rows, k, y, 1, lane, 32, acc);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
            acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], o);
        }
        if (lane == 0) out[j] = act == 0 ? op_swiglu(acc[0], acc[1]) : op_gelu_tanh(acc[0]) * acc[1];
    }
}
// The _cp entries (rows of exactly 256 16-byte chunks: 2048 F16 or BF16
// values, 1024 F32; compute capability 8.0 on, ops/norm_products.rs): a
// lane's 8 chunks of a row, lane + 32 t, are loaded half into registers
// (t < 4, as the entries above) and half by cp.async into the warp's slot
// of shared memory, which holds no registers, and the next column's copy
// is issued before the current one is summed: a warp has about twice the
// bytes in flight (TinyLlama F16 tg128 1049 -> 1143 t/s on the H200; a
// third slot, 1059). The same sums in the same order as the entries above.
#define QN_CP_SLOT 256  // uint4 of a warp's slot: 2 rows x 4 chunks x 32 lanes
// The lane's chunks lane + 32 (4 + t) of both rows into the slot (layout
// [row][t][lane]: a warp's 16-byte accesses are conflict-free). Weights
// only, so it may come before the kernel's wait.
__device__ __forceinline__ void qn_copy_half(uint4* slot, const u8* const (&rows)[2], int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(rt_smem_addr(slot + (i * 4 + t) * 32 + lane)),
                         "l"(reinterpret_cast<const uint4*>(rows[i]) + lane + 32 * (4 + t))
                         : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void qn_copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits for all but the last `pending` commit groups of the thread.
template <int PENDING>
__device__ __forceinline__ void qn_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
#endif
}
struct QnPair {
    const u8* a;
    const u8* b;
};
// A warp's columns first, first + step, ... below end, two rows each
// (rows_of(j): gate and up, or two columns of a multi launch), summed
// against the normed row; out(j, s0, s1) stores the pair's results. The
// warp's two slots take turns: the next column's half lands in one while
// the current column's is read from the other.
template <int WK, class Rows, class Out>
__device__ __forceinline__ void qn_copy_products(const QNormIn& in, u8* sm, i64 first, i64 step, i64 end, Rows rows_of,
                                                 Out out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4* slots = reinterpret_cast<uint4*>(sm + 4 * in.k) + warp * (2 * QN_CP_SLOT);
    uint4 un[2][W_ROW_LOADS / 2];
    if (first < end) {
        const QnPair r = rows_of(first);
        const u8* rows[2] = {r.a, r.b};
        w_row_load<2>(rows, 256, lane, 32, un);
        qn_copy_half(slots, rows, lane);
    }
    qn_copy_commit();
    rt_kernel_entry();
    const float* y = qn_norm_row<8>(in, sm);
    int s = 0;
    for (i64 j = first; j < end; j += step, s ^= 1) {
        const i64 jn = j + step;
        const QnPair rn = rows_of(jn < end ? jn : j);
        const u8* next[2] = {rn.a, rn.b};
        if (jn < end) qn_copy_half(slots + (s ^ 1) * QN_CP_SLOT, next, lane);
        // One group a column (empty past the end), so that waiting for all
        // but the newest always leaves this column's half landed.
        qn_copy_commit();
        float acc[2] = {0.0f, 0.0f};
        w_row_use<WK, 2>(un, y, 256, lane, 32, acc);
        if (jn < end) w_row_load<2>(next, 256, lane, 32, un);
        qn_copy_wait<1>();
        uint4 half[2][W_ROW_LOADS / 2];
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int t = 0; t < 4; ++t) half[i][t] = slots[s * QN_CP_SLOT + (i * 4 + t) * 32 + lane];
        w_row_use<WK, 2>(half, y, 256, lane + 128, 32, acc);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
            acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], o);
        }
        if (lane == 0) out(j, acc[0], acc[1]);
    }
    qn_copy_wait<0>();
}
template <int WK>
__device__ __forceinline__ void qn_multi_copy(const QNormIn& in, const QMulti& p, int count, u8* sm) {
    const i64 total = qn_columns(p, count), step = (i64)gridDim.x * QN_WARPS;
    qn_copy_products<WK>(
        in, sm, (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5), 2 * step, total,
        [&](i64 c) {
            const QnCol o0 = qn_column(p, count, c);
            const QnCol o1 = c + step < total ? qn_column(p, count, c + step) : o0;
            return QnPair{o0.row, o1.row};
        },
        [&](i64 c, float s0, float s1) {
            *qn_column(p, count, c).y = s0;
            if (c + step < total) *qn_column(p, count, c + step).y = s1;
        });
}
template <int WK>
__device__ __forceinline__ void qn_gated_copy(const QNormIn& in, const u8* wg, i64 sg, const u8* wu, i64 su, i64 n,
                                              int act, float* out, u8* sm) {
    qn_copy_products<WK>(
        in, sm, (i64)blockIdx.x * QN_WARPS + (threadIdx.x >> 5), (i64)gridDim.x * QN_WARPS, n,
        [&](i64 j) { return QnPair{wg + j * sg, wu + j * su}; },
        [&](i64 j, float g, float u) { out[j] = act == 0 ? op_swiglu(g, u) : op_gelu_tanh(g) * u; });
}

#define WN_KERNELS(NAME, WK)                                                       \
    QN_ENTRIES(NAME, qn_multi_w<WK>, qn_gated_w<WK>, false)                        \
    QN_ENTRIES(NAME##_cp, qn_multi_copy<WK>, qn_gated_copy<WK>, false)
WN_KERNELS(F16, 0) WN_KERNELS(BF16, 1) WN_KERNELS(F32, 2)

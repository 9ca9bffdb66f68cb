// Rows held in registers, shared by kernels/reduce.cu (softmax, RMS norm)
// and kernels/quant.cu (the decode step's add + norm that also quantizes
// its row, and the norm of the fused float products): ROW_PER values per
// thread, one warp per row (WARP) or one block per row. Compiled into each
// module that includes it (NVRTC has no file system:
// compile::full_source inlines it).
#define ROW_PER 8

// The sum of one value per thread over the threads of a row: the warp
// (WARP) or the whole block (all threads get it, in one fixed order, so
// every run gives the same bits).
template <bool WARP> __device__ __forceinline__ double row_sum(double v, double* smem) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (WARP) return v;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < warps; ++w) v += smem[w];
    __syncthreads();
    return v;
}

// The f32 sum of one value per thread over the whole block, in one fixed
// order (all threads get it): the decode step's norms sum their squares
// so, as llama.cpp's CUDA norm does. `part` holds a float per warp and is
// used once: no barrier after.
__device__ __forceinline__ float block_sum_f32(float v, float* part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float sum = part[0];
    for (int w = 1; w < warps; ++w) sum += part[w];
    return sum;
}

// Which row this thread works on, its index in the row and the row's
// thread count; `false` for the warps of the last block past `rows`.
template <bool WARP> __device__ __forceinline__ bool row_of(i64 rows, i64& o, int& t, int& nt) {
    if (WARP) {
        o = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
        t = threadIdx.x & 31;
        nt = 32;
    } else {
        o = blockIdx.x;
        t = threadIdx.x;
        nt = blockDim.x;
    }
    return o < rows;
}

// ADD (Op::AddRmsNorm, f32): the row is x + a (a's rows at the same
// offsets as x's), added as the binary add kernel does, written to s, then
// normalized exactly as the plain norm normalizes a tensor holding it.
template <typename TY, bool WARP, bool ADD>
__device__ void rms_norm_rows(const typename TY::store* x, const Strided& lo, const typename TY::store* a,
                              const typename TY::store* w, const Strided& lw, typename TY::store* s,
                              typename TY::store* y, i64 n64, double eps, i64 rows) {
    __shared__ double ssum[32];
    i64 o; int t, nt;
    if (!row_of<WARP>(rows, o, t, nt)) return;
    const int n = (int)n64;
    const typename TY::store* xr = x + strided_at(lo, o);
    typename TY::store* yr = y + o * n64;
    float v[ROW_PER], wv[ROW_PER], av[ROW_PER];
    double q = 0.0;
    if (ADD) {
        // Every load of the row before the first store of the sum: the
        // compiler cannot know that s aliases neither x nor a nor w, so a
        // store between them would make each load wait for the one before.
        const typename TY::store* ar = a + strided_at(lo, o);
#pragma unroll
        for (int k = 0; k < ROW_PER; ++k) {
            int r = t + k * nt;
            av[k] = r < n ? (float)load(TY(), ar[r]) : 0.0f;
        }
    }
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        int r = t + k * nt;
        v[k] = r < n ? (float)load(TY(), xr[r]) : 0.0f;
        if (ADD) v[k] = v[k] + av[k];
        // The weights are read before the reduction, not after it: their
        // loads then overlap the row's instead of adding a memory round
        // trip (a decode step's norm is one block, bound by that latency).
        // The host sends contiguous weights only (one stride of 1).
        wv[k] = (w && r < n) ? (float)load(TY(), w[lw.offset + r]) : 1.0f;
        q += (double)v[k] * (double)v[k];
    }
    if (ADD) {
#pragma unroll
        for (int k = 0; k < ROW_PER; ++k) {
            int r = t + k * nt;
            if (r < n) s[o * n64 + r] = store(TY(), v[k]);
        }
    }
    q = row_sum<WARP>(q, ssum);
    float scale = (float)(1.0 / sqrt(q / (double)n64 + eps));
#pragma unroll
    for (int k = 0; k < ROW_PER; ++k) {
        int r = t + k * nt;
        if (r < n) {
            float z = v[k] * scale;
            if (w) z = z * wv[k];
            yr[r] = store(TY(), z);
        }
    }
}

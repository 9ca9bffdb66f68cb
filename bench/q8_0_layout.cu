// Does a decode step's Q8_0 product read faster with its rows split into
// quants and scales (a CUDA-side layout) than in GGML's 34-byte blocks?
// The one-row products read Q8_0 as 4-byte words a lane, 68 bytes apart
// across the warp (kernels/quant.cu QWide<QQ8_0>): 17 load instructions a
// 64-value unit, each touching ~17 cache lines. Split rows ([k quants]
// [k/32 f16 scales]) give 16-byte loads instead. Both kernels here compute
// the same sums in the same order as QWide<QQ8_0>::dot (int8 activations,
// one f32 scale a 32-block), so only the loads differ.
//
// Shapes of TinyLlama's decode step: the gated product (gate and up rows
// 5632 x 2048, 2 columns a warp), the output projection (2048 x 2048) and
// the down projection (2048 x 5632). Each kernel cycles through copies of
// its weights totalling > 4x the L2, so every read comes from memory.
// Prints GB/s of weight bytes for each layout, and whether each gives the
// GGML kernel's bits. Also: GGML blocks staged through shared memory, and
// a grid of 2, 4 or 8 blocks an SM looping over the columns with the next
// column's rows loaded while one is summed.
// Found on the H200 (docs/BENCHMARKS.md, "How the decode step got there"): a single
// decode-sized launch spends ~5 us on its start and end whatever its loads;
// the layouts differ only in the steady state, where GGML's blocks already
// read at 3.2-3.3 TB/s.
//
// Build and run on the device:
//   nvcc -O3 -arch=sm_90 -o /tmp/q8_0_layout bench/q8_0_layout.cu && /tmp/q8_0_layout
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

typedef unsigned int u32;
typedef unsigned char u8;

__device__ __forceinline__ float f16(u32 bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

// GGML Q8_0: unit u of a row is blocks 2u, 2u + 1 (68 bytes, 4-aligned).
__device__ __forceinline__ float dot_ggml(const u8* row, int u, const int* aq, const float* ad, float acc) {
    const u32* b = (const u32*)(row + u * 68);
    u32 w[17];
#pragma unroll
    for (int i = 0; i < 17; ++i) w[i] = b[i];
    const int4* p = (const int4*)(aq + 16 * u);
    int x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int4 v = p[i];
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
    }
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s0 = __dp4a((int)__byte_perm(w[i], w[i + 1], 0x5432), x[i], s0);
        s1 = __dp4a((int)w[9 + i], x[8 + i], s1);
    }
    acc = fmaf(__fmul_rn(f16(w[0] & 0xffffu), ad[2 * u]), (float)s0, acc);
    return fmaf(__fmul_rn(f16(w[8] >> 16), ad[2 * u + 1]), (float)s1, acc);
}

// Split rows: quants at row[0..k], the f16 scales at row[k..]: unit u's
// 64 quants are four 16-byte words, its two scales one 4-byte word.
__device__ __forceinline__ float dot_split(const u8* row, int k, int u, const int* aq, const float* ad, float acc) {
    const uint4* q = (const uint4*)(row + 64 * u);
    const uint4 q0 = q[0], q1 = q[1], q2 = q[2], q3 = q[3];
    const u32 sc = *(const u32*)(row + k + 4 * u);
    const u32 w[16] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w, q2.x, q2.y, q2.z, q2.w, q3.x, q3.y, q3.z, q3.w};
    const int4* p = (const int4*)(aq + 16 * u);
    int x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int4 v = p[i];
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
    }
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s0 = __dp4a((int)w[i], x[i], s0);
        s1 = __dp4a((int)w[8 + i], x[8 + i], s1);
    }
    acc = fmaf(__fmul_rn(f16(sc & 0xffffu), ad[2 * u]), (float)s0, acc);
    return fmaf(__fmul_rn(f16(sc >> 16), ad[2 * u + 1]), (float)s1, acc);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// GGML rows read coalesced: the warp's 32 units of a row (2176 bytes,
// 16-byte aligned where the row is) copied through shared memory in
// 16-byte words, each lane then reading its unit from there.
__device__ __forceinline__ float dot_staged(const u8* row, int u0, int units, u32* sh, const int* aq, const float* ad,
                                            float acc) {
    const int lane = threadIdx.x & 31;
    const int n = units - u0 < 32 ? units - u0 : 32;
    const uint4* src = (const uint4*)(row + 68L * u0);
    const int words = (68 * n + 15) / 16;
    uint4 t[5];
#pragma unroll
    for (int i = 0; i < 5; ++i)
        if (lane + 32 * i < words) t[i] = src[lane + 32 * i];
#pragma unroll
    for (int i = 0; i < 5; ++i)
        if (lane + 32 * i < words) ((uint4*)sh)[lane + 32 * i] = t[i];
    __syncwarp();
    const int u = u0 + lane;
    if (u < units) {
        u32 w[17];
#pragma unroll
        for (int i = 0; i < 17; ++i) w[i] = sh[17 * lane + i];
        const int4* p = (const int4*)(aq + 16 * u);
        int x[16];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int4 v = p[i];
            x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
        }
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            s0 = __dp4a((int)__byte_perm(w[i], w[i + 1], 0x5432), x[i], s0);
            s1 = __dp4a((int)w[9 + i], x[8 + i], s1);
        }
        acc = fmaf(__fmul_rn(f16(w[0] & 0xffffu), ad[2 * u]), (float)s0, acc);
        acc = fmaf(__fmul_rn(f16(w[8] >> 16), ad[2 * u + 1]), (float)s1, acc);
    }
    __syncwarp();
    return acc;
}

// One warp a team (tw = 1); `cols` columns a team, rows of `rowb` bytes;
// gated: gate rows in w, up rows `half` rows later, output silu(g) * u.
template <int LAYOUT, bool GATED>
__global__ void __launch_bounds__(128) product(const u8* w, long rowb, int n, int k, int cols, const int* aq,
                                               const float* ad, float* y) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long team = (long)blockIdx.x * 4 + warp;
    const int units = k / 64;
    __shared__ u32 stage[4][2][32 * 17 + 4];
    for (int c = 0; c < cols; ++c) {
        const long j = team * cols + c;
        if (j >= n) return;
        const u8* r0 = w + j * rowb;
        const u8* r1 = w + (j + n) * rowb;
        float a0 = 0.0f, a1 = 0.0f;
        if (LAYOUT == 2) {
            for (int u0 = 0; u0 < units; u0 += 32) {
                a0 = dot_staged(r0, u0, units, stage[warp][0], aq, ad, a0);
                if (GATED) a1 = dot_staged(r1, u0, units, stage[warp][1], aq, ad, a1);
            }
        }
        if (LAYOUT != 2)
#pragma unroll 2
        for (int u = lane; u < units; u += 32) {
            if (LAYOUT == 1) {
                a0 = dot_split(r0, k, u, aq, ad, a0);
                if (GATED) a1 = dot_split(r1, k, u, aq, ad, a1);
            } else {
                a0 = dot_ggml(r0, u, aq, ad, a0);
                if (GATED) a1 = dot_ggml(r1, u, aq, ad, a1);
            }
        }
        a0 = warp_sum(a0);
        if (GATED) a1 = warp_sum(a1);
        if (lane == 0) y[j] = GATED ? a0 / (1.0f + __expf(-a0)) * a1 : a0;
    }
}

// GGML blocks, a grid sized to the GPU: warp w takes columns w, w + W, ...
// (W the grid's warps), with the next column's rows loaded while the
// current one is summed, and the lane's activations (the same for every
// column) loaded once. UPL: units a lane (k = 64 * 32 * UPL at most).
template <int UPL, bool GATED>
__global__ void __launch_bounds__(128) pipelined(const u8* w, long rowb, int n, int k, const int* aq, const float* ad,
                                                 float* y) {
    const int lane = threadIdx.x & 31;
    const long warps = (long)gridDim.x * 4;
    long j = (long)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int units = k / 64;
    constexpr int RW = GATED ? 2 : 1;
    int x[UPL][16];
    float da[UPL][2];
#pragma unroll
    for (int i = 0; i < UPL; ++i) {
        const int u = lane + 32 * i;
        if (u < units) {
            const int4* p = (const int4*)(aq + 16 * u);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int4 v = p[c];
                x[i][4 * c] = v.x; x[i][4 * c + 1] = v.y; x[i][4 * c + 2] = v.z; x[i][4 * c + 3] = v.w;
            }
            da[i][0] = ad[2 * u];
            da[i][1] = ad[2 * u + 1];
        }
    }
    u32 cur[RW][UPL][17];
    auto load = [&](long col, u32 (&dst)[RW][UPL][17]) {
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int u = lane + 32 * i;
                const u32* b = (const u32*)(w + (col + r * (long)n) * rowb + 68L * u);
#pragma unroll
                for (int e = 0; e < 17; ++e) dst[r][i][e] = (col < n && u < units) ? b[e] : 0u;
            }
    };
    if (j < n) load(j, cur);
    for (; j < n; j += warps) {
        u32 nxt[RW][UPL][17];
        load(j + warps, nxt);
        float acc[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            acc[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                if (lane + 32 * i < units) {
                    int s0 = 0, s1 = 0;
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        s0 = __dp4a((int)__byte_perm(cur[r][i][e], cur[r][i][e + 1], 0x5432), x[i][e], s0);
                        s1 = __dp4a((int)cur[r][i][9 + e], x[i][8 + e], s1);
                    }
                    acc[r] = fmaf(__fmul_rn(f16(cur[r][i][0] & 0xffffu), da[i][0]), (float)s0, acc[r]);
                    acc[r] = fmaf(__fmul_rn(f16(cur[r][i][8] >> 16), da[i][1]), (float)s1, acc[r]);
                }
            }
            acc[r] = warp_sum(acc[r]);
        }
        if (lane == 0) y[j] = GATED ? acc[0] / (1.0f + __expf(-acc[0])) * acc[1] : acc[0];
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int i = 0; i < UPL; ++i)
#pragma unroll
                for (int e = 0; e < 17; ++e) cur[r][i][e] = nxt[r][i][e];
    }
}

// GGML rows -> split rows (host).
static void split_rows(const u8* src, u8* dst, long rows, int k) {
    const long rowb = (long)k / 32 * 34;
    for (long r = 0; r < rows; ++r) {
        const u8* s = src + r * rowb;
        u8* d = dst + r * rowb;
        for (int b = 0; b < k / 32; ++b) {
            std::memcpy(d + 32 * b, s + 34 * b + 2, 32);
            std::memcpy(d + k + 2 * b, s + 34 * b, 2);
        }
    }
}

int main() {
    struct Shape {
        const char* name;
        int n, k, cols;
        bool gated;
    } shapes[] = {{"gated 2x5632x2048", 5632, 2048, 2, true},
                  {"gated 2x5632x2048 cols 1", 5632, 2048, 1, true},
                  {"output 2048x2048", 2048, 2048, 1, false},
                  {"down 2048x5632", 2048, 5632, 1, false},
                  {"gated x8 (steady state)", 8 * 5632, 2048, 2, true},
                  {"down x8 (steady state)", 8 * 2048, 5632, 1, false}};
    int dev = 0;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("%s, L2 %d MB\n", prop.name, prop.l2CacheSize >> 20);
    for (const Shape& s : shapes) {
        const long rows = s.gated ? 2L * s.n : s.n;
        const long rowb = (long)s.k / 32 * 34, bytes = rows * rowb;
        const int copies = (int)((4L * prop.l2CacheSize) / bytes + 2);
        std::vector<u8> host(bytes), split(bytes);
        if (copies < 2) std::printf("(few copies)\n");
        srand(1);
        for (long b = 0; b < rows * (s.k / 32); ++b) {
            u8* p = host.data() + 34 * b;
            const unsigned short d = __half_as_ushort(__float2half(0.01f * (1 + rand() % 7)));
            std::memcpy(p, &d, 2);
            for (int i = 0; i < 32; ++i) p[2 + i] = (u8)(rand() & 0xff);
        }
        split_rows(host.data(), split.data(), rows, s.k);
        u8 *wg, *ws;
        CHECK(cudaMalloc(&wg, bytes * copies));
        CHECK(cudaMalloc(&ws, bytes * copies));
        for (int c = 0; c < copies; ++c) {
            CHECK(cudaMemcpy(wg + c * bytes, host.data(), bytes, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(ws + c * bytes, split.data(), bytes, cudaMemcpyHostToDevice));
        }
        std::vector<int> aqh(s.k / 4);
        std::vector<float> adh(s.k / 32);
        for (auto& v : aqh) v = rand();
        for (auto& v : adh) v = 0.001f * (1 + rand() % 5);
        int* aq;
        float *ad, *y0, *y1;
        CHECK(cudaMalloc(&aq, s.k));
        CHECK(cudaMalloc(&ad, s.k / 32 * 4));
        CHECK(cudaMalloc(&y0, s.n * 4));
        CHECK(cudaMalloc(&y1, s.n * 4));
        CHECK(cudaMemcpy(aq, aqh.data(), s.k, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(ad, adh.data(), s.k / 32 * 4, cudaMemcpyHostToDevice));
        const int blocks = (int)((s.n + 4L * s.cols - 1) / (4L * s.cols));
        // layout 0: GGML blocks, 1: split rows, 2: GGML blocks staged,
        // 3-5: GGML blocks pipelined, 2 / 4 / 8 blocks an SM.
        auto run = [&](int layout, int c, float* y) {
            const u8* w = (layout == 1 ? ws : wg) + (long)c * bytes;
            if (s.gated && layout < 3) {
                if (layout == 0) product<0, true><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
                if (layout == 1) product<1, true><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
                if (layout == 2) product<2, true><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
            } else if (layout < 3) {
                if (layout == 0) product<0, false><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
                if (layout == 1) product<1, false><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
                if (layout == 2) product<2, false><<<blocks, 128>>>(w, rowb, s.n, s.k, s.cols, aq, ad, y);
            }
            if (layout >= 3) {
                const int per_sm = layout == 3 ? 2 : layout == 4 ? 4 : 8;
                const int pb = prop.multiProcessorCount * per_sm;
                const int upl = (s.k / 64 + 31) / 32;
                if (s.gated && upl == 1) pipelined<1, true><<<pb, 128>>>(w, rowb, s.n, s.k, aq, ad, y);
                if (!s.gated && upl == 1) pipelined<1, false><<<pb, 128>>>(w, rowb, s.n, s.k, aq, ad, y);
                if (!s.gated && upl == 3) pipelined<3, false><<<pb, 128>>>(w, rowb, s.n, s.k, aq, ad, y);
            }
            CHECK(cudaGetLastError());
        };
        std::vector<float> r[6];
        for (int layout = 0; layout < 6; ++layout) {
            run(layout, 0, y0);
            CHECK(cudaDeviceSynchronize());
            r[layout].resize(s.n);
            CHECK(cudaMemcpy(r[layout].data(), y0, s.n * 4, cudaMemcpyDeviceToHost));
        }
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        const int reps = 400;
        const char* names[6] = {"ggml", "split", "staged", "pipe2", "pipe4", "pipe8"};
        for (int pass = 0; pass < 2; ++pass) {
            for (int layout = 0; layout < 6; ++layout) {
                CHECK(cudaEventRecord(e0));
                for (int rep = 0; rep < reps; ++rep) run(layout, rep % copies, layout ? y1 : y0);
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                const double us = 1000.0 * ms / reps;
                const bool same = std::memcmp(r[0].data(), r[layout].data(), s.n * 4) == 0;
                std::printf("%-28s %-7s %7.2f us  %6.0f GB/s  (bits as ggml: %s)\n", s.name, names[layout], us,
                            bytes / us / 1000.0, same ? "yes" : "NO");
            }
        }
        CHECK(cudaFree(wg));
        CHECK(cudaFree(ws));
        CHECK(cudaFree(aq));
        CHECK(cudaFree(ad));
        CHECK(cudaFree(y0));
        CHECK(cudaFree(y1));
    }
    return 0;
}

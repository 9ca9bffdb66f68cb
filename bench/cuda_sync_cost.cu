// What a chain of dependent kernels costs per boundary on this GPU, against
// a grid-wide barrier inside one persistent kernel: the question behind a
// persistent decode kernel (issue 33). A decode step is ~100-200 kernels,
// each waiting for the one before; a persistent kernel would wait at a
// barrier instead.
//
// Each phase is the same small job (every thread updates one float of a
// buffer, so a phase reads what the one before wrote), run as
//   graph     N kernels recorded in a CUDA graph, plain stream order;
//   graph+pdl N kernels in a graph with programmatic dependent launch (each
//             kernel waits with griddepcontrol.wait, then lets the next in,
//             as kernels/common.cuh's rt_kernel_entry does);
//   barrier   one cooperative kernel of N phases with a grid barrier (an
//             atomic counter and a generation flag) between them.
// Prints microseconds per phase, for grids of 1, 2 and 8 blocks an SM.
//
// Build and run on the device: nvcc -O3 -arch=sm_90 -o /tmp/sync_cost bench/cuda_sync_cost.cu && /tmp/sync_cost
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

constexpr int THREADS = 256;
constexpr int PHASES = 200;

__global__ void phase_kernel(float* buf, int pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[i] = buf[i] * 0.5f + 1.0f;
}

__device__ unsigned int bar_count;
__device__ volatile unsigned int bar_generation;

// All blocks of the grid meet here (they are co-resident: cooperative launch).
__device__ void grid_barrier() {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int generation = bar_generation;
        __threadfence();
        if (atomicAdd(&bar_count, 1u) == gridDim.x - 1) {
            bar_count = 0;
            __threadfence();
            bar_generation = generation + 1;
        } else {
            while (bar_generation == generation) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

__global__ void persistent_kernel(float* buf, int phases) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int p = 0; p < phases; ++p) {
        volatile float* v = buf;
        v[i] = v[i] * 0.5f + 1.0f;
        grid_barrier();
    }
}

// Microseconds per phase of `reps` replays of `graph` (the fastest replay).
static double time_graph(cudaGraphExec_t graph, cudaStream_t s, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(graph, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, 1000.0 * ms / PHASES);
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return best;
}

static double chain(float* buf, int blocks, bool pdl, cudaStream_t s) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s;
    cfg.attrs = pdl ? attr : nullptr;
    cfg.numAttrs = pdl ? 1 : 0;
    const int flag = pdl ? 1 : 0;
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < PHASES; ++p) CHECK(cudaLaunchKernelEx(&cfg, phase_kernel, buf, flag));
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    time_graph(exec, s, 3);
    const double us = time_graph(exec, s, 20);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    return us;
}

static double barrier(float* buf, int blocks, cudaStream_t s) {
    int phases = PHASES;
    void* args[] = {&buf, &phases};
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    double best = 1e30;
    for (int r = 0; r < 23; ++r) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaLaunchCooperativeKernel((void*)persistent_kernel, dim3(blocks), dim3(THREADS), args, 0, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (r >= 3) best = std::min(best, 1000.0 * ms / PHASES);
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return best;
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, THREADS, 0));
    std::printf("%s, %d SMs; %d phases of %d-thread blocks; us per phase (fastest of 20 runs)\n", prop.name,
                prop.multiProcessorCount, PHASES, THREADS);
    std::printf("| blocks | graph | graph+pdl | barrier |\n|---|---|---|---|\n");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int per : {1, 2, 8}) {
        if (per > per_sm) continue;
        const int blocks = per * prop.multiProcessorCount;
        float* buf;
        CHECK(cudaMalloc(&buf, sizeof(float) * blocks * THREADS));
        CHECK(cudaMemset(buf, 0, sizeof(float) * blocks * THREADS));
        const double g = chain(buf, blocks, false, s);
        const double p = chain(buf, blocks, true, s);
        const double b = barrier(buf, blocks, s);
        std::printf("| %d (%d an SM) | %.2f | %.2f | %.2f |\n", blocks, per, g, p, b);
        CHECK(cudaFree(buf));
    }
    return 0;
}

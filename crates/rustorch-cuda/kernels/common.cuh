// Shared by every RusTorch CUDA kernel: strided indexing and the element
// types. Header-free on purpose (no cuda_fp16.h): NVRTC then needs no CUDA
// include directory, so the same source compiles from the PyPI NVRTC wheel
// in CI and on any driver.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define RT_MAX_DIMS 8

// Set to 1 by the host when it loads the module (src/backend.rs,
// set_module_switches; RUSTORCH_CUDA_WEIGHT_PREFETCH=0) to turn off the
// quantized products' weight prefetch before their wait
// (q_prefetch_wanted in quant.cu): the A/B switch of that prefetch.
__constant__ int rt_weight_prefetch_off;

// Programmatic dependent launch (src/launch.rs, Hopper on): a kernel may
// be scheduled while the kernel before it in the stream still runs. Every
// kernel therefore starts with rt_kernel_entry, before it touches memory
// another kernel writes or reads: it waits until the kernel before it has
// finished and its writes are visible (a kernel that is not launched that
// way returns at once), then lets the next kernel be scheduled. Only reads
// of memory no kernel writes (a product's weights, for a prefetch) may come
// first. The wait is unconditional and first, before any early return:
// a kernel whose blocks all left without waiting would let the kernel after
// it overtake the one before.
__device__ __forceinline__ void rt_kernel_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The shared-memory address (a 32-bit offset in the block's window) of p,
// a generic pointer into shared memory, for the instructions that take one
// (cp.async, ldmatrix).
__device__ __forceinline__ u32 rt_smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// A tensor's layout: element i (row-major over `shape`) is at
// offset + sum(index_d * stride_d), in elements. Mirrors `Strided` in
// src/launch.rs (same field order and sizes).
struct Strided {
    i64 shape[RT_MAX_DIMS];
    i64 stride[RT_MAX_DIMS];
    i64 offset;
    int ndim;
    int pad;
};

__device__ __forceinline__ i64 strided_at(const Strided& s, i64 i) {
    // One dim (every contiguous operand, after the host merged its dims):
    // no division.
    if (s.ndim == 1) return s.offset + i * s.stride[0];
    i64 off = s.offset;
    for (int d = s.ndim - 1; d >= 0; --d) {
        i64 n = s.shape[d];
        i64 q = i / n;
        off += (i - q * n) * s.stride[d];
        i = q;
    }
    return off;
}

// strided_at for element indices below 2^32 (every dim's size too): 32-bit
// divisions, where a 64-bit one is a long subroutine. For the small
// kernels of a decode step, whose time is their chain of dependent
// instructions.
__device__ __forceinline__ i64 strided_at32(const Strided& s, u32 i) {
    if (s.ndim == 1) return s.offset + (i64)i * s.stride[0];
    i64 off = s.offset;
    for (int d = s.ndim - 1; d >= 0; --d) {
        const u32 n = (u32)s.shape[d], q = i / n;
        off += (i64)(i - q * n) * s.stride[d];
        i = q;
    }
    return off;
}

// Where an in-place write lands (`Backend::write_into` and `write_into_at`,
// the *_into kernels): element i of the region goes to
// strided_at(ly, i) + p * step, with p read here, on the device, from `pos`
// (an int, or a long long where `wide`), so that a CUDA graph replaying the
// launch writes where the tensor says at each replay (a KV cache's token
// position). A null `pos` is the plain write at ly (p = 0). A p outside
// 0..=max_pos writes nothing and sets *bad for the launcher to report.
// Mirrors `WriteAt` in src/launch.rs (same field order and sizes).
struct WriteAt {
    const void* pos;
    i64 step;
    i64 max_pos;
    int* bad;
    int wide;
    int pad;
};

// The launch's shift in elements, or -1 when the position is out of range.
// Every thread reads the same p and so makes the same choice: no thread
// writes when one would be out of bounds.
__device__ __forceinline__ i64 write_shift(const WriteAt& at) {
    if (at.pos == 0) return 0;
    const i64 p = at.wide ? *(const i64*)at.pos : (i64)*(const int*)at.pos;
    if (p < 0 || p > at.max_pos) {
        if (blockIdx.x == 0 && threadIdx.x == 0) *at.bad = 1;
        return -1;
    }
    return p * at.step;
}

// GELU's tanh form in f32, as the CPU computes it: shared by Op::GeGlu
// (elementwise.cu) and the fused gated products (quant.cu), which must
// give the same values.
__device__ __forceinline__ float op_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
// SiLU(x) * g as Op::SwiGlu computes it (elementwise.cu, quant.cu).
__device__ __forceinline__ float op_swiglu(float x, float g) { return x / (1.0f + expf(-x)) * g; }

// f16 and bf16 travel as their bits (u16).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}
// Round to nearest even, as `half::bf16::from_f32` (NaN stays a quiet NaN).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x40u);
    }
    return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Element access in the type arithmetic runs in: f32 for f32/f16/bf16
// (as the CPU backend computes half types), f64 for f64.
struct F32T  { typedef float  store; typedef float  acc; };
struct F16T  { typedef u16    store; typedef float  acc; };
struct BF16T { typedef u16    store; typedef float  acc; };
struct F64T  { typedef double store; typedef double acc; };

__device__ __forceinline__ float  load(F32T,  float x)  { return x; }
__device__ __forceinline__ float  load(F16T,  u16 x)    { return f16_to_f32(x); }
__device__ __forceinline__ float  load(BF16T, u16 x)    { return bf16_to_f32(x); }
__device__ __forceinline__ double load(F64T,  double x) { return x; }
__device__ __forceinline__ float  store(F32T,  float x)  { return x; }
__device__ __forceinline__ u16    store(F16T,  float x)  { return f32_to_f16(x); }
__device__ __forceinline__ u16    store(BF16T, float x)  { return f32_to_bf16(x); }
__device__ __forceinline__ double store(F64T,  double x) { return x; }

#define RT_GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// 16 bytes of elements, for contiguous operands whose first element the
// host found 16-byte aligned: one 128-bit load or store per thread moves
// 4 f32, 8 halves, 2 f64 or 16 bytes (the `_v` kernels).
template <typename T> struct __align__(16) Pack { T v[16 / sizeof(T)]; };

// The `_v` kernels' loop: `BODY` maps packs `j` (each of `V` elements at
// element index `base = j * V`) of contiguous operands; `TAIL(i)` handles
// the last `n % V` elements one by one.
#define RT_VEC_LOOP(V, n, BODY, TAIL)                                                        \
    {                                                                                        \
        const i64 nv_ = (n) / (V);                                                           \
        RT_GRID_STRIDE(j, nv_) { BODY }                                                      \
        RT_GRID_STRIDE(t_, (n) - nv_ * (V)) { const i64 i = nv_ * (V) + t_; TAIL }           \
    }

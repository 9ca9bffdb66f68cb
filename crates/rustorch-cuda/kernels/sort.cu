// Op::Sort and Op::TopK along one dim: values and i64 indices.
//
// Each element becomes the CPU's key (reduce/sort.rs): an unsigned integer
// whose order is PyTorch's (NaN largest whatever its payload, -0 equal to
// +0), subtracted from the key type's maximum for a descending order, and
// paired with its index. Sorting the (key, index) pairs ascending is then
// the CPU's stable order in both directions, and its top-k order (the
// earlier of equal values first). No two pairs are equal, so any correct
// sort gives exactly the CPU's result; a bitonic network is one.
//
// Rows are addressed as in reduce.cu: element r of row o of the input at
// strided_at(lo, o) + strided_at(li, r); the outputs (k of each row) at
// strided_at(yo, o) + strided_at(yi, r) of contiguous tensors. A row of up
// to SORT_SHARED_MAX elements (padded to a power of two, P) is sorted by one
// block in shared memory (`sort_rows_*`); longer rows go through global
// scratch of P pairs per row: `sort_keys_*` fills it, one `sort_stage`
// launch per step of the network sorts it, `sort_take_*` writes the first k.
#include "common.cuh"

// Keys: f16 and bf16 through f32, as on the CPU.
__device__ __forceinline__ u64 key_of(float x) {
    u32 b = __float_as_uint(x);
    if (x != x) return 0xffffffffull;
    if (b == 0x80000000u) b = 0; // -0 sorts with +0
    u32 flip = (u32)((int)b >> 31) | 0x80000000u;
    return (u64)(b ^ flip);
}
__device__ __forceinline__ u64 key_of(double x) {
    u64 b = (u64)__double_as_longlong(x);
    if (x != x) return 0xffffffffffffffffull;
    if (b == 0x8000000000000000ull) b = 0;
    u64 flip = (u64)((i64)b >> 63) | 0x8000000000000000ull;
    return b ^ flip;
}

struct KF32 { typedef float T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return key_of(x); } };
struct KF16 { typedef u16 T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return key_of(f16_to_f32(x)); } };
struct KBF16 { typedef u16 T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return key_of(bf16_to_f32(x)); } };
struct KF64 { typedef double T; static constexpr u64 MAX = 0xffffffffffffffffull;
    __device__ static u64 key(T x) { return key_of(x); } };
struct KI32 { typedef int T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return (u64)((u32)x ^ 0x80000000u); } };
struct KI64 { typedef i64 T; static constexpr u64 MAX = 0xffffffffffffffffull;
    __device__ static u64 key(T x) { return (u64)x ^ 0x8000000000000000ull; } };
struct KU8 { typedef u8 T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return (u64)x; } };
// Bools are stored as 0/1 bytes.
struct KBOOL { typedef u8 T; static constexpr u64 MAX = 0xffffffffull;
    __device__ static u64 key(T x) { return (u64)(x != 0); } };

template <typename K> __device__ __forceinline__ u64 sort_key(typename K::T x, int descending) {
    u64 k = K::key(x);
    return descending ? K::MAX - k : k;
}

// Padding sorts after every element: the largest key and index.
#define PAD_KEY 0xffffffffffffffffull
#define PAD_IDX 0xffffffffu

__device__ __forceinline__ bool pair_less(u64 ka, u32 ia, u64 kb, u32 ib) {
    return ka < kb || (ka == kb && ia < ib);
}

// One compare-exchange of the bitonic network: positions e and e ^ j of a
// row, for the merge of size `kk`.
__device__ __forceinline__ void bitonic_step(u64* keys, u32* idx, i64 e, i64 kk, i64 j) {
    i64 p = e ^ j;
    if (p <= e) return;
    bool up = (e & kk) == 0;
    u64 ka = keys[e], kb = keys[p];
    u32 ia = idx[e], ib = idx[p];
    bool swap = up ? pair_less(kb, ib, ka, ia) : pair_less(ka, ia, kb, ib);
    if (swap) {
        keys[e] = kb; keys[p] = ka;
        idx[e] = ib; idx[p] = ia;
    }
}

#define AT(x, lo, li, o, r) x[strided_at(lo, o) + strided_at(li, r)]

// One block per row; dynamic shared memory: P keys (u64) then P indices.
template <typename K>
__device__ void sort_rows(const typename K::T* x, Strided lo, Strided li, i64 len, i64 p, i64 k,
                          int descending, typename K::T* y, i64* yidx, Strided yo, Strided yi) {
    extern __shared__ __align__(16) unsigned char sort_smem[];
    u64* keys = (u64*)sort_smem;
    u32* idx = (u32*)(keys + p);
    const i64 o = blockIdx.x;
    for (i64 e = threadIdx.x; e < p; e += blockDim.x) {
        if (e < len) {
            keys[e] = sort_key<K>(AT(x, lo, li, o, e), descending);
            idx[e] = (u32)e;
        } else {
            keys[e] = PAD_KEY;
            idx[e] = PAD_IDX;
        }
    }
    __syncthreads();
    for (i64 kk = 2; kk <= p; kk <<= 1) {
        for (i64 j = kk >> 1; j > 0; j >>= 1) {
            for (i64 e = threadIdx.x; e < p; e += blockDim.x) bitonic_step(keys, idx, e, kk, j);
            __syncthreads();
        }
    }
    for (i64 r = threadIdx.x; r < k; r += blockDim.x) {
        const u32 i = idx[r];
        AT(y, yo, yi, o, r) = AT(x, lo, li, o, (i64)i);
        AT(yidx, yo, yi, o, r) = (i64)i;
    }
}

// Global scratch: row o's pairs at [o * p, (o + 1) * p).
template <typename K>
__device__ void sort_keys(const typename K::T* x, Strided lo, Strided li, i64 len, i64 p,
                          int descending, u64* keys, u32* idx, i64 total) {
    RT_GRID_STRIDE(t, total) {
        const i64 o = t / p, e = t - o * p;
        if (e < len) {
            keys[t] = sort_key<K>(AT(x, lo, li, o, e), descending);
            idx[t] = (u32)e;
        } else {
            keys[t] = PAD_KEY;
            idx[t] = PAD_IDX;
        }
    }
}

template <typename K>
__device__ void sort_take(const typename K::T* x, Strided lo, Strided li, const u32* idx, i64 p, i64 k,
                          typename K::T* y, i64* yidx, Strided yo, Strided yi, i64 total) {
    RT_GRID_STRIDE(t, total) {
        const i64 o = t / k, r = t - o * k;
        const u32 i = idx[o * p + r];
        AT(y, yo, yi, o, r) = AT(x, lo, li, o, (i64)i);
        AT(yidx, yo, yi, o, r) = (i64)i;
    }
}

// One step (kk, j) of the network over every row of the scratch (p a power
// of two, so positions e and e ^ j stay in one row).
extern "C" __global__ void sort_stage(u64* keys, u32* idx, i64 total, i64 p, i64 kk, i64 j) { rt_kernel_entry();
    RT_GRID_STRIDE(t, total) {
        const i64 o = t / p, e = t - o * p;
        bitonic_step(keys + o * p, idx + o * p, e, kk, j);
    }
}

#define SORT(NAME)                                                                           \
    extern "C" __global__ void sort_rows_##NAME(const K##NAME::T* x, Strided lo, Strided li, \
                                                i64 len, i64 p, i64 k, int descending,       \
                                                K##NAME::T* y, i64* yidx, Strided yo,        \
                                                Strided yi) { rt_kernel_entry();                                \
        sort_rows<K##NAME>(x, lo, li, len, p, k, descending, y, yidx, yo, yi);               \
    }                                                                                        \
    extern "C" __global__ void sort_keys_##NAME(const K##NAME::T* x, Strided lo, Strided li, \
                                                i64 len, i64 p, int descending, u64* keys,   \
                                                u32* idx, i64 total) { rt_kernel_entry();                       \
        sort_keys<K##NAME>(x, lo, li, len, p, descending, keys, idx, total);                 \
    }                                                                                        \
    extern "C" __global__ void sort_take_##NAME(const K##NAME::T* x, Strided lo, Strided li, \
                                                const u32* idx, i64 p, i64 k, K##NAME::T* y, \
                                                i64* yidx, Strided yo, Strided yi,           \
                                                i64 total) { rt_kernel_entry();                                 \
        sort_take<K##NAME>(x, lo, li, idx, p, k, y, yidx, yo, yi, total);                    \
    }
SORT(F32) SORT(F16) SORT(BF16) SORT(F64) SORT(I32) SORT(I64) SORT(U8) SORT(BOOL)

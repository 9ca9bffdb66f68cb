// Indexing: index_select, embedding and gather share one kernel. Output
// element i (contiguous) reads x at strided_at(xs, i) + v * sd, where
// v = idx[strided_at(li, i)] is its index and `xs` is the source's layout
// over the output's dims with the indexed dim's stride set to 0 (the index
// supplies that coordinate). `li` places each output element's index: for
// gather the index tensor's own layout, for index_select / embedding the
// index's strides on the indexed dims and 0 elsewhere (the host builds it).
// Elements are moved by size (u8/u16/u32/u64), so every non-complex dtype
// shares four kernels per index type.
//
// An index outside 0..size is never dereferenced: the element is written
// as 0 and `bad` is set to 1, which the launcher reads back to report the
// CPU backend's InvalidInput error.
#include "common.cuh"

#define INDEX_GATHER(BYTES, T, IDX, I)                                                       \
    extern "C" __global__ void index_gather_b##BYTES##_##IDX(                                \
        const T* x, Strided xs, i64 sd, i64 size, const I* idx, Strided li, T* y, i64 n,   \
        int* bad) { rt_kernel_entry();                                                                          \
        RT_GRID_STRIDE(i, n) {                                                               \
            i64 v = (i64)idx[strided_at(li, i)];                                             \
            if (v < 0 || v >= size) {                                                        \
                *bad = 1;                                                                    \
                y[i] = (T)0;                                                                 \
            } else {                                                                         \
                y[i] = x[strided_at(xs, i) + v * sd];                                        \
            }                                                                                \
        }                                                                                    \
    }
#define INDEX_BY_SIZE(IDX, I) \
    INDEX_GATHER(1, u8, IDX, I) INDEX_GATHER(2, u16, IDX, I) INDEX_GATHER(4, u32, IDX, I) INDEX_GATHER(8, u64, IDX, I)
INDEX_BY_SIZE(I32, int)
INDEX_BY_SIZE(I64, i64)
INDEX_BY_SIZE(U8, u8)

// ---- scatter_add ---------------------------------------------------------
// Deterministic by construction: no atomics (a float atomicAdd sums in
// whatever order threads arrive, so results would vary run to run and
// differ from the CPU's). Instead one thread owns one output element and
// sums its contributions itself, in the CPU's order (the index's
// row-major order, which along one line is increasing position j), in
// the CPU's accumulator type (f32 for half types, rounded once at the
// end; wrapping for integers; logical or for bools), so results match the
// CPU bit for bit.
//
// Threads span the "work shape": the index's dims with the scattered dim
// replaced by the destination's size there (`dsize`). Thread i, at
// position t = (i / inner) % dsize along that dim, scans the k index
// entries of its line (idx at strided_at(iw, i) + j * isd) and adds the
// source element (strided_at(sw, i) + j * ssd) of each entry equal to t.
// The output already holds the destination (a copy queued before), and
// elements outside the work shape keep it. Cost: k index reads per thread,
// so O(work * k): fine for the usual short scattered dims, slow for a long
// one (a sort of the index by target would be the next step).
//
// The threads at t == 0 check every index entry once (each line has one
// such thread), setting `bad` for any outside 0..dsize, which the
// launcher reports as the CPU's InvalidInput.
__device__ __forceinline__ float sc_ld(F32T, float x) { return x; }
__device__ __forceinline__ float sc_st(F32T, float a) { return a; }
__device__ __forceinline__ float sc_ld(F16T, u16 x) { return f16_to_f32(x); }
__device__ __forceinline__ u16 sc_st(F16T, float a) { return f32_to_f16(a); }
__device__ __forceinline__ float sc_ld(BF16T, u16 x) { return bf16_to_f32(x); }
__device__ __forceinline__ u16 sc_st(BF16T, float a) { return f32_to_bf16(a); }
__device__ __forceinline__ double sc_ld(F64T, double x) { return x; }
__device__ __forceinline__ double sc_st(F64T, double a) { return a; }

// Integers travel as unsigned types of their size (wrapping addition,
// where C's signed overflow would be undefined); bools as u8 with or.
struct I32T  { typedef u32 store; typedef u32 acc; };
struct I64T  { typedef u64 store; typedef u64 acc; };
struct U8T   { typedef u8 store;  typedef u32 acc; };
struct BOOLT { typedef u8 store;  typedef u32 acc; };
__device__ __forceinline__ u32 sc_ld(I32T, u32 x) { return x; }
__device__ __forceinline__ u32 sc_st(I32T, u32 a) { return a; }
__device__ __forceinline__ u64 sc_ld(I64T, u64 x) { return x; }
__device__ __forceinline__ u64 sc_st(I64T, u64 a) { return a; }
__device__ __forceinline__ u32 sc_ld(U8T, u8 x) { return x; }
__device__ __forceinline__ u8 sc_st(U8T, u32 a) { return (u8)a; }  // mod 256: wrapping
__device__ __forceinline__ u32 sc_ld(BOOLT, u8 x) { return x != 0; }
__device__ __forceinline__ u8 sc_st(BOOLT, u32 a) { return a != 0; }
template <class TY> __device__ __forceinline__ typename TY::acc sc_add(TY, typename TY::acc a, typename TY::acc x) {
    return a + x;
}
__device__ __forceinline__ u32 sc_add(BOOLT, u32 a, u32 x) { return a | x; }

#define SCATTER_ADD(TY, IDX, I)                                                              \
    extern "C" __global__ void scatter_add_##TY##_##IDX(                                     \
        TY##T::store* y, Strided yw, const I* idx, Strided iw, i64 isd,                      \
        const TY##T::store* src, Strided sw, i64 ssd, i64 n, i64 inner, i64 dsize, i64 k,    \
        int* bad) { rt_kernel_entry();                                                             \
        RT_GRID_STRIDE(i, n) {                                                               \
            i64 t = (i / inner) % dsize;                                                     \
            i64 yo = strided_at(yw, i), io = strided_at(iw, i), so = strided_at(sw, i);      \
            TY##T::acc a = sc_ld(TY##T(), y[yo]);                                            \
            bool hit = false;                                                                \
            for (i64 j = 0; j < k; ++j) {                                                    \
                i64 v = (i64)idx[io + j * isd];                                              \
                if (t == 0 && (v < 0 || v >= dsize)) *bad = 1;                               \
                if (v == t) {                                                                \
                    TY##T::acc x = sc_ld(TY##T(), src[so + j * ssd]);                        \
                    a = sc_add(TY##T(), a, x);                                               \
                    hit = true;                                                              \
                }                                                                            \
            }                                                                                \
            if (hit) y[yo] = sc_st(TY##T(), a);                                              \
        }                                                                                    \
    }
#define SCATTER_ALL(IDX, I)                                                                  \
    SCATTER_ADD(F32, IDX, I) SCATTER_ADD(F16, IDX, I) SCATTER_ADD(BF16, IDX, I)              \
    SCATTER_ADD(F64, IDX, I) SCATTER_ADD(I32, IDX, I) SCATTER_ADD(I64, IDX, I)               \
    SCATTER_ADD(U8, IDX, I) SCATTER_ADD(BOOL, IDX, I)
SCATTER_ALL(I32, int)
SCATTER_ALL(I64, i64)
SCATTER_ALL(U8, u8)

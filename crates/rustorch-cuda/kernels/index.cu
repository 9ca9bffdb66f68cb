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
        int* bad) {                                                                          \
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

// Dtype conversions as the CPU backend makes them (PyTorch's rules, with
// Rust's `as` where C is undefined): float -> int truncates toward zero into
// an i64, saturating (NaN -> 0), then wraps to the target width like every
// int -> int conversion; anything -> bool is `!= 0`; every type reaches
// f16 and bf16 through f32, as PyTorch converts to half precision.
#include "common.cuh"

// Sources, read as the widest type of their kind.
__device__ __forceinline__ double src_f(float x)  { return x; }
__device__ __forceinline__ double src_f(double x) { return x; }
#define SRC_F32(x)  src_f(x)
#define SRC_F64(x)  src_f(x)
#define SRC_F16(x)  ((double)f16_to_f32(x))
#define SRC_BF16(x) ((double)bf16_to_f32(x))
#define SRC_I32(x)  ((i64)(x))
#define SRC_I64(x)  ((i64)(x))
#define SRC_U8(x)   ((i64)(x))
#define SRC_BOOL(x) ((i64)((x) != 0))

// Rust's `f64 as i64`: toward zero, saturating, NaN -> 0 (2^63 rounds up
// from i64::MAX as a double, hence >=).
__device__ __forceinline__ i64 sat_i64(double d) {
    if (d != d) return 0;
    if (d <= -9223372036854775808.0) return (i64)0x8000000000000000ull;
    if (d >= 9223372036854775808.0) return 0x7fffffffffffffffll;
    return (i64)d;
}

// Destinations from a float source (double) ...
#define FDST_F32(d)  ((float)(d))
#define FDST_F64(d)  (d)
#define FDST_F16(d)  f32_to_f16((float)(d))
#define FDST_BF16(d) f32_to_bf16((float)(d))
#define FDST_I32(d)  ((int)(u32)(u64)sat_i64(d))
#define FDST_I64(d)  sat_i64(d)
#define FDST_U8(d)   ((u8)(u64)sat_i64(d))
#define FDST_BOOL(d) ((u8)((d) != 0.0))
// ... and from an integer source (i64).
#define IDST_F32(v)  ((float)(v))
#define IDST_F64(v)  ((double)(v))
#define IDST_F16(v)  f32_to_f16((float)(v))
#define IDST_BF16(v) f32_to_bf16((float)(v))
#define IDST_I32(v)  ((int)(v))
#define IDST_I64(v)  ((i64)(v))
#define IDST_U8(v)   ((u8)(v))
#define IDST_BOOL(v) ((u8)((v) != 0))

// cast_A_B writes a contiguous output; cast_into_A_B writes the elements of
// an existing buffer that `ly` selects, moved as `at` says (common.cuh;
// `Backend::write_into` and `write_into_at`: a KV cache filled in place,
// f32 keys converted to the cache's f16 on the way).
#define CAST(KIND, FROM, FT, TO, TT)                                                         \
    extern "C" __global__ void cast_##FROM##_##TO(const FT* x, Strided lx, TT* y, i64 n) { rt_kernel_entry();  \
        RT_GRID_STRIDE(i, n) { y[i] = KIND##DST_##TO(SRC_##FROM(x[strided_at(lx, i)])); }    \
    }                                                                                        \
    extern "C" __global__ void cast_into_##FROM##_##TO(const FT* x, Strided lx, TT* y,      \
                                                        Strided ly, i64 n, WriteAt at) { rt_kernel_entry();    \
        const i64 shift = write_shift(at);                                                   \
        if (shift < 0) return;                                                               \
        RT_GRID_STRIDE(i, n) {                                                               \
            y[strided_at(ly, i) + shift] = KIND##DST_##TO(SRC_##FROM(x[strided_at(lx, i)])); \
        }                                                                                    \
    }
#define CAST_FROM(KIND, FROM, FT)                                                            \
    CAST(KIND, FROM, FT, F32, float) CAST(KIND, FROM, FT, F64, double)                       \
    CAST(KIND, FROM, FT, F16, u16) CAST(KIND, FROM, FT, BF16, u16)                           \
    CAST(KIND, FROM, FT, I32, int) CAST(KIND, FROM, FT, I64, i64)                            \
    CAST(KIND, FROM, FT, U8, u8) CAST(KIND, FROM, FT, BOOL, u8)

CAST_FROM(F, F32, float)
CAST_FROM(F, F64, double)
CAST_FROM(F, F16, u16)
CAST_FROM(F, BF16, u16)
CAST_FROM(I, I32, int)
CAST_FROM(I, I64, i64)
CAST_FROM(I, U8, u8)
CAST_FROM(I, BOOL, u8)

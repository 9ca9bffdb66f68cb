// Elementwise ops on strided inputs, contiguous outputs: unary, binary (the
// inputs' layouts already broadcast to the output's shape, zero strides
// where an input repeats), comparisons, where, clamp. Float types compute
// in f32 (f64 in f64), as the CPU backend does, and round once on store.
#include "common.cuh"

// An empty kernel that only waits for the one before it: launched
// RUSTORCH_CUDA_GAP_KERNELS times after every kernel (src/launch.rs), it
// measures what one more dependency between kernels costs a step.
extern "C" __global__ void rt_gap() { rt_kernel_entry(); }

// ---- unary ---------------------------------------------------------------
template <typename A> __device__ __forceinline__ A op_neg(A x) { return -x; }
template <typename A> __device__ __forceinline__ A op_abs(A x) { return x < (A)0 ? -x : x; }
__device__ __forceinline__ float  op_exp(float x)  { return expf(x); }
__device__ __forceinline__ double op_exp(double x) { return exp(x); }
__device__ __forceinline__ float  op_log(float x)  { return logf(x); }
__device__ __forceinline__ double op_log(double x) { return log(x); }
__device__ __forceinline__ float  op_sqrt(float x)  { return sqrtf(x); }
__device__ __forceinline__ double op_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float  op_rsqrt(float x)  { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double op_rsqrt(double x) { return 1.0 / sqrt(x); }
__device__ __forceinline__ float  op_sin(float x)  { return sinf(x); }
__device__ __forceinline__ double op_sin(double x) { return sin(x); }
__device__ __forceinline__ float  op_cos(float x)  { return cosf(x); }
__device__ __forceinline__ double op_cos(double x) { return cos(x); }
__device__ __forceinline__ float  op_tanh(float x)  { return tanhf(x); }
__device__ __forceinline__ double op_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float  op_sigmoid(float x)  { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double op_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
// `x < 0` is false for NaN, so NaN passes through, as in PyTorch.
template <typename A> __device__ __forceinline__ A op_relu(A x) { return x < (A)0 ? (A)0 : x; }
__device__ __forceinline__ float  op_gelu(float x)  { return 0.5f * x * erfcf(-x * 0.70710678118654752f); }
__device__ __forceinline__ double op_gelu(double x) { return 0.5 * x * erfc(-x * 0.70710678118654752); }
// op_gelu_tanh(float) is in common.cuh (the fused gated products of
// quant.cu use it too).
__device__ __forceinline__ double op_gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
__device__ __forceinline__ float  op_silu(float x)  { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ double op_silu(double x) { return x / (1.0 + exp(-x)); }
// PyTorch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float  op_softplus(float x)  { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ double op_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

#define UNARY_FLOAT(NAME, TY, FN)                                                            \
    extern "C" __global__ void unary_##NAME##_##TY(const TY##T::store* x, Strided lx,       \
                                                    TY##T::store* y, i64 n) { rt_kernel_entry();               \
        RT_GRID_STRIDE(i, n) { y[i] = store(TY##T(), FN(load(TY##T(), x[strided_at(lx, i)]))); } \
    }                                                                                        \
    extern "C" __global__ void unary_##NAME##_##TY##_v(const TY##T::store* x, Strided lx,   \
                                                        TY##T::store* y, i64 n) { rt_kernel_entry();           \
        typedef TY##T::store S;                                                              \
        const int V = 16 / sizeof(S);                                                        \
        const S* xs = x + lx.offset;                                                         \
        RT_VEC_LOOP(V, n, {                                                                  \
            Pack<S> a = reinterpret_cast<const Pack<S>*>(xs)[j]; Pack<S> r;                 \
            _Pragma("unroll") for (int k = 0; k < V; ++k)                                    \
                r.v[k] = store(TY##T(), FN(load(TY##T(), a.v[k])));                          \
            reinterpret_cast<Pack<S>*>(y)[j] = r;                                            \
        }, { y[i] = store(TY##T(), FN(load(TY##T(), xs[i]))); })                             \
    }
#define UNARY_ALL_FLOATS(NAME, FN) \
    UNARY_FLOAT(NAME, F32, FN) UNARY_FLOAT(NAME, F16, FN) UNARY_FLOAT(NAME, BF16, FN) UNARY_FLOAT(NAME, F64, FN)

UNARY_ALL_FLOATS(neg, op_neg)
UNARY_ALL_FLOATS(abs, op_abs)
UNARY_ALL_FLOATS(exp, op_exp)
UNARY_ALL_FLOATS(log, op_log)
UNARY_ALL_FLOATS(sqrt, op_sqrt)
UNARY_ALL_FLOATS(rsqrt, op_rsqrt)
UNARY_ALL_FLOATS(sin, op_sin)
UNARY_ALL_FLOATS(cos, op_cos)
UNARY_ALL_FLOATS(tanh, op_tanh)
UNARY_ALL_FLOATS(sigmoid, op_sigmoid)
UNARY_ALL_FLOATS(relu, op_relu)
UNARY_ALL_FLOATS(gelu, op_gelu)
UNARY_ALL_FLOATS(gelu_tanh, op_gelu_tanh)
UNARY_ALL_FLOATS(silu, op_silu)
UNARY_ALL_FLOATS(softplus, op_softplus)

// ---- binary --------------------------------------------------------------
template <typename A> __device__ __forceinline__ A op_add(A a, A b) { return a + b; }
template <typename A> __device__ __forceinline__ A op_sub(A a, A b) { return a - b; }
template <typename A> __device__ __forceinline__ A op_mul(A a, A b) { return a * b; }
template <typename A> __device__ __forceinline__ A op_div(A a, A b) { return a / b; }
__device__ __forceinline__ float  op_pow(float a, float b)   { return powf(a, b); }
__device__ __forceinline__ double op_pow(double a, double b) { return pow(a, b); }
// Ties keep the first operand (PyTorch's sign of zero); a NaN in either
// operand gives NaN (the CPU backend's rule).
template <typename A> __device__ __forceinline__ A op_maximum(A a, A b) {
    A m = a < b ? b : a;
    return b != b ? b : m;
}
template <typename A> __device__ __forceinline__ A op_minimum(A a, A b) {
    A m = b < a ? b : a;
    return b != b ? b : m;
}

#define BINARY_FLOAT(NAME, TY, FN)                                                           \
    extern "C" __global__ void binary_##NAME##_##TY(const TY##T::store* a, Strided la,      \
                                                     const TY##T::store* b, Strided lb,     \
                                                     TY##T::store* y, i64 n) { rt_kernel_entry();              \
        RT_GRID_STRIDE(i, n) {                                                               \
            y[i] = store(TY##T(), FN(load(TY##T(), a[strided_at(la, i)]),                    \
                                     load(TY##T(), b[strided_at(lb, i)])));                  \
        }                                                                                    \
    }                                                                                        \
    extern "C" __global__ void binary_##NAME##_##TY##_v(const TY##T::store* a, Strided la,  \
                                                         const TY##T::store* b, Strided lb, \
                                                         TY##T::store* y, i64 n) { rt_kernel_entry();          \
        typedef TY##T::store S;                                                              \
        const int V = 16 / sizeof(S);                                                        \
        const S* as = a + la.offset;                                                         \
        const S* bs = b + lb.offset;                                                         \
        RT_VEC_LOOP(V, n, {                                                                  \
            Pack<S> p = reinterpret_cast<const Pack<S>*>(as)[j];                             \
            Pack<S> q = reinterpret_cast<const Pack<S>*>(bs)[j]; Pack<S> r;                 \
            _Pragma("unroll") for (int k = 0; k < V; ++k)                                    \
                r.v[k] = store(TY##T(), FN(load(TY##T(), p.v[k]), load(TY##T(), q.v[k])));   \
            reinterpret_cast<Pack<S>*>(y)[j] = r;                                            \
        }, { y[i] = store(TY##T(), FN(load(TY##T(), as[i]), load(TY##T(), bs[i]))); })      \
    }
#define BINARY_ALL_FLOATS(NAME, FN) \
    BINARY_FLOAT(NAME, F32, FN) BINARY_FLOAT(NAME, F16, FN) BINARY_FLOAT(NAME, BF16, FN) BINARY_FLOAT(NAME, F64, FN)

BINARY_ALL_FLOATS(add, op_add)
BINARY_ALL_FLOATS(sub, op_sub)
BINARY_ALL_FLOATS(mul, op_mul)
BINARY_ALL_FLOATS(div, op_div)
BINARY_ALL_FLOATS(pow, op_pow)
BINARY_ALL_FLOATS(maximum, op_maximum)
BINARY_ALL_FLOATS(minimum, op_minimum)

// ---- comparisons (bool output, one byte 0/1) -----------------------------
#define CMP_FLOAT(NAME, TY, EXPR)                                                            \
    extern "C" __global__ void cmp_##NAME##_##TY(const TY##T::store* a, Strided la,         \
                                                  const TY##T::store* b, Strided lb,        \
                                                  u8* y, i64 n) { rt_kernel_entry();                           \
        RT_GRID_STRIDE(i, n) {                                                               \
            TY##T::acc x = load(TY##T(), a[strided_at(la, i)]);                              \
            TY##T::acc z = load(TY##T(), b[strided_at(lb, i)]);                              \
            y[i] = (EXPR) ? 1 : 0;                                                           \
        }                                                                                    \
    }
#define CMP_ALL_FLOATS(NAME, EXPR) \
    CMP_FLOAT(NAME, F32, EXPR) CMP_FLOAT(NAME, F16, EXPR) CMP_FLOAT(NAME, BF16, EXPR) CMP_FLOAT(NAME, F64, EXPR)

CMP_ALL_FLOATS(eq, x == z)
CMP_ALL_FLOATS(ne, x != z)
CMP_ALL_FLOATS(lt, x < z)
CMP_ALL_FLOATS(le, x <= z)
CMP_ALL_FLOATS(gt, x > z)
CMP_ALL_FLOATS(ge, x >= z)

// ---- clamp: bounds given in the compute type; a missing bound is NaN -----
#define CLAMP_FLOAT(TY)                                                                      \
    extern "C" __global__ void clamp_##TY(const TY##T::store* x, Strided lx, TY##T::store* y, \
                                          i64 n, double lo, double hi) { rt_kernel_entry();                    \
        RT_GRID_STRIDE(i, n) {                                                               \
            TY##T::acc v = load(TY##T(), x[strided_at(lx, i)]);                              \
            TY##T::acc l = (TY##T::acc)lo, h = (TY##T::acc)hi;                               \
            if (lo == lo && v < l) v = l;                                                    \
            if (hi == hi && v > h) v = h;                                                    \
            y[i] = store(TY##T(), v);                                                        \
        }                                                                                    \
    }
CLAMP_FLOAT(F32) CLAMP_FLOAT(F16) CLAMP_FLOAT(BF16) CLAMP_FLOAT(F64)

// ---- where and copy: any dtype, moved by element size --------------------
#define BY_SIZE(BYTES, T)                                                                    \
    extern "C" __global__ void copy_b##BYTES(const T* x, Strided lx, T* y, i64 n) { rt_kernel_entry();          \
        RT_GRID_STRIDE(i, n) { y[i] = x[strided_at(lx, i)]; }                                \
    }                                                                                        \
    extern "C" __global__ void copy_b##BYTES##_v(const T* x, Strided lx, T* y, i64 n) { rt_kernel_entry();      \
        const int V = 16 / sizeof(T);                                                        \
        const T* xs = x + lx.offset;                                                         \
        RT_VEC_LOOP(V, n, {                                                                  \
            reinterpret_cast<Pack<T>*>(y)[j] = reinterpret_cast<const Pack<T>*>(xs)[j];      \
        }, { y[i] = xs[i]; })                                                                \
    }                                                                                        \
    extern "C" __global__ void copy_into_b##BYTES(const T* x, Strided lx, T* y, Strided ly, \
                                                  i64 n, WriteAt at) { rt_kernel_entry();                      \
        const i64 shift = write_shift(at);                                                   \
        if (shift < 0) return;                                                               \
        RT_GRID_STRIDE(i, n) { y[strided_at(ly, i) + shift] = x[strided_at(lx, i)]; }        \
    }                                                                                        \
    extern "C" __global__ void where_b##BYTES(const u8* c, Strided lc, const T* a, Strided la, \
                                              const T* b, Strided lb, T* y, i64 n) { rt_kernel_entry();        \
        RT_GRID_STRIDE(i, n) {                                                               \
            y[i] = c[strided_at(lc, i)] ? a[strided_at(la, i)] : b[strided_at(lb, i)];       \
        }                                                                                    \
    }
BY_SIZE(1, u8)
BY_SIZE(2, u16)
BY_SIZE(4, u32)
BY_SIZE(8, u64)

// ---- integers: Rust's wrapping arithmetic (through unsigned types, where
// C's signed overflow would be undefined), as the CPU backend computes ------
typedef unsigned int u32_t;
template <typename T, typename U> __device__ __forceinline__ T wadd(T a, T b) { return (T)((U)a + (U)b); }
template <typename T, typename U> __device__ __forceinline__ T wsub(T a, T b) { return (T)((U)a - (U)b); }
template <typename T, typename U> __device__ __forceinline__ T wmul(T a, T b) { return (T)((U)a * (U)b); }
template <typename T, typename U> __device__ __forceinline__ T wneg(T a) { return (T)((U)0 - (U)a); }
template <typename T, typename U> __device__ __forceinline__ T wabs(T a) { return a < (T)0 ? wneg<T, U>(a) : a; }

#define INT_BINARY(NAME, TY, T, U, EXPR)                                                     \
    extern "C" __global__ void binary_##NAME##_##TY(const T* a, Strided la, const T* b,     \
                                                     Strided lb, T* y, i64 n) { rt_kernel_entry();             \
        RT_GRID_STRIDE(i, n) {                                                               \
            T x = a[strided_at(la, i)], z = b[strided_at(lb, i)];                            \
            y[i] = (EXPR);                                                                   \
        }                                                                                    \
    }
#define INT_TYPE(TY, T, U)                                                                   \
    INT_BINARY(add, TY, T, U, (wadd<T, U>(x, z)))                                            \
    INT_BINARY(sub, TY, T, U, (wsub<T, U>(x, z)))                                            \
    INT_BINARY(mul, TY, T, U, (wmul<T, U>(x, z)))                                            \
    INT_BINARY(maximum, TY, T, U, (x < z ? z : x))                                           \
    INT_BINARY(minimum, TY, T, U, (z < x ? z : x))                                           \
    extern "C" __global__ void unary_neg_##TY(const T* x, Strided lx, T* y, i64 n) { rt_kernel_entry();        \
        RT_GRID_STRIDE(i, n) { y[i] = wneg<T, U>(x[strided_at(lx, i)]); }                    \
    }                                                                                        \
    extern "C" __global__ void unary_abs_##TY(const T* x, Strided lx, T* y, i64 n) { rt_kernel_entry();        \
        RT_GRID_STRIDE(i, n) { y[i] = wabs<T, U>(x[strided_at(lx, i)]); }                    \
    }                                                                                        \
    extern "C" __global__ void unary_relu_##TY(const T* x, Strided lx, T* y, i64 n) { rt_kernel_entry();       \
        RT_GRID_STRIDE(i, n) { T v = x[strided_at(lx, i)]; y[i] = v < (T)0 ? (T)0 : v; }     \
    }
INT_TYPE(I32, int, u32_t)
INT_TYPE(I64, i64, u64)
INT_TYPE(U8, u8, u8)

#define INT_CMP(NAME, TY, T, OP)                                                             \
    extern "C" __global__ void cmp_##NAME##_##TY(const T* a, Strided la, const T* b,        \
                                                  Strided lb, u8* y, i64 n) { rt_kernel_entry();               \
        RT_GRID_STRIDE(i, n) { y[i] = (a[strided_at(la, i)] OP b[strided_at(lb, i)]) ? 1 : 0; } \
    }
#define INT_CMPS(TY, T)                                                                      \
    INT_CMP(eq, TY, T, ==) INT_CMP(ne, TY, T, !=) INT_CMP(lt, TY, T, <)                      \
    INT_CMP(le, TY, T, <=) INT_CMP(gt, TY, T, >) INT_CMP(ge, TY, T, >=)
INT_CMPS(I32, int)
INT_CMPS(I64, i64)
INT_CMPS(U8, u8)
INT_CMPS(BOOL, u8)

// ---- gated activations (Op::SwiGlu, Op::GeGlu): f32, x and g of one shape -
extern "C" __global__ void swiglu_F32(const float* x, Strided lx, const float* g, Strided lg, float* y, i64 n) { rt_kernel_entry();
    RT_GRID_STRIDE(i, n) {
        y[i] = op_swiglu(x[strided_at(lx, i)], g[strided_at(lg, i)]);
    }
}
extern "C" __global__ void geglu_F32(const float* x, Strided lx, const float* g, Strided lg, float* y, i64 n) { rt_kernel_entry();
    RT_GRID_STRIDE(i, n) { y[i] = op_gelu_tanh(x[strided_at(lx, i)]) * g[strided_at(lg, i)]; }
}

// ---- integer division and powers, bool maximum/minimum -------------------
// As the CPU computes them: division truncates, with Rust's wrapping_div
// (MIN / -1 wraps to MIN; C leaves it undefined, so it is spelled out);
// powers square and multiply with wrapping products. The CPU rejects zero
// divisors and negative exponents before running anything; the launcher
// does the same with `int_check_*` first, so the zero-divisor and
// negative-exponent branches here only keep the kernels total.
template <typename T, typename U> __device__ __forceinline__ T wpow(T a, T e) {
    T acc = (T)1, base = a;
    while (e > (T)0) {
        if (e & (T)1) acc = wmul<T, U>(acc, base);
        base = wmul<T, U>(base, base);
        e = (T)(e >> 1);
    }
    return acc;
}
#define INT_DIV_POW(TY, T, U, DIV)                                                           \
    INT_BINARY(div, TY, T, U, (DIV))                                                         \
    INT_BINARY(pow, TY, T, U, (wpow<T, U>(x, z)))
INT_DIV_POW(I32, int, u32_t, (z == 0 ? 0 : (z == -1 ? wneg<int, u32_t>(x) : x / z)))
INT_DIV_POW(I64, i64, u64, (z == 0 ? 0 : (z == -1 ? wneg<i64, u64>(x) : x / z)))
INT_DIV_POW(U8, u8, u8, (z == 0 ? 0 : (u8)(x / z)))

// Sets *bad when any element of `b` (its own layout, n elements) is a zero
// divisor (`div`) or a negative exponent (`pow`).
#define INT_CHECK(TY, T)                                                                     \
    extern "C" __global__ void int_check_div_##TY(const T* b, Strided lb, i64 n, int* bad) { rt_kernel_entry(); \
        RT_GRID_STRIDE(i, n) { if (b[strided_at(lb, i)] == (T)0) *bad = 1; }                 \
    }                                                                                        \
    extern "C" __global__ void int_check_pow_##TY(const T* b, Strided lb, i64 n, int* bad) { rt_kernel_entry(); \
        RT_GRID_STRIDE(i, n) { if (b[strided_at(lb, i)] < (T)0) *bad = 1; }                  \
    }
INT_CHECK(I32, int)
INT_CHECK(I64, i64)
INT_CHECK(U8, u8)

// Integer clamp: bounds already rounded inward and saturated into the
// dtype by the host (as the CPU takes them; a NaN bound never gets here),
// compared in i64. Lower bound first, then upper, as on the CPU, so every
// element becomes `hi` when lo > hi.
#define INT_CLAMP(TY, T)                                                                     \
    extern "C" __global__ void clamp_##TY(const T* x, Strided lx, T* y, i64 n, i64 lo, i64 hi) { rt_kernel_entry(); \
        RT_GRID_STRIDE(i, n) {                                                               \
            i64 v = (i64)x[strided_at(lx, i)];                                               \
            if (v < lo) v = lo;                                                              \
            if (v > hi) v = hi;                                                              \
            y[i] = (T)v;                                                                     \
        }                                                                                    \
    }
INT_CLAMP(I32, int)
INT_CLAMP(I64, i64)
INT_CLAMP(U8, u8)

// Bools (0/1 bytes): maximum is or, minimum is and.
INT_BINARY(maximum, BOOL, u8, u8, ((x | z) ? 1 : 0))
INT_BINARY(minimum, BOOL, u8, u8, ((x & z) ? 1 : 0))

// Writes to `address` (outside every allocation): the device-fault tests'
// way to lose the context as a broken kernel would
// (`CudaBackend::provoke_fault_for_tests`).
extern "C" __global__ void provoke_fault(u32* address) { rt_kernel_entry(); *(volatile u32*)address = 1; }

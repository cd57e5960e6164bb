/* crun/tensor.h — n-d tensors on the host: dtype, shape, strides, refcounted
 * 64-byte aligned storage shared by views. Include <crun.h>. */
#ifndef CRUN_TENSOR_H
#define CRUN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CRUN_MAX_DIMS 8

/* X(name, C-ish type name, element size) */
#define CRUN_DTYPE_MAP(X)        \
  X(FLOAT32, float32, 4)         \
  X(FLOAT64, float64, 8)         \
  X(FLOAT16, float16, 2)         \
  X(BFLOAT16, bfloat16, 2)       \
  X(INT32, int32, 4)             \
  X(INT64, int64, 8)             \
  X(UINT8, uint8, 1)             \
  X(INT8, int8, 1)               \
  X(INT16, int16, 2)             \
  X(BOOL, bool, 1)

typedef enum {
#define CRUN_X_DT(NAME, name, size) CRUN_##NAME,
  CRUN_DTYPE_MAP(CRUN_X_DT)
#undef CRUN_X_DT
  CRUN_DTYPE_COUNT
} crun_dtype_t;

/* Returns the element size in bytes / the name ("float32"); 0 / NULL if bad. */
size_t crun_dtype_size(crun_dtype_t dt);
const char *crun_dtype_name(crun_dtype_t dt);

/* Parses "float32" (also "float", "double", "half", "int", "long", "byte");
 * returns CRUN_EINVAL for unknown names. */
int crun_dtype_parse(const char *name, crun_dtype_t *out);

/* Returns non-zero for int32, int64, uint8, int8, int16 (not bool). */
int crun_dtype_is_integer(crun_dtype_t dt);

/* The values integer dtype dt holds, [*lo, *hi] (int64's for any other dtype). */
void crun_dtype_int_range(crun_dtype_t dt, int64_t *lo, int64_t *hi);

typedef struct crun_tensor crun_tensor_t;

/* Creates a contiguous zero-filled tensor of the given shape. */
int crun_tensor_new(crun_dtype_t dt, int ndim, const int64_t *shape, crun_tensor_t **out);

/* Takes / drops a reference; storage is freed when no tensor uses it. */
void crun_tensor_retain(crun_tensor_t *t);
void crun_tensor_release(crun_tensor_t *t);

crun_dtype_t crun_tensor_dtype(const crun_tensor_t *t);
int crun_tensor_ndim(const crun_tensor_t *t);
const int64_t *crun_tensor_shape(const crun_tensor_t *t);   /* ndim entries */
const int64_t *crun_tensor_strides(const crun_tensor_t *t); /* in elements */
int64_t crun_tensor_numel(const crun_tensor_t *t);
size_t crun_tensor_nbytes(const crun_tensor_t *t);          /* numel * elsize */
int crun_tensor_is_contiguous(const crun_tensor_t *t);

/* Returns the address of the first element (storage + offset). */
void *crun_tensor_data(const crun_tensor_t *t);

/* Returns 1 when t is contiguous in host memory, with its first element,
 * element count and dtype in the out parameters (what a collective on it
 * needs, in one call); else 0 and leaves them alone. */
int crun_tensor_host_span(const crun_tensor_t *t, void **data, size_t *count, crun_dtype_t *dt);

/* ---------------------------------------------------------------- creation
 * Shapes have 0..CRUN_MAX_DIMS dims, each >= 0 (a 0-d tensor holds one
 * element). Every function returning a tensor through `out` gives the caller
 * one reference. Dims and indices in the C API are 0-based. */

/* Creates a contiguous tensor with uninitialised elements. */
int crun_tensor_empty(crun_dtype_t dt, int ndim, const int64_t *shape, crun_tensor_t **out);

/* Creates a contiguous tensor holding a copy of `nbytes` bytes of row-major
 * elements at `data`; nbytes must equal numel * element size. */
int crun_tensor_from_data(crun_dtype_t dt, int ndim, const int64_t *shape, const void *data,
                          size_t nbytes, crun_tensor_t **out);

/* ---------------------------------------------------------------- views
 * Views share the storage of `t` (writes through a view change t). */

/* Narrows dim to [start, start + len). */
int crun_tensor_narrow(crun_tensor_t *t, int dim, int64_t start, int64_t len, crun_tensor_t **out);

/* Selects index `i` of `dim`, dropping that dim. */
int crun_tensor_select(crun_tensor_t *t, int dim, int64_t i, crun_tensor_t **out);

/* Reshapes a contiguous tensor; one entry of shape may be -1 (inferred).
 * CRUN_EINVAL when t is not contiguous or the element counts differ. */
int crun_tensor_view(crun_tensor_t *t, int ndim, const int64_t *shape, crun_tensor_t **out);

/* Swaps two dims (a strided view, not contiguous in general). */
int crun_tensor_transpose(crun_tensor_t *t, int d0, int d1, crun_tensor_t **out);

/* Views a dim of size 1 as `size` copies (stride 0): a read-only broadcast. */
int crun_tensor_expand(crun_tensor_t *t, int ndim, const int64_t *shape, crun_tensor_t **out);

/* Returns non-zero when a and b use the same storage. */
int crun_tensor_same_storage(const crun_tensor_t *a, const crun_tensor_t *b);

/* ---------------------------------------------------------------- copies */

/* Returns t itself (a new reference) when contiguous, else a contiguous copy. */
int crun_tensor_contiguous(crun_tensor_t *t, crun_tensor_t **out);

/* Returns a contiguous copy of t (with dtype dt; same dtype: pass t's). */
int crun_tensor_clone(crun_tensor_t *t, crun_tensor_t **out);
int crun_tensor_to(crun_tensor_t *t, crun_dtype_t dt, crun_tensor_t **out);

/* Copies src into dst element by element, converting dtypes (float -> int
 * truncates toward zero, and fails with CRUN_EINVAL, writing nothing, when a
 * value is nan, +-inf or out of the integer dtype's range; int -> narrower int
 * wraps, as torch's; 16-bit floats round to nearest even). Shapes must be
 * equal; src may be a view of dst only when both are the same elements. */
int crun_tensor_copy(crun_tensor_t *dst, crun_tensor_t *src);

/* Flushes denormal floats to zero (on) or not (off, the default) in the calling
 * thread's tensor math, as torch.set_flush_denormal. Returns 1 where the CPU
 * supports it (x86-64), 0 otherwise (and nothing changes). */
int crun_set_flush_denormal(int on);

/* Sets every element of t to v (converted to t's dtype). */
int crun_tensor_fill(crun_tensor_t *t, double v);

/* Sets every element of t to the integer v: exact in an int64 tensor past
 * 2^53, where a double rounds (integer dtypes wrap as a C cast, others
 * convert; on a GPU v goes through a double). */
int crun_tensor_fill_int64(crun_tensor_t *t, int64_t v);

/* Returns 1 when a and b have the same shape and values (any dtypes,
 * compared as doubles; nan never equals), else 0. */
int crun_tensor_equal(crun_tensor_t *a, crun_tensor_t *b);

/* Returns 1 when shapes match and |a - b| <= atol + rtol * |b| everywhere
 * (nan never close), else 0. */
int crun_tensor_allclose(crun_tensor_t *a, crun_tensor_t *b, double rtol, double atol);

/* Reads / writes one element at 0-based `idx` (ndim entries). Integer
 * dtypes keep all 64 bits through the int64 forms. */
int crun_tensor_get_double(const crun_tensor_t *t, const int64_t *idx, double *out);
int crun_tensor_set_double(crun_tensor_t *t, const int64_t *idx, double v);
int crun_tensor_get_int64(const crun_tensor_t *t, const int64_t *idx, int64_t *out);
int crun_tensor_set_int64(crun_tensor_t *t, const int64_t *idx, int64_t v);

/* Reads / writes element `i` (0-based) of a contiguous run of dtype dt. */
double crun_elem_get_double(crun_dtype_t dt, const void *base, int64_t i);
void crun_elem_set_double(crun_dtype_t dt, void *base, int64_t i, double v);
int64_t crun_elem_get_int64(crun_dtype_t dt, const void *base, int64_t i);
void crun_elem_set_int64(crun_dtype_t dt, void *base, int64_t i, int64_t v);

/* ---------------------------------------------------------------- random
 * xoshiro256** seeded through splitmix64: the same seed gives the same
 * numbers on every machine. Not thread-safe per generator. */
typedef struct { uint64_t s[4]; int has_spare; double spare; } crun_generator_t;

void crun_generator_seed(crun_generator_t *g, uint64_t seed);
uint64_t crun_generator_next(crun_generator_t *g);
double crun_generator_uniform(crun_generator_t *g);  /* [0, 1), 53 bits */
double crun_generator_normal(crun_generator_t *g);   /* N(0, 1), Box-Muller */

/* Fills t with uniform values in [lo, hi) / normal values (mean, std), in
 * row-major order; integer dtypes get floor of the uniform value. */
int crun_tensor_uniform_(crun_tensor_t *t, crun_generator_t *g, double lo, double hi);
int crun_tensor_normal_(crun_tensor_t *t, crun_generator_t *g, double mean, double std);


/* ---------------------------------------------------------------- math
 * Element-wise ops, reductions along a dim, BLAS products, indexing and
 * softmax. Float ops need float32 or float64 (CRUN_ENOTSUP for other dtypes,
 * named in the message); add/sub/mul/maximum/minimum and the comparisons also
 * take int32, int64, int16, int8 and uint8, and bool (add = or, mul/minimum =
 * and, maximum = or, the comparisons; not sub). Binary ops broadcast with numpy's rules. Each
 * `_out` form writes into an existing `out` of the result shape and dtype;
 * out may be an input (in-place). Functions returning `**out` give a new
 * tensor (one reference). Indices in index tensors are counted from `base`
 * (0 for C, 1 for Lua). */
#define CRUN_BINOP_MAP(X) \
  X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(POW, pow) X(MAXIMUM, maximum) \
  X(MINIMUM, minimum) X(EQ, eq) X(NE, ne) X(LT, lt) X(LE, le) X(GT, gt) X(GE, ge)

typedef enum {
#define CRUN_X_BIN(NAME, name) CRUN_BIN_##NAME,
  CRUN_BINOP_MAP(CRUN_X_BIN)
#undef CRUN_X_BIN
  CRUN_BINOP_COUNT
} crun_binop_t;

#define CRUN_UNOP_MAP(X) \
  X(NEG, neg) X(EXP, exp) X(LOG, log) X(TANH, tanh) X(SIGMOID, sigmoid) X(RELU, relu) \
  X(SQRT, sqrt) X(ABS, abs) X(SIN, sin) X(COS, cos) X(FLOOR, floor) X(CEIL, ceil)   \
  X(ROUND, round) X(SIGN, sign) X(RECIPROCAL, reciprocal) X(SQUARE, square)          \
  X(LOG1P, log1p) X(EXPM1, expm1) X(RSQRT, rsqrt)

typedef enum {
#define CRUN_X_UN(NAME, name) CRUN_UN_##NAME,
  CRUN_UNOP_MAP(CRUN_X_UN)
#undef CRUN_X_UN
  CRUN_UNOP_COUNT
} crun_unop_t;

/* Returns the name ("add", "exp") of an op; NULL if bad. Parses a name. */
const char *crun_binop_name(crun_binop_t op);
const char *crun_unop_name(crun_unop_t op);
int crun_binop_parse(const char *name, crun_binop_t *out);
int crun_unop_parse(const char *name, crun_unop_t *out);

/* out = a op b, broadcast; comparisons give bool (as torch's). */
int crun_tensor_binop(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out);
int crun_tensor_binop_out(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t *out);

/* out = a op s, or s op a when `reverse`. Integer tensors need an integral s. */
int crun_tensor_binop_scalar(crun_binop_t op, crun_tensor_t *a, double s, int reverse,
                             crun_tensor_t **out);
int crun_tensor_binop_scalar_out(crun_binop_t op, crun_tensor_t *a, double s, int reverse,
                                 crun_tensor_t *out);

/* torch's floor_divide (a // b, rounding toward -inf; also div with
 * rounding_mode="floor"), remainder (a % b, the sign of b), fmod (the sign
 * of a) and div with rounding_mode="trunc" (toward 0). */
#define CRUN_DIVMOD_MAP(X) X(FLOOR_DIVIDE, floor_divide) X(REMAINDER, remainder) X(FMOD, fmod) X(DIV_TRUNC, div_trunc)

typedef enum {
#define CRUN_X_DM(NAME, name) CRUN_DIVMOD_##NAME,
  CRUN_DIVMOD_MAP(CRUN_X_DM)
#undef CRUN_X_DM
  CRUN_DIVMOD_COUNT
} crun_divmod_t;

/* out = a op b, broadcast, in the dtype of a and b (which must match): on
 * integers exact (wrapping as torch's: INT64_MIN // -1 is INT64_MIN), a zero
 * divisor CRUN_EINVAL; on float32 / float64 with torch's formulas (x // 0 is
 * inf or nan, x % 0 nan). Host tensors only (CRUN_ENOTSUP on a device). */
int crun_tensor_divmod(crun_divmod_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out);

/* out = cond ? a : b element by element (torch.where): cond is a bool (or
 * uint8: non-zero is true) tensor, a and b share one dtype, the result has
 * theirs; the three broadcast with numpy's rules. A select, not arithmetic:
 * the picked elements are copied bit for bit (inf and nan stay). Host
 * tensors only (CRUN_ENOTSUP on a device). */
int crun_tensor_where(crun_tensor_t *cond, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out);

/* out = f(a) element-wise. */
int crun_tensor_unop(crun_unop_t op, crun_tensor_t *a, crun_tensor_t **out);
int crun_tensor_unop_out(crun_unop_t op, crun_tensor_t *a, crun_tensor_t *out);

/* out = min(max(a, lo), hi); pass -INFINITY / INFINITY for one side. A nan
 * element stays nan; lo > hi or a nan bound is CRUN_EINVAL. */
int crun_tensor_clamp(crun_tensor_t *a, double lo, double hi, crun_tensor_t **out);
int crun_tensor_clamp_out(crun_tensor_t *a, double lo, double hi, crun_tensor_t *out);

#define CRUN_DIMRED_MAP(X) X(SUM, sum) X(MEAN, mean) X(PROD, prod) X(MAX, max) X(MIN, min)
typedef enum {
#define CRUN_X_DR(NAME, name) CRUN_DIMRED_##NAME,
  CRUN_DIMRED_MAP(CRUN_X_DR)
#undef CRUN_X_DR
  CRUN_DIMRED_COUNT
} crun_dimred_t;

/* Reduces `dim` (0-based; -1 = every element, giving a 0-d tensor). Sums and
 * products of integer dtypes give int64, mean needs a float dtype. For MAX /
 * MIN, `indices` (nullable) receives int64 positions counted from `base`
 * (the first of equal values; nan wins). keepdim keeps dim with size 1.
 * Over an empty dim: sum 0, prod 1, mean nan (0/0, as torch's); max and min
 * fail with CRUN_EINVAL (no identity). */
int crun_tensor_reduce_dim(crun_dimred_t op, crun_tensor_t *a, int dim, int keepdim, int64_t base,
                           crun_tensor_t **values, crun_tensor_t **indices);

/* Running sums (op CRUN_DIMRED_SUM) or products (CRUN_DIMRED_PROD) along
 * `dim` (0-based; -1 for a 0-d tensor): torch's cumsum / cumprod, in the
 * shape of a. Integer and bool dtypes accumulate in (and give) int64,
 * floats accumulate in double. Host tensors only. */
int crun_tensor_cumulate(crun_dimred_t op, crun_tensor_t *a, int dim, crun_tensor_t **out);

/* torch's sort along `dim` (0-based; -1 for a 0-d tensor): *values holds
 * each slice ordered ascending (descending when `descending`), nan the
 * largest, equal values in their original order (torch's stable=True);
 * *indices (int64) their positions counted from `base`. Host tensors only. */
int crun_tensor_sort(crun_tensor_t *a, int dim, int descending, int64_t base, crun_tensor_t **values,
                     crun_tensor_t **indices);

/* C = alpha * op(A) op(B) + beta * C for 2-d float tensors of one dtype,
 * op(X) = X or X^T; C must not overlap A or B. Uses OpenBLAS gemm. */
int crun_tensor_gemm(int trans_a, int trans_b, double alpha, crun_tensor_t *A, crun_tensor_t *B,
                     double beta, crun_tensor_t *C);

/* Matrix products: 1-d x 1-d (dot, 0-d result), 2-d x 1-d, 1-d x 2-d,
 * 2-d x 2-d, 3-d x 3-d (batched) and 3-d x 2-d. */
int crun_tensor_matmul(crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out);

/* out = x W^T + b (b nullable) for x [N, in] or [in], W [out, in], b [out]. */
int crun_tensor_linear(crun_tensor_t *x, crun_tensor_t *W, crun_tensor_t *b, crun_tensor_t **out);

/* Picks entries `index` (1-d int32/int64) along dim: out has dim sized
 * numel(index). Any dtype. */
int crun_tensor_index_select(crun_tensor_t *a, int dim, crun_tensor_t *index, int64_t base,
                             crun_tensor_t **out);

/* out[i][j] = a[i][index[i][j]] along dim (torch.gather); index has a's
 * ndim and no larger dims elsewhere. scatter_add_: a[..index..] += src (src may
 * share a's storage: it is then read from a copy). */
int crun_tensor_gather(crun_tensor_t *a, int dim, crun_tensor_t *index, int64_t base,
                       crun_tensor_t **out);
int crun_tensor_scatter_add_(crun_tensor_t *a, int dim, crun_tensor_t *index, crun_tensor_t *src,
                             int64_t base);

/* Softmax / log-softmax along dim, numerically stable (max subtracted). */
int crun_tensor_softmax(crun_tensor_t *a, int dim, int log, crun_tensor_t **out);

/* Advances the splitmix64 stream *state and returns its next value. */
uint64_t crun_splitmix64_next(uint64_t *state);

/* ---------------------------------------------------------------- reductions
 * The element-wise kernels every backend shares. AVG reduces as SUM; the
 * caller divides once at the end (crun_scale_div). Bitwise ops on float dtypes
 * fail with CRUN_EINVAL. float16/bfloat16 are computed in float32 and rounded
 * (round-to-nearest-even) once per call. MIN / MAX propagate nan; integer
 * SUM / PRODUCT wrap around on overflow. bool (bytes 0 / 1) reduces as torch
 * does: SUM and MAX are logical or, PRODUCT and MIN logical and; AVG on bool
 * is CRUN_EINVAL. */
#define CRUN_REDUCE_OP_MAP(X) \
  X(SUM, sum) X(PRODUCT, product) X(MIN, min) X(MAX, max) X(AVG, avg) \
  X(BAND, band) X(BOR, bor) X(BXOR, bxor) X(PREMUL_SUM, premul_sum)

typedef enum {
#define CRUN_X_OP(NAME, name) CRUN_OP_##NAME,
  CRUN_REDUCE_OP_MAP(CRUN_X_OP)
#undef CRUN_X_OP
  CRUN_OP_COUNT
} crun_reduce_op_t;

/* Parses "sum" (case-insensitive; also "SUM", "prod"); CRUN_EINVAL otherwise. */
int crun_reduce_op_parse(const char *name, crun_reduce_op_t *out);
const char *crun_reduce_op_name(crun_reduce_op_t op);

/* Returns 0 when op is defined on dt, else CRUN_EINVAL with a message
 * ("bxor is only defined on integer dtypes, got float32"). */
int crun_reduce_op_check(crun_dtype_t dt, crun_reduce_op_t op);

/* dst[i] = dst[i] op src[i], i < n. dst == src is allowed. */
int crun_reduce_into(crun_dtype_t dt, crun_reduce_op_t op, void *dst, const void *src, size_t n);

/* dst[i] = a[i] op b[i]; dst may alias a or b. */
int crun_reduce3(crun_dtype_t dt, crun_reduce_op_t op, void *dst, const void *a,
                 const void *b, size_t n);

/* dst[i] = srcs[0][i] op srcs[1][i] op ... (nsrc >= 1), accumulating
 * float16/bfloat16 in float32 and rounding once; dst may alias any src. */
int crun_reduce_n(crun_dtype_t dt, crun_reduce_op_t op, void *dst,
                  const void *const *srcs, int nsrc, size_t n);

/* PREMUL_SUM (torch's make_premul_sum): every input multiplied by a factor,
 * then summed; floating dtypes only. The kernels above refuse it: the process
 * group scales copies of the inputs with crun_scale_mul and sums those. */

/* dst[i] = src[i] * f in the dtype's precision (float16/bfloat16 through
 * float32, rounded once); floating dtypes only. dst may equal src. */
int crun_scale_mul(crun_dtype_t dt, void *dst, const void *src, size_t n, double f);

/* data[i] /= d (integers: truncating division), for AVG. */
int crun_scale_div(crun_dtype_t dt, void *data, size_t n, double d);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_TENSOR_H */

/* elementwise.c — element-wise binary and unary ops with broadcasting.
 * Kernels are specialised per (dtype, op) by macros and run over contiguous
 * runs in fixed blocks that the compiler vectorises; the drivers turn any
 * strided or broadcast operands into such runs first. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VB 32

/* Runs STMT (which uses i) for i < n: full blocks vectorised, then a tail. */
#define VLOOP(n, STMT)                                                         \
  do {                                                                         \
    size_t i_ = 0;                                                             \
    for (; i_ + VB <= (n); i_ += VB) {                                         \
      _Pragma("GCC ivdep") for (size_t i = i_; i < i_ + VB; i++) { STMT; }     \
    }                                                                          \
    for (size_t i = i_; i < (n); i++) { STMT; }                                \
  } while (0)

/* Float math by type, so that float32 stays in float32. */
#define MATHFN(fn)                                                             \
  static inline float m_##fn##_f32(float x) { return fn##f(x); }               \
  static inline double m_##fn##_f64(double x) { return fn(x); }
MATHFN(exp) MATHFN(log) MATHFN(tanh) MATHFN(sqrt) MATHFN(fabs) MATHFN(sin) MATHFN(cos)
MATHFN(floor) MATHFN(ceil) MATHFN(nearbyint) MATHFN(log1p) MATHFN(expm1)
static inline float m_pow_f32(float x, float y) { return powf(x, y); }
static inline double m_pow_f64(double x, double y) { return pow(x, y); }

/* Binary expressions on x, y of type T computed in U (wrapping integers). */
#define E_ADD(tn, T, U, x, y) ((T)((U)(x) + (U)(y)))
#define E_SUB(tn, T, U, x, y) ((T)((U)(x) - (U)(y)))
#define E_MUL(tn, T, U, x, y) ((T)((U)(x) * (U)(y)))
#define E_DIV(tn, T, U, x, y) ((x) / (y))
#define E_POW(tn, T, U, x, y) m_pow_##tn(x, y)
#define E_MAXIMUM(tn, T, U, x, y) ((x) != (x) ? (x) : ((y) > (x) || (y) != (y)) ? (y) : (x))
#define E_MINIMUM(tn, T, U, x, y) ((x) != (x) ? (x) : ((y) < (x) || (y) != (y)) ? (y) : (x))
#define E_EQ(tn, T, U, x, y) ((uint8_t)((x) == (y)))
#define E_NE(tn, T, U, x, y) ((uint8_t)((x) != (y)))
#define E_LT(tn, T, U, x, y) ((uint8_t)((x) < (y)))
#define E_LE(tn, T, U, x, y) ((uint8_t)((x) <= (y)))
#define E_GT(tn, T, U, x, y) ((uint8_t)((x) > (y)))
#define E_GE(tn, T, U, x, y) ((uint8_t)((x) >= (y)))

typedef void (*bin_fn)(void *o, const void *a, const void *b, size_t n);

/* vv: o = a op b; vs: o = a op b[0]; sv: o = b[0] op a. */
#define BIN(tn, T, U, opn, OT, E)                                              \
  static void bvv_##tn##_##opn(void *ov, const void *av, const void *bv, size_t n) { \
    OT *o = ov;                                                                \
    const T *a = av, *b = bv;                                                  \
    VLOOP(n, o[i] = E(tn, T, U, a[i], b[i]));                                  \
  }                                                                            \
  static void bvs_##tn##_##opn(void *ov, const void *av, const void *bv, size_t n) { \
    OT *o = ov;                                                                \
    const T *a = av, s = *(const T *)bv;                                       \
    VLOOP(n, o[i] = E(tn, T, U, a[i], s));                                     \
  }                                                                            \
  static void bsv_##tn##_##opn(void *ov, const void *av, const void *bv, size_t n) { \
    OT *o = ov;                                                                \
    const T *a = av, s = *(const T *)bv;                                       \
    VLOOP(n, o[i] = E(tn, T, U, s, a[i]));                                     \
  }

#define BIN_COMMON(tn, T, U)                                                   \
  BIN(tn, T, U, add, T, E_ADD) BIN(tn, T, U, sub, T, E_SUB)                    \
  BIN(tn, T, U, mul, T, E_MUL) BIN(tn, T, U, maximum, T, E_MAXIMUM)            \
  BIN(tn, T, U, minimum, T, E_MINIMUM) BIN(tn, T, U, eq, uint8_t, E_EQ)        \
  BIN(tn, T, U, ne, uint8_t, E_NE) BIN(tn, T, U, lt, uint8_t, E_LT)            \
  BIN(tn, T, U, le, uint8_t, E_LE) BIN(tn, T, U, gt, uint8_t, E_GT)            \
  BIN(tn, T, U, ge, uint8_t, E_GE)

BIN_COMMON(f32, float, float)
BIN_COMMON(f64, double, double)
BIN_COMMON(i32, int32_t, uint32_t)
BIN_COMMON(i64, int64_t, uint64_t)
BIN_COMMON(u8, uint8_t, unsigned)
BIN_COMMON(i8, int8_t, unsigned)
BIN_COMMON(i16, int16_t, unsigned)
/* bool with bool, as torch's: add is or (mul, maximum and minimum on 0/1 are
 * already and, or and and); sub stays unsupported. */
#define E_OR(tn, T, U, x, y) ((uint8_t)((x) | (y)))
BIN(b8, uint8_t, unsigned, add, uint8_t, E_OR)
BIN(f32, float, float, div, float, E_DIV)
BIN(f64, double, double, div, double, E_DIV)
BIN(f32, float, float, pow, float, E_POW)
BIN(f64, double, double, pow, double, E_POW)

#define BE(tn, opn) {bvv_##tn##_##opn, bvs_##tn##_##opn, bsv_##tn##_##opn}
#define BIN_ROW_COMMON(tn)                                                     \
  [CRUN_BIN_ADD] = BE(tn, add), [CRUN_BIN_SUB] = BE(tn, sub), [CRUN_BIN_MUL] = BE(tn, mul), \
  [CRUN_BIN_MAXIMUM] = BE(tn, maximum), [CRUN_BIN_MINIMUM] = BE(tn, minimum),  \
  [CRUN_BIN_EQ] = BE(tn, eq), [CRUN_BIN_NE] = BE(tn, ne), [CRUN_BIN_LT] = BE(tn, lt), \
  [CRUN_BIN_LE] = BE(tn, le), [CRUN_BIN_GT] = BE(tn, gt), [CRUN_BIN_GE] = BE(tn, ge)

static const bin_fn bin_table[CRUN_DTYPE_COUNT][CRUN_BINOP_COUNT][3] = {
    [CRUN_FLOAT32] = {BIN_ROW_COMMON(f32), [CRUN_BIN_DIV] = BE(f32, div), [CRUN_BIN_POW] = BE(f32, pow)},
    [CRUN_FLOAT64] = {BIN_ROW_COMMON(f64), [CRUN_BIN_DIV] = BE(f64, div), [CRUN_BIN_POW] = BE(f64, pow)},
    [CRUN_INT32] = {BIN_ROW_COMMON(i32)},
    [CRUN_INT64] = {BIN_ROW_COMMON(i64)},
    [CRUN_UINT8] = {BIN_ROW_COMMON(u8)},
    [CRUN_INT8] = {BIN_ROW_COMMON(i8)},
    [CRUN_INT16] = {BIN_ROW_COMMON(i16)},
    [CRUN_BOOL] = {[CRUN_BIN_ADD] = BE(b8, add), [CRUN_BIN_MUL] = BE(u8, mul), [CRUN_BIN_MAXIMUM] = BE(u8, maximum),
                   [CRUN_BIN_MINIMUM] = BE(u8, minimum), [CRUN_BIN_EQ] = BE(u8, eq), [CRUN_BIN_NE] = BE(u8, ne),
                   [CRUN_BIN_LT] = BE(u8, lt), [CRUN_BIN_LE] = BE(u8, le), [CRUN_BIN_GT] = BE(u8, gt),
                   [CRUN_BIN_GE] = BE(u8, ge)},
};

/* Unary expressions on x for float type tn. */
#define U_NEG(tn, T, x) (-(x))
#define U_EXP(tn, T, x) m_exp_##tn(x)
#define U_LOG(tn, T, x) m_log_##tn(x)
#define U_TANH(tn, T, x) m_tanh_##tn(x)
#define U_SIGMOID(tn, T, x) ((T)1 / ((T)1 + m_exp_##tn(-(x))))
#define U_RELU(tn, T, x) ((x) < 0 ? (T)0 : (x))
#define U_SQRT(tn, T, x) m_sqrt_##tn(x)
#define U_ABS(tn, T, x) m_fabs_##tn(x)
#define U_SIN(tn, T, x) m_sin_##tn(x)
#define U_COS(tn, T, x) m_cos_##tn(x)
#define U_FLOOR(tn, T, x) m_floor_##tn(x)
#define U_CEIL(tn, T, x) m_ceil_##tn(x)
#define U_ROUND(tn, T, x) m_nearbyint_##tn(x)
#define U_SIGN(tn, T, x) ((x) != (x) ? (x) : (T)(((x) > 0) - ((x) < 0)))
#define U_RECIPROCAL(tn, T, x) ((T)1 / (x))
#define U_SQUARE(tn, T, x) ((x) * (x))
#define U_LOG1P(tn, T, x) m_log1p_##tn(x)
#define U_EXPM1(tn, T, x) m_expm1_##tn(x)
#define U_RSQRT(tn, T, x) ((T)1 / m_sqrt_##tn(x))

typedef void (*un_fn)(void *o, const void *a, size_t n);

#define UN(tn, T, NAME, name)                                                  \
  static void un_##tn##_##name(void *ov, const void *av, size_t n) {          \
    T *o = ov;                                                                 \
    const T *a = av;                                                           \
    VLOOP(n, o[i] = U_##NAME(tn, T, a[i]));                                    \
  }
#define UN_F32(NAME, name) UN(f32, float, NAME, name)
#define UN_F64(NAME, name) UN(f64, double, NAME, name)
CRUN_UNOP_MAP(UN_F32)
CRUN_UNOP_MAP(UN_F64)
#define UE_F32(NAME, name) [CRUN_UN_##NAME] = un_f32_##name,
#define UE_F64(NAME, name) [CRUN_UN_##NAME] = un_f64_##name,
static const un_fn un_table[CRUN_DTYPE_COUNT][CRUN_UNOP_COUNT] = {
    [CRUN_FLOAT32] = {CRUN_UNOP_MAP(UE_F32)},
    [CRUN_FLOAT64] = {CRUN_UNOP_MAP(UE_F64)},
};

#define CLAMP(tn, T)                                                           \
  static void clamp_##tn(void *ov, const void *av, size_t n, double lo, double hi) { \
    T *o = ov;                                                                 \
    const T *a = av, l = (T)lo, h = (T)hi;                                     \
    VLOOP(n, o[i] = a[i] < l ? l : (a[i] > h ? h : a[i]));                     \
  }
CLAMP(f32, float)
CLAMP(f64, double)

/* ------------------------------------------------------------ names */

const char *crun_binop_name(crun_binop_t op) {
  switch (op) {
#define CRUN_X_BN(NAME, name) case CRUN_BIN_##NAME: return #name;
    CRUN_BINOP_MAP(CRUN_X_BN)
#undef CRUN_X_BN
    default: return NULL;
  }
}

const char *crun_unop_name(crun_unop_t op) {
  switch (op) {
#define CRUN_X_UNN(NAME, name) case CRUN_UN_##NAME: return #name;
    CRUN_UNOP_MAP(CRUN_X_UNN)
#undef CRUN_X_UNN
    default: return NULL;
  }
}

int crun_binop_parse(const char *name, crun_binop_t *out) {
  for (int i = 0; name && i < CRUN_BINOP_COUNT; i++)
    if (strcmp(name, crun_binop_name((crun_binop_t)i)) == 0) return *out = (crun_binop_t)i, 0;
  return crun_error(CRUN_EINVAL, "unknown binary op '%s'", name ? name : "(null)");
}

int crun_unop_parse(const char *name, crun_unop_t *out) {
  for (int i = 0; name && i < CRUN_UNOP_COUNT; i++)
    if (strcmp(name, crun_unop_name((crun_unop_t)i)) == 0) return *out = (crun_unop_t)i, 0;
  return crun_error(CRUN_EINVAL, "unknown unary op '%s'", name ? name : "(null)");
}

/* ------------------------------------------------------------ drivers */

static int is_cmp(crun_binop_t op) { return op >= CRUN_BIN_EQ; }

/* The dtype of a op b for an a of dtype dt: bool for a comparison (torch's). */
static crun_dtype_t result_dtype(crun_binop_t op, crun_dtype_t dt) { return is_cmp(op) ? CRUN_BOOL : dt; }

static int same_shape(int nd, const int64_t *s, const crun_tensor_t *t) {
  return nd == t->ndim && memcmp(s, t->shape, (size_t)nd * sizeof *s) == 0;
}

/* Computes the broadcast shape of shapes sa (na dims) and sb (nb dims), numpy rules. */
static int broadcast_dims(const char *what, int na, const int64_t *sa, int nb, const int64_t *sb,
                          int *nd, int64_t *shape) {
  int n = na > nb ? na : nb;
  int64_t r[CRUN_MAX_DIMS];
  for (int d = n - 1, da = na - 1, db = nb - 1; d >= 0; d--, da--, db--) {
    int64_t x = da >= 0 ? sa[da] : 1, y = db >= 0 ? sb[db] : 1;
    if (x != y && x != 1 && y != 1) {
      char s1[128], s2[128];
      return crun_error(CRUN_EINVAL, "%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)",
                        what, crun__shape_str(na, sa, s1, sizeof s1), crun__shape_str(nb, sb, s2, sizeof s2),
                        d + 1, (long long)x, (long long)y);
    }
    r[d] = x == 1 ? y : x;
  }
  memcpy(shape, r, (size_t)n * sizeof *r);
  *nd = n;
  return 0;
}

/* Computes the broadcast shape of a and b (numpy rules). */
static int broadcast_shape(const char *what, const crun_tensor_t *a, const crun_tensor_t *b,
                           int *nd, int64_t *shape) {
  return broadcast_dims(what, a->ndim, a->shape, b->ndim, b->shape, nd, shape);
}

/* Returns a contiguous tensor holding t broadcast to shape (t itself when
 * it already is). */
static int materialize(crun_tensor_t *t, int nd, const int64_t *shape, crun_tensor_t **out) {
  if (same_shape(nd, shape, t)) return crun_tensor_contiguous(t, out);
  crun_tensor_t *e;
  CRUN_CHECK(crun_tensor_expand(t, nd, shape, &e));
  int rc = crun_tensor_clone(e, out);
  crun_tensor_release(e);
  return rc;
}

/* Non-zero when b, left-padded with 1s, is 1s followed by shape's trailing
 * dims: then b repeats every numel(b) elements of the result. */
static int is_trailing_block(const crun_tensor_t *b, int nd, const int64_t *shape) {
  int lead = 1;
  for (int d = 0, db = d - (nd - b->ndim); d < nd; d++, db++) {
    int64_t y = db >= 0 ? b->shape[db] : 1;
    if (lead && y == 1 && shape[d] != 1) continue;
    lead = 0;
    if (y != shape[d]) return 0;
  }
  return 1;
}

/* Whether contiguous x and contiguous o share bytes without being the same
 * elements: a kernel writing o while it reads x would then read results
 * instead of inputs (x[2..n] += x[1..n-1], or x += x[1] where the row is
 * reread for every row of o). */
static int partial_overlap(const crun_tensor_t *x, const crun_tensor_t *o) {
  if (x->st != o->st) return 0;
  const char *x0 = crun_tensor_data(x), *o0 = crun_tensor_data(o);
  const char *x1 = x0 + (size_t)crun_tensor_numel(x) * crun_dtype_size(x->dt);
  const char *o1 = o0 + (size_t)crun_tensor_numel(o) * crun_dtype_size(o->dt);
  if (x1 <= o0 || o1 <= x0) return 0;
  return !(x0 == o0 && x1 == o1);
}

/* Replaces *x (one reference, owned) by a copy when it partially overlaps o. */
static int unalias(crun_tensor_t **x, const crun_tensor_t *o) {
  if (!partial_overlap(*x, o)) return 0;
  crun_tensor_t *c;
  CRUN_CHECK(crun_tensor_clone(*x, &c));
  crun_tensor_release(*x);
  *x = c;
  return 0;
}

/* Output target: out itself when contiguous, else a temporary copied back. */
static int begin_out(crun_tensor_t *out, crun_tensor_t **tmp) {
  if (crun_tensor_is_contiguous(out)) {
    crun_tensor_retain(out);
    *tmp = out;
    return 0;
  }
  return crun_tensor_empty(out->dt, out->ndim, out->shape, tmp);
}

static int end_out(crun_tensor_t *out, crun_tensor_t *tmp, int rc) {
  if (rc == 0 && tmp != out) rc = crun_tensor_copy(out, tmp);
  crun_tensor_release(tmp);
  return rc;
}

static int check_out(const char *what, crun_tensor_t *out, crun_dtype_t dt, int nd, const int64_t *shape) {
  char s1[128], s2[128];
  CRUN_CHECK(crun__check_writable(out, what));
  if (out->dt != dt)
    return crun_error(CRUN_EINVAL, "%s: output has dtype %s, expected %s", what,
                      crun_dtype_name(out->dt), crun_dtype_name(dt));
  if (!same_shape(nd, shape, out))
    return crun_error(CRUN_EINVAL, "%s: output has shape %s, expected %s", what,
                      crun__shape_str(out->ndim, out->shape, s1, sizeof s1),
                      crun__shape_str(nd, shape, s2, sizeof s2));
  return 0;
}

static int check_bin(crun_binop_t op, crun_dtype_t dt) {
  if ((unsigned)op >= CRUN_BINOP_COUNT) return crun_error(CRUN_EINVAL, "bad binary op %d", (int)op);
  if (!bin_table[dt][op][0])
    return crun_error(CRUN_ENOTSUP, "%s is not supported on %s tensors (convert with :float() or :double())",
                      crun_binop_name(op), crun_dtype_name(dt));
  return 0;
}

/* Runs the kernel over contiguous A, B into O (B full, a row block or one value). */
static void run_bin(bin_fn const *k, crun_tensor_t *O, crun_tensor_t *A, crun_tensor_t *B) {
  size_t n = (size_t)crun_tensor_numel(O), p = (size_t)crun_tensor_numel(B);
  size_t ea = crun_dtype_size(A->dt), eo = crun_dtype_size(O->dt);
  char *o = crun_tensor_data(O), *a = crun_tensor_data(A), *b = crun_tensor_data(B);
  if (p == n) k[0](o, a, b, n);
  else if (p == 1) k[1](o, a, b, n);
  else
    for (size_t r = 0; r < n / p; r++) k[0](o + r * p * eo, a + r * p * ea, b, p);
}

int crun_tensor_binop_out(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t *out) {
  const char *what = crun_binop_name(op) ? crun_binop_name(op) : "binop";
  if (a->dt != b->dt)
    return crun_error(CRUN_EINVAL, "%s: dtype mismatch, %s and %s (convert one with :to())", what,
                      crun_dtype_name(a->dt), crun_dtype_name(b->dt));
  CRUN_CHECK(check_bin(op, a->dt));
  int nd;
  int64_t shape[CRUN_MAX_DIMS];
  CRUN_CHECK(broadcast_shape(what, a, b, &nd, shape));
  CRUN_CHECK(check_out(what, out, result_dtype(op, a->dt), nd, shape));
  if (crun_tensor_numel(out) == 0) return 0;
  /* -1 (host) on every side keeps the AND negative: one branch */
  if (__builtin_expect((a->st->device & b->st->device & out->st->device) >= 0, 0)) return crun__dev_binop(op, a, b, out);
  crun_tensor_t *A = NULL, *B = NULL, *O = NULL;
  int rc;
  int b_block = !same_shape(nd, shape, b) && is_trailing_block(b, nd, shape);
  CRUN_CHECK_GOTO(materialize(a, nd, shape, &A), rc, done);
  CRUN_CHECK_GOTO(b_block ? crun_tensor_contiguous(b, &B) : materialize(b, nd, shape, &B), rc, done);
  CRUN_CHECK_GOTO(begin_out(out, &O), rc, done);
  CRUN_CHECK_GOTO(unalias(&A, O), rc, done);
  CRUN_CHECK_GOTO(unalias(&B, O), rc, done);
  run_bin(bin_table[a->dt][op], O, A, B);
  rc = end_out(out, O, 0);
  O = NULL;
done:
  crun_tensor_release(A);
  crun_tensor_release(B);
  crun_tensor_release(O);
  return rc;
}

int crun_tensor_binop(crun_binop_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  int nd;
  int64_t shape[CRUN_MAX_DIMS];
  CRUN_CHECK(broadcast_shape(crun_binop_name(op) ? crun_binop_name(op) : "binop", a, b, &nd, shape));
  CRUN_CHECK(crun_tensor_empty_on(result_dtype(op, a->dt), nd, shape, a->st->device, out));
  int rc = crun_tensor_binop_out(op, a, b, *out);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

/* Converts s to one element of dt; integer dtypes need an integral s in range. */
static int scalar_of(const char *what, crun_dtype_t dt, double s, void *buf) {
  if (crun_dtype_is_integer(dt)) {
    double lo = dt == CRUN_UINT8 ? 0 : dt == CRUN_INT8 ? -128.0 : dt == CRUN_INT16 ? -32768.0
              : dt == CRUN_INT32 ? -2147483648.0 : -9223372036854775808.0;
    double hi = dt == CRUN_UINT8 ? 255 : dt == CRUN_INT8 ? 127.0 : dt == CRUN_INT16 ? 32767.0
              : dt == CRUN_INT32 ? 2147483647.0 : 9223372036854774784.0;
    if (s != floor(s))
      return crun_error(CRUN_ENOTSUP, "%s: %s tensor with non-integral scalar %g (convert with :double())",
                        what, crun_dtype_name(dt), s);
    if (s < lo || s > hi) return crun_error(CRUN_ERANGE, "%s: scalar %g out of range for %s", what, s, crun_dtype_name(dt));
  }
  crun_elem_set_double(dt, buf, 0, s);
  return 0;
}

int crun_tensor_binop_scalar_out(crun_binop_t op, crun_tensor_t *a, double s, int reverse,
                                 crun_tensor_t *out) {
  const char *what = crun_binop_name(op) ? crun_binop_name(op) : "binop";
  CRUN_CHECK(check_bin(op, a->dt));
  CRUN_CHECK(check_out(what, out, result_dtype(op, a->dt), a->ndim, a->shape));
  _Alignas(8) unsigned char buf[8];
  CRUN_CHECK(scalar_of(what, a->dt, s, buf));
  if (crun_tensor_numel(a) == 0) return 0;
  if (__builtin_expect((a->st->device & out->st->device) >= 0, 0)) return crun__dev_binop_scalar(op, a, s, reverse, out);
  crun_tensor_t *A, *O;
  CRUN_CHECK(crun_tensor_contiguous(a, &A));
  int rc = begin_out(out, &O);
  if (rc == 0 && (rc = unalias(&A, O)) < 0) crun_tensor_release(O);
  if (rc == 0) {
    bin_table[a->dt][op][reverse ? 2 : 1](crun_tensor_data(O), crun_tensor_data(A), buf,
                                          (size_t)crun_tensor_numel(A));
    rc = end_out(out, O, 0);
  }
  crun_tensor_release(A);
  return rc;
}

int crun_tensor_binop_scalar(crun_binop_t op, crun_tensor_t *a, double s, int reverse,
                             crun_tensor_t **out) {
  CRUN_CHECK(check_bin(op, a->dt));
  CRUN_CHECK(crun_tensor_empty_on(result_dtype(op, a->dt), a->ndim, a->shape, a->st->device, out));
  int rc = crun_tensor_binop_scalar_out(op, a, s, reverse, *out);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

static int check_float(const char *what, crun_dtype_t dt) {
  if (dt != CRUN_FLOAT32 && dt != CRUN_FLOAT64)
    return crun_error(CRUN_ENOTSUP, "%s needs a float32 or float64 tensor, got %s (convert with :float())",
                      what, crun_dtype_name(dt));
  return 0;
}

/* Runs a same-shape unary step: contiguous input, output (maybe a temp). */
static int unary_drive(const char *what, crun_unop_t op, crun_tensor_t *a, crun_tensor_t *out, un_fn f,
                       void (*fc)(void *, const void *, size_t, double, double), double lo, double hi) {
  CRUN_CHECK(check_float(what, a->dt));
  CRUN_CHECK(check_out(what, out, a->dt, a->ndim, a->shape));
  if (crun_tensor_numel(a) == 0) return 0;
  if (__builtin_expect((a->st->device & out->st->device) >= 0, 0))
    return f ? crun__dev_unop(op, a, out) : crun__dev_clamp(a, lo, hi, out);
  crun_tensor_t *A, *O;
  CRUN_CHECK(crun_tensor_contiguous(a, &A));
  int rc = begin_out(out, &O);
  if (rc == 0 && (rc = unalias(&A, O)) < 0) crun_tensor_release(O);
  if (rc == 0) {
    size_t n = (size_t)crun_tensor_numel(A);
    if (f) f(crun_tensor_data(O), crun_tensor_data(A), n);
    else fc(crun_tensor_data(O), crun_tensor_data(A), n, lo, hi);
    rc = end_out(out, O, 0);
  }
  crun_tensor_release(A);
  return rc;
}

int crun_tensor_unop_out(crun_unop_t op, crun_tensor_t *a, crun_tensor_t *out) {
  if ((unsigned)op >= CRUN_UNOP_COUNT) return crun_error(CRUN_EINVAL, "bad unary op %d", (int)op);
  CRUN_CHECK(check_float(crun_unop_name(op), a->dt));
  return unary_drive(crun_unop_name(op), op, a, out, un_table[a->dt][op], NULL, 0, 0);
}

int crun_tensor_unop(crun_unop_t op, crun_tensor_t *a, crun_tensor_t **out) {
  if ((unsigned)op >= CRUN_UNOP_COUNT) return crun_error(CRUN_EINVAL, "bad unary op %d", (int)op);
  CRUN_CHECK(check_float(crun_unop_name(op), a->dt));
  CRUN_CHECK(crun_tensor_empty_on(a->dt, a->ndim, a->shape, a->st->device, out));
  int rc = crun_tensor_unop_out(op, a, *out);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

int crun_tensor_clamp_out(crun_tensor_t *a, double lo, double hi, crun_tensor_t *out) {
  if (lo != lo || hi != hi) /* (torch's result is nan everywhere; ignoring the bound would differ silently) */
    return crun_error(CRUN_EINVAL, "clamp: %s is nan", lo != lo ? "min" : "max");
  if (lo > hi) return crun_error(CRUN_EINVAL, "clamp: min %g > max %g", lo, hi);
  CRUN_CHECK(check_float("clamp", a->dt));
  return unary_drive("clamp", CRUN_UN_NEG, a, out, NULL, a->dt == CRUN_FLOAT32 ? clamp_f32 : clamp_f64, lo, hi);
}

int crun_tensor_clamp(crun_tensor_t *a, double lo, double hi, crun_tensor_t **out) {
  CRUN_CHECK(check_float("clamp", a->dt));
  CRUN_CHECK(crun_tensor_empty_on(a->dt, a->ndim, a->shape, a->st->device, out));
  int rc = crun_tensor_clamp_out(a, lo, hi, *out);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

/* ------------------------------------------------------------ divmod */

static const char *divmod_name(crun_divmod_t op) {
  static const char *names[] = {
#define CRUN_X_DM(NAME, name) #name,
      CRUN_DIVMOD_MAP(CRUN_X_DM)
#undef CRUN_X_DM
  };
  return (unsigned)op < CRUN_DIVMOD_COUNT ? names[op] : "divmod";
}

/* x op y on int64s (y != 0): the truncated quotient and remainder, moved
 * toward -inf when their signs call for it; y == -1 wraps INT64_MIN. */
static int64_t divmod_int(crun_divmod_t op, int64_t x, int64_t y) {
  int64_t q = y == -1 ? (int64_t)(0u - (uint64_t)x) : x / y, r = y == -1 ? 0 : x % y;
  if (op == CRUN_DIVMOD_FMOD) return r;
  if (op == CRUN_DIVMOD_DIV_TRUNC) return q;
  if (r != 0 && (r < 0) != (y < 0)) q -= 1, r += y;
  return op == CRUN_DIVMOD_FLOOR_DIVIDE ? q : r;
}

/* x op y in T (float or double), as torch's kernels compute them. */
#define DIVMOD_FLOAT(tn, T, FMOD, FLOOR, TRUNC)                                \
  static T divmod_##tn(crun_divmod_t op, T x, T y) {                           \
    if (op == CRUN_DIVMOD_DIV_TRUNC) return TRUNC(x / y);                      \
    T m = FMOD(x, y);                                                          \
    if (op == CRUN_DIVMOD_FMOD) return m;                                      \
    int adjust = m != 0 && (y < 0) != (m < 0);                                 \
    if (op == CRUN_DIVMOD_REMAINDER) return adjust ? m + y : m;                \
    if (y == 0) return x / y;                                                  \
    T q = (x - m) / y;                                                         \
    if (adjust) q -= 1;                                                        \
    if (q == 0) return copysign(0.0, (double)(x / y));                         \
    T f = FLOOR(q);                                                            \
    return q - f > (T)0.5 ? f + 1 : f;                                         \
  }
DIVMOD_FLOAT(f32, float, fmodf, floorf, truncf)
DIVMOD_FLOAT(f64, double, fmod, floor, trunc)

/* Runs op over contiguous A and B (the result's shape) into contiguous O. */
static int divmod_run(crun_divmod_t op, crun_tensor_t *A, crun_tensor_t *B, crun_tensor_t *O) {
  int64_t n = crun_tensor_numel(O);
  const void *a = crun_tensor_data(A), *b = crun_tensor_data(B);
  void *o = crun_tensor_data(O);
  for (int64_t i = 0; i < n; i++) {
    switch (O->dt) {
      case CRUN_FLOAT32: ((float *)o)[i] = divmod_f32(op, ((const float *)a)[i], ((const float *)b)[i]); break;
      case CRUN_FLOAT64: ((double *)o)[i] = divmod_f64(op, ((const double *)a)[i], ((const double *)b)[i]); break;
      default: {
        int64_t y = crun__elem_get_int64(O->dt, b, i);
        if (y == 0) return crun_error(CRUN_EINVAL, "%s: integer division by zero (element %lld)", divmod_name(op), (long long)i + 1);
        crun__elem_set_int64(O->dt, o, i, divmod_int(op, crun__elem_get_int64(O->dt, a, i), y));
      }
    }
  }
  return 0;
}

int crun_tensor_divmod(crun_divmod_t op, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  const char *what = divmod_name(op);
  if ((unsigned)op >= CRUN_DIVMOD_COUNT) return crun_error(CRUN_EINVAL, "bad divmod op %d", (int)op);
  if (a->dt != b->dt)
    return crun_error(CRUN_EINVAL, "%s: dtype mismatch, %s and %s (convert one with :to())", what,
                      crun_dtype_name(a->dt), crun_dtype_name(b->dt));
  if (!(crun_dtype_is_integer(a->dt) || a->dt == CRUN_FLOAT32 || a->dt == CRUN_FLOAT64))
    return crun_error(CRUN_ENOTSUP, "%s is not supported on %s tensors (convert with :float() or :double())", what,
                      crun_dtype_name(a->dt));
  if (a->st->device >= 0 || b->st->device >= 0)
    return crun_error(CRUN_ENOTSUP, "%s: not implemented for a tensor on cuda:%d (copy it to the host with :cpu() first)",
                      what, a->st->device >= 0 ? a->st->device : b->st->device);
  int nd;
  int64_t shape[CRUN_MAX_DIMS];
  CRUN_CHECK(broadcast_shape(what, a, b, &nd, shape));
  crun_tensor_t *A = NULL, *B = NULL, *O = NULL;
  int rc;
  CRUN_CHECK_GOTO(materialize(a, nd, shape, &A), rc, done);
  CRUN_CHECK_GOTO(materialize(b, nd, shape, &B), rc, done);
  CRUN_CHECK_GOTO(crun_tensor_empty(a->dt, nd, shape, &O), rc, done);
  CRUN_CHECK_GOTO(divmod_run(op, A, B, O), rc, done);
  *out = O;
  O = NULL;
done:
  crun_tensor_release(A);
  crun_tensor_release(B);
  crun_tensor_release(O);
  return rc;
}

/* ------------------------------------------------------------ where */

/* o[i] = c[i] ? a[i] : b[i] over n elements of T (a copy of the bits). */
#define WHERE_RUN(T, o, c, a, b, n)                                            \
  do {                                                                         \
    T *o_ = (T *)(o);                                                          \
    const T *a_ = (const T *)(a), *b_ = (const T *)(b);                        \
    VLOOP(n, o_[i] = (c)[i] ? a_[i] : b_[i]);                                  \
  } while (0)

/* Selects over contiguous C, A, B of the result's shape into contiguous O. */
static void where_run(crun_tensor_t *C, crun_tensor_t *A, crun_tensor_t *B, crun_tensor_t *O) {
  size_t n = (size_t)crun_tensor_numel(O);
  const uint8_t *c = crun_tensor_data(C);
  const void *a = crun_tensor_data(A), *b = crun_tensor_data(B);
  void *o = crun_tensor_data(O);
  switch (crun_dtype_size(O->dt)) {
    case 1: WHERE_RUN(uint8_t, o, c, a, b, n); break;
    case 2: WHERE_RUN(uint16_t, o, c, a, b, n); break;
    case 4: WHERE_RUN(uint32_t, o, c, a, b, n); break;
    default: WHERE_RUN(uint64_t, o, c, a, b, n); break;
  }
}

/* Validates where's operands: cond bool or uint8, a and b of one dtype, all on the host. */
static int where_check(const crun_tensor_t *cond, const crun_tensor_t *a, const crun_tensor_t *b) {
  if (cond->dt != CRUN_BOOL && cond->dt != CRUN_UINT8)
    return crun_error(CRUN_EINVAL, "where: the condition must be a bool tensor, got %s (compare, e.g. m:ne(0), "
                      "or convert with :bool())", crun_dtype_name(cond->dt));
  if (a->dt != b->dt)
    return crun_error(CRUN_EINVAL, "where: dtype mismatch, %s and %s (convert one with :to())",
                      crun_dtype_name(a->dt), crun_dtype_name(b->dt));
  const crun_tensor_t *ts[3] = {cond, a, b};
  for (int i = 0; i < 3; i++)
    if (ts[i]->st->device >= 0)
      return crun_error(CRUN_ENOTSUP, "where: not implemented for a tensor on cuda:%d (copy it to the host with "
                        ":cpu() first)", ts[i]->st->device);
  return 0;
}

int crun_tensor_where(crun_tensor_t *cond, crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  CRUN_CHECK(where_check(cond, a, b));
  int nd;
  int64_t shape[CRUN_MAX_DIMS];
  CRUN_CHECK(broadcast_shape("where", a, b, &nd, shape));
  CRUN_CHECK(broadcast_dims("where", cond->ndim, cond->shape, nd, shape, &nd, shape));
  crun_tensor_t *C = NULL, *A = NULL, *B = NULL, *O = NULL;
  int rc;
  CRUN_CHECK_GOTO(crun_tensor_empty(a->dt, nd, shape, &O), rc, done);
  if (crun_tensor_numel(O) > 0) {
    CRUN_CHECK_GOTO(materialize(cond, nd, shape, &C), rc, done);
    CRUN_CHECK_GOTO(materialize(a, nd, shape, &A), rc, done);
    CRUN_CHECK_GOTO(materialize(b, nd, shape, &B), rc, done);
    where_run(C, A, B, O);
  }
  *out = O;
  O = NULL;
done:
  crun_tensor_release(C);
  crun_tensor_release(A);
  crun_tensor_release(B);
  crun_tensor_release(O);
  return rc;
}

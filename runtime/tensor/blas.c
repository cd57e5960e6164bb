/* blas.c — gemm, matmul and linear on OpenBLAS. Strided operands whose rows
 * or columns are contiguous go to BLAS as they are (a transposed view is just
 * the other transpose flag); anything else is copied contiguous first. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"
#include "cuda/dispatch.h"

#include "tensor/blas_lib.h"
#include <string.h>

static int check_float2(const char *what, const crun_tensor_t *t, crun_dtype_t dt, const char *name) {
  if (t->dt != CRUN_FLOAT32 && t->dt != CRUN_FLOAT64)
    return crun_error(CRUN_ENOTSUP, "%s needs float32 or float64 tensors, %s is %s", what, name,
                      crun_dtype_name(t->dt));
  if (t->dt != dt)
    return crun_error(CRUN_EINVAL, "%s: dtype mismatch, %s is %s, expected %s", what, name,
                      crun_dtype_name(t->dt), crun_dtype_name(dt));
  return 0;
}

/* Finds how GEMM can read 2-d t: row-major (trans 0) or as the transpose of
 * a row-major matrix (trans 1), with leading dimension ld; -1 if neither.
 * Shared with the device GEMM (cuda/dispatch.c). */
int crun__gemm_layout(const crun_tensor_t *t, int *trans, int64_t *ld) {
  int64_t r = t->shape[0], c = t->shape[1], s0 = t->strides[0], s1 = t->strides[1];
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= (c > 1 ? c : 1))) {
    *trans = 0;
    *ld = r <= 1 ? (c > 1 ? c : 1) : s0;
    return 0;
  }
  if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= (r > 1 ? r : 1))) {
    *trans = 1;
    *ld = c <= 1 ? (r > 1 ? r : 1) : s1;
    return 0;
  }
  return -1;
}

/* Returns t (retained) or a contiguous copy on t's device, and its GEMM layout. */
int crun__gemm_operand(crun_tensor_t *t, crun_tensor_t **use, int *trans, int64_t *ld) {
  if (crun__gemm_layout(t, trans, ld) == 0) {
    crun_tensor_retain(t);
    *use = t;
    return 0;
  }
  CRUN_CHECK(crun_tensor_clone(t, use));
  crun__gemm_layout(*use, trans, ld);
  return 0;
}

static void scale(crun_tensor_t *C, double beta) {
  if (beta == 1.0) return;
  crun__rowiter_t it;
  crun__rowiter_init(&it, C);
  if (it.rows_left <= 0) return;
  do {
    for (int64_t i = 0; i < it.len; i++) {
      double v = beta == 0.0 ? 0.0 : beta * crun_elem_get_double(C->dt, it.row, i * it.step);
      crun_elem_set_double(C->dt, it.row, i * it.step, v);
    }
  } while (crun__rowiter_next(&it));
}

/* Calls gemm on C (row-major, contiguous rows) with ready operands. */
static void call_gemm(crun_tensor_t *A, int ta, int64_t lda, crun_tensor_t *B, int tb, int64_t ldb,
                      crun_tensor_t *C, int64_t K, double alpha, double beta) {
  int M = (int)C->shape[0], N = (int)C->shape[1];
  int ldc = (int)(M <= 1 ? (N > 1 ? N : 1) : C->strides[0]);
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (C->dt == CRUN_FLOAT32)
    crun__blas_sgemm(CblasRowMajor, TA, TB, M, N, (int)K, (float)alpha, crun_tensor_data(A), (int)lda,
                     crun_tensor_data(B), (int)ldb, (float)beta, crun_tensor_data(C), ldc);
  else
    crun__blas_dgemm(CblasRowMajor, TA, TB, M, N, (int)K, alpha, crun_tensor_data(A), (int)lda,
                     crun_tensor_data(B), (int)ldb, beta, crun_tensor_data(C), ldc);
}

static int gemm_shapes(int ta, int tb, const crun_tensor_t *A, const crun_tensor_t *B,
                       const crun_tensor_t *C, int64_t *K) {
  if (A->ndim != 2 || B->ndim != 2 || C->ndim != 2)
    return crun_error(CRUN_EINVAL, "gemm needs 2-d tensors, got %d-d, %d-d and %d-d", A->ndim, B->ndim, C->ndim);
  int64_t am = A->shape[ta], ak = A->shape[!ta], bk = B->shape[tb], bn = B->shape[!tb];
  if (ak != bk || am != C->shape[0] || bn != C->shape[1])
    return crun_error(CRUN_EINVAL, "gemm: sizes do not match: op(A) is %lldx%lld, op(B) is %lldx%lld, C is %lldx%lld",
                      (long long)am, (long long)ak, (long long)bk, (long long)bn,
                      (long long)C->shape[0], (long long)C->shape[1]);
  if (am > INT32_MAX || ak > INT32_MAX || bn > INT32_MAX)
    return crun_error(CRUN_ERANGE, "gemm: dims beyond 2^31 are not supported by BLAS");
  *K = ak;
  return 0;
}

int crun_tensor_gemm(int trans_a, int trans_b, double alpha, crun_tensor_t *A, crun_tensor_t *B,
                     double beta, crun_tensor_t *C) {
  int64_t K = 0, lda = 0, ldb = 0, ldc = 0;
  int ta = 0, tb = 0, tc = 0, rc;
  trans_a = !!trans_a;
  trans_b = !!trans_b;
  CRUN_CHECK(check_float2("gemm", A, C->dt, "A"));
  CRUN_CHECK(check_float2("gemm", B, C->dt, "B"));
  CRUN_CHECK(check_float2("gemm", C, C->dt, "C"));
  CRUN_CHECK(gemm_shapes(trans_a, trans_b, A, B, C, &K));
  if (crun_tensor_numel(C) == 0) return 0;
  if (__builtin_expect((A->st->device & B->st->device & C->st->device) >= 0, 0))
    return crun__dev_gemm(trans_a, trans_b, alpha, A, B, beta, C);
  if (K == 0) return scale(C, beta), 0;
  crun_tensor_t *Au = NULL, *Bu = NULL, *Cu = NULL;
  CRUN_CHECK_GOTO(crun__gemm_operand(A, &Au, &ta, &lda), rc, done);
  CRUN_CHECK_GOTO(crun__gemm_operand(B, &Bu, &tb, &ldb), rc, done);
  if (crun__gemm_layout(C, &tc, &ldc) == 0 && tc == 0 && !crun_tensor_same_storage(C, A) &&
      !crun_tensor_same_storage(C, B)) {
    crun_tensor_retain(C);
    Cu = C;
  } else {
    CRUN_CHECK_GOTO(crun_tensor_clone(C, &Cu), rc, done);
  }
  call_gemm(Au, ta ^ trans_a, lda, Bu, tb ^ trans_b, ldb, Cu, K, alpha, beta);
  rc = Cu != C ? crun_tensor_copy(C, Cu) : 0;
done:
  crun_tensor_release(Au);
  crun_tensor_release(Bu);
  crun_tensor_release(Cu);
  return rc;
}

/* A 2-d view of a 1-d tensor as a row (1 x n) or a column (n x 1). */
static int as_2d(crun_tensor_t *v, int column, crun_tensor_t **out) {
  int64_t shape[2] = {column ? v->shape[0] : 1, column ? 1 : v->shape[0]};
  int64_t strides[2] = {column ? v->strides[0] : v->shape[0] * v->strides[0], column ? 1 : v->strides[0]};
  if (!column && strides[1] == 0) strides[1] = 1;
  return crun__tensor_view_of(v, 2, shape, strides, v->offset, out);
}

static int mm_new(crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  int64_t shape[2] = {a->shape[0], b->shape[1]};
  CRUN_CHECK(crun_tensor_new_on(a->dt, 2, shape, a->st->device, out));
  int rc = crun_tensor_gemm(0, 0, 1.0, a, b, 0.0, *out);
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

/* Retains t as *out, or a 2-d view when t is 1-d (row or column). */
static int lift(crun_tensor_t *t, int column, crun_tensor_t **out) {
  if (t->ndim == 1) return as_2d(t, column, out);
  crun_tensor_retain(t);
  *out = t;
  return 0;
}

static int matmul_vec(crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  crun_tensor_t *A = NULL, *B = NULL, *R = NULL;
  int rc = lift(a, 0, &A);
  if (rc == 0) rc = lift(b, 1, &B);
  if (rc == 0) rc = mm_new(A, B, &R);
  if (rc == 0) {
    int64_t shape[1] = {a->ndim == 1 ? R->shape[1] : R->shape[0]};
    rc = a->ndim == 1 && b->ndim == 1 ? crun_tensor_view(R, 0, NULL, out) : crun_tensor_view(R, 1, shape, out);
  }
  crun_tensor_release(A);
  crun_tensor_release(B);
  crun_tensor_release(R);
  return rc;
}

static int matmul_batched(crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  int64_t nb = a->shape[0];
  if (b->ndim == 3 && b->shape[0] != nb)
    return crun_error(CRUN_EINVAL, "matmul: batch sizes differ (%lld vs %lld)", (long long)nb, (long long)b->shape[0]);
  int64_t shape[3] = {nb, a->shape[1], b->shape[b->ndim - 1]};
  CRUN_CHECK(crun_tensor_new_on(a->dt, 3, shape, a->st->device, out));
  int rc = 0;
  for (int64_t i = 0; i < nb && rc == 0; i++) {
    crun_tensor_t *ai = NULL, *bi = NULL, *oi = NULL;
    rc = crun_tensor_select(a, 0, i, &ai);
    if (rc == 0) rc = b->ndim == 3 ? crun_tensor_select(b, 0, i, &bi) : (crun_tensor_retain(b), bi = b, 0);
    if (rc == 0) rc = crun_tensor_select(*out, 0, i, &oi);
    if (rc == 0) rc = crun_tensor_gemm(0, 0, 1.0, ai, bi, 0.0, oi);
    crun_tensor_release(ai); crun_tensor_release(bi); crun_tensor_release(oi);
  }
  if (rc < 0) crun_tensor_release(*out);
  return rc;
}

int crun_tensor_matmul(crun_tensor_t *a, crun_tensor_t *b, crun_tensor_t **out) {
  CRUN_CHECK(check_float2("matmul", a, a->dt, "the left operand"));
  CRUN_CHECK(check_float2("matmul", b, a->dt, "the right operand"));
  int64_t ak = a->ndim ? a->shape[a->ndim - 1] : 0;
  int64_t bk = b->ndim == 1 ? b->shape[0] : b->ndim >= 2 ? b->shape[b->ndim - 2] : 0;
  char s1[128], s2[128];
  if (a->ndim < 1 || a->ndim > 3 || b->ndim < 1 || b->ndim > 3 || (a->ndim < 3 && b->ndim == 3) || ak != bk)
    return crun_error(CRUN_EINVAL, "matmul: cannot multiply %s by %s", crun__shape_str(a->ndim, a->shape, s1, sizeof s1),
                      crun__shape_str(b->ndim, b->shape, s2, sizeof s2));
  if (a->ndim == 3) {
    if (b->ndim == 1) return crun_error(CRUN_EINVAL, "matmul: 3-d by 1-d is not supported");
    return matmul_batched(a, b, out);
  }
  if (a->ndim == 2 && b->ndim == 2) return mm_new(a, b, out);
  return matmul_vec(a, b, out);
}

int crun_tensor_linear(crun_tensor_t *x, crun_tensor_t *W, crun_tensor_t *b, crun_tensor_t **out) {
  CRUN_CHECK(check_float2("linear", x, x->dt, "x"));
  CRUN_CHECK(check_float2("linear", W, x->dt, "weight"));
  if (b) CRUN_CHECK(check_float2("linear", b, x->dt, "bias"));
  char s1[128], s2[128];
  int64_t in = x->ndim ? x->shape[x->ndim - 1] : -1;
  if ((x->ndim != 1 && x->ndim != 2) || W->ndim != 2 || W->shape[1] != in)
    return crun_error(CRUN_EINVAL, "linear: input %s does not fit weight %s (expected [N, %lld])",
                      crun__shape_str(x->ndim, x->shape, s1, sizeof s1),
                      crun__shape_str(W->ndim, W->shape, s2, sizeof s2), W->ndim == 2 ? (long long)W->shape[1] : -1LL);
  if (b && (b->ndim != 1 || b->shape[0] != W->shape[0]))
    return crun_error(CRUN_EINVAL, "linear: bias has shape %s, expected %lld",
                      crun__shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)W->shape[0]);
  crun_tensor_t *X, *O = NULL;
  CRUN_CHECK(lift(x, 0, &X));
  int64_t shape[2] = {X->shape[0], W->shape[0]};
  int rc = crun_tensor_empty_on(x->dt, 2, shape, x->st->device, &O);
  if (rc == 0 && b) {
    crun_tensor_t *e;
    rc = crun_tensor_expand(b, 2, shape, &e);
    if (rc == 0) rc = crun_tensor_copy(O, e), crun_tensor_release(e);
  }
  if (rc == 0) rc = crun_tensor_gemm(0, 1, 1.0, X, W, b ? 1.0 : 0.0, O);
  if (rc == 0) rc = x->ndim == 1 ? crun_tensor_view(O, 1, shape + 1, out) : (crun_tensor_retain(O), *out = O, 0);
  crun_tensor_release(X);
  crun_tensor_release(O);
  return rc;
}

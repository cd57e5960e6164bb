/* blas_lib.c — OpenBLAS through dlopen on first use (see blas_lib.h). */
#include "tensor/blas_lib.h"
#include "crun.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#ifndef CRUN_OPENBLAS_PATH /* the library CMake found (a development symlink) */
#define CRUN_OPENBLAS_PATH "libopenblas.so"
#endif

static struct {
  __typeof__(cblas_sgemm) *sgemm;
  __typeof__(cblas_dgemm) *dgemm;
  __typeof__(openblas_set_num_threads) *set_threads;
  __typeof__(openblas_get_num_threads) *get_threads;
} g_blas;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Opens CRUN_OPENBLAS when set (another build of OpenBLAS), else OpenBLAS
 * by its soname, then by the path found at build time, and takes the four
 * functions; on failure says once that the loop is used. */
static void blas_open(void) {
  const char *env = getenv("CRUN_OPENBLAS");
  const char *names[] = {env && *env ? env : "libopenblas.so.0", env && *env ? NULL : CRUN_OPENBLAS_PATH};
  const char *why = "not found";
  for (size_t i = 0; i < sizeof names / sizeof *names && names[i] && !g_blas.sgemm; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) { why = dlerror(); continue; }
    g_blas.sgemm = (__typeof__(g_blas.sgemm))dlsym(h, "cblas_sgemm");
    g_blas.dgemm = (__typeof__(g_blas.dgemm))dlsym(h, "cblas_dgemm");
    g_blas.set_threads = (__typeof__(g_blas.set_threads))dlsym(h, "openblas_set_num_threads");
    g_blas.get_threads = (__typeof__(g_blas.get_threads))dlsym(h, "openblas_get_num_threads");
    if (g_blas.sgemm && g_blas.dgemm && g_blas.set_threads && g_blas.get_threads) return;
    g_blas.sgemm = NULL, g_blas.dgemm = NULL, why = "it lacks cblas_sgemm/cblas_dgemm";
    dlclose(h);
  }
  CRUN_LOG(WARN, CORE, "cannot load OpenBLAS (%s): matrix products use a plain loop (slow)", why);
}

static void blas_load(void) { pthread_once(&g_once, blas_open); }

/* op(X)[r][c] of a row-major (or column-major) operand with leading dimension ld. */
#define OP(x, tr, r, c, ld, colmaj) ((tr) != (colmaj) ? (x)[(size_t)(c) * (ld) + (r)] : (x)[(size_t)(r) * (ld) + (c)])

/* The loop that stands in for ?gemm: C = alpha op(A) op(B) + beta C (a beta
 * of 0 ignores what C held, as BLAS does). */
#define REF_GEMM(T)                                                                      \
  do {                                                                                   \
    int colmaj = order == CblasColMajor, at = ta != CblasNoTrans, bt = tb != CblasNoTrans; \
    for (blasint i = 0; i < m; i++)                                                      \
      for (blasint j = 0; j < n; j++) {                                                  \
        T s = 0;                                                                         \
        for (blasint p = 0; p < k; p++) s += OP(a, at, i, p, lda, colmaj) * OP(b, bt, p, j, ldb, colmaj); \
        T *cij = colmaj ? &c[(size_t)j * ldc + i] : &c[(size_t)i * ldc + j];            \
        *cij = alpha * s + (beta == 0 ? 0 : beta * *cij);                               \
      }                                                                                  \
  } while (0)

void crun__blas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                      blasint m, blasint n, blasint k, float alpha, const float *a, blasint lda,
                      const float *b, blasint ldb, float beta, float *c, blasint ldc) {
  blas_load();
  if (g_blas.sgemm) g_blas.sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else REF_GEMM(float);
}

void crun__blas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                      blasint m, blasint n, blasint k, double alpha, const double *a, blasint lda,
                      const double *b, blasint ldb, double beta, double *c, blasint ldc) {
  blas_load();
  if (g_blas.dgemm) g_blas.dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else REF_GEMM(double);
}

void crun__blas_set_threads(int n) {
  blas_load();
  if (g_blas.set_threads) g_blas.set_threads(n);
}

int crun__blas_get_threads(void) {
  blas_load();
  return g_blas.get_threads ? g_blas.get_threads() : 1;
}

/* blas_lib.h — the BLAS calls the runtime makes, with OpenBLAS loaded on
 * first use (blas_lib.c) instead of at program start.
 *
 * Linked in, OpenBLAS costs every process that loads libcrunrt (crun-lua's
 * launcher included) its 16,000 symbol relocations and a thread pool that
 * spins on sched_yield for its first ~0.1 s: about 6 ms of CPU before main
 * on a 2-core VM, before the first worker can be forked. Loaded on first
 * use, only the processes that multiply matrices pay it. The same
 * prototypes as cblas_?gemm; when OpenBLAS cannot be loaded a plain loop
 * computes the same result (slowly) after one WARN line. CRUN_OPENBLAS=PATH
 * loads that library instead (another OpenBLAS build). */
#ifndef CRUN_TENSOR_BLAS_LIB_H
#define CRUN_TENSOR_BLAS_LIB_H

#include <cblas.h>

/* cblas_sgemm / cblas_dgemm (row- or column-major, as cblas). Loads
 * OpenBLAS on the first call (thread-safe). */
void crun__blas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                      blasint m, blasint n, blasint k, float alpha, const float *a, blasint lda,
                      const float *b, blasint ldb, float beta, float *c, blasint ldc);
void crun__blas_dgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                      blasint m, blasint n, blasint k, double alpha, const double *a, blasint lda,
                      const double *b, blasint ldb, double beta, double *c, blasint ldc);

/* openblas_set_num_threads / openblas_get_num_threads (loading OpenBLAS);
 * without OpenBLAS the count is 1 and setting it does nothing. */
void crun__blas_set_threads(int n);
int crun__blas_get_threads(void);

#endif

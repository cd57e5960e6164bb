/* tensor_impl.h — the tensor struct and a row iterator (internal to runtime/). */
#ifndef CRUN_TENSOR_IMPL_H
#define CRUN_TENSOR_IMPL_H

#include <stdatomic.h>

#include "crun.h"

/* Refcounted, 64-byte aligned element storage shared by views. `device` is
 * CRUN_DEVICE_CPU (-1) for host memory or a CUDA device index: then `data`
 * is a device pointer (never read on the host) returned to the pool on
 * `stream` (the stream it was allocated on; one reference held). `pinned`
 * marks page-locked host memory (cudaHostAlloc). */
typedef struct crun__storage {
  atomic_long refs;
  size_t nbytes;
  void *data;
  int device;
  int pinned;
  crun_cuda_stream_t *stream;
} crun__storage_t;

struct crun_tensor {
  atomic_long refs;
  crun_dtype_t dt;
  int ndim;
  int64_t shape[CRUN_MAX_DIMS];
  int64_t strides[CRUN_MAX_DIMS]; /* in elements */
  int64_t offset;                 /* in elements */
  crun__storage_t *st;
};

/* Walks a tensor row by row (the last dim) in row-major order. A 0-d tensor
 * is one row of one element; an empty tensor has no rows. */
typedef struct {
  int nd;                       /* dims above the last one */
  int64_t idx[CRUN_MAX_DIMS];
  const int64_t *shape, *strides;
  char *row;                    /* first element of the current row */
  size_t es;
  int64_t len, step;            /* elements per row, stride inside the row */
  int64_t rows_left;
} crun__rowiter_t;

void crun__rowiter_init(crun__rowiter_t *it, const crun_tensor_t *t);

/* How GEMM (OpenBLAS or cuBLAS-style) reads 2-d t: row-major (*trans 0) or
 * the transpose of a row-major matrix (*trans 1), leading dim *ld; -1 when
 * neither (tensor/blas.c). crun__gemm_operand gives t retained, or a
 * contiguous clone when GEMM cannot read t, with its layout. */
int crun__gemm_layout(const crun_tensor_t *t, int *trans, int64_t *ld);
int crun__gemm_operand(crun_tensor_t *t, crun_tensor_t **use, int *trans, int64_t *ld);

/* Advances to the next row; returns 0 when there is none left. */
int crun__rowiter_next(crun__rowiter_t *it);

/* A conversion of host tensor src into integer dtype ddt needs every value,
 * truncated toward zero, in ddt's range: EINVAL naming the first element
 * (row-major, 1-based) that is nan, +-inf or out of range. 0 when ddt is not
 * an integer dtype or src is not a float one (integers wrap, as in torch). */
int crun__check_cast_fits(crun_dtype_t ddt, const crun_tensor_t *src);

/* Reads / writes element i of a run with the given element stride. */
int64_t crun__elem_get_int64(crun_dtype_t dt, const void *base, int64_t i);
void crun__elem_set_int64(crun_dtype_t dt, void *base, int64_t i, int64_t v);

/* Formats a shape as "2x3" (or "scalar") into buf. */
const char *crun__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* Validates a new tensor's shape: ndim range and dims >= 0. */
int crun__check_shape(int ndim, const int64_t *shape, const char *where);

/* Fails (EINVAL) when elements of t share memory, as expand() makes them: a
 * write into t would store several results in one element. */
int crun__check_writable(const crun_tensor_t *t, const char *where);

/* Creates a contiguous tensor of the given shape over storage st (whose
 * refcount it raises; st starts with refs 0). */
int crun__tensor_over_storage(crun_dtype_t dt, int ndim, const int64_t *shape, crun__storage_t *st,
                              crun_tensor_t **out);

/* Frees a device or pinned storage's memory (runtime/cuda/tensor_dev.c). */
void crun__storage_free_dev(crun__storage_t *st);

/* crun_tensor_copy when either side is on a device (tensor_dev.c). */
int crun__tensor_copy_dev(crun_tensor_t *dst, crun_tensor_t *src);

/* crun_tensor_fill of a device tensor: zero by memset, other values through
 * a host copy (until device kernels take it over). */
int crun__tensor_fill_dev(crun_tensor_t *t, double v);

/* crun_tensor_equal (eq != NULL) / allclose (eq == NULL) with either side on
 * a device: compares host copies; 0 when a copy fails. */
int crun__tensor_compare_dev(crun_tensor_t *a, crun_tensor_t *b, int (*eq)(crun_tensor_t *, crun_tensor_t *),
                             double rtol, double atol);

/* Creates a tensor struct viewing t's storage with the given geometry. */
int crun__tensor_view_of(crun_tensor_t *t, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset, crun_tensor_t **out);

#endif

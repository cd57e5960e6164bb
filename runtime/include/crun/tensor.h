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
  X(UINT8, uint8, 1)

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

/* Returns non-zero for int32, int64, uint8. */
int crun_dtype_is_integer(crun_dtype_t dt);

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

#ifdef __cplusplus
}
#endif
#endif /* CRUN_TENSOR_H */

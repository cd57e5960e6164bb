/* check.h — argument checks shared by the train kernels (internal). */
#ifndef CRUN_TRAIN_CHECK_H
#define CRUN_TRAIN_CHECK_H

#include "crun.h"
#include "crun/train.h"

/* Fails with CRUN_EINVAL unless t is a non-NULL contiguous float32/float64
 * tensor; `fn` and `arg` name the caller and argument in the message. */
int crun__train_check_float(const char *fn, const char *arg, const crun_tensor_t *t);

/* Fails unless a and b have the same dtype and number of elements. */
int crun__train_check_like(const char *fn, const char *arg, const crun_tensor_t *a,
                           const crun_tensor_t *b);

/* Fails unless t is float with ndim == 2; stores the two dims. */
int crun__train_check_2d(const char *fn, const char *arg, const crun_tensor_t *t,
                         int64_t *rows, int64_t *cols);

/* Writes "2x3" (or "scalar") for t's shape into buf. */
const char *crun__train_shape_str(const crun_tensor_t *t, char *buf, size_t n);

#endif /* CRUN_TRAIN_CHECK_H */

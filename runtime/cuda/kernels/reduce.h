/* reduce.h — sum / mean / prod / max / min (with the position of the max /
 * min) as a fold over one slice, the rules of runtime/tensor/reduce_dim.c:
 * floats accumulate in double, integers in int64 (wrapping); max / min keep
 * the first of equal values and the first nan wins. A slice can also be
 * folded in pieces and the pieces combined (what a thread block does on the
 * device); for max / min the combined result equals the sequential one. */
#ifndef CRUN_CUDA_KERNELS_REDUCE_H
#define CRUN_CUDA_KERNELS_REDUCE_H

#include "cuda/kernels/common.h"

typedef struct {
  double d;      /* float accumulator */
  int64_t i;     /* integer accumulator */
  int64_t pos;   /* position of the max / min; -1 while empty */
} crun__kacc_t;

CRUN_HD crun__kacc_t crun__k_red_init(int op) {
  crun__kacc_t a;
  a.d = op == CRUN_DIMRED_PROD ? 1.0 : 0.0;
  a.i = op == CRUN_DIMRED_PROD ? 1 : 0;
  a.pos = -1;
  return a;
}

/* Folds element k (its value read from p at offset `at`) into a. */
CRUN_HD void crun__k_red_fold(int op, int dt, crun__kacc_t *a, const void *p, int64_t at, int64_t k) {
  int first = a->pos < 0;
  if (crun__k_is_int(dt)) {
    int64_t v = crun__k_get_i64(dt, p, at);
    switch (op) {
      case CRUN_DIMRED_SUM: case CRUN_DIMRED_MEAN: a->i = (int64_t)((uint64_t)a->i + (uint64_t)v); break;
      case CRUN_DIMRED_PROD: a->i = (int64_t)((uint64_t)a->i * (uint64_t)v); break;
      case CRUN_DIMRED_MAX: if (first || v > a->i) a->i = v, a->pos = k; break;
      default: if (first || v < a->i) a->i = v, a->pos = k; break;
    }
  } else {
    double v = crun__k_get_f64(dt, p, at);
    switch (op) {
      case CRUN_DIMRED_SUM: case CRUN_DIMRED_MEAN: a->d += v; break;
      case CRUN_DIMRED_PROD: a->d *= v; break;
      case CRUN_DIMRED_MAX: if (first || (a->d == a->d && (v > a->d || v != v))) a->d = v, a->pos = k; break;
      default: if (first || (a->d == a->d && (v < a->d || v != v))) a->d = v, a->pos = k; break;
    }
  }
  if (a->pos < 0) a->pos = k; /* sums count as started */
}

/* a = a combined with b, where b folded elements of other positions. */
CRUN_HD void crun__k_red_combine(int op, int dt, crun__kacc_t *a, const crun__kacc_t *b) {
  if (b->pos < 0) return;
  if (a->pos < 0) { *a = *b; return; }
  int ints = crun__k_is_int(dt), take;
  if (op == CRUN_DIMRED_SUM || op == CRUN_DIMRED_MEAN) {
    a->d += b->d;
    a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
    if (b->pos < a->pos) a->pos = b->pos;
    return;
  }
  if (op == CRUN_DIMRED_PROD) {
    a->d *= b->d;
    a->i = (int64_t)((uint64_t)a->i * (uint64_t)b->i);
    if (b->pos < a->pos) a->pos = b->pos;
    return;
  }
  int max = op == CRUN_DIMRED_MAX;
  if (ints) {
    take = max ? b->i > a->i : b->i < a->i;
    if (b->i == a->i) take = b->pos < a->pos;
  } else {
    int an = a->d != a->d, bn = b->d != b->d;
    if (an || bn) take = bn && (!an || b->pos < a->pos);
    else if (b->d == a->d) take = b->pos < a->pos;
    else take = max ? b->d > a->d : b->d < a->d;
  }
  if (take) *a = *b;
}

/* Stores the result of a slice of n elements as element `at` of values
 * (dtype vdt) and its position plus `base` into indices (nullable, int64). */
CRUN_HD void crun__k_red_store(int op, int dt, const crun__kacc_t *a, int64_t n, void *values, int vdt,
                               int64_t *indices, int64_t at, int64_t base) {
  if (n == 0) crun__k_set_f64(vdt, values, at, op == CRUN_DIMRED_PROD ? 1.0 : op == CRUN_DIMRED_MEAN ? NAN : 0.0);
  else if (crun__k_is_int(dt)) crun__k_set_i64(vdt, values, at, a->i);
  else crun__k_set_f64(vdt, values, at, op == CRUN_DIMRED_MEAN ? a->d / (double)n : a->d);
  if (indices) indices[at] = (a->pos < 0 ? 0 : a->pos) + base;
}

/* One softmax / log-softmax slice of n values at stride `inner` starting at
 * element `at` (crun_tensor_softmax: max subtracted, sums in double). */
CRUN_HD void crun__k_softmax_slice(int dt, const void *a, void *out, int64_t at, int64_t n, int64_t inner,
                                   int use_log) {
  double mx = -INFINITY, sum = 0;
  for (int64_t k = 0; k < n; k++) {
    double v = crun__k_get_f64(dt, a, at + k * inner);
    if (v > mx || v != v) mx = v;
  }
  if (mx == -INFINITY) mx = 0; /* all -inf: keep the arithmetic below nan-free */
  for (int64_t k = 0; k < n; k++) sum += exp(crun__k_get_f64(dt, a, at + k * inner) - mx);
  double lse = use_log ? mx + log(sum) : 0;
  for (int64_t k = 0; k < n; k++) {
    double v = crun__k_get_f64(dt, a, at + k * inner);
    crun__k_set_f64(dt, out, at + k * inner, use_log ? v - lse : exp(v - mx) / sum);
  }
}

#endif

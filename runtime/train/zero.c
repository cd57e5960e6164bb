/* zero.c — ZeroRedundancyOptimizer's partition arithmetic: torch's greedy
 * assignment of parameters to ranks (largest first, to the rank holding the
 * fewest elements so far, the lowest rank on ties) and the element offsets
 * of each parameter inside its owner's flat buffer. */
#include <stdlib.h>

#include "crun/core.h"
#include "crun/train.h"

/* Sort key: numel descending, then index ascending (a stable sort, as
 * Python's sorted(..., reverse=True) that torch uses). */
typedef struct {
  int64_t numel;
  int index;
} zero_item_t;

static int cmp_items(const void *a, const void *b) {
  const zero_item_t *x = a, *y = b;
  if (x->numel != y->numel) return x->numel > y->numel ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

/* Index of the smallest value in v[0..n-1], the lowest index on ties. */
static int min_index(const int64_t *v, int n) {
  int best = 0;
  for (int r = 1; r < n; r++)
    if (v[r] < v[best]) best = r;
  return best;
}

/* Fails with CRUN_EINVAL unless n >= 0, world >= 1 and every numel >= 0. */
static int check_sizes(const char *fn, const int64_t *numel, int n, int world) {
  if (n < 0) return crun_error(CRUN_EINVAL, "%s: %d parameters", fn, n);
  if (world < 1) return crun_error(CRUN_EINVAL, "%s: world size %d must be >= 1", fn, world);
  if (n > 0 && !numel) return crun_error(CRUN_EINVAL, "%s: NULL numel list", fn);
  for (int i = 0; i < n; i++)
    if (numel[i] < 0)
      return crun_error(CRUN_EINVAL, "%s: parameter %d has a negative size %lld", fn, i,
                        (long long)numel[i]);
  return 0;
}

int crun_zero_assign(const int64_t *numel, int n, int world, int *owner, int64_t *rank_numel) {
  static const char *fn = "zero assign";
  CRUN_CHECK(check_sizes(fn, numel, n, world));
  if (n > 0 && !owner) return crun_error(CRUN_EINVAL, "%s: NULL owner list", fn);
  zero_item_t *items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
  int64_t *sizes = calloc((size_t)world, sizeof *sizes);
  if (!items || !sizes) {
    free(items);
    free(sizes);
    return crun_error(CRUN_ENOMEM, "%s: %d parameters on %d ranks", fn, n, world);
  }
  for (int i = 0; i < n; i++) items[i] = (zero_item_t){numel[i], i};
  qsort(items, (size_t)n, sizeof *items, cmp_items);
  int rc = 0;
  for (int k = 0; k < n && rc == 0; k++) {
    int r = min_index(sizes, world);
    if (items[k].numel > INT64_MAX - sizes[r])
      rc = crun_error(CRUN_ERANGE, "%s: rank %d's element count overflows at parameter %d", fn, r,
                      items[k].index);
    else {
      owner[items[k].index] = r;
      sizes[r] += items[k].numel;
    }
  }
  if (rc == 0 && rank_numel)
    for (int r = 0; r < world; r++) rank_numel[r] = sizes[r];
  free(items);
  free(sizes);
  return rc;
}

int crun_zero_offsets(const int64_t *numel, const int *owner, const int *key, int n, int world,
                      int nkeys, int64_t *offset, int64_t *bucket_numel) {
  static const char *fn = "zero offsets";
  CRUN_CHECK(check_sizes(fn, numel, n, world));
  if (nkeys < 1 || (size_t)world > SIZE_MAX / sizeof(int64_t) / (size_t)nkeys)
    return crun_error(CRUN_EINVAL, "%s: %d keys on %d ranks", fn, nkeys, world);
  if (n > 0 && (!owner || !offset)) return crun_error(CRUN_EINVAL, "%s: NULL owner or offset list", fn);
  size_t nb = (size_t)world * (size_t)nkeys;
  int64_t *fill = calloc(nb, sizeof *fill);
  if (!fill) return crun_error(CRUN_ENOMEM, "%s: %d ranks x %d keys", fn, world, nkeys);
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    int k = key ? key[i] : 0;
    if (owner[i] < 0 || owner[i] >= world)
      rc = crun_error(CRUN_EINVAL, "%s: parameter %d's owner %d is not in [0, %d)", fn, i, owner[i], world);
    else if (k < 0 || k >= nkeys)
      rc = crun_error(CRUN_EINVAL, "%s: parameter %d's key %d is not in [0, %d)", fn, i, k, nkeys);
    else {
      int64_t *f = &fill[(size_t)owner[i] * (size_t)nkeys + (size_t)k];
      if (numel[i] > INT64_MAX - *f)
        rc = crun_error(CRUN_ERANGE, "%s: rank %d's buffer %d overflows at parameter %d", fn, owner[i], k, i);
      else {
        offset[i] = *f;
        *f += numel[i];
      }
    }
  }
  if (rc == 0 && bucket_numel)
    for (size_t b = 0; b < nb; b++) bucket_numel[b] = fill[b];
  free(fill);
  return rc;
}

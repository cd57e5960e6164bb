/* sampler.c — torch.utils.data.DistributedSampler's index math: num_samples,
 * total_size, wrap-around padding, rank striding, drop_last, a deterministic
 * shuffle (splitmix64 Fisher-Yates seeded with seed + epoch) and the
 * exactly-once mode that omits the padded duplicates; and resuming an epoch
 * part-way (start: the global positions consumed before a checkpoint, handed
 * out again over another number of ranks). */
#include <stdint.h>
#include <stdlib.h>

#include "crun/core.h"
#include "crun/train.h"

#define SAMPLER_MAX_SIZE (INT64_C(1) << 62)

/* Floor division (b > 0), as Lua's // on integers. */
static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* num_samples and total_size by torch's formulas, over the positions of the
 * epoch not yet consumed (size - start). */
static void shape(crun_sampler_t *s) {
  int64_t R = s->num_replicas, n = s->size - s->start;
  if (s->drop_last && n % R != 0)
    s->num_samples = floor_div(n - R + R - 1, R);
  else
    s->num_samples = floor_div(n + R - 1, R);
  if (s->num_samples < 0) s->num_samples = 0;
  s->total_size = s->num_samples * R;
}


void crun_permutation(int64_t n, uint64_t seed, int64_t *out) {
  for (int64_t i = 0; i < n; i++) out[i] = i;
  uint64_t st = seed;
  for (int64_t i = n - 1; i >= 1; i--) {
    int64_t j = (int64_t)((crun_splitmix64_next(&st) >> 11) % (uint64_t)(i + 1));
    int64_t t = out[i];
    out[i] = out[j];
    out[j] = t;
  }
}

int crun_sampler_init(crun_sampler_t *s, int64_t size, int num_replicas, int rank,
                      int shuffle, uint64_t seed, int drop_last) {
  if (!s) return crun_error(CRUN_EINVAL, "sampler init: NULL sampler");
  if (size < 0) return crun_error(CRUN_EINVAL, "sampler: size %lld is negative", (long long)size);
  /* the padded total (size + num_replicas - 1) and the positions past it
   * must stay within int64 */
  if (size > SAMPLER_MAX_SIZE)
    return crun_error(CRUN_EINVAL, "sampler: size %lld is too large (at most 2^62)", (long long)size);
  if (num_replicas < 1)
    return crun_error(CRUN_EINVAL, "sampler: num_replicas %d must be >= 1", num_replicas);
  if (rank < 0 || rank >= num_replicas)
    return crun_error(CRUN_EINVAL, "sampler: rank %d out of range [0, %d)", rank, num_replicas);
  s->size = size;
  s->num_replicas = num_replicas;
  s->rank = rank;
  s->shuffle = shuffle != 0;
  s->seed = seed;
  s->drop_last = drop_last != 0;
  s->drop_padding = 0;
  s->epoch = 0;
  s->start = 0;
  shape(s);
  return 0;
}

int crun_sampler_resume(crun_sampler_t *s, int64_t start) {
  if (!s) return crun_error(CRUN_EINVAL, "sampler resume: NULL sampler");
  if (start < 0 || start > s->size)
    return crun_error(CRUN_EINVAL, "sampler resume: %lld samples consumed is outside [0, %lld] (the data set's size)",
                      (long long)start, (long long)s->size);
  s->start = start;
  shape(s);
  return 0;
}

/* The global positions this rank reads stop before this one. */
static int64_t limit_of(const crun_sampler_t *s) {
  int64_t rem = s->size - s->start;
  if (!s->drop_padding) return s->total_size;
  return rem < s->total_size ? rem : s->total_size;
}

int64_t crun_sampler_len(const crun_sampler_t *s) {
  int64_t limit = limit_of(s);
  if (s->rank >= limit) return 0;
  return (limit - 1 - s->rank) / s->num_replicas + 1;
}

int crun_sampler_indices(const crun_sampler_t *s, int64_t epoch, int64_t *out, int64_t *n) {
  if (!s || !out || !n) return crun_error(CRUN_EINVAL, "sampler_indices: NULL argument");
  if (epoch < 0) return crun_error(CRUN_EINVAL, "sampler_indices: epoch %lld is negative", (long long)epoch);
  int64_t size = s->size, rem = size - s->start, limit = limit_of(s), k = 0;
  if (rem <= 0 && limit > 0) return crun_error(CRUN_EINVAL, "sampler: cannot pad an empty data set");
  int64_t *order = NULL;
  if (s->shuffle && size > 0) {
    if ((uint64_t)size > SIZE_MAX / sizeof *order)
      return crun_error(CRUN_ENOMEM, "sampler: a permutation of %lld indices overflows size_t", (long long)size);
    order = malloc((size_t)size * sizeof *order);
    if (!order) return crun_error(CRUN_ENOMEM, "sampler: no memory for a permutation of %lld", (long long)size);
    crun_permutation(size, s->seed + (uint64_t)epoch, order);
  }
  for (int64_t pos = s->rank; pos < limit; pos += s->num_replicas) {
    int64_t p = s->start + pos % rem; /* wrap-around padding over what is left; drop_last truncates */
    out[k++] = order ? order[p] : p;
  }
  free(order);
  *n = k;
  return 0;
}

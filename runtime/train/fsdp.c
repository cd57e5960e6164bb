/* fsdp.c — FullyShardedDataParallel's flat-parameter arithmetic and copies:
 * the layout of a unit's flat buffer (each parameter's offset, the total,
 * the padded length, the shard length), the part of it a rank owns, and the
 * copies and views between the parameters and the flat buffer; and the
 * schedule: each unit's state, which gathers to launch, wait for and
 * prefetch, and when each strategy frees a unit. The collectives and the
 * buffer pool they use are lua/crun/fsdp.lua's. */
#include <stdlib.h>
#include <string.h>

#include "crun/core.h"
#include "crun/train.h"

#include "../core/checked.h"

int crun_fsdp_layout(const int64_t *numel, int n, int world, int no_shard, int64_t *offset,
                     crun_fsdp_layout_t *out) {
  static const char *fn = "fsdp layout";
  if (n < 0) return crun_error(CRUN_EINVAL, "%s: %d parameters", fn, n);
  if (world < 1) return crun_error(CRUN_EINVAL, "%s: world size %d must be >= 1", fn, world);
  if (!out || (n > 0 && (!numel || !offset)))
    return crun_error(CRUN_EINVAL, "%s: NULL numel, offset or output", fn);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (numel[i] < 0)
      return crun_error(CRUN_EINVAL, "%s: parameter %d has a negative size %lld", fn, i, (long long)numel[i]);
    offset[i] = total;
    if (crun__add_i64(total, numel[i], &total))
      return crun_error(CRUN_ERANGE, "%s: the unit's element count overflows at parameter %d", fn, i);
  }
  crun_fsdp_layout_t l = {.numel = total, .padded = total, .shard_numel = total};
  if (!no_shard) {
    /* ceil(total / world) without total + world - 1 overflowing */
    l.shard_numel = total / world + (total % world != 0);
    if (crun__mul_i64(l.shard_numel, world, &l.padded))
      return crun_error(CRUN_ERANGE, "%s: %lld elements padded to a multiple of %d overflow", fn,
                        (long long)total, world);
  }
  *out = l;
  return 0;
}

int crun_fsdp_shard_range(int64_t numel, int world, int rank, crun_fsdp_range_t *out) {
  static const char *fn = "fsdp shard range";
  if (numel < 0) return crun_error(CRUN_EINVAL, "%s: negative size %lld", fn, (long long)numel);
  if (world < 1) return crun_error(CRUN_EINVAL, "%s: world size %d must be >= 1", fn, world);
  if (rank < 0 || rank >= world) return crun_error(CRUN_EINVAL, "%s: rank %d is not in [0, %d)", fn, rank, world);
  if (!out) return crun_error(CRUN_EINVAL, "%s: NULL output", fn);
  int64_t per = numel / world + (numel % world != 0), start;
  /* rank * per <= (world - 1) * per < padded: only the padded total can overflow */
  if (crun__mul_i64(per, world, &start))
    return crun_error(CRUN_ERANGE, "%s: %lld elements padded to a multiple of %d overflow", fn,
                      (long long)numel, world);
  start = per * rank;
  int64_t first = start < numel ? start : numel;
  int64_t end = numel - start > per ? start + per : numel; /* min(numel, start + per) without overflow */
  *out = (crun_fsdp_range_t){.start = start, .per = per, .first = first, .count = end > first ? end - first : 0};
  return 0;
}

/* Fails with CRUN_EINVAL unless flat is a contiguous 1-d tensor and
 * parameter i's n elements at off fit in it. */
static int check_slot(const char *fn, const crun_tensor_t *flat, int i, int64_t off, int64_t n) {
  if (!flat || crun_tensor_ndim(flat) != 1 || !crun_tensor_is_contiguous(flat))
    return crun_error(CRUN_EINVAL, "%s: the flat buffer must be a contiguous 1-d tensor", fn);
  int64_t len = crun_tensor_numel(flat);
  if (off < 0 || off > len || n > len - off)
    return crun_error(CRUN_EINVAL, "%s: parameter %d's %lld elements at offset %lld do not fit in %lld", fn, i,
                      (long long)n, (long long)off, (long long)len);
  return 0;
}

int crun_fsdp_view(crun_tensor_t *flat, int64_t offset, int ndim, const int64_t *shape, crun_tensor_t **out) {
  static const char *fn = "fsdp view";
  int64_t n;
  if (ndim < 0 || ndim > CRUN_MAX_DIMS || (ndim > 0 && !shape) || crun__prod_i64(shape, ndim, &n))
    return crun_error(CRUN_EINVAL, "%s: bad shape (%d dims)", fn, ndim);
  CRUN_CHECK(check_slot(fn, flat, 0, offset, n));
  crun_tensor_t *slice = NULL;
  CRUN_CHECK(crun_tensor_narrow(flat, 0, offset, n, &slice));
  int rc = crun_tensor_view(slice, ndim, shape, out);
  crun_tensor_release(slice);
  return rc;
}

/* Copies between params[i] and flat[offset[i], + numel) in the direction
 * `to_flat`; the shared body of flatten and unflatten. */
static int copy_all(const char *fn, crun_tensor_t *flat, crun_tensor_t *const *params, const int64_t *offset, int n,
                    int to_flat) {
  if (n < 0 || (n > 0 && (!params || !offset))) return crun_error(CRUN_EINVAL, "%s: %d parameters", fn, n);
  for (int i = 0; i < n; i++) {
    crun_tensor_t *p = params[i];
    if (!p || !flat) return crun_error(CRUN_EINVAL, "%s: parameter %d is NULL", fn, i);
    if (crun_tensor_dtype(p) != crun_tensor_dtype(flat))
      return crun_error(CRUN_EINVAL, "%s: parameter %d is %s, the flat buffer %s", fn, i,
                        crun_dtype_name(crun_tensor_dtype(p)), crun_dtype_name(crun_tensor_dtype(flat)));
    CRUN_CHECK(check_slot(fn, flat, i, offset[i], crun_tensor_numel(p)));
    crun_tensor_t *v = NULL;
    CRUN_CHECK(crun_fsdp_view(flat, offset[i], crun_tensor_ndim(p), crun_tensor_shape(p), &v));
    int rc = to_flat ? crun_tensor_copy(v, p) : crun_tensor_copy(p, v);
    crun_tensor_release(v);
    CRUN_CHECK(rc);
  }
  return 0;
}

int crun_fsdp_flatten(crun_tensor_t *flat, crun_tensor_t *const *params, const int64_t *offset, int n) {
  return copy_all("fsdp flatten", flat, params, offset, n, 1);
}

int crun_fsdp_unflatten(crun_tensor_t *flat, crun_tensor_t *const *params, const int64_t *offset, int n) {
  return copy_all("fsdp unflatten", flat, params, offset, n, 0);
}

/* ---------------------------------------------------------------- schedule */

struct crun_fsdp_sched {
  int n;
  crun_fsdp_strategy_t strategy;
  int prefetch_fwd, prefetch_bwd;
  unsigned char *state;    /* crun_fsdp_unit_state_t per unit */
  unsigned char *bwd_done; /* the unit's backward ran since its last forward */
};

int crun_fsdp_sched_new(int nunits, crun_fsdp_strategy_t strategy, int prefetch_fwd, int prefetch_bwd,
                        crun_fsdp_sched_t **out) {
  static const char *fn = "fsdp sched";
  if (!out) return crun_error(CRUN_EINVAL, "%s: NULL output", fn);
  *out = NULL;
  if (nunits < 0) return crun_error(CRUN_EINVAL, "%s: %d units", fn, nunits);
  if (strategy < CRUN_FSDP_FULL_SHARD || strategy > CRUN_FSDP_NO_SHARD)
    return crun_error(CRUN_EINVAL, "%s: unknown sharding strategy %d", fn, (int)strategy);
  crun_fsdp_sched_t *s = calloc(1, sizeof *s);
  size_t cnt = (size_t)(nunits > 0 ? nunits : 1);
  if (s) s->state = calloc(cnt, 1), s->bwd_done = calloc(cnt, 1);
  if (!s || !s->state || !s->bwd_done) {
    crun_fsdp_sched_free(s);
    return crun_error(CRUN_ENOMEM, "%s: %d units", fn, nunits);
  }
  s->n = nunits;
  s->strategy = strategy;
  s->prefetch_fwd = prefetch_fwd != 0;
  s->prefetch_bwd = prefetch_bwd != 0;
  /* NO_SHARD units are whole from the start and stay so */
  if (strategy == CRUN_FSDP_NO_SHARD) memset(s->state, CRUN_FSDP_GATHERED, cnt);
  *out = s;
  return 0;
}

void crun_fsdp_sched_free(crun_fsdp_sched_t *s) {
  if (!s) return;
  free(s->state);
  free(s->bwd_done);
  free(s);
}

/* Fails with CRUN_EINVAL unless k names a unit of s. */
static int check_unit(const crun_fsdp_sched_t *s, const char *what, int k) {
  if (!s) return crun_error(CRUN_EINVAL, "fsdp sched %s: NULL schedule", what);
  if (k < 0 || k >= s->n) return crun_error(CRUN_EINVAL, "fsdp sched %s: unit %d is not in [0, %d)", what, k, s->n);
  return 0;
}

int crun_fsdp_sched_state(const crun_fsdp_sched_t *s, int k) {
  CRUN_CHECK(check_unit(s, "state", k));
  return s->state[k];
}

/* Unit k is needed now: fills step's launch and wait, and k is gathered. */
static void need(crun_fsdp_sched_t *s, int k, crun_fsdp_step_t *step) {
  step->launch = s->state[k] == CRUN_FSDP_SHARDED;
  step->wait = s->state[k] != CRUN_FSDP_GATHERED;
  s->state[k] = CRUN_FSDP_GATHERED;
  step->prefetch = -1;
}

/* Prefetches unit j (if j is a unit and sharded) into step. */
static void prefetch(crun_fsdp_sched_t *s, int j, crun_fsdp_step_t *step) {
  if (j < 0 || j >= s->n || s->state[j] != CRUN_FSDP_SHARDED) return;
  s->state[j] = CRUN_FSDP_GATHERING;
  step->prefetch = j;
}

int crun_fsdp_sched_pre_forward(crun_fsdp_sched_t *s, int k, int first, crun_fsdp_step_t *step) {
  CRUN_CHECK(check_unit(s, "pre_forward", k));
  if (!step) return crun_error(CRUN_EINVAL, "fsdp sched pre_forward: NULL step");
  s->bwd_done[k] = 0;
  need(s, k, step);
  if (first && s->prefetch_fwd) prefetch(s, k + 1, step);
  return 0;
}

int crun_fsdp_sched_pre_backward(crun_fsdp_sched_t *s, int k, crun_fsdp_step_t *step) {
  CRUN_CHECK(check_unit(s, "pre_backward", k));
  if (!step) return crun_error(CRUN_EINVAL, "fsdp sched pre_backward: NULL step");
  need(s, k, step);
  if (!s->prefetch_bwd) return 0;
  int j = k - 1;
  while (j >= 0 && s->bwd_done[j]) j--;
  prefetch(s, j, step);
  return 0;
}

/* Unit k goes back to its shard (returns 1) if gathered and `when`. */
static int release_if(crun_fsdp_sched_t *s, int k, int when) {
  if (!when || s->strategy == CRUN_FSDP_NO_SHARD || s->state[k] != CRUN_FSDP_GATHERED) return 0;
  s->state[k] = CRUN_FSDP_SHARDED;
  return 1;
}

int crun_fsdp_sched_post_forward(crun_fsdp_sched_t *s, int k) {
  CRUN_CHECK(check_unit(s, "post_forward", k));
  return release_if(s, k, s->strategy == CRUN_FSDP_FULL_SHARD);
}

int crun_fsdp_sched_post_backward(crun_fsdp_sched_t *s, int k) {
  CRUN_CHECK(check_unit(s, "post_backward", k));
  s->bwd_done[k] = 1;
  return release_if(s, k, 1);
}

int crun_fsdp_sched_end_backward(crun_fsdp_sched_t *s) {
  if (!s) return crun_error(CRUN_EINVAL, "fsdp sched end_backward: NULL schedule");
  int dropped = 0;
  for (int k = 0; k < s->n; k++)
    if (s->state[k] == CRUN_FSDP_GATHERING) s->state[k] = CRUN_FSDP_SHARDED, dropped++;
  return dropped;
}

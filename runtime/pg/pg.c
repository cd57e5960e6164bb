/* pg.c — the process group object: creation through a store, sub-groups,
 * references, and the progress board ("progress/<rank>" = "op #seq") read
 * when a collective times out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/clock_int.h"

const char *crun__coll_name(int kind) {
  static const char *names[] = {
#define CRUN_X_NAME(NAME, name) #name,
      CRUN_COLL_MAP(CRUN_X_NAME)
#undef CRUN_X_NAME
  };
  return kind >= 0 && kind < CRUN__COLL_COUNT ? names[kind] : "?";
}

int crun__pg_global(const crun_pg_t *pg, int r) { return pg && r >= 0 && r < pg->size ? pg->global[r] : r; }

crun__who_t crun__pg_who(const crun_pg_t *pg, int r) {
  return crun__who(pg ? pg->global : NULL, pg ? pg->size : 0, r);
}

void crun__pg_coll_desc(const crun_pg_t *pg, const crun__coll_t *c, char *buf, size_t cap) {
  if (c->kind == CRUN__COLL_SEND)
    snprintf(buf, cap, "send to %s (tag %d)", CRUN__WHO(pg, c->root), c->tag);
  else if (c->kind == CRUN__COLL_RECV && c->root == CRUN_ANY_SOURCE)
    snprintf(buf, cap, "recv from any rank (tag %d)", c->tag);
  else if (c->kind == CRUN__COLL_RECV)
    snprintf(buf, cap, "recv from %s (tag %d)", CRUN__WHO(pg, c->root), c->tag);
  else if (!c->seq) /* queued: numbered when it starts (crun__pg_execute) */
    snprintf(buf, cap, "%s (queued, not started)", crun__coll_name(c->kind));
  else
    snprintf(buf, cap, "%s #%llu", crun__coll_name(c->kind), (unsigned long long)c->seq);
}

void crun__coll_desc(const crun__coll_t *c, char *buf, size_t cap) { crun__pg_coll_desc(NULL, c, buf, cap); }

static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* Allocates a group object (no connections yet). */
static crun_pg_t *pg_alloc(crun_store_t *base, const char *prefix, int rank, int size, double timeout) {
  crun_pg_t *pg = calloc(1, sizeof *pg);
  if (!pg) return NULL;
  atomic_init(&pg->refs, 1);
  atomic_init(&pg->cur, 0);
  pg->prefix = strdup(prefix);
  pg->global = calloc((size_t)size, sizeof(int));
  pg->rank = rank;
  pg->size = size;
  pg->timeout = crun__timeout_or(timeout, CRUN_PG_DEFAULT_TIMEOUT);
  pg->group_id = fnv1a(prefix);
  pg->base = base;
  crun_store_retain(base);
  pthread_mutex_init(&pg->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&pg->cv, &ca);
  pthread_cond_init(&pg->pub_cv, &ca);
  pthread_condattr_destroy(&ca);
  if (!pg->prefix || !pg->global || crun_store_prefix_new(prefix, base, &pg->store) < 0 ||
      crun_store_prefix_new(prefix, base, &pg->board) < 0) {
    crun_pg_release(pg);
    return NULL;
  }
  /* a failure report must not wait long on a store that is gone */
  crun_store_set_timeout(pg->board, 2.0);
  return pg;
}

/* Makes the state of backend be for pg: split from the parent's when the
 * backend can, else created. */
static int be_make(const crun_backend_vtable_t *be, crun_pg_t *pg, void *parent_state, void **state) {
  if (parent_state && be->split) return be->split(parent_state, pg, state);
  return be->create(pg, state);
}

/* Connects the backend(s) (from parent's states when given); releases pg on
 * failure. */
static int pg_connect(crun_pg_t *pg, const crun_backend_vtable_t *be, const crun_backend_vtable_t *be_dev,
                      const crun_pg_t *parent, crun_pg_t **out) {
  pg->be = be;
  int rc = be_make(be, pg, parent ? parent->be_state : NULL, &pg->be_state);
  if (rc < 0) pg->be = NULL;
  if (rc == 0 && be->direct) pg->ar_fn = be->direct(pg->be_state, CRUN__COLL_ALL_REDUCE, &pg->ar_state);
  /* the device backend of "auto" connects on the first CUDA collective
   * (crun__pg_execute), as torch's does: a CPU-only job on a GPU machine never
   * opens NCCL; a sub-group of a parent whose communicator exists splits it */
  if (rc == 0 && be_dev) {
    pg->be_dev = be_dev;
    if (parent && parent->be_dev_state && be_dev->split) rc = be_dev->split(parent->be_dev_state, pg, &pg->be_dev_state);
    if (rc < 0) pg->be_dev = NULL;
  }
  if (rc < 0) {
    crun_pg_release(pg);
    return rc;
  }
  CRUN_LOG(INFO, PG, "group '%s' up: rank %d of %d, backend %s%s%s", pg->prefix, pg->rank, pg->size, be->name,
           be_dev ? " + " : "", be_dev ? be_dev->name : "");
  *out = pg;
  return 0;
}

int crun_pg_new(const crun_pg_opts_t *o, crun_pg_t **out) {
  if (!o || !o->store || !out) return crun_error(CRUN_EINVAL, "crun_pg_new: store and out are required");
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return crun_error(CRUN_EINVAL, "crun_pg_new: rank %d is out of range for world_size %d", o->rank, o->world_size);
  const crun_backend_vtable_t *be = crun__backend_find(o->backend);
  if (!be)
    return crun_error(CRUN_ENOTSUP, "backend '%s' is not available in this build (have: %s)", o->backend,
                      crun__backend_names());
  const char *name = o->name && *o->name ? o->name : "pg";
  char key[256], prefix[300];
  int64_t n;
  snprintf(key, sizeof key, "%s/incarnation", name);
  CRUN_CHECK(crun_store_add(o->store, key, 1, &n));
  snprintf(prefix, sizeof prefix, "%s/%lld", name, (long long)((n - 1) / o->world_size));
  crun_pg_t *pg = pg_alloc(o->store, prefix, o->rank, o->world_size, o->timeout);
  if (!pg) return crun_error(CRUN_ENOMEM, "process group");
  for (int i = 0; i < o->world_size; i++) pg->global[i] = i;
  return pg_connect(pg, be, crun__backend_auto_device(o->backend), NULL, out);
}

/* Checks the rank list of new_group (sorted copy in sorted[]); returns my
 * index in it or -1 in *me. */
static int check_ranks(const crun_pg_t *parent, const int *ranks, int n, int *sorted, int *me) {
  if (!ranks || n < 1) return crun_error(CRUN_EINVAL, "new_group: needs at least one rank");
  *me = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      return crun_error(CRUN_EINVAL, "new_group: rank %d is out of range for a group of %d ranks", ranks[i], parent->size);
    /* insertion sort: lists are short, and torch orders group ranks by global rank */
    int j = i;
    for (; j > 0 && sorted[j - 1] > ranks[i]; j--) sorted[j] = sorted[j - 1];
    if (j > 0 && sorted[j - 1] == ranks[i]) return crun_error(CRUN_EINVAL, "new_group: rank %d is listed twice", ranks[i]);
    sorted[j] = ranks[i];
  }
  for (int i = 0; i < n; i++)
    if (sorted[i] == parent->rank) *me = i;
  return 0;
}

/* FNV-1a over a rank list, with its length first. */
static int64_t list_hash(const int *rs, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = -1; i < n; i++) {
    uint32_t v = (uint32_t)(i < 0 ? n : rs[i]);
    for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return (int64_t)(h >> 1);
}

/* Writes "{0,2,5}" into buf (every rank, truncated with "..." past cap). */
static void list_text(char *buf, size_t cap, const int64_t *rs, int n) {
  size_t len = (size_t)snprintf(buf, cap, "{");
  for (int i = 0; i < n && len + 16 < cap; i++) len += (size_t)snprintf(buf + len, cap - len, i ? ",%lld" : "%lld", (long long)rs[i]);
  snprintf(buf + len, cap - len, len + 16 < cap ? "}" : "...}");
}

/* Every rank of the parent compares its sorted list for new_group #idx with
 * everyone's through one all_gather of list hashes on the parent (any
 * backend); when they differ, a second all_gather brings the lists so the
 * EMISMATCH names two of them. A rank that never calls new_group shows as
 * the parent's collective timeout naming it. */
/* all_gather of w int64 words per rank on the parent: its collective, or,
 * when the parent only moves device memory (backend nccl), its store
 * ("newgroup/<idx>/<step>/<rank>"), naming missing ranks on timeout. */
static int gather_words(crun_pg_t *parent, int idx, int step, const int64_t *mine, size_t w, int64_t *out,
                        double timeout) {
  int size = parent->size;
  if (!parent->be->device) {
    crun_coll_opts_t o = {.timeout = timeout};
    void **outs = calloc((size_t)size, sizeof *outs);
    if (!outs) return crun_error(CRUN_ENOMEM, "new_group: rank lists");
    for (int r = 0; r < size; r++) outs[r] = out + w * (size_t)r;
    int rc = crun_pg_all_gather(parent, outs, mine, w, CRUN_INT64, &o, NULL);
    free(outs);
    return rc;
  }
  char key[96];
  snprintf(key, sizeof key, "newgroup/%d/%d/%d", idx, step, parent->rank);
  CRUN_CHECK(crun_store_set(parent->store, key, mine, w * sizeof(int64_t)));
  char (*keys)[96] = calloc((size_t)size, 96);
  const char **kp = calloc((size_t)size, sizeof *kp);
  crun_buf_t *v = calloc((size_t)size, sizeof *v);
  int rc = keys && kp && v ? 0 : crun_error(CRUN_ENOMEM, "new_group: rank lists");
  for (int r = 0; rc == 0 && r < size; r++) snprintf(keys[r], 96, "newgroup/%d/%d/%d", idx, step, r), kp[r] = keys[r];
  if (rc == 0) rc = crun_store_wait(parent->store, kp, (size_t)size, timeout);
  if (rc == CRUN_ETIMEDOUT) {
    int *late = malloc(sizeof(int) * (size_t)size), nl = 0;
    for (int r = 0; late && r < size; r++) {
      int ok = 0;
      if (crun_store_check(parent->board, &kp[r], 1, &ok) == 0 && !ok) late[nl++] = r;
    }
    char who[256] = "some ranks";
    if (late && nl) crun__ranks_text(who, sizeof who, late, nl);
    free(late);
    rc = crun_error(CRUN_ETIMEDOUT, "new_group #%d on rank %d: %s did not call it within %.1f s", idx, parent->rank,
                    who, timeout);
  }
  if (rc == 0) rc = crun_store_multi_get(parent->store, kp, (size_t)size, v);
  for (int r = 0; rc == 0 && r < size; r++) {
    if (v[r].len != w * sizeof(int64_t)) rc = crun_error(CRUN_EIO, "new_group #%d: rank %d's entry is %zu bytes", idx, r, v[r].len);
    else memcpy(out + w * (size_t)r, v[r].data, v[r].len);
  }
  for (int r = 0; v && r < size; r++) crun_buf_free(&v[r]);
  free(v);
  free(kp);
  free(keys);
  return rc;
}

static int agree_on_ranks(crun_pg_t *parent, int idx, const int *sorted, int n, double timeout) {
  int size = parent->size, rc = 0;
  int64_t *h = calloc((size_t)size, sizeof *h), *lists = NULL, mine = list_hash(sorted, n);
  if (!h) { rc = crun_error(CRUN_ENOMEM, "new_group: rank lists"); goto out; }
  CRUN_CHECK_GOTO(gather_words(parent, idx, 0, &mine, 1, h, timeout), rc, out);
  int other = -1;
  for (int r = 0; r < size && other < 0; r++)
    if (h[r] != h[0]) other = r;
  if (other < 0) goto out; /* everyone agrees */
  /* every rank saw the same hashes, so every rank takes this second step */
  size_t w = (size_t)size + 1;
  lists = calloc(w * (size_t)(size + 1), sizeof *lists);
  if (!lists) { rc = crun_error(CRUN_ENOMEM, "new_group: rank lists"); goto out; }
  int64_t *me = lists + w * (size_t)size;
  me[0] = n;
  for (int i = 0; i < n; i++) me[i + 1] = sorted[i];
  CRUN_CHECK_GOTO(gather_words(parent, idx, 1, me, w, lists, timeout), rc, out);
  char a[160], b[160];
  list_text(a, sizeof a, lists + 1, (int)lists[0]);
  list_text(b, sizeof b, lists + w * (size_t)other + 1, (int)lists[w * (size_t)other]);
  rc = crun_error(CRUN_EMISMATCH, "new_group #%d on rank %d: ranks disagree on the members: rank %d gave %s, rank %d gave %s",
                  idx, parent->rank, parent->global[0], a, parent->global[other], b);
out:
  free(h);
  free(lists);
  return rc;
}

int crun_pg_new_group(crun_pg_t *parent, const int *ranks, int n, double timeout, crun_pg_t **out) {
  if (!parent || !out) return crun_error(CRUN_EINVAL, "new_group: parent and out are required");
  int me = -1;
  *out = NULL;
  if (n > parent->size) return crun_error(CRUN_EINVAL, "new_group: %d ranks listed, the group has %d", n, parent->size);
  int *sorted = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (!sorted) return crun_error(CRUN_ENOMEM, "new_group");
  int rc = check_ranks(parent, ranks, n, sorted, &me);
  pthread_mutex_lock(&parent->mu);
  int idx = ++parent->nchildren; /* counted on every call, so ranks stay in step after an error */
  pthread_mutex_unlock(&parent->mu);
  double t = crun__timeout_or(timeout, parent->timeout);
  /* `timeout` is the new group's operations'; the agreement (the parent's
   * operation: a failure breaks the parent) and the connection wait at
   * least the parent's, so that a short one does not cut them short */
  double join = t > parent->timeout ? t : parent->timeout;
  if (rc == 0) rc = agree_on_ranks(parent, idx, sorted, n, join);
  if (rc == 0 && me < 0) { /* a backend that splits needs every parent rank */
    if (parent->be->split) rc = parent->be->split(parent->be_state, NULL, NULL);
    if (rc == 0 && parent->be_dev && parent->be_dev_state && parent->be_dev->split)
      rc = parent->be_dev->split(parent->be_dev_state, NULL, NULL);
  }
  if (rc < 0 || me < 0) {
    free(sorted);
    return rc < 0 ? rc : 0;
  }
  char prefix[512];
  snprintf(prefix, sizeof prefix, "%s/g%d", parent->prefix, idx);
  crun_pg_t *pg = pg_alloc(parent->base, prefix, me, n, join);
  if (!pg) {
    free(sorted);
    return crun_error(CRUN_ENOMEM, "process group");
  }
  for (int i = 0; i < n; i++) pg->global[i] = parent->global[sorted[i]];
  free(sorted);
  rc = pg_connect(pg, parent->be, parent->be_dev, parent, out);
  if (rc == 0) crun_pg_set_timeout(*out, t);
  return rc;
}

void crun_pg_retain(crun_pg_t *pg) { atomic_fetch_add(&pg->refs, 1); }

/* Leaves "stopped/<rank>" on the board of a group that ran a collective
 * and is closed here while it still works: a peer that refuses a call
 * this rank never makes (coll.c, every_rank_refused) stops at once instead
 * of waiting its timeout for a refusal from a rank that is gone. Bounded by
 * a short timeout: a store already gone costs a close little. */
static void leave_closed(crun_pg_t *pg) {
  if (!atomic_load(&pg->cur) || pg->size < 2 || !pg->board || atomic_load(&pg->is_broken) || (pg->be && pg->be->private_board)) return;
  crun_store_set_timeout(pg->board, 0.25);
  crun__pg_leave_stopped(pg, "closed");
}

void crun_pg_release(crun_pg_t *pg) {
  if (!pg || atomic_fetch_sub(&pg->refs, 1) != 1) return;
  crun__pg_queue_stop(pg);
  crun__pg_progress_stop(pg);
  leave_closed(pg);
  if (pg->be_dev && pg->be_dev_state) pg->be_dev->destroy(pg->be_dev_state);
  if (pg->be && pg->be_state) pg->be->destroy(pg->be_state);
  if (pg->store) crun_store_release(pg->store);
  if (pg->board) crun_store_release(pg->board);
  if (pg->base) crun_store_release(pg->base);
  pthread_mutex_destroy(&pg->mu);
  pthread_cond_destroy(&pg->cv);
  pthread_cond_destroy(&pg->pub_cv);
  free(pg->broken);
  free(pg->prefix);
  free(pg->global);
  free(atomic_exchange(&pg->spare, NULL));
  free(pg);
}

void crun_pg_destroy(crun_pg_t *pg) {
  if (!pg) return;
  if (atomic_load(&pg->refs) > 1 && pg->be && pg->be_state && pg->be->destroy_pending && !pg->be_dev_state) {
    crun__pg_queue_stop(pg); /* queued work runs first; nothing can be queued after */
    pg->has_thread = 0;      /* joined: the last release does not join again */
    crun__pg_progress_stop(pg);
    pg->has_pub = 0;
    void *state = pg->be_state;
    pg->be_state = NULL;
    pg->be->destroy(state); /* fails pending p2p work with ECLOSED (its Works finish) and closes */
  }
  crun_pg_release(pg);
}

int crun_pg_rank(const crun_pg_t *pg) { return pg->rank; }
int crun_pg_size(const crun_pg_t *pg) { return pg->size; }
int crun_pg_global_rank(const crun_pg_t *pg, int r) { return r >= 0 && r < pg->size ? pg->global[r] : -1; }
const char *crun_pg_backend(const crun_pg_t *pg) { return pg->be ? pg->be->name : "none"; }
void crun_pg_set_timeout(crun_pg_t *pg, double s) { pg->timeout = crun__timeout_or(s, CRUN_PG_DEFAULT_TIMEOUT); }
double crun_pg_get_timeout(const crun_pg_t *pg) { return pg->timeout; }

uint64_t crun_pg_next_seq(const crun_pg_t *pg) { return atomic_load(&((crun_pg_t *)pg)->next_seq) + 1; }

/* ---------------------------------------------------------------- progress board */

int crun__pg_board_peek(crun_pg_t *pg, const char *key, crun_buf_t *out) {
  int ok = 0;
  if (!pg->board) return 0;
  if (crun_store_check(pg->board, &key, 1, &ok) < 0 || (ok && crun_store_get(pg->board, key, out) < 0)) return -1;
  return ok;
}

void crun__pg_leave_stopped(crun_pg_t *pg, const char *val) {
  char key[32];
  snprintf(key, sizeof key, "stopped/%d", pg->rank);
  if (pg->board && crun_store_set(pg->board, key, val, strlen(val)) < 0)
    CRUN_LOG(INFO, PG, "could not leave %s on the board: %s", key, crun_last_error());
}

static void progress_text(uint64_t v, char *buf, size_t cap) {
  int kind = (int)(v >> 56);
  uint64_t seq = v & ((1ull << 56) - 1);
  if (kind == CRUN__COLL_SEND || kind == CRUN__COLL_RECV) snprintf(buf, cap, "%s", crun__coll_name(kind));
  else snprintf(buf, cap, "%s #%llu", crun__coll_name(kind), (unsigned long long)seq);
}

static void publish(crun_pg_t *pg, uint64_t v) {
  char key[32], val[64];
  snprintf(key, sizeof key, "progress/%d", pg->rank);
  progress_text(v, val, sizeof val);
  if (crun_store_set(pg->board, key, val, strlen(val)) < 0)
    CRUN_LOG(INFO, PG, "could not publish progress: %s", crun_last_error());
}

/* Publishes "blocked/<rank>": the blocking send or recv b (pg->p2p_wait)
 * this rank waits in, "<kind> <peer> <gen>", or "-" for none. */
static void publish_blocked(crun_pg_t *pg, uint64_t b) {
  char key[32], val[64] = "-";
  snprintf(key, sizeof key, "blocked/%d", pg->rank);
  if (b) snprintf(val, sizeof val, "%d %d %llu", (int)((b >> 20) & 0xf), (int)(b & 0xfffff) - 1,
                  (unsigned long long)(b >> 24));
  if (crun_store_set(pg->board, key, val, strlen(val)) < 0)
    CRUN_LOG(INFO, PG, "could not publish %s: %s", key, crun_last_error());
}

/* Publishes the current collective, and the blocking send or recv this
 * rank waits in, at most every 200 ms, only when they changed. */
static void *publisher(void *arg) {
  crun_pg_t *pg = arg;
  pthread_mutex_lock(&pg->mu);
  while (!pg->pub_stop) {
    uint64_t v = atomic_load(&pg->cur), b = atomic_load(&pg->p2p_wait);
    if (v != pg->published) {
      pg->published = v;
      pthread_mutex_unlock(&pg->mu);
      publish(pg, v);
      pthread_mutex_lock(&pg->mu);
    }
    if (b != pg->p2p_published) {
      pg->p2p_published = b;
      pthread_mutex_unlock(&pg->mu);
      publish_blocked(pg, b);
      pthread_mutex_lock(&pg->mu);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 200 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
    pthread_cond_timedwait(&pg->pub_cv, &pg->mu, &ts);
  }
  pthread_mutex_unlock(&pg->mu);
  return NULL;
}

void crun__pg_mark(crun_pg_t *pg, const crun__coll_t *c) {
  /* read by the publisher thread, which needs no ordering with anything else:
   * a plain store (a seq_cst one is a locked xchg on every collective) */
  atomic_store_explicit(&pg->cur, ((uint64_t)c->kind << 56) | (c->seq & ((1ull << 56) - 1)),
                        memory_order_relaxed);
  if (pg->has_pub || pg->size < 2) return;
  pthread_mutex_lock(&pg->mu);
  if (!pg->has_pub && !pg->pub_stop)
    pg->has_pub = pthread_create(&pg->pub_thread, NULL, publisher, pg) == 0;
  pthread_mutex_unlock(&pg->mu);
}

void crun__pg_progress_stop(crun_pg_t *pg) {
  pthread_mutex_lock(&pg->mu);
  pg->pub_stop = 1;
  pthread_cond_broadcast(&pg->pub_cv);
  int had = pg->has_pub;
  pthread_mutex_unlock(&pg->mu);
  if (had) pthread_join(pg->pub_thread, NULL);
}

size_t crun__ranks_text(char *buf, size_t cap, const int *rs, int n) {
  size_t len = (size_t)snprintf(buf, cap, "%s ", n > 1 ? "ranks" : "rank");
  for (int i = 0; i < n && len < cap;) {
    int j = i;
    while (j + 1 < n && rs[j + 1] == rs[j] + 1) j++;
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", rs[i]);
    if (j > i && len < cap) len += (size_t)snprintf(buf + len, cap - len, "-%d", rs[j]);
    i = j + 1;
  }
  return len;
}

size_t crun__pg_ranks_text(const crun_pg_t *pg, char *buf, size_t cap, const int *rs, int n) {
  int shifted = 0;
  for (int i = 0; i < n && !shifted; i++) shifted = pg->global[rs[i]] != rs[i];
  if (!shifted || n > 64) return crun__ranks_text(buf, cap, rs, n);
  int gs[64];
  for (int i = 0; i < n; i++) gs[i] = pg->global[rs[i]];
  size_t len = crun__ranks_text(buf, cap, gs, n);
  if (len + 8 < cap) {
    len += (size_t)snprintf(buf + len, cap - len, " (group ");
    if (len < cap) len += crun__ranks_text(buf + len, cap - len, rs, n);
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, ")");
  }
  return len;
}

int crun__pg_timeout_text(crun_pg_t *pg, int rc) {
  char where[512], text[1024];
  snprintf(text, sizeof text, "%s", crun_last_error() + strlen("ETIMEDOUT: "));
  crun__pg_progress_report(pg, where, sizeof where);
  /* a stage below (TCP) or the rank that reported the timeout may have said it already */
  if (!where[0] || strstr(text, where)) return rc;
  return crun_error(rc, "%s; %s", text, where);
}

void crun__pg_progress_report(crun_pg_t *pg, char *out, size_t cap) {
  int n = pg->size, *rs = malloc(sizeof(int) * (size_t)n), *done = calloc((size_t)n, sizeof(int));
  char (*txt)[64] = calloc((size_t)n, 64);
  out[0] = 0;
  if (!rs || !done || !txt) goto out;
  publish(pg, atomic_load(&pg->cur));
  for (int r = 0; r < n; r++) {
    char key[32];
    snprintf(key, sizeof key, "progress/%d", r);
    crun_buf_t v = {0};
    int ok = crun__pg_board_peek(pg, key, &v);
    if (ok < 0) { /* the store is gone or slow: say so rather than guess, and stop asking */
      snprintf(out, cap, "the progress board could not be read (%s)", crun_last_error());
      goto out;
    }
    if (ok) snprintf(txt[r], 64, "%.*s", (int)v.len, (char *)v.data);
    crun_buf_free(&v);
  }
  size_t len = 0;
  for (int r = 0; r < n && len < cap; r++) {
    if (done[r]) continue;
    int m = 0;
    for (int q = r; q < n; q++)
      if (!done[q] && !strcmp(txt[q], txt[r])) { rs[m++] = q; done[q] = 1; }
    if (len) len += (size_t)snprintf(out + len, cap - len, "; ");
    if (len < cap) len += crun__pg_ranks_text(pg, out + len, cap - len, rs, m);
    if (len < cap && txt[r][0])
      len += (size_t)snprintf(out + len, cap - len, " %s at %s", m > 1 ? "are" : "is", txt[r]);
    else if (len < cap)
      len += (size_t)snprintf(out + len, cap - len, " %s not entered any collective", m > 1 ? "have" : "has");
  }
out:
  free(rs);
  free(done);
  free(txt);
}

/* coll.c — the public collective entry points: validate the arguments on
 * this rank (a clear EINVAL naming the call and rank), describe the operation
 * and hand it to the group's queue. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/checked.h"
#include "core/clock_int.h"
#include "cuda/cuda_int.h"

/* A new Work for kind on pg with the per-call options applied: `local` (a
 * blocking call's, on the caller's stack: no allocation, no reference
 * counting; crun__pg_submit moves it to the heap when it has to be queued) or
 * one from the heap, which holds a reference to the group until released. */
static crun_work_t *work_new(crun_pg_t *pg, int kind, crun_dtype_t dt, size_t count,
                             const crun_coll_opts_t *o, crun_work_t *local) {
  crun_work_t *w = local;
  if (w) memset(w, 0, sizeof *w);
  else if (CRUN__WORK_SPARE && (w = atomic_exchange(&pg->spare, NULL))) memset(w, 0, sizeof *w);
  else if (!(w = calloc(1, sizeof *w))) return NULL;
  atomic_init(&w->refs, 1);
  w->on_stack = local != NULL;
  if (!local) crun_pg_retain(pg);
  w->pg = pg;
  w->c.kind = kind;
  w->c.dt = dt;
  w->c.user_dt = -1;
  w->c.count = count;
  w->c.tag = o ? o->tag : 0;
  w->c.timeout = o ? crun__timeout_or(o->timeout, pg->timeout) : pg->timeout;
  w->c.src_out = -1;
  w->c.cuda = o && o->cuda;
  int dev = -1;
  if (w->c.cuda && crun__cuda_current_device(&dev) == 0) w->c.stream = crun__cuda_current_stream(dev);
  return w;
}

static int is_cuda(const crun_coll_opts_t *o) { return o && o->cuda; }

/* Device memory needs a device backend, host memory a host one: a clear
 * EINVAL before anything is queued (torch's "no backend for device"). */
static int check_device(const crun_pg_t *pg, int kind, const crun_coll_opts_t *o) {
  int dev_be = pg->be_dev != NULL || pg->be->device;
  if (is_cuda(o) && !dev_be)
    return crun_error(CRUN_EINVAL, "%s on %s: a CUDA tensor was given to a group with backend %s, which "
                      "works on CPU tensors (use backend \"nccl\", or \"auto\" on a GPU machine, or move the "
                      "tensor with :cpu())", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), pg->be->name);
  if (!is_cuda(o) && pg->be->device && kind != CRUN__COLL_BARRIER)
    return crun_error(CRUN_EINVAL, "%s on %s: a CPU tensor was given to a group with backend %s, which "
                      "works on CUDA tensors (move it with :cuda(), or create the group with backend \"auto\" "
                      "to serve both)", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), pg->be->name);
  return 0;
}

/* Checks what every call shares: group, dtype and (when used) op. */
/* The backend that will run a call with these options may refuse it. */
static int backend_validate(const crun_pg_t *pg, int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op,
                            const crun_coll_opts_t *o) {
  const crun_backend_vtable_t *be = is_cuda(o) && pg->be_dev ? pg->be_dev : pg->be;
  return be->validate ? be->validate(kind, dt, has_op, op, pg) : 0;
}

static int check_common_full(const crun_pg_t *pg, int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op,
                             const crun_coll_opts_t *o) {
#define name crun__coll_name(kind) /* only an error needs it */
  CRUN_CHECK(check_device(pg, kind, o));
  if ((int)dt < 0 || dt >= CRUN_DTYPE_COUNT) return crun_error(CRUN_EINVAL, "%s on %s: bad dtype %d", name, CRUN__WHO(pg, pg->rank), (int)dt);
  if (!has_op) return backend_validate(pg, kind, dt, 0, op, o);
  if ((int)op < 0 || op >= CRUN_OP_COUNT) return crun_error(CRUN_EINVAL, "%s on %s: bad reduce op %d", name, CRUN__WHO(pg, pg->rank), (int)op);
  if (crun_reduce_op_check(dt, op) < 0)
    return crun_error(CRUN_EINVAL, "%s on %s: %s", name, CRUN__WHO(pg, pg->rank), crun_last_error() + strlen("EINVAL: "));
  return backend_validate(pg, kind, dt, has_op, op, o);
#undef name
}

/* What check_common_full decides depends on the group and on (kind, dtype,
 * op, options) alone, so a call without options like the group's last one
 * that passed (pg->checked_call) passes again without the checks: ~70
 * instructions of a small all_reduce. */
static inline uint32_t checked_code(int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op) {
  return (uint32_t)1 << 31 | ((uint32_t)kind & 0xff) << 16 | ((uint32_t)dt & 0xff) << 8 |
         (has_op ? ((uint32_t)op & 0x7f) | 0x80 : 0);
}

static int check_common_dev(crun_pg_t *pg, int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op,
                            const crun_coll_opts_t *o) {
  if (!pg) return crun_error(CRUN_EINVAL, "%s: the process group is NULL", crun__coll_name(kind));
  uint32_t call = checked_code(kind, dt, has_op, op);
  int known = !o && (unsigned)dt < CRUN_DTYPE_COUNT && (unsigned)op < CRUN_OP_COUNT;
  if (known && atomic_load_explicit(&pg->checked_call, memory_order_relaxed) == call) return 0;
  CRUN_CHECK(check_common_full(pg, kind, dt, has_op, op, o));
  if (known) atomic_store_explicit(&pg->checked_call, call, memory_order_relaxed);
  return 0;
}

#define check_common(pg, kind, dt, has_op, op) check_common_dev(pg, kind, dt, has_op, op, opts)

static int check_rank(const crun_pg_t *pg, int kind, const char *what, int r) {
  if (r >= 0 && r < pg->size) return 0;
  return crun_error(CRUN_EINVAL, "%s on %s: %s %d is out of range for a group of %d ranks",
                    crun__coll_name(kind), CRUN__WHO(pg, pg->rank), what, r, pg->size);
}

static int check_buf(const crun_pg_t *pg, int kind, const void *p, size_t count, const char *what) {
  if (p || count == 0) return 0;
  return crun_error(CRUN_EINVAL, "%s on %s: %s is NULL", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), what);
}

/* Whether the byte ranges [a, a+na) and [b, b+nb) share a byte. */
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
  return na && nb && (const char *)a < (const char *)b + nb && (const char *)b < (const char *)a + na;
}

/* Fails when buffer `one` overlaps an entry of `list` (one buffer per rank,
 * count elements each) other than this rank's entry being `one` itself (the
 * in-place form): a transport may write one while it still reads the other. */
static int check_apart(const crun_pg_t *pg, int kind, const void *one, const void *const *list, size_t count,
                       crun_dtype_t dt, const char *one_name, const char *list_name) {
  size_t bytes = count * crun_dtype_size(dt);
  for (int i = 0; list && i < pg->size; i++)
    if (overlaps(one, bytes, list[i], bytes) && !(i == pg->rank && list[i] == one))
      return crun_error(CRUN_EINVAL, "%s on %s: the %s overlaps the %s for %s (only this rank's may be "
                        "the %s itself)", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), one_name, list_name, CRUN__WHO(pg, i), one_name);
  return 0;
}

/* A point-to-point tag must be 0 or more: torch's gloo ("Tag must be
 * nonnegative") and MPI refuse a negative one, so every backend does. */
static int check_tag(const crun_pg_t *pg, int kind, const crun_coll_opts_t *o) {
  if (!o || o->tag >= 0) return 0;
  return crun_error(CRUN_EINVAL, "%s on %s: tag %d is negative (tags must be 0 or more, as in "
                    "torch.distributed)", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), o->tag);
}

/* Copies an array of `size` buffer pointers, checking each one. */
static int copy_ptrs(crun_pg_t *pg, int kind, const void *const *src, size_t count, const char *what, void ***dst) {
  if (!src) return crun_error(CRUN_EINVAL, "%s on %s: the %s list is NULL", crun__coll_name(kind), CRUN__WHO(pg, pg->rank), what);
  *dst = malloc(sizeof(void *) * (size_t)pg->size);
  if (!*dst) return crun_error(CRUN_ENOMEM, "%s list", what);
  for (int i = 0; i < pg->size; i++) {
    CRUN_CHECK(check_buf(pg, kind, src[i], count, what));
    (*dst)[i] = (void *)src[i];
  }
  return 0;
}

/* Submits w; blocking calls release it here. */
static int submit(crun_pg_t *pg, crun_work_t *w, crun_work_t **work, int *src_out) {
  int rc = crun__pg_submit(pg, w, work);
  if (work && rc == 0) return 0;
  if (src_out) *src_out = rc == 0 ? w->c.src_out : -1;
  crun_work_release(w);
  return rc;
}

uint64_t crun__pg_p2p_block(crun_pg_t *pg, const crun__coll_t *c) {
  uint64_t gen = atomic_fetch_add_explicit(&pg->p2p_gen, 1, memory_order_relaxed) + 1;
  uint64_t b = gen << 24 | (uint64_t)c->kind << 20 | (uint64_t)((c->root + 1) & 0xfffff);
  atomic_store_explicit(&pg->p2p_wait, b, memory_order_relaxed);
  return b;
}

void crun__pg_p2p_unblock(crun_pg_t *pg, uint64_t b) {
  atomic_compare_exchange_strong(&pg->p2p_wait, &b, 0); /* unless another thread's wait replaced it */
}

/* submit for a blocking send or recv w: while it waits, pg->p2p_wait names
 * it (its peer, and a number of its own), which the publisher leaves on the
 * board for a peer's refusal (peer_blocked). */
static int submit_blocking_p2p(crun_pg_t *pg, crun_work_t *w, int *src_out) {
  uint64_t b = crun__pg_p2p_block(pg, &w->c);
  int rc = submit(pg, w, NULL, src_out);
  crun__pg_p2p_unblock(pg, b);
  return rc;
}

#define NEW_WORK(w, kind, dt, count)                                   \
  crun_work_t w##_local;                                               \
  crun_work_t *w = work_new(pg, kind, dt, count, opts, work ? NULL : &w##_local); \
  if (!w) return crun_error(CRUN_ENOMEM, "%s", crun__coll_name(kind))

/* Call number k of pg as peer q's progress board entry names it: 0 when
 * q has run no collective yet or is in a send or recv (no number). */
static uint64_t board_seq(crun_pg_t *pg, int q, int *gone) {
  char key[32];
  snprintf(key, sizeof key, "progress/%d", q);
  crun_buf_t v = {0};
  int ok = crun__pg_board_peek(pg, key, &v);
  if (ok < 0) {
    *gone = 1;
    return 0;
  }
  const char *hash = ok ? memchr(v.data, '#', v.len) : NULL;
  uint64_t seq = 0;
  for (const char *p = hash ? hash + 1 : NULL; p && p < (const char *)v.data + v.len && *p >= '0' && *p <= '9'; p++)
    seq = seq * 10 + (uint64_t)(*p - '0');
  crun_buf_free(&v);
  return seq;
}

/* The backend that runs collective c on pg, and its state. */
static const crun_backend_vtable_t *coll_backend(const crun_pg_t *pg, const crun__coll_t *c, void **state) {
  const crun_backend_vtable_t *be = c->cuda && pg->be_dev ? pg->be_dev : pg->be;
  *state = be == pg->be_dev ? pg->be_dev_state : pg->be_state;
  return be;
}

/* How long a peer must be seen blocked in one send or recv with this rank
 * before a refusal counts on it never reaching the refused call: more than
 * the publisher's 200 ms period, so that a wait that ended shows so. */
#define REFUSE_BLOCKED_S 0.5

/* What a refusal's agreement last saw of a peer's blocking send or recv. */
typedef struct {
  uint64_t gen;
  double since;
} blocked_seen_t;

/* Whether peer q has waited, for REFUSE_BLOCKED_S or more (seen: what was
 * seen of q before), in one blocking send to or recv from this rank
 * ("blocked/<q>", published within 200 ms) while this rank has no send or
 * recv going on in the background: only this rank could end that wait, and
 * it waits in its refusal, so q never reaches the refused call. */
static int peer_blocked(crun_pg_t *pg, int q, blocked_seen_t *seen) {
  char key[32], text[64];
  snprintf(key, sizeof key, "blocked/%d", q);
  crun_buf_t v = {0};
  if (crun__pg_board_peek(pg, key, &v) <= 0) return 0;
  snprintf(text, sizeof text, "%.*s", (int)(v.len < sizeof text ? v.len : sizeof text - 1), (const char *)v.data);
  crun_buf_free(&v);
  int kind = -1, peer = -2;
  unsigned long long gen = 0;
  if (sscanf(text, "%d %d %llu", &kind, &peer, &gen) != 3 || (kind != CRUN__COLL_SEND && kind != CRUN__COLL_RECV) ||
      !(peer == pg->rank || (peer == CRUN_ANY_SOURCE && pg->size == 2))) {
    seen->gen = 0;
    return 0;
  }
  double now = crun_clock();
  if (seen->gen != gen) *seen = (blocked_seen_t){gen, now};
  pthread_mutex_lock(&pg->mu);
  int mine = pg->npending;
  pthread_mutex_unlock(&pg->mu);
  return !mine && now - seen->since >= REFUSE_BLOCKED_S;
}

/* Whether peer q left "refused/<k>/<q>" on pg's board: 1 it did, 0 not yet
 * (it has not reached call k), -1 it will not: it runs call k or a later one
 * instead, it stopped the group by a refusal of its own ("stopped/<q>": one
 * that took no number, beside its queued work or another thread's call),
 * closed the group (pg.c, leave_closed) or saw it fail (the backend's abort
 * leaves stopped/<q> too), its process is gone (be's peer_gone: its end of
 * the mesh closed), or the board cannot be read. A peer sets its key before
 * its own agreement ends, so one that refused k and moved on shows its key
 * when looked at again after its progress. */
static int peer_refused(crun_pg_t *pg, const crun_backend_vtable_t *be, void *state, uint64_t k, int q,
                        blocked_seen_t *seen) {
  char key[64], stop[32];
  snprintf(key, sizeof key, "refused/%llu/%d", (unsigned long long)k, q);
  snprintf(stop, sizeof stop, "stopped/%d", q);
  const char *kp = key, *sp = stop;
  int ok = 0, gone = 0;
  if (crun_store_check(pg->board, &kp, 1, &ok) < 0) return -1;
  if (ok) return 1;
  if (be->peer_gone && state && be->peer_gone(state, q)) return -1;
  if (crun_store_check(pg->board, &sp, 1, &ok) < 0 || ok) return -1;
  uint64_t at = board_seq(pg, q, &gone);
  if (gone) return -1;
  if (at < k) return peer_blocked(pg, q, seen) ? -1 : 0;
  return crun_store_check(pg->board, &kp, 1, &ok) == 0 && ok ? 1 : -1;
}

/* The group's decision on its refused call k, once a rank made it: 1 the
 * group goes on, 0 it stops, -1 none yet (or the board cannot be read). */
static int decided(crun_pg_t *pg, uint64_t k) {
  char key[48];
  snprintf(key, sizeof key, "refusal/%llu", (unsigned long long)k);
  crun_buf_t v = {0};
  if (crun__pg_board_peek(pg, key, &v) <= 0) return -1;
  int go = v.len == 2 && memcmp(v.data, "go", 2) == 0;
  crun_buf_free(&v);
  return go;
}

/* Makes the group's decision on its refused call k this rank's finding
 * `go` unless a rank decided first: "refusal/<k>" is written once (the
 * store's compare_set), and every rank returns what it holds, so that no
 * rank says the group goes on while another stops it (a rank whose wait
 * ended just as a late peer's refusal came). A board that cannot be
 * written: 0 (this rank stops the group, which its peers then see). */
static int decide(crun_pg_t *pg, uint64_t k, int go) {
  char key[48];
  snprintf(key, sizeof key, "refusal/%llu", (unsigned long long)k);
  const char *mine = go ? "go" : "stop";
  crun_buf_t v = {0};
  if (crun_store_compare_set(pg->board, key, "", 0, mine, strlen(mine), &v) < 0) return 0;
  go = v.len == 2 && memcmp(v.data, "go", 2) == 0;
  crun_buf_free(&v);
  return go;
}

/* Whether every rank of pg refused its call number k, as this one did (rc,
 * text): then no rank sent or waits for anything of it, every rank numbers
 * its next call alike, and the group goes on, as torch's does after an
 * argument error every rank made (the same line at the REPL, the same bad
 * option in every rank's script). This rank leaves "refused/<k>/<rank>" on
 * the group's board and waits, up to 5 s (REFUSE_AGREE_S; the group's timeout
 * when shorter), until every peer either left its own or runs call k or a
 * later one instead (peer_refused), until a rank decided (decided), or until
 * the group fails; then the group's one decision (decide) is the answer.
 * Failure path only. */
#define REFUSE_AGREE_S 5.0
static int every_rank_refused(crun_pg_t *pg, const crun__coll_t *c, uint64_t k, int rc, const char *text) {
  void *state;
  const crun_backend_vtable_t *be = coll_backend(pg, c, &state);
  char key[64], val[600];
  snprintf(key, sizeof key, "refused/%llu/%d", (unsigned long long)k, pg->rank);
  int len = snprintf(val, sizeof val, "%d %s", -rc, text);
  char *done = calloc((size_t)pg->size, 1);
  blocked_seen_t *seen = calloc((size_t)pg->size, sizeof *seen);
  if (!done || !seen || !pg->board ||
      crun_store_set(pg->board, key, val, (size_t)(len < (int)sizeof val ? len : (int)sizeof val - 1)) < 0) {
    free(done);
    free(seen);
    return 0;
  }
  int left = pg->size - 1, ran = 0, known = -1;
  done[pg->rank] = 1;
  /* bounded well below the usual timeout: ranks that make the same mistake
   * reach it close together, and a peer held elsewhere (a recv from this
   * rank, which waits here) must not keep both until the timeout */
  double end = crun_clock() + (pg->timeout < REFUSE_AGREE_S ? pg->timeout : REFUSE_AGREE_S);
  useconds_t nap = 500;
  while (left > 0 && !ran && !atomic_load(&pg->is_broken) && crun_clock() < end && (known = decided(pg, k)) < 0) {
    for (int q = 0; q < pg->size && !ran; q++) {
      if (done[q]) continue;
      int r = peer_refused(pg, be, state, k, q, &seen[q]);
      if (r > 0) done[q] = 1, left--;
      ran = r < 0;
    }
    if (left > 0 && !ran) {
      usleep(nap);
      nap = nap < 20000 ? nap * 2 : 20000;
    }
  }
  free(done);
  free(seen);
  return known >= 0 ? known : decide(pg, k, left == 0);
}

/* A check only this rank makes (the root's own list of buffers, a list on a
 * rank that is not the root, a rank's all_to_all split sizes, its list-form
 * buffers overlapping, the count it sends itself, its dtype that takes no
 * such reduce op, a NULL buffer: any check of a collective's arguments, as
 * the peers' may pass theirs) failed with rc
 * for call c: its peers cannot see that and would finish the call without
 * it, or wait for it, and meet its next call as an EMISMATCH. When the
 * backend can reach them, the group fails with this rank's text, so every
 * peer fails this call (without algo/root_agree.c's check, a gather's
 * senders, who wait for nothing, their next one) naming this rank and its
 * reason. Failure path only; returns rc with crun_last_error()'s text kept. */
static int refuse_call(crun_pg_t *pg, const crun__coll_t *c, int rc) {
  /* the backend that runs c (backend "auto": the device one for CUDA
   * buffers, unusable until its first CUDA call connected it) */
  void *state;
  const crun_backend_vtable_t *be = coll_backend(pg, c, &state);
  if (pg->size < 2 || !state || !be->abort_reaches || !be->abort_reaches(state, c)) return rc;
  char mine[512], seq[32] = "", text[700];
  snprintf(mine, sizeof mine, "%s", crun_last_error());
  /* with nothing queued or running, c would have been the group's next call:
   * it takes that number, as the same call does on the peers, whose next
   * call then has the same number as this rank's (ESTATE) */
  uint64_t num = 0;
  if (crun__pg_number_refused(pg, &num)) snprintf(seq, sizeof seq, " #%llu", (unsigned long long)num);
  size_t n = strlen(crun_err_name(rc));
  const char *body = strncmp(mine, crun_err_name(rc), n) == 0 && mine[n] == ':' ? mine + n + 2 : mine;
  /* a group already unusable has no peer to agree with: theirs fail at once (ESTATE) */
  if (seq[0] && !be->private_board && !atomic_load(&pg->is_broken) && every_rank_refused(pg, c, num, rc, body))
    return crun_error(rc, "%s (every rank refused %s #%llu: the group goes on)", body, crun__coll_name(c->kind),
                      (unsigned long long)num);
  int root = crun__coll_rooted(c->kind) && c->root == pg->rank;
  /* this rank, once: "rank 2 (group rank 1)" on a sub-group whose ranks are shifted */
  snprintf(text, sizeof text, "%s (%s%s refused its part of %s%s: the group stops)", mine, CRUN__WHO(pg, pg->rank),
           root ? ", the root," : "", crun__coll_name(c->kind), seq);
  /* a peer waiting for a refusal this rank never numbered stops at once:
   * failing the group leaves stopped/<rank> on its board (work.c break_group) */
  crun__pg_fail(pg, rc, text);
  return crun_error(rc, "%s", body);
}

/* refuse_call for work w, which it releases. */
static int refuse(crun_pg_t *pg, crun_work_t *w, int rc) {
  rc = refuse_call(pg, &w->c, rc);
  crun_work_release(w);
  return rc;
}

int crun_pg_refuse(crun_pg_t *pg, const char *call, int root, const crun_coll_opts_t *opts, int status,
                   const char *text) {
  crun__coll_t c = {.kind = -1, .root = root, .cuda = opts && opts->cuda};
  for (int k = 0; k < CRUN__COLL_COUNT && call; k++)
    if (strcmp(call, crun__coll_name(k)) == 0) c.kind = k;
  crun_error(status, "%s", text ? text : "refused");
  if (!pg || c.kind < 0 || status >= 0) return status;
  return refuse_call(pg, &c, status);
}

/* refuse_call for collective kind of pg (root: its root, or -1), refused
 * before it had a Work; a NULL group has no peers to tell. */
static int refuse_kind(crun_pg_t *pg, int kind, int root, const crun_coll_opts_t *opts, int rc) {
  if (!pg) return rc;
  crun__coll_t c = {.kind = kind, .root = root, .cuda = is_cuda(opts)};
  return refuse_call(pg, &c, rc);
}

/* Runs check `call` of this rank's own arguments to collective kind (on a
 * rank whose peers may have passed theirs: a dtype that takes no such op,
 * a NULL buffer, a root out of range): a failure refuses the call for the
 * group (refuse_call), so that no peer pairs its call with this rank's next. */
#define REFUSE_CHECK(kind, root, call)                                 \
  do {                                                                 \
    int crun__r = (call);                                              \
    if (crun__r < 0) return refuse_kind(pg, kind, root, opts, crun__r); \
  } while (0)

#define REFUSE_WORK(w, call)                                           \
  do {                                                                 \
    int crun__r = (call);                                              \
    if (crun__r < 0) return refuse(pg, w, crun__r);                    \
  } while (0)

/* premul_sum (torch's make_premul_sum): the work sums scaled copies of the
 * inputs, owned by the work, so that an input that is not also the output is
 * left as the caller gave it (reduce on a non-root rank, reduce_scatter);
 * all_reduce and the root of reduce scale their buffer in place, which is
 * where the result goes. Every engine then runs a plain sum. */
static double premul_factor(const crun_coll_opts_t *opts) { return opts ? opts->premul_factor : 1.0; }

static int premul_copies(crun_work_t *w, const void *const *ins, int n) {
  size_t bytes = w->c.count * crun_dtype_size(w->c.dt);
  if (bytes == 0) return 0;
  char *s = malloc(bytes * (size_t)n);
  if (!s) return crun_error(CRUN_ENOMEM, "premul_sum: %zu bytes of scaled inputs", bytes * (size_t)n);
  w->scratch = s;
  return 0;
}

int crun_pg_send(crun_pg_t *pg, const void *buf, size_t count, crun_dtype_t dt, int dst,
                 const crun_coll_opts_t *opts, crun_work_t **work) {
  CRUN_CHECK(check_common(pg, CRUN__COLL_SEND, dt, 0, 0));
  CRUN_CHECK(check_tag(pg, CRUN__COLL_SEND, opts));
  CRUN_CHECK(check_rank(pg, CRUN__COLL_SEND, "destination rank", dst));
  if (dst == pg->rank) return crun_error(CRUN_EINVAL, "send on %s: cannot send to itself", CRUN__WHO(pg, pg->rank));
  CRUN_CHECK(check_buf(pg, CRUN__COLL_SEND, buf, count, "buffer"));
  NEW_WORK(w, CRUN__COLL_SEND, dt, count);
  w->c.buf = (void *)buf;
  w->c.root = dst;
  return work ? submit(pg, w, work, NULL) : submit_blocking_p2p(pg, w, NULL);
}

int crun_pg_recv(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, int src,
                 const crun_coll_opts_t *opts, int *src_out, crun_work_t **work) {
  CRUN_CHECK(check_common(pg, CRUN__COLL_RECV, dt, 0, 0));
  CRUN_CHECK(check_tag(pg, CRUN__COLL_RECV, opts));
  if (src != CRUN_ANY_SOURCE) CRUN_CHECK(check_rank(pg, CRUN__COLL_RECV, "source rank", src));
  if (src == pg->rank) return crun_error(CRUN_EINVAL, "recv on %s: cannot receive from itself", CRUN__WHO(pg, pg->rank));
  if (src == CRUN_ANY_SOURCE && (is_cuda(opts) && pg->be_dev ? pg->be_dev : pg->be)->device)
    return crun_error(CRUN_ENOTSUP, "recv from any rank on %s is not supported by backend nccl (NCCL needs "
                      "the source rank)", CRUN__WHO(pg, pg->rank));
  if (src == CRUN_ANY_SOURCE && pg->size < 2)
    return crun_error(CRUN_EINVAL, "recv on %s: no other rank to receive from", CRUN__WHO(pg, pg->rank));
  CRUN_CHECK(check_buf(pg, CRUN__COLL_RECV, buf, count, "buffer"));
  NEW_WORK(w, CRUN__COLL_RECV, dt, count);
  w->c.buf = buf;
  w->c.root = src;
  return work ? submit(pg, w, work, src_out) : submit_blocking_p2p(pg, w, src_out);
}

int crun_pg_broadcast(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, int root,
                      const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_BROADCAST, root, check_common(pg, CRUN__COLL_BROADCAST, dt, 0, 0));
  REFUSE_CHECK(CRUN__COLL_BROADCAST, root, check_rank(pg, CRUN__COLL_BROADCAST, "root", root));
  REFUSE_CHECK(CRUN__COLL_BROADCAST, root, check_buf(pg, CRUN__COLL_BROADCAST, buf, count, "buffer"));
  NEW_WORK(w, CRUN__COLL_BROADCAST, dt, count);
  w->c.buf = buf;
  w->c.root = root;
  return submit(pg, w, work, NULL);
}

/* crun_pg_all_reduce's general path (out of line: the commonest call does
 * not pay for its frame) */
static __attribute__((noinline)) int all_reduce_checked(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt,
                                                        crun_reduce_op_t op, const crun_coll_opts_t *opts,
                                                        crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_ALL_REDUCE, -1, check_common(pg, CRUN__COLL_ALL_REDUCE, dt, 1, op));
  REFUSE_CHECK(CRUN__COLL_ALL_REDUCE, -1, check_buf(pg, CRUN__COLL_ALL_REDUCE, buf, count, "buffer"));
  if (op == CRUN_OP_PREMUL_SUM && !is_cuda(opts)) {
    REFUSE_CHECK(CRUN__COLL_ALL_REDUCE, -1, crun_scale_mul(dt, buf, buf, count, premul_factor(opts)));
    op = CRUN_OP_SUM;
  }
  NEW_WORK(w, CRUN__COLL_ALL_REDUCE, dt, count);
  w->c.buf = buf;
  w->c.op = op;
  w->c.premul = premul_factor(opts);
  return submit(pg, w, work, NULL);
}

int crun_pg_all_reduce(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt,
                       crun_reduce_op_t op, const crun_coll_opts_t *opts, crun_work_t **work) {
  /* the commonest call: checked like the group's last one, which passed */
  if (!opts && !work && pg && (buf || !count) && (unsigned)dt < CRUN_DTYPE_COUNT && (unsigned)op < CRUN_OP_COUNT &&
      op != CRUN_OP_PREMUL_SUM &&
      atomic_load_explicit(&pg->checked_call, memory_order_relaxed) == checked_code(CRUN__COLL_ALL_REDUCE, dt, 1, op)) {
    int rc = crun__pg_all_reduce_now(pg, buf, count, dt, op);
    if (rc <= 0) return rc;
  }
  return all_reduce_checked(pg, buf, count, dt, op, opts, work);
}

int crun_pg_reduce(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, crun_reduce_op_t op,
                   int root, const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_REDUCE, root, check_common(pg, CRUN__COLL_REDUCE, dt, 1, op));
  REFUSE_CHECK(CRUN__COLL_REDUCE, root, check_rank(pg, CRUN__COLL_REDUCE, "root", root));
  REFUSE_CHECK(CRUN__COLL_REDUCE, root, check_buf(pg, CRUN__COLL_REDUCE, buf, count, "buffer"));
  NEW_WORK(w, CRUN__COLL_REDUCE, dt, count);
  w->c.buf = buf;
  w->c.root = root;
  w->c.premul = premul_factor(opts);
  if (op == CRUN_OP_PREMUL_SUM && !is_cuda(opts)) {
    if (pg->rank != root) {
      REFUSE_WORK(w, premul_copies(w, NULL, 1));
      if (w->scratch) w->c.buf = w->scratch;
    }
    REFUSE_WORK(w, crun_scale_mul(dt, w->c.buf, buf, count, premul_factor(opts)));
    op = CRUN_OP_SUM;
  }
  w->c.op = op;
  return submit(pg, w, work, NULL);
}

int crun_pg_all_gather(crun_pg_t *pg, void *const *outs, const void *in, size_t count,
                       crun_dtype_t dt, const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_ALL_GATHER, -1, check_common(pg, CRUN__COLL_ALL_GATHER, dt, 0, 0));
  REFUSE_CHECK(CRUN__COLL_ALL_GATHER, -1, check_buf(pg, CRUN__COLL_ALL_GATHER, in, count, "input"));
  NEW_WORK(w, CRUN__COLL_ALL_GATHER, dt, count);
  w->c.in = in;
  REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_ALL_GATHER, (const void *const *)outs, count, "output", &w->c.outs));
  if (!is_cuda(opts))
    REFUSE_WORK(w, check_apart(pg, CRUN__COLL_ALL_GATHER, in, (const void *const *)outs, count, dt, "input", "output"));
  return submit(pg, w, work, NULL);
}

int crun_pg_gather(crun_pg_t *pg, const void *in, void *const *outs, size_t count, crun_dtype_t dt,
                   int root, const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_GATHER, root, check_common(pg, CRUN__COLL_GATHER, dt, 0, 0));
  REFUSE_CHECK(CRUN__COLL_GATHER, root, check_rank(pg, CRUN__COLL_GATHER, "root", root));
  REFUSE_CHECK(CRUN__COLL_GATHER, root, check_buf(pg, CRUN__COLL_GATHER, in, count, "input"));
  NEW_WORK(w, CRUN__COLL_GATHER, dt, count);
  w->c.in = in;
  w->c.root = root;
  if (pg->rank == root)
    REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_GATHER, (const void *const *)outs, count, "output", &w->c.outs));
  if (pg->rank == root && !is_cuda(opts))
    REFUSE_WORK(w, check_apart(pg, CRUN__COLL_GATHER, in, (const void *const *)outs, count, dt, "input", "output"));
  return submit(pg, w, work, NULL);
}

int crun_pg_scatter(crun_pg_t *pg, void *out, const void *const *ins, size_t count, crun_dtype_t dt,
                    int root, const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_SCATTER, root, check_common(pg, CRUN__COLL_SCATTER, dt, 0, 0));
  REFUSE_CHECK(CRUN__COLL_SCATTER, root, check_rank(pg, CRUN__COLL_SCATTER, "root", root));
  REFUSE_CHECK(CRUN__COLL_SCATTER, root, check_buf(pg, CRUN__COLL_SCATTER, out, count, "output"));
  NEW_WORK(w, CRUN__COLL_SCATTER, dt, count);
  w->c.buf = out;
  w->c.root = root;
  if (pg->rank == root)
    REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_SCATTER, ins, count, "input", (void ***)&w->c.ins));
  if (pg->rank == root && !is_cuda(opts))
    REFUSE_WORK(w, check_apart(pg, CRUN__COLL_SCATTER, out, ins, count, dt, "output", "input"));
  return submit(pg, w, work, NULL);
}

int crun_pg_reduce_scatter(crun_pg_t *pg, void *out, const void *const *ins, size_t count,
                           crun_dtype_t dt, crun_reduce_op_t op, const crun_coll_opts_t *opts,
                           crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_REDUCE_SCATTER, -1, check_common(pg, CRUN__COLL_REDUCE_SCATTER, dt, 1, op));
  REFUSE_CHECK(CRUN__COLL_REDUCE_SCATTER, -1, check_buf(pg, CRUN__COLL_REDUCE_SCATTER, out, count, "output"));
  size_t bytes = count * crun_dtype_size(dt);
  NEW_WORK(w, CRUN__COLL_REDUCE_SCATTER, dt, count);
  w->c.buf = out;
  w->c.op = op;
  for (int i = 0; ins && !is_cuda(opts) && i < pg->size; i++)
    if (overlaps(out, bytes, ins[i], bytes))
      REFUSE_WORK(w, crun_error(CRUN_EINVAL, "reduce_scatter on %s: the output overlaps the input for %s "
                                "(inputs are read while the output is written: give a separate output)", CRUN__WHO(pg, pg->rank), CRUN__WHO(pg, i)));
  REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_REDUCE_SCATTER, ins, count, "input", (void ***)&w->c.ins));
  w->c.premul = premul_factor(opts);
  if (op == CRUN_OP_PREMUL_SUM && !is_cuda(opts)) {
    REFUSE_WORK(w, premul_copies(w, ins, pg->size));
    for (int i = 0; i < pg->size && bytes > 0; i++) {
      char *s = (char *)w->scratch + (size_t)i * bytes;
      REFUSE_WORK(w, crun_scale_mul(dt, s, ins[i], count, premul_factor(opts)));
      ((const void **)w->c.ins)[i] = s;
    }
    w->c.op = CRUN_OP_SUM;
  }
  return submit(pg, w, work, NULL);
}

/* Copies the per-peer counts of all_to_all. */
static int copy_counts(crun_pg_t *pg, const size_t *src, const char *what, size_t **dst) {
  if (!src) return crun_error(CRUN_EINVAL, "all_to_all on %s: %s counts are NULL", CRUN__WHO(pg, pg->rank), what);
  *dst = malloc(sizeof(size_t) * (size_t)pg->size);
  if (!*dst) return crun_error(CRUN_ENOMEM, "all_to_all counts");
  memcpy(*dst, src, sizeof(size_t) * (size_t)pg->size);
  return 0;
}

/* all_to_all in place (an output block overlapping an input block, as in
 * all_to_all_single(t, t)): a transport that receives from one peer before
 * it sent to every peer would overwrite inputs still to be sent, so the work
 * then sends from a copy of the inputs that it owns. */
static int a2a_unalias(crun_work_t *w, int n) {
  crun__coll_t *c = &w->c;
  size_t es = crun_dtype_size(c->dt), total = 0;
  /* the span of every output block against that of every input block first:
   * separate tensors (the usual call) are told apart in one pass, and only
   * spans that meet are checked block by block */
  const char *olo = NULL, *ohi = NULL, *ilo = NULL, *ihi = NULL;
  for (int i = 0; i < n; i++) {
    const char *o = c->outs[i], *in = c->ins[i];
    size_t ob = c->out_counts[i] * es, ib = c->in_counts[i] * es;
    if (ob && (!olo || o < olo)) olo = o;
    if (ob && (!ohi || o + ob > ohi)) ohi = o + ob;
    if (ib && (!ilo || in < ilo)) ilo = in;
    if (ib && (!ihi || in + ib > ihi)) ihi = in + ib;
  }
  if (!olo || !ilo || olo >= ihi || ilo >= ohi) return 0;
  int alias = 0;
  for (int i = 0; i < n && !alias; i++)
    for (int j = 0; j < n && !alias; j++)
      alias = overlaps(c->outs[i], c->out_counts[i] * es, c->ins[j], c->in_counts[j] * es);
  if (!alias) return 0;
  for (int j = 0; j < n; j++) total += c->in_counts[j] * es;
  char *s = malloc(total);
  if (!s) return crun_error(CRUN_ENOMEM, "all_to_all on %s: %zu bytes to copy in-place inputs", CRUN__WHO(w->pg, w->pg->rank), total);
  w->scratch = s;
  for (int j = 0; j < n; j++) {
    size_t b = c->in_counts[j] * es;
    memcpy(s, c->ins[j], b);
    ((const void **)c->ins)[j] = s;
    s += b;
  }
  return 0;
}

/* Checks all_to_all's blocks in one direction (bufs, counts: one per rank;
 * what: "input" or "output"): a NULL buffer with a count is an EINVAL, and so
 * is a block whose bytes (count x element size), or a sum of the blocks'
 * counts or bytes, does not fit in a size_t, or a block that would end past
 * the address space: no later size or pointer arithmetic (a2a_unalias, the
 * engines) can then wrap. *sum (when not NULL): the sum of the counts. */
static int a2a_check_blocks(const crun_pg_t *pg, const void *const *bufs, const size_t *counts, crun_dtype_t dt,
                            const char *what, size_t *sum) {
  size_t es = crun_dtype_size(dt), elems = 0, bytes = 0, b = 0;
  for (int i = 0; i < pg->size; i++) {
    if (!bufs[i] && counts[i])
      return crun_error(CRUN_EINVAL, "all_to_all on %s: buffer %d is NULL", CRUN__WHO(pg, pg->rank), i);
    if (crun__mul_size(counts[i], es, &b) || (uintptr_t)bufs[i] > UINTPTR_MAX - b)
      return crun_error(CRUN_EINVAL, "all_to_all on %s: the %s block for %s (%zu elements of %zu bytes) "
                        "does not fit in memory", CRUN__WHO(pg, pg->rank), what, CRUN__WHO(pg, i), counts[i], es);
    if (crun__add_size(elems, counts[i], &elems) || crun__add_size(bytes, b, &bytes))
      return crun_error(CRUN_EINVAL, "all_to_all on %s: the %s counts add up to more than %zu bytes at the "
                        "one for %s (%zu elements)", CRUN__WHO(pg, pg->rank), what, SIZE_MAX, CRUN__WHO(pg, i), counts[i]);
  }
  if (sum) *sum = elems;
  return 0;
}

int crun_pg_all_to_all(crun_pg_t *pg, void *const *outs, const size_t *out_counts,
                       const void *const *ins, const size_t *in_counts, crun_dtype_t dt,
                       const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_ALL_TO_ALL, -1, check_common(pg, CRUN__COLL_ALL_TO_ALL, dt, 0, 0));
  NEW_WORK(w, CRUN__COLL_ALL_TO_ALL, dt, 0);
  REFUSE_WORK(w, copy_counts(pg, out_counts, "output", &w->c.out_counts));
  REFUSE_WORK(w, copy_counts(pg, in_counts, "input", &w->c.in_counts));
  REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_ALL_TO_ALL, (const void *const *)outs, 0, "output", &w->c.outs));
  REFUSE_WORK(w, copy_ptrs(pg, CRUN__COLL_ALL_TO_ALL, ins, 0, "input", (void ***)&w->c.ins));
  REFUSE_WORK(w, a2a_check_blocks(pg, (const void *const *)outs, out_counts, dt, "output", NULL));
  REFUSE_WORK(w, a2a_check_blocks(pg, ins, in_counts, dt, "input", &w->c.count));
  if (in_counts[pg->rank] != out_counts[pg->rank])
    REFUSE_WORK(w, crun_error(CRUN_EINVAL, "all_to_all on %s: sends %zu elements to itself but expects %zu",
                              CRUN__WHO(pg, pg->rank), in_counts[pg->rank], out_counts[pg->rank]));
  if (!is_cuda(opts)) REFUSE_WORK(w, a2a_unalias(w, pg->size));
  return submit(pg, w, work, NULL);
}

int crun_pg_barrier(crun_pg_t *pg, const crun_coll_opts_t *opts, crun_work_t **work) {
  REFUSE_CHECK(CRUN__COLL_BARRIER, -1, check_common(pg, CRUN__COLL_BARRIER, CRUN_UINT8, 0, 0));
  crun_store_flush_sets(); /* a set made before the barrier is seen after it (store.h) */
  NEW_WORK(w, CRUN__COLL_BARRIER, CRUN_UINT8, 0);
  return submit(pg, w, work, NULL);
}

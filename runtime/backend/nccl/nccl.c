/* nccl.c — the nccl backend's vtable: communicator creation (unique id
 * through the store, ncclCommSplit for sub-groups), stream ordering, every
 * collective and send/recv, and the device work hooks (end events). See
 * nccl_int.h for the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/nccl/nccl_int.h"
#include "cuda/cuda_int.h"
#include "cuda/launch.h"

/* The caller's current stream on dev (crun.cuda.current_stream). */
static cudaStream_t current_stream(int dev) { return (cudaStream_t)crun__cuda_current_stream(dev); }

/* Records EIO for `call`'s error e in desc on pg's rank (pg NULL: a work
 * that may outlive its group, named by desc alone). */
static int cuda_fail(cudaError_t e, const char *desc, const crun_pg_t *pg, const char *call) {
  if (!pg) return crun_error(CRUN_EIO, "%s: %s failed: %s", desc, call, cudaGetErrorString(e));
  return crun_error(CRUN_EIO, "%s on %s: %s failed: %s", desc, CRUN__WHO(pg, pg->rank), call, cudaGetErrorString(e));
}

/* A call's description ("all_reduce #3"), written on first use (DESC): a
 * call that succeeds never formats it. */
typedef struct {
  const crun__coll_t *c;
  char text[64];
  const crun_pg_t *pg; /* c's group: a peer is named as CRUN__WHO names it */
} desc_t;

static const char *DESC(desc_t *d) {
  if (!d->text[0]) crun__pg_coll_desc(d->pg, d->c, d->text, sizeof d->text);
  return d->text;
}

/* Evaluates `call`, an NCCL call on the group's communicator `comm` (a local
 * the gate sets, named in the call), through the gate (watch.c):
 * ncclInvalidUsage without calling it once the group is marked aborted. */
#define GATED(b, comm, call) (crun__nccl_enter((b), &(comm)) < 0 ? ncclInvalidUsage : crun__nccl_exit((b), (call)))

/* The failure r of `call` on b's communicator: a peer's abort notice when a
 * remote or system error meets one, else its text with NCCL's last error,
 * read through the gate; ESTATE once the group is marked aborted (the gate
 * refused, or NCCL's text is gone with the communicator). */
static int fail_on(crun__nccl_t *b, ncclResult_t r, desc_t *d, const char *call) {
  const char *desc = DESC(d);
  /* a peer that aborted the group posted why before its communicator went
   * (watch.c): that names the cause, NCCL's "remote process exited" does not */
  if (r == ncclRemoteError || r == ncclSystemError) {
    int prc = crun__nccl_poll_abort(b, desc);
    if (prc < 0) return prc;
  }
  ncclComm_t comm;
  if (crun__nccl_enter(b, &comm) < 0)
    return crun_error(CRUN_ESTATE, "%s on %s: %s: the communicator was aborted", desc, CRUN__WHO(b->pg, b->pg->rank), call);
  int rc = crun__nccl_fail(r, comm, desc, b->pg, call);
  crun__nccl_exit(b, ncclSuccess);
  return rc;
}

#define NCCL_TRY(b, comm, call, desc)                                               \
  do {                                                                              \
    ncclResult_t crun__nr = GATED(b, comm, call);                                   \
    if (crun__nr != ncclSuccess) return fail_on(b, crun__nr, desc, #call);          \
  } while (0)

static int env_check(void) {
  const char *e = getenv("CRUN_NCCL_CHECK");
  return !(e && !strcmp(e, "0"));
}

/* Publishes a new communicator to the watchdog thread, which is already
 * running (ThreadSanitizer: data race against ncclCommInitRank's write into
 * b->comm when it was handed &b->comm). */
static void set_comm(crun__nccl_t *b, ncclComm_t nc) { atomic_store(&b->comm, nc); }

/* Stream, events, scratch and the watchdog of a fresh state. */
static int setup(crun__nccl_t *b, const char *what) {
  cudaError_t e;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  CRUN_CHECK(crun__cuda_current_device(&b->device)); /* under crun-lua: LOCAL_RANK's */
  if ((e = cudaSetDevice(b->device)) != cudaSuccess) return cuda_fail(e, what, b->pg, "cudaSetDevice");
  if ((e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess)
    return cuda_fail(e, what, b->pg, "cudaStreamCreateWithFlags");
  if ((e = cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming)) != cudaSuccess)
    return cuda_fail(e, what, b->pg, "cudaEventCreateWithFlags");
  CRUN_CHECK(crun__nccl_pool_new(&b->pool));
  CRUN_CHECK(crun__cuda_alloc(b->device, sizeof(float), b->stream, &b->one));
  b->check = env_check();
  return crun__nccl_watch_start(b);
}

static void nccl_destroy(void *state) {
  crun__nccl_t *b = state;
  if (!b) return;
  if (b->has_watch) { /* pending work ends, or the watchdog aborts it at its deadline */
    pthread_mutex_lock(&b->mu);
    while (b->pending && !atomic_load(&b->aborted)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_nsec += 50 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
      pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
  }
  crun__nccl_watch_stop(b);
  ncclComm_t comm = atomic_exchange(&b->comm, NULL); /* NULL once aborted */
  if (comm) {
    if (b->stream) cudaStreamSynchronize(b->stream);
    ncclCommDestroy(comm);
  }
  if (b->one) crun__cuda_free(b->device, b->one, sizeof(float), b->stream);
  if (b->scratch) crun__cuda_free(b->device, b->scratch, b->scratch_cap, b->stream);
  if (b->stream) cudaStreamSynchronize(b->stream);
  if (b->ready) cudaEventDestroy(b->ready);
  crun__nccl_pool_release(b->pool); /* the spares; an op still held goes back later */
  if (b->stream) cudaStreamDestroy(b->stream);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  free(b->fail_text);
  free(b);
}

/* A store barrier before ncclCommInitRank (which has no deadline): every
 * member writes nccl/join/<rank>; a missing one is named in an ETIMEDOUT. */
static int join(crun_pg_t *pg) {
  char k[48];
  snprintf(k, sizeof k, "nccl/join/%d", pg->rank);
  CRUN_CHECK(crun_store_set(pg->store, k, "1", 1));
  int n = pg->size, rc = 0;
  char (*keys)[48] = calloc((size_t)n, 48);
  const char **kp = calloc((size_t)n, sizeof *kp);
  if (!keys || !kp) { free(keys); free(kp); return crun_error(CRUN_ENOMEM, "nccl join"); }
  for (int r = 0; r < n; r++) snprintf(keys[r], 48, "nccl/join/%d", r), kp[r] = keys[r];
  rc = crun_store_wait(pg->store, kp, (size_t)n, pg->timeout);
  if (rc == CRUN_ETIMEDOUT) {
    int *late = malloc(sizeof(int) * (size_t)n), nl = 0;
    for (int r = 0; late && r < n; r++) {
      int ok = 0;
      if (crun_store_check(pg->board, &kp[r], 1, &ok) == 0 && !ok) late[nl++] = r;
    }
    char who[256] = "some ranks";
    if (late && nl) crun__pg_ranks_text(pg, who, sizeof who, late, nl);
    free(late);
    rc = crun_error(CRUN_ETIMEDOUT, "creating group '%s' (backend nccl) on %s: %s did not join within %.1f s; "
                    "every member must create the group, in the same order on every rank", pg->prefix,
                    CRUN__WHO(pg, pg->rank), who, pg->timeout);
  }
  free(keys);
  free(kp);
  return rc;
}

static int nccl_create(crun_pg_t *pg, void **state) {
  crun__nccl_t *b = calloc(1, sizeof *b);
  if (!b) return crun_error(CRUN_ENOMEM, "nccl backend");
  b->pg = pg;
  char what[64];
  snprintf(what, sizeof what, "creating group '%.40s'", pg->prefix);
  int rc = setup(b, what);
  ncclUniqueId id;
  if (rc == 0 && pg->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) rc = crun__nccl_fail(r, NULL, what, pg, "ncclGetUniqueId");
    else rc = crun_store_set(pg->store, "nccl/id", &id, sizeof id);
  }
  if (rc == 0) rc = join(pg);
  if (rc == 0 && pg->rank != 0) {
    crun_buf_t v = {0};
    rc = crun_store_get(pg->store, "nccl/id", &v);
    if (rc == 0 && v.len != sizeof id) rc = crun_error(CRUN_EIO, "%s on %s: the unique id in the store is %zu bytes", what,
                                                     CRUN__WHO(pg, pg->rank), v.len);
    if (rc == 0) memcpy(&id, v.data, sizeof id);
    crun_buf_free(&v);
  }
  if (rc == 0) {
    /* the watchdog (started by setup) reads b->comm meanwhile */
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRank(&nc, pg->size, id, pg->rank);
    if (r != ncclSuccess) rc = crun__nccl_fail(r, NULL, what, pg, "ncclCommInitRank");
    else set_comm(b, nc);
  }
  if (rc < 0) { nccl_destroy(b); return rc; }
  *state = b;
  return 0;
}

/* Sub-groups: every rank of the parent calls this (pg NULL for non-members),
 * right after the parent agreed on the members, so ncclCommSplit (collective
 * over the parent) cannot hang on a missing rank. */
static int nccl_split(void *parent_state, crun_pg_t *pg, void **state) {
  crun__nccl_t *p = parent_state, *b = NULL;
  desc_t d = {NULL, "", NULL}; /* a text of its own (DESC formats none) */
  const char *what = d.text;
  snprintf(d.text, sizeof d.text, "new_group on '%.40s'", p->pg->prefix);
  if (atomic_load(&p->aborted) || !p->comm)
    return crun_error(CRUN_ESTATE, "%s on %s: the parent's communicator was aborted", what,
                      CRUN__WHO(p->pg, p->pg->rank));
  if (pg) {
    if (!(b = calloc(1, sizeof *b))) return crun_error(CRUN_ENOMEM, "nccl backend");
    b->pg = pg;
  }
  int rc = b ? setup(b, what) : 0;
  ncclComm_t nc = NULL, pc;
  ncclResult_t r = GATED(p, pc, ncclCommSplit(pc, rc == 0 && b ? 0 : NCCL_SPLIT_NOCOLOR, b ? pg->rank : 0, &nc, NULL));
  if (r != ncclSuccess && rc == 0) rc = fail_on(p, r, &d, "ncclCommSplit");
  if (!b) return rc;
  if (nc) set_comm(b, nc);
  if (rc < 0) { nccl_destroy(b); return rc; }
  *state = b;
  return 0;
}

static void nccl_abort(void *state, int status, const char *text) {
  crun__nccl_abort_comm(state, status, text, 1);
}

/* The abort posts a notice to the group's board (watch.c) that every peer
 * reads: in the signature check of its next collective (check.c), and while
 * it waits inside NCCL, through its watchdog (with the check off, for
 * send/recv): every peer of every call learns of it. */
static int nccl_abort_reaches(void *state, const crun__coll_t *c) {
  (void)c;
  return state != NULL;
}

/* ---------------------------------------------------------------- device work */

static int op_wait(void *dev, int host, double timeout) {
  crun__nccl_op_t *op = dev;
  double end = crun_clock() + (timeout > 0 ? timeout : 1e9);
  char desc[64];
  if (!host) { /* the caller's stream waits on the end event */
    if (op->status < 0) return crun_error(op->status, "%s", op->err);
    cudaError_t e = op->end ? cudaStreamWaitEvent(current_stream(op->device), op->end, 0) : cudaSuccess;
    if (e == cudaSuccess) return 0;
    crun__nccl_name_text(NULL, &op->name, desc, sizeof desc); /* the op may outlive its group */
    return cuda_fail(e, desc, NULL, "cudaStreamWaitEvent");
  }
  for (;;) {
    int st = atomic_load_explicit((_Atomic int *)&op->done, memory_order_acquire);
    if (st && op->status < 0) return crun_error(op->status, "%s", op->err);
    if (st || !op->end || cudaEventQuery(op->end) == cudaSuccess) {
      if (op->status < 0) return crun_error(op->status, "%s", op->err);
      return 0;
    }
    if (crun_clock() > end) {
      crun__nccl_name_text(NULL, &op->name, desc, sizeof desc);
      return crun_error(CRUN_ETIMEDOUT, "synchronize on %s timed out after %.3g s; it is still running", desc, timeout);
    }
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int op_query(void *dev) {
  crun__nccl_op_t *op = dev;
  if (op->status < 0) return crun_error(op->status, "%s", op->err);
  return op->done || !op->end || cudaEventQuery(op->end) == cudaSuccess;
}

static void op_free(void *dev) { crun__nccl_op_unref(dev); }

static const crun__dev_ops_t dev_ops = {op_wait, op_query, op_free};

/* ---------------------------------------------------------------- operations */

typedef int (*enqueue_fn)(crun__nccl_t *b, crun__coll_t *c, desc_t *desc);

static int enqueue(crun__nccl_t *b, crun__coll_t *c, enqueue_fn fn, cudaStream_t cur, desc_t *desc);

/* Check, order after the caller's stream, enqueue, record the end event and
 * make the caller's stream wait on it. */
static int run(crun__nccl_t *b, crun__coll_t *c, enqueue_fn fn) {
  desc_t desc = {c, "", b->pg};
  if (atomic_load(&b->aborted)) {
    pthread_mutex_lock(&b->mu);
    int rc = crun_error(CRUN_ESTATE, "%s on %s: the communicator was aborted: %s", DESC(&desc), CRUN__WHO(b->pg, b->pg->rank),
                        b->fail_text ? b->fail_text : "?");
    pthread_mutex_unlock(&b->mu);
    return rc;
  }
  if (c->kind != CRUN__COLL_SEND && c->kind != CRUN__COLL_RECV) CRUN_CHECK(crun__nccl_check(b, c));
  /* the caller's stream at the call (async work runs on the group's thread) */
  cudaStream_t cur = c->stream ? (cudaStream_t)c->stream : current_stream(b->device);
  int saved = b->device;
  cudaGetDevice(&saved);
  if (saved != b->device) cudaSetDevice(b->device);
  int rc = enqueue(b, c, fn, cur, &desc);
  if (saved != b->device) cudaSetDevice(saved);
  return rc;
}

/* run()'s part on the group's device. */
static int enqueue(crun__nccl_t *b, crun__coll_t *c, enqueue_fn fn, cudaStream_t cur, desc_t *desc) {
  cudaError_t e = cudaEventRecord(b->ready, cur);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(b->stream, b->ready, 0);
  if (e != cudaSuccess) return cuda_fail(e, DESC(desc), b->pg, "ordering after the current stream");
  crun__nccl_op_t *op = NULL;
  CRUN_CHECK(crun__nccl_op_begin(b, c, &op));
  int rc = crun__nccl_op_end(b, op, fn(b, c, desc));
  if (rc == 0 && op->end && (e = cudaStreamWaitEvent(cur, op->end, 0)) != cudaSuccess)
    rc = cuda_fail(e, DESC(desc), b->pg, "cudaStreamWaitEvent");
  if (rc < 0) { crun__nccl_op_unref(op); return rc; }
  c->dev = op;
  c->dev_ops = &dev_ops;
  return 0;
}

/* The NCCL op for c's reduction; *post (else 1) is a factor to scale the
 * result by afterwards. A one-rank group never asks NCCL for avg or
 * premul_sum: there avg is the identity and premul_sum a scaling, so it asks
 * for ncclSum (a copy) and scales the result itself. NCCL's own one-rank
 * kernel for those ops drops the tail before 2.29.7 (it gives each of up to
 * 32 blocks alignUp(n / blocks, 16 B) elements, which can end short of n).
 * On an H200 with NCCL 2.28.9, reduce_scatter avg of 4099 float64 left the
 * last element unwritten; tests/gpu_double reproduces that kernel's split. */
static int red_op(crun__nccl_t *b, const crun__coll_t *c, ncclDataType_t t, ncclRedOp_t *op, double *post,
                  desc_t *desc) {
  *post = 1;
  if (c->op != CRUN_OP_PREMUL_SUM) {
    if (crun__nccl_op(c->dt, c->op, op, "", b->pg) < 0) /* again for the text */
      return crun__nccl_op(c->dt, c->op, op, DESC(desc), b->pg);
    if (b->pg->size == 1 && c->op == CRUN_OP_AVG) *op = ncclSum;
    return 0;
  }
  if (c->dt != CRUN_FLOAT32 && c->dt != CRUN_FLOAT64 && c->dt != CRUN_FLOAT16 && c->dt != CRUN_BFLOAT16)
    return crun_error(CRUN_ENOTSUP, "%s on %s: reduce op premul_sum on %s is not supported by backend nccl",
                      DESC(desc), CRUN__WHO(b->pg, b->pg->rank), crun_dtype_name(c->dt));
  if (b->pg->size == 1) {
    *op = ncclSum;
    *post = c->premul;
    return 0;
  }
  unsigned char scalar[8];
  crun_elem_set_double(c->dt, scalar, 0, c->premul);
  ncclComm_t comm;
  NCCL_TRY(b, comm, ncclRedOpCreatePreMulSum(op, scalar, t, ncclScalarHostImmediate, comm), desc);
  return 0;
}

/* Destroys an op red_op created (ncclSum and the other built-in ops stay). */
static void red_done(crun__nccl_t *b, ncclRedOp_t op) {
  ncclComm_t comm; /* once aborted, the op went with the communicator */
  if ((int)op >= (int)ncclNumOps) (void)GATED(b, comm, ncclRedOpDestroy(op, comm));
}

/* A one-rank premul_sum's scaling (red_op's *post), on the group's stream. */
static int post_scale(crun__nccl_t *b, const crun__coll_t *c, double post, desc_t *desc) {
  if (post == 1 || c->count == 0) return 0;
  (void)desc; /* the launcher's error names the kernel and the dtype */
  return crun__cuda_binary_scalar(CRUN_BIN_MUL, c->dt, c->buf, c->buf, (int64_t)c->count, post, 0, b->stream);
}

static int reduces(int kind) {
  return kind == CRUN__COLL_ALL_REDUCE || kind == CRUN__COLL_REDUCE || kind == CRUN__COLL_REDUCE_SCATTER;
}

static int types(crun__nccl_t *b, const crun__coll_t *c, ncclDataType_t *t, size_t *n, desc_t *desc) {
  int rc = crun__nccl_dtype(c->dt, reduces(c->kind), c->op, t, n, "", b->pg);
  return rc < 0 ? crun__nccl_dtype(c->dt, reduces(c->kind), c->op, t, n, DESC(desc), b->pg) : rc;
}

static int q_all_reduce(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  ncclRedOp_t op;
  size_t k;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  double post;
  CRUN_CHECK(red_op(b, c, t, &op, &post, desc));
  if (b->pg->size == 1) return post_scale(b, c, post, desc); /* in place: the result is the input */
  ncclComm_t comm;
  ncclResult_t r = GATED(b, comm, ncclAllReduce(c->buf, c->buf, c->count * k, t, op, comm, b->stream));
  red_done(b, op);
  return r == ncclSuccess ? post_scale(b, c, post, desc) : fail_on(b, r, desc, "ncclAllReduce");
}

static int q_reduce(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  ncclRedOp_t op;
  size_t k;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  double post;
  CRUN_CHECK(red_op(b, c, t, &op, &post, desc));
  if (b->pg->size == 1) return post_scale(b, c, post, desc);
  ncclComm_t comm;
  ncclResult_t r = GATED(b, comm, ncclReduce(c->buf, c->buf, c->count * k, t, op, c->root, comm, b->stream));
  red_done(b, op);
  return r == ncclSuccess ? post_scale(b, c, post, desc) : fail_on(b, r, desc, "ncclReduce");
}

static int q_broadcast(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  size_t k;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  if (b->pg->size == 1) return 0;
  ncclComm_t comm;
  NCCL_TRY(b, comm, ncclBroadcast(c->buf, c->buf, c->count * k, t, c->root, comm, b->stream), desc);
  return 0;
}

/* The group's device scratch of at least n bytes into *p: all_gather and
 * reduce_scatter stage blocks that are not one contiguous run there. It is
 * kept for the next call (cudaMallocAsync and cudaFreeAsync per call cost
 * microseconds) and grows when a call needs more; it is used only on the
 * group's stream, in order, so a call never finds it still in use; it shows
 * in the device's memory figures until the group is destroyed. */
static int scratch(crun__nccl_t *b, size_t n, void **p, desc_t *desc) {
  (void)desc; /* the allocator's error names the size and the device's memory */
  if (n == 0) n = 1; /* NCCL is given no NULL buffer */
  if (n > b->scratch_cap) {
    if (b->scratch) crun__cuda_free(b->device, b->scratch, b->scratch_cap, b->stream);
    b->scratch = NULL, b->scratch_cap = 0;
    CRUN_CHECK(crun__cuda_alloc(b->device, n, b->stream, &b->scratch));
    b->scratch_cap = n;
  }
  *p = b->scratch;
  return 0;
}

static int copy(crun__nccl_t *b, void *dst, const void *src, size_t n, desc_t *desc) {
  if (n == 0 || dst == src) return 0;
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, b->stream);
  return e == cudaSuccess ? 0 : cuda_fail(e, DESC(desc), b->pg, "cudaMemcpyAsync");
}

/* all_gather: native ncclAllGather into the outputs when they are one
 * contiguous run, else into a scratch buffer copied out. */
static int q_all_gather(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  size_t k, bytes = c->count * crun_dtype_size(c->dt), p = (size_t)b->pg->size;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  if (p == 1) return copy(b, c->outs[0], c->in, bytes, desc);
  int flat = 1;
  for (size_t r = 1; r < p; r++) flat &= (char *)c->outs[r] == (char *)c->outs[0] + r * bytes;
  void *dst = c->outs[0];
  if (!flat) CRUN_CHECK(scratch(b, bytes * p, &dst, desc));
  ncclComm_t comm;
  ncclResult_t nr = GATED(b, comm, ncclAllGather(c->in, dst, c->count * k, t, comm, b->stream));
  int rc = nr == ncclSuccess ? 0 : fail_on(b, nr, desc, "ncclAllGather");
  for (size_t r = 0; !flat && rc == 0 && r < p; r++) rc = copy(b, c->outs[r], (char *)dst + r * bytes, bytes, desc);
  return rc;
}

static int q_reduce_scatter(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  ncclRedOp_t op;
  size_t k, bytes = c->count * crun_dtype_size(c->dt), p = (size_t)b->pg->size;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  if (p == 1) { /* this rank's block is the result (the op checked before anything is written) */
    double post = 1;
    int rc = red_op(b, c, t, &op, &post, desc);
    if (rc == 0) rc = copy(b, c->buf, c->ins[0], bytes, desc);
    return rc == 0 ? post_scale(b, c, post, desc) : rc;
  }
  int flat = 1;
  for (size_t r = 1; r < p; r++) flat &= (const char *)c->ins[r] == (const char *)c->ins[0] + r * bytes;
  void *src = (void *)c->ins[0];
  if (!flat) CRUN_CHECK(scratch(b, bytes * p, &src, desc));
  int rc = 0;
  for (size_t r = 0; !flat && rc == 0 && r < p; r++) rc = copy(b, (char *)src + r * bytes, c->ins[r], bytes, desc);
  double post = 1;
  if (rc == 0) rc = red_op(b, c, t, &op, &post, desc);
  if (rc == 0) {
    ncclComm_t comm;
    ncclResult_t nr = GATED(b, comm, ncclReduceScatter(src, c->buf, c->count * k, t, op, comm, b->stream));
    red_done(b, op);
    rc = nr == ncclSuccess ? post_scale(b, c, post, desc) : fail_on(b, nr, desc, "ncclReduceScatter");
  }
  return rc;
}

/* Runs the sends and receives of one grouped call (ncclGroupStart/End),
 * inside the gate from ncclGroupStart to ncclGroupEnd: the group is one
 * NCCL operation (a refused ncclGroupEnd would leave the thread's group
 * open). */
static int grouped(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  ncclDataType_t t;
  size_t k, es = crun_dtype_size(c->dt);
  int me = b->pg->rank, n = b->pg->size, rc = 0;
  CRUN_CHECK(types(b, c, &t, &k, desc));
  if (n == 1 && c->kind == CRUN__COLL_GATHER) return copy(b, c->outs[0], c->in, c->count * es, desc);
  if (n == 1 && c->kind == CRUN__COLL_SCATTER) return copy(b, c->buf, c->ins[0], c->count * es, desc);
  if (n == 1 && c->kind == CRUN__COLL_ALL_TO_ALL) return copy(b, c->outs[0], c->ins[0], c->in_counts[0] * es, desc);
  ncclComm_t comm;
  if (crun__nccl_enter(b, &comm) < 0) return fail_on(b, ncclInvalidUsage, desc, "ncclGroupStart");
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) {
    crun__nccl_exit(b, r);
    return fail_on(b, r, desc, "ncclGroupStart");
  }
  switch (c->kind) {
  case CRUN__COLL_SEND: r = ncclSend(c->buf, c->count * k, t, c->root, comm, b->stream); break;
  case CRUN__COLL_RECV: r = ncclRecv(c->buf, c->count * k, t, c->root, comm, b->stream); break;
  case CRUN__COLL_GATHER:
    if (me != c->root) { r = ncclSend(c->in, c->count * k, t, c->root, comm, b->stream); break; }
    for (int p = 0; p < n && r == ncclSuccess && rc == 0; p++)
      if (p == me) rc = copy(b, c->outs[p], c->in, c->count * es, desc);
      else r = ncclRecv(c->outs[p], c->count * k, t, p, comm, b->stream);
    break;
  case CRUN__COLL_SCATTER:
    if (me != c->root) { r = ncclRecv(c->buf, c->count * k, t, c->root, comm, b->stream); break; }
    for (int p = 0; p < n && r == ncclSuccess && rc == 0; p++)
      if (p == me) rc = copy(b, c->buf, c->ins[p], c->count * es, desc);
      else r = ncclSend(c->ins[p], c->count * k, t, p, comm, b->stream);
    break;
  case CRUN__COLL_ALL_TO_ALL:
    for (int p = 0; p < n && r == ncclSuccess && rc == 0; p++) {
      if (p == me) { rc = copy(b, c->outs[p], c->ins[p], c->in_counts[p] * es, desc); continue; }
      if (c->in_counts[p]) r = ncclSend(c->ins[p], c->in_counts[p] * k, t, p, comm, b->stream);
      if (r == ncclSuccess && c->out_counts[p]) r = ncclRecv(c->outs[p], c->out_counts[p] * k, t, p, comm, b->stream);
    }
    break;
  }
  ncclResult_t e = crun__nccl_exit(b, ncclGroupEnd());
  if (rc < 0) return rc;
  if (r != ncclSuccess) return fail_on(b, r, desc, "ncclSend/ncclRecv");
  return e == ncclSuccess ? 0 : fail_on(b, e, desc, "ncclGroupEnd");
}

/* barrier: an all_reduce of one float on the device, then a host wait. */
static int q_barrier(crun__nccl_t *b, crun__coll_t *c, desc_t *desc) {
  (void)c;
  if (b->pg->size == 1) return 0; /* the end event: after the caller's work */
  ncclComm_t comm;
  NCCL_TRY(b, comm, ncclAllReduce(b->one, b->one, 1, ncclFloat32, ncclSum, comm, b->stream), desc);
  return 0;
}

static int nccl_coll(void *state, crun__coll_t *c) {
  crun__nccl_t *b = state;
  switch (c->kind) {
  case CRUN__COLL_ALL_REDUCE: return run(b, c, q_all_reduce);
  case CRUN__COLL_REDUCE: return run(b, c, q_reduce);
  case CRUN__COLL_BROADCAST: return run(b, c, q_broadcast);
  case CRUN__COLL_ALL_GATHER: return run(b, c, q_all_gather);
  case CRUN__COLL_REDUCE_SCATTER: return run(b, c, q_reduce_scatter);
  case CRUN__COLL_GATHER: case CRUN__COLL_SCATTER: case CRUN__COLL_ALL_TO_ALL: return run(b, c, grouped);
  case CRUN__COLL_BARRIER: {
    int rc = run(b, c, q_barrier);
    if (rc == 0) rc = op_wait(c->dev, 1, 0);
    return rc;
  }
  }
  return crun_error(CRUN_ENOTSUP, "%s is not supported by backend nccl", crun__coll_name(c->kind));
}

static int nccl_p2p(void *state, crun__coll_t *c) {
  crun__nccl_t *b = state;
  if (c->kind == CRUN__COLL_RECV && c->root == CRUN_ANY_SOURCE)
    return crun_error(CRUN_ENOTSUP, "recv from any rank on %s is not supported by backend nccl (NCCL needs the "
                      "source rank)", CRUN__WHO(b->pg, b->pg->rank));
  int rc = run(b, c, grouped);
  if (rc == 0 && c->kind == CRUN__COLL_RECV) c->src_out = c->root;
  return rc;
}

static int nccl_validate(int kind, crun_dtype_t dt, int has_op, crun_reduce_op_t op, const crun_pg_t *pg) {
  ncclDataType_t t;
  ncclRedOp_t o;
  size_t k;
  const char *name = crun__coll_name(kind);
  if (kind == CRUN__COLL_BARRIER) return 0;
  CRUN_CHECK(crun__nccl_dtype(dt, has_op, op, &t, &k, name, pg));
  if (!has_op || op == CRUN_OP_PREMUL_SUM) return 0;
  return crun__nccl_op(dt, op, &o, name, pg);
}

/* A GPU is visible to this process. */
static int nccl_available(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const crun_backend_vtable_t crun__backend_nccl = {
    .name = "nccl", .available = nccl_available, .validate = nccl_validate, .create = nccl_create, .abort = nccl_abort, .destroy = nccl_destroy, .split = nccl_split,
    .abort_reaches = nccl_abort_reaches,
    .device = 1, .send = nccl_p2p, .recv = nccl_p2p, .broadcast = nccl_coll, .all_reduce = nccl_coll,
    .reduce = nccl_coll, .all_gather = nccl_coll, .gather = nccl_coll, .scatter = nccl_coll,
    .reduce_scatter = nccl_coll, .all_to_all = nccl_coll, .barrier = nccl_coll};

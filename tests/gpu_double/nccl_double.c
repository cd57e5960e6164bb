/* nccl_double.c — a TEST DOUBLE of the NCCL subset crun's nccl backend calls,
 * for CI machines without a GPU. Never linked into libcrunrt or crun-lua: only
 * the double build (tests/gpu_double) links it, in place of libnccl.
 *
 * "Device memory" is host memory. Each communicator is a crun process group
 * with the cpu backend among the same ranks: ncclGetUniqueId starts a store
 * server and writes its address and a fresh name into the id (NCCL's own
 * bootstrap works the same way), ncclCommInitRank joins it. Operations run at
 * on the calling thread once the stream reached them (crun_dbl_stream_sync,
 * the CUDA runtime double's uncounted cudaStreamSynchronize: earlier work on the stream, and what the stream
 * waits for, has run), as if the device ran them at that moment, through
 * the inner group's collectives on staging copies (an aborted operation may
 * still finish on the inner group later; it then only touches the staging).
 * ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd are collected and
 * run together at ncclGroupEnd (async inner sends and receives). Reduce ops
 * made by ncclRedOpCreatePreMulSum scale staging copies, then sum.
 *
 * A host thread inside an operation polls the communicator's abort flag, so
 * ncclCommAbort (the watchdog's) makes it return ncclInvalidUsage at once, as
 * the real library's abort does. Failure injection for the specs:
 *   CRUN_NCCL_DOUBLE_ASYNC_ERROR=<global rank>: that rank's communicators skip
 *     their first operation and ncclCommGetAsyncError reports
 *     ncclSystemError from then on (a device-side fault);
 *   CRUN_NCCL_DOUBLE_TIMEOUT=<s>: the inner groups' timeout (default 120);
 *   CRUN_NCCL_DOUBLE_ENTRY_DELAY_US=<us>: every operation's call taking a
 *     communicator sleeps that long before it first reads it (a host thread
 *     stalled on its way into NCCL: widens the window a racing abort must
 *     not hit).
 * A rank that never calls is simulated by the spec itself (it sleeps).
 *
 * The real ncclCommAbort frees the communicator. The double keeps it, so a
 * call that arrives with it after ncclCommAbort returned (a use after free
 * with NCCL) is caught at its entry (entry()): the double prints that on
 * stderr and aborts the process. A thread already inside a call when the
 * abort comes is fine (NCCL's abort is meant to end such calls). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crun.h"
#include "double_counts.h"

struct ncclComm {
  crun_pg_t *pg;
  crun_store_t *store;
  int rank, nranks;
  char name[96];
  int nsplits;
  atomic_int aborted;
  atomic_int gone;       /* ncclCommAbort returned: NCCL would have freed it */
  int inject;            /* ASYNC_ERROR names this rank */
  atomic_int async_err;  /* ncclResult_t reported by ncclCommGetAsyncError (the watchdog's thread) */
  char last[256];
  struct ncclComm *next_aborted; /* the list of aborted communicators */
};

#define MAX_PREMUL 64
static struct { int used; double f; } premul[MAX_PREMUL];
static pthread_mutex_t premul_mu = PTHREAD_MUTEX_INITIALIZER;

static crun_store_server_t *server;
static pthread_mutex_t server_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------- groups of calls */

typedef struct {
  int send;
  void *buf;
  size_t count;
  ncclDataType_t dt;
  int peer;
  ncclComm_t comm;
} p2p_t;

static _Thread_local int group_depth;
static _Thread_local p2p_t *queued;
static _Thread_local int nqueued, capqueued;

static double inner_timeout(void) {
  const char *e = getenv("CRUN_NCCL_DOUBLE_TIMEOUT");
  double t = e ? atof(e) : 0;
  return t > 0 ? t : 120.0;
}

static int dtype(ncclDataType_t t, crun_dtype_t *out) {
  switch (t) {
  case ncclInt8: *out = CRUN_INT8; return 0;
  case ncclUint8: *out = CRUN_UINT8; return 0;
  case ncclInt32: *out = CRUN_INT32; return 0;
  case ncclInt64: *out = CRUN_INT64; return 0;
  case ncclFloat16: *out = CRUN_FLOAT16; return 0;
  case ncclFloat32: *out = CRUN_FLOAT32; return 0;
  case ncclFloat64: *out = CRUN_FLOAT64; return 0;
  case ncclBfloat16: *out = CRUN_BFLOAT16; return 0;
  default: return -1; /* uint32, uint64, fp8: crun has no such dtype */
  }
}

static ncclResult_t fail(ncclComm_t comm, ncclResult_t r, const char *fmt, const char *detail) {
  if (comm) snprintf(comm->last, sizeof comm->last, fmt, detail ? detail : "");
  return r;
}

/* Waits for an inner work, watching the abort flag. */
static ncclResult_t await(ncclComm_t comm, crun_work_t *w, const char *what) {
  for (;;) {
    if (atomic_load(&comm->aborted)) {
      /* the work may still run on the inner group: it owns its staging */
      return fail(comm, ncclInvalidUsage, "%s: the communicator was aborted", what);
    }
    int rc = crun_work_wait(w, 0.01);
    if (rc == 0) { crun_work_release(w); return ncclSuccess; }
    if (rc == CRUN_ETIMEDOUT && strstr(crun_last_error(), "it is still running")) continue;
    snprintf(comm->last, sizeof comm->last, "%s: %s", what, crun_last_error());
    crun_work_release(w);
    return ncclRemoteError;
  }
}

/* A device-side fault on the injected rank: the operation never runs. */
static int injected(ncclComm_t comm) {
  if (!comm->inject) return 0;
  comm->async_err = ncclSystemError;
  snprintf(comm->last, sizeof comm->last, "injected by CRUN_NCCL_DOUBLE_ASYNC_ERROR (simulated device fault)");
  return 1;
}

static long entry_delay_us(void) {
  const char *e = getenv("CRUN_NCCL_DOUBLE_ENTRY_DELAY_US");
  return e ? atol(e) : 0;
}

/* The first thing every call taking comm does: fails the process when comm
 * was freed, as far as NCCL is concerned (see the top of the file). stall:
 * the call is one an operation makes (the entry delay applies; not to the
 * watchdog's polls, which hold the group's lock). */
static void entry(ncclComm_t comm, const char *fn, int stall) {
  if (stall) crun_dbl_count_add(CRUN_DBL_NCCL_OP); /* an operation's call (double_counts.h) */
  long us = stall ? entry_delay_us() : 0;
  if (us > 0) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
  }
  if (comm && atomic_load(&comm->gone)) {
    fprintf(stderr, "nccl double: %s called with a communicator after ncclCommAbort returned on it "
            "(a use after free with NCCL)\n", fn);
    abort();
  }
}

static ncclResult_t check_comm(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  if (atomic_load(&comm->aborted)) return fail(comm, ncclInvalidUsage, "the communicator was aborted%s", "");
  return ncclSuccess;
}

/* ---------------------------------------------------------------- setup */

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

static _Thread_local char init_last[512];

const char *ncclGetLastError(ncclComm_t comm) {
  entry(comm, "ncclGetLastError", 0);
  return comm ? comm->last : init_last;
}

/* Records why setting up a communicator failed (ncclGetLastError(NULL)). */
static ncclResult_t init_fail(const char *what) {
  snprintf(init_last, sizeof init_last, "%s: %s", what, crun_last_error());
  return ncclSystemError;
}

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  pthread_mutex_lock(&server_mu);
  if (!server && crun_store_server_start_token("127.0.0.1", 0, "", &server) < 0) server = NULL;
  crun_store_server_t *s = server;
  pthread_mutex_unlock(&server_mu);
  if (!s) return init_fail("the double's bootstrap store server");
  static atomic_int n;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "crun-double %d %d-%ld-%d", crun_store_server_port(s), (int)getpid(),
           (long)ts.tv_nsec, atomic_fetch_add(&n, 1));
  return ncclSuccess;
}

static ncclResult_t join(ncclComm_t *out, crun_store_t *store, const char *name, int nranks, int rank, int inject) {
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  crun_pg_opts_t o = {.store = store, .rank = rank, .world_size = nranks, .timeout = inner_timeout(),
                      .backend = "cpu", .name = name};
  if (crun_pg_new(&o, &c->pg) < 0) {
    free(c);
    return init_fail("the double's inner process group");
  }
  /* everyone finished joining before anyone may leave (rank 0 serves the store) */
  if (crun_pg_barrier(c->pg, NULL, NULL) < 0) {
    ncclResult_t r = init_fail("the double's inner process group");
    crun_pg_release(c->pg);
    free(c);
    return r;
  }
  crun_store_retain(store);
  c->store = store;
  c->rank = rank;
  c->nranks = nranks;
  c->inject = inject;
  snprintf(c->name, sizeof c->name, "%s", name);
  atomic_init(&c->aborted, 0);
  *out = c;
  return ncclSuccess;
}

static int inject_me(void) {
  const char *e = getenv("CRUN_NCCL_DOUBLE_ASYNC_ERROR"), *r = getenv("RANK");
  return e && *e && r && atoi(e) == atoi(r);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int port = 0;
  char name[96];
  if (sscanf(id.internal, "crun-double %d %80s", &port, name) != 2) return ncclInvalidArgument;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  crun_store_tcp_opts_t so = {.host = "127.0.0.1", .port = port, .timeout = inner_timeout(), .token = ""};
  crun_store_t *store = NULL;
  if (crun_store_tcp_new(&so, &store) < 0) return init_fail("the double's bootstrap store");
  ncclResult_t r = join(comm, store, name, nranks, rank, inject_me());
  crun_store_release(store);
  return r;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)config;
  return ncclCommInitRank(comm, nranks, id, rank);
}

/* Every rank of comm calls it: an all_gather of (color, key) on the inner
 * group, then a new inner group among the ranks of each color, ordered by
 * (key, rank). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  entry(comm, "ncclCommSplit", 1);
  ncclResult_t r = check_comm(comm);
  if (r != ncclSuccess) return r;
  int n = comm->nranks;
  int64_t mine[2] = {color, key}, *all = calloc((size_t)n * 2, sizeof(int64_t));
  void **outs = calloc((size_t)n, sizeof *outs);
  if (!all || !outs) { free(all); free(outs); return ncclSystemError; }
  for (int i = 0; i < n; i++) outs[i] = all + 2 * i;
  crun_work_t *w = NULL;
  int rc = crun_pg_all_gather(comm->pg, outs, mine, 2, CRUN_INT64, NULL, &w);
  r = rc < 0 ? ncclSystemError : await(comm, w, "ncclCommSplit");
  int idx = ++comm->nsplits, size = 0, me = 0;
  for (int i = 0; r == ncclSuccess && i < n; i++) {
    if (all[2 * i] != color) continue;
    size++;
    if (all[2 * i + 1] < key || (all[2 * i + 1] == key && i < comm->rank)) me++;
  }
  free(all);
  free(outs);
  *newcomm = NULL;
  if (r != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) return r;
  char name[160];
  snprintf(name, sizeof name, "%s.s%d.c%d", comm->name, idx, color);
  return join(newcomm, comm->store, name, size, me, comm->inject);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  entry(comm, "ncclCommDestroy", 0);
  if (!comm) return ncclInvalidArgument;
  if (atomic_load(&comm->aborted)) return ncclInvalidUsage;
  crun_pg_release(comm->pg);
  crun_store_release(comm->store);
  free(comm);
  return ncclSuccess;
}

/* Marks the communicator aborted: a thread inside an operation returns at
 * once, leaving its inner work (which holds the inner group) to end by the
 * inner timeout. The communicator object itself is never freed (a thread may
 * still be leaving an operation): a few hundred bytes per aborted one, kept
 * on a list so that LeakSanitizer sees them held, not lost (the caller drops
 * its handle, as it must after ncclCommAbort). */
static struct ncclComm *aborted_comms;
static pthread_mutex_t aborted_mu = PTHREAD_MUTEX_INITIALIZER;

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  entry(comm, "ncclCommAbort", 0); /* a second abort: a double free with NCCL */
  if (!comm || atomic_exchange(&comm->aborted, 1)) return ncclSuccess;
  pthread_mutex_lock(&aborted_mu);
  comm->next_aborted = aborted_comms;
  aborted_comms = comm;
  pthread_mutex_unlock(&aborted_mu);
  crun_pg_release(comm->pg);
  crun_store_release(comm->store);
  atomic_store(&comm->gone, 1);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
  entry(comm, "ncclCommGetAsyncError", 0);
  if (!comm) return ncclInvalidArgument;
  *err = (ncclResult_t)comm->async_err;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  entry(comm, "ncclCommCount", 0);
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  entry(comm, "ncclCommUserRank", 0);
  *rank = comm->rank;
  return ncclSuccess;
}

/* ---------------------------------------------------------------- reduce ops */

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  entry(comm, "ncclRedOpCreatePreMulSum", 1);
  crun_dtype_t dt;
  if (dtype(datatype, &dt) < 0 || residence != ncclScalarHostImmediate)
    return fail(comm, ncclInvalidArgument, "ncclRedOpCreatePreMulSum: unsupported type or residence%s", "");
  double f = crun_elem_get_double(dt, scalar, 0);
  pthread_mutex_lock(&premul_mu);
  for (int i = 0; i < MAX_PREMUL; i++)
    if (!premul[i].used) {
      premul[i].used = 1;
      premul[i].f = f;
      pthread_mutex_unlock(&premul_mu);
      *op = (ncclRedOp_t)(ncclNumOps + i);
      return ncclSuccess;
    }
  pthread_mutex_unlock(&premul_mu);
  return fail(comm, ncclInternalError, "too many premul_sum ops%s", "");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  entry(comm, "ncclRedOpDestroy", 1);
  int i = (int)op - ncclNumOps;
  if (i < 0 || i >= MAX_PREMUL) return ncclInvalidArgument;
  pthread_mutex_lock(&premul_mu);
  premul[i].used = 0;
  pthread_mutex_unlock(&premul_mu);
  return ncclSuccess;
}

/* crun's op for op; *factor set (else 1) for premul_sum ops. */
static int redop(ncclRedOp_t op, crun_reduce_op_t *out, double *factor) {
  *factor = 1;
  switch ((int)op) {
  case ncclSum: *out = CRUN_OP_SUM; return 0;
  case ncclProd: *out = CRUN_OP_PRODUCT; return 0;
  case ncclMax: *out = CRUN_OP_MAX; return 0;
  case ncclMin: *out = CRUN_OP_MIN; return 0;
  case ncclAvg: *out = CRUN_OP_AVG; return 0;
  }
  int i = (int)op - ncclNumOps;
  if (i < 0 || i >= MAX_PREMUL || !premul[i].used) return -1;
  *factor = premul[i].f;
  *out = CRUN_OP_SUM;
  return 0;
}

/* ---------------------------------------------------------------- collectives */

typedef struct {
  ncclComm_t comm;
  crun_dtype_t dt;
  crun_reduce_op_t op;
  double factor;
  size_t es;
} call_t;

static ncclResult_t prepare(call_t *k, ncclComm_t comm, ncclDataType_t t, int has_op, ncclRedOp_t op, const char *what) {
  ncclResult_t r = check_comm(comm);
  if (r != ncclSuccess) return r;
  k->comm = comm;
  if (dtype(t, &k->dt) < 0) return fail(comm, ncclInvalidArgument, "%s: datatype not supported by the double", what);
  k->es = crun_dtype_size(k->dt);
  if (has_op && redop(op, &k->op, &k->factor) < 0) return fail(comm, ncclInvalidArgument, "%s: bad reduce op", what);
  return ncclSuccess;
}

/* memcpy that takes the NULL data of an empty tensor (count 0), as NCCL does */
static void copy_out(void *dst, const void *src, size_t bytes) {
  if (bytes) memcpy(dst, src, bytes);
}

static void *stage(const void *src, size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (p && src && bytes) memcpy(p, src, bytes);
  return p;
}

/* The staging buffers of an operation: freed when done, leaked to the
 * inner group (never freed) when the communicator was aborted meanwhile. */
static ncclResult_t finish(call_t *k, ncclResult_t r, void *a, void *b) {
  if (!atomic_load(&k->comm->aborted)) { free(a); free(b); }
  return r;
}

static void scale(call_t *k, void *buf, size_t n) {
  if (k->factor != 1) crun_scale_mul(k->dt, buf, buf, n, k->factor);
}

/* What NCCL writes of a one-rank avg or premul_sum on a floating type.
 * Before 2.29.7 (the double answers for the nccl.h it was built against)
 * its one-rank kernel splits n elements over min(32, ceil(n*es / 16 KiB))
 * blocks of alignUp(n / blocks, 16 B) elements each, and that can end short
 * of n: the last elements stay as they were (seen on an H200 with 2.28.9).
 * The double writes the same prefix, so crun's one-rank way round it
 * (red_op in runtime/backend/nccl/nccl.c) is tested here. */
static size_t onerank_written(const call_t *k, ncclRedOp_t op, size_t n) {
  if (NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 7) || k->comm->nranks != 1 || n == 0) return n;
  if (op != ncclAvg && (int)op < (int)ncclNumOps) return n; /* sum, prod, min, max: a plain copy */
  if (k->dt != CRUN_FLOAT16 && k->dt != CRUN_BFLOAT16 && k->dt != CRUN_FLOAT32 && k->dt != CRUN_FLOAT64)
    return n; /* integer avg is a sum and a division: the copy too */
  size_t blocks = (n * k->es + 16383) / 16384, pack = 16 / k->es;
  if (blocks > 32) blocks = 32;
  size_t each = (n / blocks + pack - 1) / pack * pack;
  return blocks * each < n ? blocks * each : n;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  call_t k;
  entry(comm, "ncclAllReduce", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  ncclResult_t r = prepare(&k, comm, datatype, 1, op, "ncclAllReduce");
  if (r != ncclSuccess) return r;
  if (injected(comm)) return ncclSuccess;
  void *s = stage(sendbuff, count * k.es);
  if (!s) return ncclSystemError;
  scale(&k, s, count);
  crun_work_t *w = NULL;
  r = crun_pg_all_reduce(comm->pg, s, count, k.dt, k.op, NULL, &w) < 0 ? ncclSystemError : await(comm, w, "ncclAllReduce");
  if (r == ncclSuccess) copy_out(recvbuff, s, onerank_written(&k, op, count) * k.es);
  return finish(&k, r, s, NULL);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  call_t k;
  entry(comm, "ncclReduce", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  ncclResult_t r = prepare(&k, comm, datatype, 1, op, "ncclReduce");
  if (r != ncclSuccess) return r;
  if (injected(comm)) return ncclSuccess;
  void *s = stage(sendbuff, count * k.es);
  if (!s) return ncclSystemError;
  scale(&k, s, count);
  crun_work_t *w = NULL;
  r = crun_pg_reduce(comm->pg, s, count, k.dt, k.op, root, NULL, &w) < 0 ? ncclSystemError : await(comm, w, "ncclReduce");
  if (r == ncclSuccess && comm->rank == root) copy_out(recvbuff, s, onerank_written(&k, op, count) * k.es);
  return finish(&k, r, s, NULL);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  call_t k;
  entry(comm, "ncclBroadcast", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  ncclResult_t r = prepare(&k, comm, datatype, 0, ncclSum, "ncclBroadcast");
  if (r != ncclSuccess) return r;
  if (injected(comm)) return ncclSuccess;
  void *s = stage(comm->rank == root ? sendbuff : NULL, count * k.es);
  if (!s) return ncclSystemError;
  crun_work_t *w = NULL;
  r = crun_pg_broadcast(comm->pg, s, count, k.dt, root, NULL, &w) < 0 ? ncclSystemError : await(comm, w, "ncclBroadcast");
  if (r == ncclSuccess) copy_out(recvbuff, s, count * k.es);
  return finish(&k, r, s, NULL);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  call_t k;
  entry(comm, "ncclAllGather", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  ncclResult_t r = prepare(&k, comm, datatype, 0, ncclSum, "ncclAllGather");
  if (r != ncclSuccess) return r;
  if (injected(comm)) return ncclSuccess;
  size_t bytes = sendcount * k.es, n = (size_t)comm->nranks;
  void *s = stage(sendbuff, bytes), *d = stage(NULL, bytes * n);
  void **outs = calloc(n, sizeof *outs);
  if (!s || !d || !outs) { free(s); free(d); free(outs); return ncclSystemError; }
  for (size_t i = 0; i < n; i++) outs[i] = (char *)d + i * bytes;
  crun_work_t *w = NULL;
  r = crun_pg_all_gather(comm->pg, outs, s, sendcount, k.dt, NULL, &w) < 0 ? ncclSystemError : await(comm, w, "ncclAllGather");
  free(outs); /* the inner work copied the list */
  if (r == ncclSuccess) copy_out(recvbuff, d, bytes * n);
  return finish(&k, r, s, d);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  call_t k;
  entry(comm, "ncclReduceScatter", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  ncclResult_t r = prepare(&k, comm, datatype, 1, op, "ncclReduceScatter");
  if (r != ncclSuccess) return r;
  if (injected(comm)) return ncclSuccess;
  size_t bytes = recvcount * k.es, n = (size_t)comm->nranks;
  void *s = stage(sendbuff, bytes * n), *d = stage(NULL, bytes);
  const void **ins = calloc(n, sizeof *ins);
  if (!s || !d || !ins) { free(s); free(d); free(ins); return ncclSystemError; }
  scale(&k, s, recvcount * n);
  for (size_t i = 0; i < n; i++) ins[i] = (char *)s + i * bytes;
  crun_work_t *w = NULL;
  r = crun_pg_reduce_scatter(comm->pg, d, ins, recvcount, k.dt, k.op, NULL, &w) < 0 ? ncclSystemError
                                                                                     : await(comm, w, "ncclReduceScatter");
  free(ins);
  if (r == ncclSuccess) copy_out(recvbuff, d, onerank_written(&k, op, recvcount) * k.es);
  return finish(&k, r, s, d);
}

/* ---------------------------------------------------------------- point-to-point */

static ncclResult_t p2p_run(const p2p_t *ops, int n);

static ncclResult_t p2p_add(int send, const void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm) {
  call_t k;
  ncclResult_t r = prepare(&k, comm, dt, 0, ncclSum, send ? "ncclSend" : "ncclRecv");
  if (r != ncclSuccess) return r;
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
    return fail(comm, ncclInvalidArgument, "ncclSend/ncclRecv: bad peer%s", "");
  p2p_t op = {send, (void *)buf, count, dt, peer, comm};
  if (group_depth == 0) return p2p_run(&op, 1);
  if (nqueued == capqueued) {
    int cap = capqueued ? 2 * capqueued : 16;
    p2p_t *q = realloc(queued, sizeof *q * (size_t)cap);
    if (!q) return ncclSystemError;
    queued = q;
    capqueued = cap;
  }
  queued[nqueued++] = op;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  entry(comm, "ncclSend", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  return p2p_add(1, sendbuff, count, datatype, peer, comm);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  entry(comm, "ncclRecv", 1);
  if (crun_dbl_stream_sync(stream) != cudaSuccess) return fail(comm, ncclUnhandledCudaError, "stream%s", "");
  return p2p_add(0, recvbuff, count, datatype, peer, comm);
}

/* Sends first (they complete once handed to the transport), then receives;
 * every operation on staging copies. */
static ncclResult_t p2p_run(const p2p_t *ops, int n) {
  ncclResult_t r = ncclSuccess;
  crun_work_t **ws = calloc((size_t)n + 1, sizeof *ws);
  void **st = calloc((size_t)n + 1, sizeof *st);
  if (!ws || !st) { free(ws); free(st); return ncclSystemError; }
  for (int i = 0; i < n; i++) entry(ops[i].comm, "ncclGroupEnd", 1);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n && r == ncclSuccess; i++) {
      const p2p_t *o = &ops[i];
      if (o->send != !pass) continue;
      crun_dtype_t dt;
      dtype(o->dt, &dt);
      if (injected(o->comm)) continue;
      size_t bytes = o->count * crun_dtype_size(dt);
      if (!(st[i] = stage(o->send ? o->buf : NULL, bytes))) { r = ncclSystemError; break; }
      int rc = o->send ? crun_pg_send(o->comm->pg, st[i], o->count, dt, o->peer, NULL, &ws[i])
                       : crun_pg_recv(o->comm->pg, st[i], o->count, dt, o->peer, NULL, NULL, &ws[i]);
      if (rc < 0) {
        snprintf(o->comm->last, sizeof o->comm->last, "%s", crun_last_error());
        r = ncclSystemError;
      }
    }
  for (int i = 0; i < n; i++) {
    const p2p_t *o = &ops[i];
    if (!ws[i]) { if (r == ncclSuccess || !atomic_load(&o->comm->aborted)) free(st[i]); continue; }
    ncclResult_t x = r == ncclSuccess ? await(o->comm, ws[i], o->send ? "ncclSend" : "ncclRecv") : ncclSuccess;
    if (r != ncclSuccess && !atomic_load(&o->comm->aborted)) { crun_work_wait(ws[i], 0); crun_work_release(ws[i]); }
    if (x == ncclSuccess && r == ncclSuccess && !o->send) {
      crun_dtype_t dt;
      dtype(o->dt, &dt);
      copy_out(o->buf, st[i], o->count * crun_dtype_size(dt));
    }
    if (x != ncclSuccess) r = x;
    if (!atomic_load(&o->comm->aborted)) free(st[i]);
  }
  free(ws);
  free(st);
  return r;
}

ncclResult_t ncclGroupStart(void) {
  crun_dbl_count_add(CRUN_DBL_NCCL_OP);
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  int n = nqueued;
  nqueued = 0;
  ncclResult_t r = n ? p2p_run(queued, n) : ncclSuccess;
  free(queued); /* thread-local: a thread that ends (a progress thread) would leak it */
  queued = NULL;
  capqueued = 0;
  return r;
}

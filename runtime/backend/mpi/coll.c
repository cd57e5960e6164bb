/* coll.c — every collective on its MPI counterpart, after the signature
 * exchange (check.c): MPI_Bcast, MPI_Allreduce, MPI_Reduce, MPI_Allgather,
 * MPI_Gather, MPI_Scatter, MPI_Reduce_scatter_block, MPI_Alltoallv,
 * MPI_Barrier. float16/bfloat16 reductions run on a float32 copy (summed in
 * float32, rounded once at the end); avg is a sum divided once by the group
 * size (crun_scale_div, truncating for integers, as the cpu backend does).
 * Per-rank buffer lists that are not laid out back to back go through a
 * staging buffer. A call's staging buffers (and all_to_all's layout) are
 * taken before the signature exchange (reserve): a rank without memory then
 * fails before it sent its signature, and its abort notice fails every peer
 * waiting in the exchange, where a failure after it left those peers inside
 * the MPI collective until the watchdog aborted the job. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mpi/mpi_int.h"
#include "tensor/half.h"

MPI_Datatype crun__mpi_type(crun_dtype_t dt) {
  switch (dt) {
  case CRUN_FLOAT32: return MPI_FLOAT;
  case CRUN_FLOAT64: return MPI_DOUBLE;
  case CRUN_INT32: return MPI_INT32_T;
  case CRUN_INT64: return MPI_INT64_T;
  case CRUN_UINT8: return MPI_UINT8_T;
  case CRUN_INT8: return MPI_INT8_T;
  case CRUN_INT16: return MPI_INT16_T;
  case CRUN_BOOL: return MPI_UINT8_T; /* bytes 0 / 1, reduced with lor / land */
  default: return MPI_UINT16_T; /* float16 / bfloat16 bits */
  }
}

/* 8- and 16-bit integer sum and product as user ops that wrap as C does:
 * Open MPI 4.1's AVX kernels (op/avx) saturate MPI_SUM on MPI_UINT8_T at
 * 255 (and use saturating adds for the other narrow types). The kernel is
 * crun_reduce_into, picked by the MPI datatype. */
static crun_dtype_t narrow_dtype(MPI_Datatype t) {
  if (t == MPI_INT8_T) return CRUN_INT8;
  if (t == MPI_INT16_T) return CRUN_INT16;
  return CRUN_UINT8;
}

static void narrow_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
  crun_reduce_into(narrow_dtype(*dt), CRUN_OP_SUM, inout, in, (size_t)*len);
}

static void narrow_prod(void *in, void *inout, int *len, MPI_Datatype *dt) {
  crun_reduce_into(narrow_dtype(*dt), CRUN_OP_PRODUCT, inout, in, (size_t)*len);
}

static pthread_once_t g_ops_once = PTHREAD_ONCE_INIT;
static MPI_Op g_u8_sum = MPI_OP_NULL, g_u8_prod = MPI_OP_NULL;

static void make_ops(void) {
  MPI_Op_create(narrow_sum, 1, &g_u8_sum);
  MPI_Op_create(narrow_prod, 1, &g_u8_prod);
}

static MPI_Op mpi_op(crun_dtype_t dt, crun_reduce_op_t op) {
  if ((dt == CRUN_UINT8 || dt == CRUN_INT8 || dt == CRUN_INT16) &&
      (op == CRUN_OP_SUM || op == CRUN_OP_AVG || op == CRUN_OP_PRODUCT)) {
    pthread_once(&g_ops_once, make_ops);
    return op == CRUN_OP_PRODUCT ? g_u8_prod : g_u8_sum;
  }
  if (dt == CRUN_BOOL) /* torch: sum / max are or, product / min and */
    return op == CRUN_OP_SUM || op == CRUN_OP_MAX || op == CRUN_OP_BOR ? MPI_LOR
         : op == CRUN_OP_BXOR ? MPI_LXOR : MPI_LAND;
  switch (op) {
  case CRUN_OP_PRODUCT: return MPI_PROD;
  case CRUN_OP_MIN: return MPI_MIN;
  case CRUN_OP_MAX: return MPI_MAX;
  case CRUN_OP_BAND: return MPI_BAND;
  case CRUN_OP_BOR: return MPI_BOR;
  case CRUN_OP_BXOR: return MPI_BXOR;
  default: return MPI_SUM; /* sum, avg */
  }
}

static int is_half(crun_dtype_t dt) { return dt == CRUN_FLOAT16 || dt == CRUN_BFLOAT16; }

/* Runs one blocking MPI call under the watchdog; returns on failure. */
#define RUN(b, c, name, call)                                                \
  do {                                                                       \
    char d_[64];                                                             \
    crun__pg_coll_desc((b)->pg, (c), d_, sizeof d_);                         \
    crun__mpi_watch_begin(&(b)->watch, (c)->timeout, d_, name);              \
    int r_ = (call);                                                         \
    crun__mpi_watch_end(&(b)->watch);                                        \
    if (r_ != MPI_SUCCESS) return crun__mpi_fail(r_, d_, (b)->pg, (b)->rank, name);   \
  } while (0)

/* ---------------------------------------------------------------- reductions */

/* Copies n elements of src to dst as a reduction's working data: as they
 * are, or widened to float32 for the 16-bit float dtypes. Returns dst. */
static void *red_in(const crun__coll_t *c, void *dst, const void *src, size_t n) {
  if (!is_half(c->dt)) {
    if (dst != src && n) memcpy(dst, src, n * crun_dtype_size(c->dt));
    return dst;
  }
  if (c->dt == CRUN_FLOAT16) crun__f16_to_f32_n(dst, src, n);
  else crun__bf16_to_f32_n(dst, src, n);
  return dst;
}

/* Applies avg's division and writes a float32 result back as float16/bfloat16. */
static void red_out(crun__mpi_t *b, const crun__coll_t *c, void *buf, void *work, size_t n) {
  crun_dtype_t wt = is_half(c->dt) ? CRUN_FLOAT32 : c->dt;
  if (c->op == CRUN_OP_AVG) crun_scale_div(wt, work, n, (double)b->size);
  if (c->dt == CRUN_FLOAT16) crun__f32_to_f16_n(buf, work, n);
  else if (c->dt == CRUN_BFLOAT16) crun__f32_to_bf16_n(buf, work, n);
}

/* The working buffer of an in-place reduction on buf: buf itself or its
 * float32 copy in staging buffer s[0] (reserved). */
static void *red_buf(const crun__coll_t *c, char *const *s, void *buf, size_t n) {
  return is_half(c->dt) ? red_in(c, s[0], buf, n) : buf;
}

static MPI_Datatype red_type(const crun__coll_t *c) { return is_half(c->dt) ? MPI_FLOAT : crun__mpi_type(c->dt); }

static int all_reduce(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  void *w = red_buf(c, s, c->buf, c->count);
  RUN(b, c, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, w, (int)c->count, red_type(c), mpi_op(c->dt, c->op), b->comm));
  red_out(b, c, c->buf, w, c->count);
  return 0;
}

static int reduce(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  void *w = red_buf(c, s, c->buf, c->count);
  int root = c->root == b->rank;
  RUN(b, c, "MPI_Reduce", MPI_Reduce(root ? MPI_IN_PLACE : w, root ? w : NULL, (int)c->count, red_type(c),
                                     mpi_op(c->dt, c->op), c->root, b->comm));
  if (root) red_out(b, c, c->buf, w, c->count);
  return 0;
}

/* Returns the start of ptrs when block i sits at start + i * bytes for every i. */
static char *contiguous(void *const *ptrs, int n, size_t bytes) {
  char *base = ptrs[0];
  for (int i = 1; i < n; i++)
    if ((char *)ptrs[i] != base + (size_t)i * bytes) return NULL;
  return base;
}

/* Staged (s[0]: the blocks packed, widened for 16-bit floats; s[1]: a
 * float32 result) where reserve found it needed. */
static int reduce_scatter(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  size_t n = c->count, ws = is_half(c->dt) ? sizeof(float) : crun_dtype_size(c->dt);
  char *in = s[0] ? s[0] : (char *)c->ins[0];
  for (int r = 0; s[0] && r < b->size; r++) red_in(c, in + (size_t)r * n * ws, c->ins[r], n);
  void *out = s[1] ? s[1] : c->buf;
  RUN(b, c, "MPI_Reduce_scatter_block",
      MPI_Reduce_scatter_block(in, out, (int)n, red_type(c), mpi_op(c->dt, c->op), b->comm));
  red_out(b, c, c->buf, out, n);
  return 0;
}

/* ---------------------------------------------------------------- data movement */

static int broadcast(crun__mpi_t *b, crun__coll_t *c) {
  RUN(b, c, "MPI_Bcast", MPI_Bcast(c->buf, (int)c->count, crun__mpi_type(c->dt), c->root, b->comm));
  return 0;
}

/* Copies n blocks of `bytes` from a packed buffer out to ptrs. */
static void unpack(void *const *ptrs, int n, const char *src, size_t bytes) {
  for (int i = 0; i < n; i++)
    if (bytes) memcpy(ptrs[i], src + (size_t)i * bytes, bytes);
}

/* Gathers into outs back to back, or into staging buffer s[0] (reserved
 * when they are not) and then out to them. */
static int all_gather(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  size_t bytes = c->count * crun_dtype_size(c->dt);
  MPI_Datatype t = crun__mpi_type(c->dt);
  int n = (int)c->count;
  if (!s[0]) {
    const void *in = c->in == c->outs[b->rank] ? MPI_IN_PLACE : c->in;
    RUN(b, c, "MPI_Allgather", MPI_Allgather(in, n, t, c->outs[0], n, t, b->comm));
    return 0;
  }
  RUN(b, c, "MPI_Allgather", MPI_Allgather(c->in, n, t, s[0], n, t, b->comm));
  unpack(c->outs, b->size, s[0], bytes);
  return 0;
}

/* As all_gather, on the root. */
static int gather(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  size_t bytes = c->count * crun_dtype_size(c->dt);
  MPI_Datatype t = crun__mpi_type(c->dt);
  int n = (int)c->count;
  if (c->root != b->rank) {
    RUN(b, c, "MPI_Gather", MPI_Gather(c->in, n, t, NULL, 0, t, c->root, b->comm));
    return 0;
  }
  if (!s[0]) {
    const void *in = c->in == c->outs[b->rank] ? MPI_IN_PLACE : c->in;
    RUN(b, c, "MPI_Gather", MPI_Gather(in, n, t, c->outs[0], n, t, c->root, b->comm));
    return 0;
  }
  RUN(b, c, "MPI_Gather", MPI_Gather(c->in, n, t, s[0], n, t, c->root, b->comm));
  unpack(c->outs, b->size, s[0], bytes);
  return 0;
}

/* Scatters from ins back to back, or (on the root) from their copy packed
 * into staging buffer s[0] (reserved when they are not). */
static int scatter(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  size_t bytes = c->count * crun_dtype_size(c->dt);
  MPI_Datatype t = crun__mpi_type(c->dt);
  int n = (int)c->count;
  if (c->root != b->rank) {
    RUN(b, c, "MPI_Scatter", MPI_Scatter(NULL, 0, t, c->buf, n, t, c->root, b->comm));
    return 0;
  }
  char *base = s[0] ? s[0] : (char *)c->ins[0];
  void *out = !s[0] && c->buf == c->ins[b->rank] ? MPI_IN_PLACE : c->buf;
  for (int r = 0; s[0] && r < b->size; r++)
    if (bytes) memcpy(base + (size_t)r * bytes, c->ins[r], bytes);
  RUN(b, c, "MPI_Scatter", MPI_Scatter(base, n, t, out, n, t, c->root, b->comm));
  return 0;
}

/* ---------------------------------------------------------------- all_to_all */

/* Packs (or, with dir < 0, unpacks) the per-peer blocks of all_to_all. */
static void a2a_copy(void *const *ptrs, const size_t *counts, int n, char *packed, size_t es, int dir) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = counts[i] * es;
    if (bytes && dir > 0) memcpy(packed + off, ptrs[i], bytes);
    if (bytes && dir < 0) memcpy(ptrs[i], packed + off, bytes);
    off += bytes;
  }
}

/* Fills MPI's int counts and displacements from the blocks this rank sends
 * (out 0) or receives (out 1); ERANGE when their total exceeds int. The
 * test is count > INT_MAX - total: total + count wraps past SIZE_MAX (a
 * count near it passed, and MPI got a negative count while the packing
 * copied SIZE_MAX bytes into a staging buffer sized by the wrapped total). */
static int a2a_layout(crun__mpi_t *b, const crun__coll_t *c, const size_t *counts, int out, int *cnt, int *disp,
                      size_t *total) {
  *total = 0;
  for (int i = 0; i < b->size; i++) {
    if (counts[i] > (size_t)INT_MAX - *total)
      return crun_error(CRUN_ERANGE, "all_to_all #%llu on %s: the blocks it %s add up to more than %d elements "
                        "(the mpi backend's limit per call) at the one %s %s (%zu elements)",
                        (unsigned long long)c->seq, CRUN__WHO(b->pg, b->rank), out ? "receives" : "sends", INT_MAX,
                        out ? "from" : "for", CRUN__WHO(b->pg, i), counts[i]);
    cnt[i] = (int)counts[i];
    disp[i] = (int)*total;
    *total += counts[i];
  }
  return 0;
}

/* Sends the packed blocks with MPI_Alltoallv, on every rank. (Choosing
 * MPI_Alltoall where this rank's blocks happen to be equal is a local decision:
 * with splits {1, 1} on rank 0 and {1, 0} on rank 1 the ranks entered two
 * different collectives and hung.) */
static int a2a_run(crun__mpi_t *b, crun__coll_t *c, const char *s, char *r, const int *lay) {
  const int *sc = lay, *sd = lay + b->size, *rc = lay + 2 * b->size, *rd = lay + 3 * b->size;
  MPI_Datatype t = crun__mpi_type(c->dt);
  RUN(b, c, "MPI_Alltoallv", MPI_Alltoallv(s, sc, sd, t, r, rc, rd, t, b->comm));
  return 0;
}

/* Packs ins into s[0], exchanges into s[1] and unpacks to outs (the
 * layout in b->a2a_lay and both buffers reserved). */
static int all_to_all(crun__mpi_t *b, crun__coll_t *c, char *const *s) {
  size_t es = crun_dtype_size(c->dt);
  a2a_copy((void *const *)c->ins, c->in_counts, b->size, s[0], es, 1);
  int rc = a2a_run(b, c, s[0], s[1], b->a2a_lay);
  if (rc == 0) a2a_copy(c->outs, c->out_counts, b->size, s[1], es, -1);
  return rc;
}

/* ---------------------------------------------------------------- reserve */

/* Takes staging buffer i of `bytes` for c into s[i] (allocation `site`);
 * `what` says what it holds. */
static int take(crun__mpi_t *b, const crun__coll_t *c, char **s, int i, size_t bytes, const char *site,
                const char *what) {
  if ((s[i] = crun__mpi_stage(b, i, bytes, site))) return 0;
  char desc[64];
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  return crun_error(CRUN_ENOMEM, "%s on %s: no memory for its staging buffer (%s, %zu bytes)", desc, CRUN__WHO(b->pg, b->rank),
                    what, bytes);
}

/* reserve for all_to_all: its MPI counts and displacements into b->a2a_lay
 * (ERANGE beyond int), then its send and receive buffers. */
static int reserve_a2a(crun__mpi_t *b, const crun__coll_t *c, char **s) {
  size_t es = crun_dtype_size(c->dt), tin, tout;
  int *lay = b->a2a_lay, n = b->size;
  CRUN_CHECK(a2a_layout(b, c, c->in_counts, 0, lay, lay + n, &tin));
  CRUN_CHECK(a2a_layout(b, c, c->out_counts, 1, lay + 2 * n, lay + 3 * n, &tout));
  CRUN_CHECK(take(b, c, s, 0, tin * es, "mpi.stage_a2a", "the blocks it sends, packed"));
  return take(b, c, s, 1, tout * es, "mpi.stage_a2a", "the blocks it receives, packed");
}

/* Takes the staging buffers c needs on this rank into s[0..1] (NULL: none
 * needed), before the signature exchange (see the top of the file): a
 * float32 copy of a float16/bfloat16 reduction's data, a buffer list that
 * is not back to back packed, all_to_all's packed blocks. Reused buffers:
 * taking one allocates only when it grows. */
static int reserve(crun__mpi_t *b, const crun__coll_t *c, char **s) {
  size_t n = c->count, es = crun_dtype_size(c->dt), all = n * es * (size_t)b->size;
  int root = c->root == b->rank;
  s[0] = s[1] = NULL;
  switch (c->kind) {
  case CRUN__COLL_ALL_REDUCE: case CRUN__COLL_REDUCE:
    if (!is_half(c->dt)) return 0;
    return take(b, c, s, 0, n * sizeof(float), "mpi.stage_half", "its data as float32");
  case CRUN__COLL_REDUCE_SCATTER:
    if (!is_half(c->dt))
      return contiguous((void *const *)c->ins, b->size, n * es)
                 ? 0 : take(b, c, s, 0, all, "mpi.stage_list", "its inputs packed back to back");
    CRUN_CHECK(take(b, c, s, 0, n * sizeof(float) * (size_t)b->size, "mpi.stage_half", "its inputs as float32"));
    return take(b, c, s, 1, n * sizeof(float), "mpi.stage_half", "its result as float32");
  case CRUN__COLL_ALL_GATHER: case CRUN__COLL_GATHER:
    if ((c->kind == CRUN__COLL_GATHER && !root) || contiguous(c->outs, b->size, n * es)) return 0;
    return take(b, c, s, 0, all, "mpi.stage_list", "its outputs packed back to back");
  case CRUN__COLL_SCATTER:
    if (!root || contiguous((void *const *)c->ins, b->size, n * es)) return 0;
    return take(b, c, s, 0, all, "mpi.stage_list", "its inputs packed back to back");
  case CRUN__COLL_ALL_TO_ALL: return reserve_a2a(b, c, s);
  default: return 0;
  }
}

/* ---------------------------------------------------------------- dispatch */

static int barrier(crun__mpi_t *b, crun__coll_t *c) {
  if (b->check && b->size > 1) return 0; /* the signature exchange was a complete barrier */
  RUN(b, c, "MPI_Barrier", MPI_Barrier(b->comm));
  return 0;
}

int crun__mpi_coll(void *state, crun__coll_t *c) {
  crun__mpi_t *b = state;
  if (c->count > INT_MAX)
    return crun_error(CRUN_ERANGE, "%s #%llu on %s: %zu elements exceed the mpi backend's limit of %d per call",
                      crun__coll_name(c->kind), (unsigned long long)c->seq, CRUN__WHO(b->pg, b->rank), c->count, INT_MAX);
  char *s[2];
  CRUN_CHECK(reserve(b, c, s));
  if (b->check) CRUN_CHECK(crun__mpi_check(b, c));
  switch (c->kind) {
  case CRUN__COLL_BROADCAST: return broadcast(b, c);
  case CRUN__COLL_ALL_REDUCE: return all_reduce(b, c, s);
  case CRUN__COLL_REDUCE: return reduce(b, c, s);
  case CRUN__COLL_ALL_GATHER: return all_gather(b, c, s);
  case CRUN__COLL_GATHER: return gather(b, c, s);
  case CRUN__COLL_SCATTER: return scatter(b, c, s);
  case CRUN__COLL_REDUCE_SCATTER: return reduce_scatter(b, c, s);
  case CRUN__COLL_ALL_TO_ALL: return all_to_all(b, c, s);
  case CRUN__COLL_BARRIER: return barrier(b, c);
  }
  return crun_error(CRUN_ENOTSUP, "mpi backend: no collective %s", crun__coll_name(c->kind));
}

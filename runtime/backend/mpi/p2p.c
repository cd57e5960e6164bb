/* p2p.c — send and recv on the group's communicator. A message is a 16-byte
 * header (dtype, count) followed by the payload, sent as bytes in one MPI
 * message: packed into a staging buffer when small, described in place by a
 * struct datatype (no copy) when large. The receiver polls MPI_Improbe until
 * the deadline, so a recv that times out leaves nothing posted in MPI; it
 * checks the size before receiving and the header after, so a sender with
 * another count or dtype gets an EMISMATCH naming both sides. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mpi/mpi_int.h"
#include "core/fault.h"

#define HDR 16
#define SMALL 8192

static pthread_once_t g_types_once = PTHREAD_ONCE_INIT;
static MPI_Datatype g_elem[9]; /* g_elem[s]: s contiguous bytes */

static void make_types(void) {
  for (int s = 1; s <= 8; s *= 2) {
    if (s == 1) {
      g_elem[s] = MPI_BYTE;
      continue;
    }
    MPI_Type_contiguous(s, MPI_BYTE, &g_elem[s]);
    MPI_Type_commit(&g_elem[s]);
  }
}

/* Checks the tag against MPI's range, less its top (group.c's notice). */
static int check_tag(const crun__mpi_t *b, const crun__coll_t *c, const char *desc) {
  int max = crun__mpi_tag_ub(b->comm) - 1;
  if (c->tag >= 0 && c->tag <= max && c->count <= INT32_MAX) return 0;
  if (c->count > INT32_MAX)
    return crun_error(CRUN_ERANGE, "%s on %s: %zu elements exceed the mpi backend's limit of %d per message",
                      desc, CRUN__WHO(b->pg, b->rank), c->count, INT32_MAX);
  return crun_error(CRUN_EINVAL, "%s on %s: tag %d is outside MPI's range 0..%d", desc, CRUN__WHO(b->pg, b->rank), c->tag, max);
}

/* Builds the datatype of (header, payload) at their absolute addresses;
 * returns MPI's code (fault site mpi.msg_type: MPI_ERR_NO_MEM, as when MPI
 * has no memory for the type). */
static int msg_type(int64_t *hdr, void *buf, const crun__coll_t *c, MPI_Datatype *out) {
  if (crun__fault_alloc("mpi.msg_type")) return MPI_ERR_NO_MEM;
  pthread_once(&g_types_once, make_types);
  int lens[2] = {HDR, (int)c->count};
  MPI_Aint at[2];
  MPI_Datatype types[2] = {MPI_BYTE, g_elem[crun_dtype_size(c->dt)]};
  MPI_Get_address(hdr, &at[0]);
  MPI_Get_address(buf ? buf : (void *)hdr, &at[1]);
  int rc = MPI_Type_create_struct(2, lens, at, types, out);
  return rc == MPI_SUCCESS ? MPI_Type_commit(out) : rc;
}

int crun__mpi_sends_reap(crun__mpi_send_t **list) {
  crun__mpi_send_t **p = list;
  while (*p) {
    int done = 0;
    if (MPI_Test(&(*p)->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
    if (!done) { p = &(*p)->next; continue; }
    crun__mpi_send_t *s = *p;
    *p = s->next;
    free(s);
  }
  return *list == NULL;
}

/* Drops the finished buffered sends; with wait > 0, first waits up to that
 * many seconds for the others (which stay in b->sends: group.c keeps them
 * with the retired group until they complete). */
static void reap(crun__mpi_t *b, double wait) {
  crun__mpi_spin_t spin = {0};
  double end = crun_clock() + wait;
  while (!crun__mpi_sends_reap(&b->sends) && wait > 0 && crun_clock() < end) crun__mpi_relax(&spin);
}

void crun__mpi_sends_drain(crun__mpi_t *b, double wait) { reap(b, wait); }

/* Starts the send of a heap copy of (header, payload); its completion does
 * not wait for the receiver, so a send followed by a recv in one queue never
 * deadlocks whatever the size (as a send into a socket buffer would not). */
static int start_send(crun__mpi_t *b, crun__coll_t *c, size_t bytes, crun__mpi_send_t *s) {
  int64_t *hdr = (int64_t *)s->data;
  hdr[0] = c->dt, hdr[1] = (int64_t)c->count;
  if (bytes) memcpy(s->data + HDR, c->buf, bytes);
  if (HDR + bytes <= INT32_MAX) return MPI_Isend(s->data, (int)(HDR + bytes), MPI_BYTE, c->root, c->tag, b->comm, &s->req);
  MPI_Datatype t;
  int rc = msg_type(hdr, s->data + HDR, c, &t);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_Isend(MPI_BOTTOM, 1, t, c->root, c->tag, b->comm, &s->req);
  MPI_Type_free(&t);
  return rc;
}

int crun__mpi_send(void *state, crun__coll_t *c) {
  crun__mpi_t *b = state;
  char desc[64];
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  CRUN_CHECK(check_tag(b, c, desc));
  CRUN_CHECK(crun__mpi_poll_abort(b, desc));
  reap(b, 0);
  size_t bytes = c->count * crun_dtype_size(c->dt);
  crun__mpi_send_t *s = malloc(sizeof *s + HDR + bytes);
  if (!s) return crun_error(CRUN_ENOMEM, "%s on %s: no memory to buffer %zu bytes", desc, CRUN__WHO(b->pg, b->rank), bytes);
  int rc = start_send(b, c, bytes, s);
  if (rc != MPI_SUCCESS) {
    free(s);
    return crun__mpi_fail(rc, desc, b->pg, b->rank, "MPI_Isend");
  }
  s->next = b->sends;
  b->sends = s;
  return 0;
}

/* ---------------------------------------------------------------- recv */

/* How long a recv still looks for a message from a rank after that rank's
 * notice that it destroyed the group: the notice travels on ctrl, the data on
 * comm, and MPI does not order two communicators, so data sent before leaving
 * may show up after the notice. */
#define LEFT_GRACE 1.0

/* Whether every rank that may send recv c (its source, or every peer for a
 * recv from any rank) left its notice that it destroyed the group. */
static int senders_left(crun__mpi_t *b, const crun__coll_t *c, const char *desc) {
  if (c->root != CRUN_ANY_SOURCE) return crun__mpi_poll_left(b, c->root, desc) < 0;
  for (int p = 0; p < b->size; p++)
    if (p != b->rank && crun__mpi_poll_left(b, p, desc) == 0) return 0;
  return 1;
}

/* The EPEERDIED of a recv whose possible senders all destroyed the group:
 * its source, or every peer ("ranks 1-2") for a recv from any rank. */
static int senders_gone(crun__mpi_t *b, const crun__coll_t *c, const char *desc) {
  char who[256] = "every other rank";
  int *rs = c->root == CRUN_ANY_SOURCE ? malloc(sizeof(int) * (size_t)b->size) : NULL, n = 0;
  for (int p = 0; rs && p < b->size; p++)
    if (p != b->rank) rs[n++] = p;
  if (rs) crun__pg_ranks_text(b->pg, who, sizeof who, rs, n);
  else if (c->root != CRUN_ANY_SOURCE) snprintf(who, sizeof who, "%s", CRUN__WHO(b->pg, c->root));
  free(rs);
  return crun_error(CRUN_EPEERDIED, "%s on %s: %s destroyed the group without sending it", desc,
                    CRUN__WHO(b->pg, b->rank), who);
}

/* Polls for a message matching (source, tag) until the deadline, or until
 * LEFT_GRACE after the notices that every rank that may send it destroyed
 * the group (its source; for a recv from any rank, every peer: looked for
 * every 256 polls, one peer after another until one that has not left). */
static int probe(crun__mpi_t *b, crun__coll_t *c, const char *desc, MPI_Message *m, MPI_Status *st) {
  crun__mpi_spin_t spin = {0};
  int src = c->root == CRUN_ANY_SOURCE ? MPI_ANY_SOURCE : c->root;
  double gone = 0;   /* when the last sender's notice was seen */
  for (;;) {
    int flag = 0, rc = MPI_Improbe(src, c->tag, b->comm, &flag, m, st);
    if (rc != MPI_SUCCESS) return crun__mpi_fail(rc, desc, b->pg, b->rank, "MPI_Improbe");
    if (flag) return 0;
    if ((rc = crun__mpi_poll_abort(b, desc)) < 0) return rc;
    if (crun_clock() >= c->deadline) break;
    if (!gone && spin.spins % 256 == 255 && senders_left(b, c, desc)) gone = crun_clock();
    if (gone && crun_clock() >= gone + LEFT_GRACE) return senders_gone(b, c, desc);
    crun__mpi_relax(&spin);
  }
  if (src == MPI_ANY_SOURCE)
    return crun_error(CRUN_ETIMEDOUT, "%s on %s: no sender after %.1f s", desc, CRUN__WHO(b->pg, b->rank), c->timeout);
  return crun_error(CRUN_ETIMEDOUT, "%s on %s: no data from %s after %.1f s", desc, CRUN__WHO(b->pg, b->rank), CRUN__WHO(b->pg, c->root),
                    c->timeout);
}

/* Reports a message whose header or size differs from the receive. */
static int mismatch(crun__mpi_t *b, crun__coll_t *c, const char *desc, int from, const int64_t *h, int has_hdr,
                    long long bytes) {
  const char *want = crun_dtype_name(c->dt), *got = has_hdr ? crun_dtype_name((crun_dtype_t)h[0]) : NULL;
  if (!got)
    return crun_error(CRUN_EMISMATCH, "%s on %s expected %s[%zu], %s sent %lld bytes that are not a "
                      "crun message (tag %d)", desc, CRUN__WHO(b->pg, b->rank), want, c->count, CRUN__WHO(b->pg, from), bytes, c->tag);
  return crun_error(CRUN_EMISMATCH, "%s on %s expected %s[%zu], %s sent %s[%lld] (tag %d)", desc, CRUN__WHO(b->pg, b->rank),
                    want, c->count, CRUN__WHO(b->pg, from), got, (long long)h[1], c->tag);
}

/* Bytes of the sink that crun__mpi_mrecv_head drops a message's rest into. */
#define SINK 4096

/* The datatype of SINK bytes with extent 0 (every copy lands on the last),
 * made once and kept (an extent-0 block needs no memory per message); a
 * failure (fault site mpi.sink_base: MPI_Type_contiguous fails with
 * MPI_ERR_NO_MEM) leaves it MPI_DATATYPE_NULL, tried again next time.
 * Returns MPI's code; every handle is freed only once it was made. */
static pthread_mutex_t g_sink_lock = PTHREAD_MUTEX_INITIALIZER;
static MPI_Datatype g_sink = MPI_DATATYPE_NULL;

static int sink_type(MPI_Datatype *out) {
  pthread_mutex_lock(&g_sink_lock);
  int rc = MPI_SUCCESS;
  if (g_sink == MPI_DATATYPE_NULL) {
    MPI_Datatype blk, zero;
    rc = crun__fault_alloc("mpi.sink_base") ? MPI_ERR_NO_MEM : MPI_Type_contiguous(SINK, MPI_BYTE, &blk);
    if (rc == MPI_SUCCESS) {
      rc = MPI_Type_create_resized(blk, 0, 0, &zero);
      MPI_Type_free(&blk);
    }
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&zero)) != MPI_SUCCESS) MPI_Type_free(&zero);
    if (rc == MPI_SUCCESS) g_sink = zero;
  }
  *out = g_sink;
  pthread_mutex_unlock(&g_sink_lock);
  return rc;
}

/* The datatype of a message's first k bytes at head and its rest (`rest`
 * bytes) on sink, at absolute addresses, from extent-0 block zero (fault
 * site mpi.sink_type: MPI_ERR_NO_MEM, as when MPI has no memory for it). */
static int head_type(void *head, MPI_Count k, char *sink, MPI_Count rest, MPI_Datatype zero, MPI_Datatype *t) {
  if (crun__fault_alloc("mpi.sink_type")) return MPI_ERR_NO_MEM;
  int lens[3] = {(int)k, (int)(rest / SINK), (int)(rest % SINK)};
  MPI_Aint at[3];
  MPI_Get_address(head, &at[0]);
  MPI_Get_address(sink, &at[1]);
  at[2] = at[1];
  MPI_Datatype types[3] = {MPI_BYTE, zero, MPI_BYTE};
  int rc = MPI_Type_create_struct(3, lens, at, types, t);
  if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(t)) != MPI_SUCCESS) MPI_Type_free(t);
  return rc;
}

/* Receives m whole without its head (rx: as crun__mpi_mrecv_head's), after
 * the datatype that would keep the head failed (why: its code, call: the
 * call): into the sink SINK bytes at a time through zero when there is
 * one, else into a heap copy of the message (fault site mpi.sink_copy),
 * which keeps the head after all. Returns MPI_SUCCESS when the head was
 * kept, else the code of the failure (rx->taken: whether m was received). */
static int mrecv_fallback(MPI_Message *m, MPI_Count bytes, char *sink, void *head, size_t keep, MPI_Datatype zero,
                          int why, const char *call, crun__mpi_rx_t *rx) {
  MPI_Count blocks = (bytes + SINK - 1) / SINK;
  rx->call = call;
  if (zero != MPI_DATATYPE_NULL && blocks <= INT32_MAX) {
    int rc = MPI_Mrecv(sink, (int)blocks, zero, m, MPI_STATUS_IGNORE); /* a message shorter than the buffer */
    rx->taken = 1;
    if (rc != MPI_SUCCESS) rx->call = "MPI_Mrecv";
    return rc == MPI_SUCCESS && keep ? why : rc;
  }
  char *copy = bytes <= INT32_MAX ? CRUN__FAULT_MALLOC("mpi.sink_copy", (size_t)bytes) : NULL;
  if (!copy) return why; /* nothing can take it: it stays matched */
  int rc = MPI_Mrecv(copy, (int)bytes, MPI_BYTE, m, MPI_STATUS_IGNORE);
  rx->taken = 1;
  rx->call = "MPI_Mrecv";
  if (rc == MPI_SUCCESS && keep) memcpy(head, copy, keep < (size_t)bytes ? keep : (size_t)bytes);
  free(copy);
  return rc;
}

int crun__mpi_mrecv_head(MPI_Message *m, MPI_Count bytes, void *head, size_t keep, crun__mpi_rx_t *rx) {
  char sink[SINK];
  crun__mpi_rx_t none;
  if (!rx) rx = &none;
  *rx = (crun__mpi_rx_t){0, "MPI_Mrecv"};
  if (!head) keep = 0;
  if (bytes <= SINK) { /* whole into the sink: no datatype to make */
    int rc = MPI_Mrecv(sink, (int)bytes, MPI_BYTE, m, MPI_STATUS_IGNORE);
    rx->taken = 1;
    if (rc == MPI_SUCCESS && keep && bytes > 0) memcpy(head, sink, keep < (size_t)bytes ? keep : (size_t)bytes);
    return rc;
  }
  MPI_Count k = bytes < (MPI_Count)keep ? bytes : (MPI_Count)keep, rest = bytes - k;
  if (rest / SINK > INT32_MAX) return rx->call = "crun__mpi_mrecv_head", MPI_ERR_COUNT; /* over 8 TiB */
  MPI_Datatype zero, t;
  int rc = sink_type(&zero);
  if (rc != MPI_SUCCESS) return mrecv_fallback(m, bytes, sink, head, keep, zero, rc, "MPI_Type_contiguous", rx);
  if (!k) { /* nothing to keep: the sink, SINK bytes at a time */
    rc = MPI_Mrecv(sink, (int)((bytes + SINK - 1) / SINK), zero, m, MPI_STATUS_IGNORE);
    rx->taken = 1;
    return rc;
  }
  rc = head_type(head, k, sink, rest, zero, &t);
  if (rc != MPI_SUCCESS) return mrecv_fallback(m, bytes, sink, head, keep, zero, rc, "MPI_Type_create_struct", rx);
  rc = MPI_Mrecv(MPI_BOTTOM, 1, t, m, MPI_STATUS_IGNORE);
  rx->taken = 1;
  MPI_Type_free(&t);
  return rc;
}

/* Receives a message of another size (its header and, whatever its length,
 * nothing else) and reports it as an EMISMATCH naming both sides; when the
 * header could not be read, says so and what became of the message. */
static int recv_wrong(crun__mpi_t *b, crun__coll_t *c, const char *desc, MPI_Message *m, int from, MPI_Count got) {
  int64_t h[2] = {-1, 0};
  crun__mpi_rx_t rx;
  int rc = crun__mpi_mrecv_head(m, got, h, HDR, &rx);
  if (rc == MPI_SUCCESS)
    return mismatch(b, c, desc, from, h, got >= HDR && h[0] >= 0 && h[0] < CRUN_DTYPE_COUNT, (long long)got);
  char why[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  MPI_Error_string(rc, why, &len);
  const char *fate = !rx.taken ? "it stays matched in MPI, and the sender's send may never complete"
                     : strcmp(rx.call, "MPI_Mrecv") ? "the message was received and dropped"
                                                    : "the message is dropped";
  return crun_error(rx.taken ? CRUN_EMISMATCH : crun__mpi_status(rc), "%s on %s expected %s[%zu], %s "
                    "sent %lld bytes; its header was not read (%s failed: %s): %s", desc, CRUN__WHO(b->pg, b->rank),
                    crun_dtype_name(c->dt), c->count, CRUN__WHO(b->pg, from), (long long)got, rx.call, why, fate);
}

/* Receives and drops matched message m (`got` bytes from rank `from`)
 * that could not be received in place because MPI call `call` failed with
 * mpirc, and reports that failure. A matched message must be received: left
 * matched inside MPI, its sender's send never completes (a rendezvous send
 * hung its sender's destroy until the group's timeout). */
static int drop(crun__mpi_t *b, const char *desc, MPI_Message *m, int from, MPI_Count got, int mpirc,
                const char *call) {
  char why[MPI_MAX_ERROR_STRING + 1] = "", how[MPI_MAX_ERROR_STRING + 1] = "";
  crun__mpi_rx_t rx;
  int len = 0, drc = crun__mpi_mrecv_head(m, got, NULL, 0, &rx);
  MPI_Error_string(mpirc, why, &len);
  if (drc == MPI_SUCCESS)
    return crun_error(crun__mpi_status(mpirc), "%s on %s: %s failed: %s; the message from %s (%lld "
                      "bytes) was received and dropped", desc, CRUN__WHO(b->pg, b->rank), call, why,
                      CRUN__WHO(b->pg, from), (long long)got);
  MPI_Error_string(drc, how, &len);
  if (rx.taken)
    return crun_error(crun__mpi_status(mpirc), "%s on %s: %s failed: %s; the message from %s (%lld "
                      "bytes) is dropped (receiving it failed too: %s: %s)", desc, CRUN__WHO(b->pg, b->rank), call,
                      why, CRUN__WHO(b->pg, from), (long long)got, rx.call, how);
  return crun_error(crun__mpi_status(mpirc), "%s on %s: %s failed: %s; dropping the message from %s "
                    "(%lld bytes) failed too (%s: %s): it stays in MPI and %s's send may never complete", desc,
                    CRUN__WHO(b->pg, b->rank), call, why, CRUN__WHO(b->pg, from), (long long)got, rx.call, how,
                    CRUN__WHO(b->pg, from));
}

/* Receives a message of the expected size into the buffer (through the
 * staging buffer s when small). */
static int recv_right(crun__mpi_t *b, crun__coll_t *c, const char *desc, MPI_Message *m, int from, size_t bytes,
                      char *s) {
  int64_t h[2];
  int rc;
  if (bytes <= SMALL) {
    rc = MPI_Mrecv(s, (int)(HDR + bytes), MPI_BYTE, m, MPI_STATUS_IGNORE);
    memcpy(h, s, HDR);
    if (rc == MPI_SUCCESS && h[0] == c->dt && bytes) memcpy(c->buf, s + HDR, bytes);
  } else {
    MPI_Datatype t;
    rc = msg_type(h, c->buf, c, &t);
    if (rc != MPI_SUCCESS) return drop(b, desc, m, from, (MPI_Count)(HDR + bytes), rc, "MPI_Type_create_struct");
    rc = MPI_Mrecv(MPI_BOTTOM, 1, t, m, MPI_STATUS_IGNORE);
    MPI_Type_free(&t);
  }
  if (rc != MPI_SUCCESS) return crun__mpi_fail(rc, desc, b->pg, b->rank, "MPI_Mrecv");
  if (h[0] != c->dt || h[1] != (int64_t)c->count) return mismatch(b, c, desc, from, h, h[0] >= 0 && h[0] < CRUN_DTYPE_COUNT, 0);
  return 0;
}

int crun__mpi_recv(void *state, crun__coll_t *c) {
  crun__mpi_t *b = state;
  char desc[64];
  crun__pg_coll_desc(b->pg, c, desc, sizeof desc);
  CRUN_CHECK(check_tag(b, c, desc));
  reap(b, 0);
  /* allocated before the probe: a message MPI_Improbe matched must be
   * received, or it is lost inside MPI (before, a failure here left it
   * matched and never received: a sender's rendezvous send never ended) */
  size_t bytes = c->count * crun_dtype_size(c->dt);
  char *s = bytes <= SMALL ? crun__mpi_stage(b, 1, HDR + bytes, "mpi.stage_recv") : NULL;
  if (bytes <= SMALL && !s)
    return crun_error(CRUN_ENOMEM, "%s on %s: no memory for its staging buffer (%zu bytes)", desc, CRUN__WHO(b->pg, b->rank),
                      HDR + bytes);
  MPI_Message m;
  MPI_Status st;
  CRUN_CHECK(probe(b, c, desc, &m, &st));
  MPI_Count got = 0;
  MPI_Get_elements_x(&st, MPI_BYTE, &got);
  c->src_out = st.MPI_SOURCE;
  if (got != (MPI_Count)(HDR + bytes)) return recv_wrong(b, c, desc, &m, st.MPI_SOURCE, got);
  return recv_right(b, c, desc, &m, st.MPI_SOURCE, bytes, s);
}

/* tcp_wire.c — the mesh's checks of what arrives on the wire, apart from
 * any socket (see tcp_priv.h): tcp_mesh.c, tcp_xfer.c and tcp_p2p.c call
 * them, and so does tests/fuzz. */
#include <stdio.h>
#include <string.h>

#include "transport/tcp_priv.h"

const char *crun__tcp_conn_how(int err, char *buf, size_t cap) {
  if (err) snprintf(buf, cap, "failed: %s", strerror(err));
  else snprintf(buf, cap, "closed");
  return buf;
}

int crun__tcp_hello_check(const crun__hello_t *h, uint32_t group, int rank, int size, const int *fds) {
  if (h->magic != CRUN__TCP_HELLO || h->group != group || h->rank <= rank || h->rank >= size ||
      h->size != size || fds[h->rank] >= 0)
    return crun_error(CRUN_EPROTO, "unexpected hello (rank %d of %d, group %08x)", h->rank, h->size, h->group);
  return 0;
}

int crun__tcp_hdr_garbled(const crun__hdr_t *h, uint32_t group, const crun_pg_t *pg, int rank, int from, char *text,
                          size_t cap) {
  if (h->magic != CRUN__TCP_MAGIC || h->group != group) {
    snprintf(text, cap, "%s: garbled frame from %s (magic %08x group %08x)", CRUN__WHO(pg, rank), CRUN__WHO(pg, from),
             h->magic, h->group);
    return 1;
  }
  if (h->kind != CRUN__KIND_ABORT || h->nbytes <= CRUN__ABORT_FRAME_MAX) return 0;
  snprintf(text, cap, "%s: garbled frame from %s (an abort frame of %llu bytes; at most %u)", CRUN__WHO(pg, rank),
           CRUN__WHO(pg, from), (unsigned long long)h->nbytes, CRUN__ABORT_FRAME_MAX);
  return 1;
}

char *crun__tcp_abort_dst(char *text, char *sink, size_t sinkcap, uint64_t nbytes, uint64_t got, size_t *want) {
  uint64_t kept = nbytes < CRUN__ABORT_TEXT_MAX ? nbytes : CRUN__ABORT_TEXT_MAX;
  if (got < kept) {
    *want = (size_t)(kept - got);
    return text + got;
  }
  uint64_t left = nbytes - got; /* dropped in pieces of at most sinkcap */
  *want = (size_t)(left < sinkcap ? left : sinkcap);
  return sink;
}

const char *crun__tcp_abort_body(const crun__hdr_t *h, const char *text, int *st) {
  *st = h->status > 0 && h->status < 1000 ? -(int)h->status : CRUN_EIO; /* no -INT_MIN */
  if (!strcmp(crun_err_name(*st), "EUNKNOWN")) *st = CRUN_EIO;
  const char *sp = strstr(text, ": ");
  return sp && !strncmp(text, crun_err_name(*st), (size_t)(sp - text)) ? sp + 2 : text;
}

int crun__tcp_call_shape(char *b, size_t cap, int dt, uint64_t count, int op, int root, int show_op,
                         int show_root) {
  const char *dn = crun_dtype_name((crun_dtype_t)dt);
  int n = snprintf(b, cap, "%s[%llu]", dn ? dn : "?", (unsigned long long)count);
  const char *on = crun_reduce_op_name((crun_reduce_op_t)op);
  if (show_op && (size_t)n < cap)
    n += on ? snprintf(b + n, cap - (size_t)n, " %s", on) : snprintf(b + n, cap - (size_t)n, " op %d", op);
  if (show_root && (size_t)n < cap)
    n += snprintf(b + n, cap - (size_t)n, " root %d", root);
  return n;
}

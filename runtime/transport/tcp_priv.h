/* tcp_priv.h — the TCP transport's internals shared by tcp_mesh.c and
 * tcp_xfer.c: the wire header, the per-peer stash of early frames. */
#ifndef CRUN_TRANSPORT_TCP_PRIV_H
#define CRUN_TRANSPORT_TCP_PRIV_H

#include "transport/tcp.h"

#define CRUN__TCP_MAGIC 0x314e5243u /* "CRN1" */
#define CRUN__TCP_HELLO 0x4f4c4548u /* "HELO" */
#define CRUN__KIND_ABORT 0xff

/* The header in front of every frame (host byte order: one host family). */
typedef struct {
  uint32_t magic;
  uint32_t group;
  uint8_t kind, dtype, op, algo;
  int32_t root;
  int32_t tag;
  uint32_t status;   /* abort frames: -status */
  uint64_t seq;
  uint64_t count;
  uint64_t nbytes;   /* payload bytes that follow */
} crun__hdr_t;

/* A whole frame read ahead of the call that wants it. */
typedef struct crun__stash {
  crun__hdr_t h;
  void *data;
  struct crun__stash *next;
} crun__stash_t;

struct crun__tcp {
  crun_pg_t *pg;
  int rank, size;
  uint32_t group;
  int *fds;             /* fds[peer]; -1 for self */
  char *tx_dirty;       /* a frame to that peer was left half sent */
  char *closed;         /* the peer closed its side (seen by an any-source recv) */
  crun__stash_t **stash;/* per-peer FIFO */
  int aborted;
};

/* Returns 1 when fd is ready for `ev`, 0 at the deadline, <0 on poll error. */
int crun__tcp_wait_fd(int fd, short ev, double deadline);

#endif

/* tcp.h — the TCP transport: a full mesh of connections built through the
 * store, carrying framed messages. Every frame starts with a header naming
 * the group, the operation (kind, sequence number, dtype, count, op, root) so
 * that a receiver detects a rank that called something else before touching
 * its buffer. All I/O is non-blocking with poll()-based deadlines; one call
 * sends and receives at the same time so ring steps never deadlock, and
 * point-to-point operations progress in the background (any transport call
 * and a pump thread drive them), so a posted send never blocks a receive. */
#ifndef CRUN_TRANSPORT_TCP_H
#define CRUN_TRANSPORT_TCP_H

#include "algo/algo.h"

typedef struct crun__tcp crun__tcp_t;

/* Connects the mesh of group `pg` (its store, rank, size, group id). */
int crun__tcp_open(crun_pg_t *pg, crun__tcp_t **out);

/* Closes every connection and frees the transport. */
void crun__tcp_close(crun__tcp_t *t);

/* Runs one step (see crun__xfer_t) of collective c by c->deadline. */
int crun__tcp_xfer(crun__tcp_t *t, crun__coll_t *c, const crun__xfer_t *x);

/* Point-to-point: sends c->buf to c->root with c->tag. Returns 0 when the
 * whole frame was written, or CRUN__PENDING: the rest goes out in the
 * background (tcp_p2p.c) and crun__pg_p2p_done(pg, c, rc) reports the end;
 * c (inside its crun_work) and c->buf must live until then. */
int crun__tcp_send(crun__tcp_t *t, crun__coll_t *c);

/* Point-to-point: receives into c->buf from c->root (or any) with c->tag and
 * sets c->src_out; CRUN__PENDING and the end as for crun__tcp_send. */
int crun__tcp_recv(crun__tcp_t *t, crun__coll_t *c);

/* Whether peer j's end of the mesh is gone: its connection was closed or
 * reset (its process ended, or it closed or failed the group), so j runs no
 * further call of the group. Never blocks, reads nothing. */
int crun__tcp_peer_gone(crun__tcp_t *t, int j);

/* Sends an abort frame with the text to every peer it can reach without
 * blocking, then shuts every connection down. */
void crun__tcp_abort(crun__tcp_t *t, int status, const char *text);

#endif

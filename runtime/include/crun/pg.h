/* crun/pg.h — process groups, collectives and Work handles. Include <crun.h>.
 *
 * A process group (crun_pg_t) is a set of `size` ranks that rendezvous through
 * a store and then talk over a backend ("cpu": a full mesh of TCP connections,
 * with a shared-memory engine taking over what it supports). Every collective
 * works on plain host buffers of `count` elements of one dtype, so C programs
 * can use the runtime the way they would use Gloo.
 *
 * Blocking and async: every collective takes `crun_work_t **work`. NULL means
 * blocking: the call returns when this rank's part is done (running inline on
 * the calling thread when nothing is queued on the group). Non-NULL means
 * async: the call returns at once with a Work handle in *work; the buffers must
 * stay valid until crun_work_wait() returns; errors surface there. Work on one
 * group runs in issue order, on the group's progress thread.
 *
 * Failure: a collective that fails (mismatch between ranks, timeout, a peer that
 * died) fails on every rank that takes part, with a text naming the ranks and
 * calls; the group is then broken and further calls fail with CRUN_ESTATE.
 * Collectives must be called in the same order on every rank of the group.
 *
 * Timeouts name the peer that sent nothing and where every rank is: each
 * group keeps "progress/<rank>" = "<op> #<seq>" in its store, published by a
 * background thread at most every 200 ms (a collective itself only stores an
 * atomic), e.g. "ETIMEDOUT: all_reduce #42 on rank 0: no data from rank 3
 * after 2.0 s; ranks 0-2 are at all_reduce #42; rank 3 is at barrier #41".
 *
 * Environment: CRUN_ALGO=ring,rd,binomial,chain,... forces algorithms (one
 * file each in runtime/algo/); CRUN_RING_SLICE is the slice (bytes, default
 * 512 KiB) the ring all_reduce works through at a time;
 * CRUN_TRANSPORT=tcp (or CRUN_SHM=0) keeps every collective on TCP,
 * CRUN_TRANSPORT=shm requires the shared-memory engine (group creation fails
 * with CRUN_EINVAL naming the hosts otherwise), unset/auto: ranks on one host
 * use the shared-memory engine, groups spanning hosts the hierarchical one
 * (shm within each host, TCP among one rank per host, for all_reduce,
 * broadcast, reduce and barrier; CRUN_HIER=0: flat TCP); a rank's host is its
 * boot id, hostname and namespaces unless CRUN_HOST_ID names it
 * (CRUN_HOST_ID=rank_div:K fakes hosts: global rank r on host r / K) — see
 * runtime/backend/cpu/hier.c; CRUN_TCP_BUFFER sets SO_SNDBUF/SO_RCVBUF (default 4 MiB, 0 =
 * kernel autotuning); CRUN_HOST is the address peers dial (default: the
 * local address routing to MASTER_ADDR, else 127.0.0.1). */
#ifndef CRUN_PG_H
#define CRUN_PG_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CRUN_PG_DEFAULT_TIMEOUT 300.0
#define CRUN_ANY_SOURCE (-1)

typedef struct crun_pg crun_pg_t;
typedef struct crun_work crun_work_t;

typedef struct {
  crun_store_t *store;  /* rendezvous store; the group retains it */
  int rank;             /* 0 <= rank < world_size */
  int world_size;       /* >= 1 */
  double timeout;       /* default deadline of every collective, s; <=0 or NaN: 300; at most 1e9 (inf: 1e9) */
  const char *backend;  /* "cpu", "mpi", "nccl" (CUDA buffers: opts.cuda); NULL or
                           "auto": cpu (mpi under mpirun), plus nccl for CUDA
                           buffers when built in and a GPU is present */
  const char *name;     /* prefixes the group's store keys; NULL: "pg" */
} crun_pg_opts_t;

/* Per-call options; pass NULL for the defaults. */
typedef struct {
  double timeout;       /* deadline of this call in s; <=0 or NaN: the group's; at most 1e9 */
  int tag;              /* send/recv only: matched between the two sides */
  double premul_factor; /* CRUN_OP_PREMUL_SUM only: each input is multiplied by it */
  int cuda;             /* non-zero: the buffers are CUDA device memory of the
                           current device (backend nccl, or "auto" with a GPU) */
} crun_coll_opts_t;

/* Creates the group: every rank publishes its address in the store and the
 * full mesh is connected. Blocks until all `world_size` ranks joined or the
 * timeout passed (CRUN_ETIMEDOUT naming the missing ranks). */
int crun_pg_new(const crun_pg_opts_t *opts, crun_pg_t **out);

/* Creates a sub-group of `parent` holding the parent ranks ranks[0..n-1] (in
 * that order: ranks[i] becomes group rank i). Every rank of the parent must
 * call it, in the same order; non-members get *out = NULL and return 0.
 * Blocks like crun_pg_new. timeout is the new group's (<= 0 inherits the
 * parent's); joining it (the ranks' agreement on the parent, connecting)
 * waits at least the parent's. */
int crun_pg_new_group(crun_pg_t *parent, const int *ranks, int n, double timeout,
                      crun_pg_t **out);

/* Takes / drops a reference. The last release waits for queued work (failing
 * what cannot run), closes the connections and frees the group. */
void crun_pg_retain(crun_pg_t *pg);
void crun_pg_release(crun_pg_t *pg);

/* Destroys the group for its owner (torch's destroy_process_group) and
 * drops the owner's reference. Blocks while queued work runs. Where Work
 * handles still hold the group, its point-to-point work still pending fails
 * now with ECLOSED ("the group was destroyed while it was pending") and its
 * connections close, so that peers waiting on this rank fail at once with
 * EPEERDIED instead of at their deadline; those handles stay valid until
 * released. (A group whose CUDA backend is connected, or whose backend
 * cannot fail pending work early, is only released here.) */
void crun_pg_destroy(crun_pg_t *pg);

/* Returns this rank in the group / the number of ranks. */
int crun_pg_rank(const crun_pg_t *pg);
int crun_pg_size(const crun_pg_t *pg);

/* Returns the rank in the root group (the one made by crun_pg_new) of group
 * rank r; -1 when r is out of range. */
int crun_pg_global_rank(const crun_pg_t *pg, int r);

/* Returns the backend name ("cpu"). */
const char *crun_pg_backend(const crun_pg_t *pg);

/* Sets / gets the default per-collective deadline (seconds; <= 0 or NaN:
 * the default, 300; more than 1e9, or inf, is 1e9: every wait ends). */
void crun_pg_set_timeout(crun_pg_t *pg, double seconds);
double crun_pg_get_timeout(const crun_pg_t *pg);

/* Returns the sequence number the next collective to run will get (1 for the
 * first). Collectives are numbered in the order the group runs them; an async
 * one still queued has no number yet. */
uint64_t crun_pg_next_seq(const crun_pg_t *pg);

/* For a binding whose own argument check of collective `call` ("gather",
 * "scatter", "all_to_all") failed on this rank alone (a root's list of
 * tensors, a list given to a rank that is not the root, a rank's split
 * sizes); root: the call's root, or -1; opts: the call's options (cuda
 * picks the backend of a group of backend "auto"; NULL: host buffers).
 * Records (status, text) as the last error and, when the backend that would
 * run the call can reach its peers (the TCP mesh, the shared-memory engine,
 * MPI, NCCL's abort notice), fails the group with the text so that they fail
 * the call, or their next one, naming this rank and its reason rather than a
 * later EMISMATCH; the refused call then takes its number (crun_pg_next_seq),
 * as it does on the peers. When every rank refused that same call number
 * (the same bad argument in every rank's script, a REPL line), the group
 * goes on instead, as torch's does, and the text says so ("every rank
 * refused <call> #N: the group goes on"). To tell the two apart it leaves
 * "refused/<N>/<rank>" on the group's progress board and waits until every
 * peer left its own or is seen in call N or later (the progress board, within
 * 200 ms), stopped, closed or failed the group, is gone (its end of the TCP
 * mesh closed: killed), or waits (0.5 s seen) in a blocking send to or recv
 * from this rank, at most 5 s (the group's timeout when shorter); the
 * first rank to decide writes "refusal/<N>" (go or stop) once and every
 * rank takes that decision, so a peer that reaches the same refusal later
 * finds the group stopped: it blocks like the call it refuses.
 * Not on backend mpi, whose ranks share no store under mpirun: there the
 * group always stops. Returns status (< 0). */
int crun_pg_refuse(crun_pg_t *pg, const char *call, int root, const crun_coll_opts_t *opts, int status,
                   const char *text);

/* ---------------------------------------------------------------- p2p */

/* Sends count elements to group rank dst; completes when the bytes are handed
 * to the transport (the receiver may not have them yet). */
int crun_pg_send(crun_pg_t *pg, const void *buf, size_t count, crun_dtype_t dt, int dst,
                 const crun_coll_opts_t *opts, crun_work_t **work);

/* Receives count elements from group rank src (CRUN_ANY_SOURCE: from whoever
 * sends first) with a matching tag; stores the sender in *src_out (may be NULL;
 * for async use crun_work_source). The sender's count and dtype must match. */
int crun_pg_recv(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, int src,
                 const crun_coll_opts_t *opts, int *src_out, crun_work_t **work);

/* ---------------------------------------------------------------- collectives
 * `ins` / `outs` are arrays of `size` pointers, one block of `count` elements
 * per rank (entry i belongs to group rank i). An argument a collective refuses
 * (CRUN_EINVAL: a dtype its op is not defined on, a NULL buffer, a root out of
 * range, ...) is refused for the group as crun_pg_refuse does: the peers may
 * have passed theirs, so the group stops rather than pair their call with this
 * rank's next one (every later call is CRUN_ESTATE), unless every rank
 * refused the same call. */

/* Copies root's buf into buf on every rank. */
int crun_pg_broadcast(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt, int root,
                      const crun_coll_opts_t *opts, crun_work_t **work);

/* Reduces buf element-wise over all ranks, in place; every rank gets the result. */
int crun_pg_all_reduce(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt,
                       crun_reduce_op_t op, const crun_coll_opts_t *opts, crun_work_t **work);

/* Reduces buf over all ranks into root's buf (in place); other ranks' buf is
 * left unchanged. */
int crun_pg_reduce(crun_pg_t *pg, void *buf, size_t count, crun_dtype_t dt,
                   crun_reduce_op_t op, int root, const crun_coll_opts_t *opts,
                   crun_work_t **work);

/* Every rank's `in` lands in outs[rank] on every rank. in == outs[rank] is allowed. */
int crun_pg_all_gather(crun_pg_t *pg, void *const *outs, const void *in, size_t count,
                       crun_dtype_t dt, const crun_coll_opts_t *opts, crun_work_t **work);

/* Every rank's `in` lands in outs[rank] on root; outs is ignored elsewhere. */
int crun_pg_gather(crun_pg_t *pg, const void *in, void *const *outs, size_t count,
                   crun_dtype_t dt, int root, const crun_coll_opts_t *opts, crun_work_t **work);

/* Root's ins[r] lands in out on rank r; ins is ignored elsewhere. */
int crun_pg_scatter(crun_pg_t *pg, void *out, const void *const *ins, size_t count,
                    crun_dtype_t dt, int root, const crun_coll_opts_t *opts, crun_work_t **work);

/* out on rank r = reduction over all ranks of their ins[r]. out may not alias ins. */
int crun_pg_reduce_scatter(crun_pg_t *pg, void *out, const void *const *ins, size_t count,
                           crun_dtype_t dt, crun_reduce_op_t op, const crun_coll_opts_t *opts,
                           crun_work_t **work);

/* ins[j] (in_counts[j] elements) on rank r lands in outs[r] on rank j, which
 * must expect out_counts[r] == in_counts[j] elements. ins and outs may not alias. */
int crun_pg_all_to_all(crun_pg_t *pg, void *const *outs, const size_t *out_counts,
                       const void *const *ins, const size_t *in_counts, crun_dtype_t dt,
                       const crun_coll_opts_t *opts, crun_work_t **work);

/* Returns when every rank of the group entered the barrier. */
int crun_pg_barrier(crun_pg_t *pg, const crun_coll_opts_t *opts, crun_work_t **work);

/* ---------------------------------------------------------------- Work */

/* Blocks until the work finished or `timeout` seconds passed (<= 0, or more
 * than 1e9 as math.huge is: until it finished, which the operation's own
 * deadline bounds: its opts.timeout or the group's, counted from when it
 * starts to run, after the work queued before it, each bounded alike; a
 * pending send or recv is failed at its deadline by the backend's pump
 * thread; NaN is CRUN_EINVAL). Returns the operation's
 * status (its error text in crun_last_error()), or CRUN_ETIMEDOUT when the
 * wait itself timed out (the work keeps running). */
int crun_work_wait(crun_work_t *w, double timeout);

/* Returns non-zero when the work finished (successfully or not). Never blocks. */
int crun_work_is_completed(crun_work_t *w);

/* Device work (nccl): crun_work_wait makes the caller's current CUDA stream
 * wait for the work's end event and returns (torch's Work.wait());
 * crun_work_synchronize also waits on the host until the device finished it
 * (timeout <= 0: until it ends or the group's watchdog fails it). On host
 * work both are crun_work_wait. crun_work_is_completed queries the end
 * event. */
int crun_work_synchronize(crun_work_t *w, double timeout);

/* Returns the sender's rank of a finished recv; -1 otherwise. */
int crun_work_source(crun_work_t *w);

/* Returns a short description ("all_reduce #3"). */
const char *crun_work_describe(crun_work_t *w);

/* Drops the handle; an unfinished work still runs to completion. */
void crun_work_release(crun_work_t *w);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_PG_H */

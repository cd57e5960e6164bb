/* shm.h — the same-host shared-memory collective engine (internal API).
 *
 * A communicator joins `size` processes of one host through one POSIX shared
 * memory segment. Rank 0 creates it and publishes its name through a store
 * under "<prefix>/shm_name"; the others attach, and the last one to attach
 * unlinks it at once, so nothing stays in /dev/shm even when a rank crashes
 * later (a create that fails on a rank also removes the name there). The segment is mapped by every rank and freed by the kernel when the
 * last mapping goes away.
 *
 * Every collective is blocking and must be called by every rank in the same
 * order with the same kind, count, dtype, op and root; a rank that does
 * otherwise is reported at once with CRUN_EMISMATCH naming it. Two paths run
 * a collective: up to CRUN_SHM_SMALL bytes (default 32 KiB) a one-shot path
 * (each rank copies its input into its slot, one synchronisation, each rank
 * computes its result from every slot); above that a pipelined path in chunks
 * of CRUN_SHM_CHUNK bytes (default 512 KiB) through CRUN_SHM_NBUF (default 3)
 * buffers per rank, where for reductions each rank reduces its 1/size slice of
 * a chunk while the next chunk is copied in. When every rank's buffers lie in
 * one shared tensor heap (core/heap.h: workers of one crun-lua), large
 * all_reduce, reduce, broadcast, all_gather and gather take the direct path
 * instead (direct.c): peers' buffers are read and written in place between
 * two synchronisations, one pass over the data.
 *
 * Waiting: with ranks <= cores a waiter spins up to CRUN_SHM_SPIN_US (default
 * 50) microseconds, then yields up to CRUN_SHM_YIELDS (default 50) times, then
 * sleeps on a futex (a poster calls FUTEX_WAKE only when someone sleeps);
 * with more ranks than cores, or when the awaited peer last posted from this
 * CPU, it skips the spin (except direct-path waits whose missing ranks all
 * last posted from other CPUs: they spin up to CRUN_SHM_SPIN_US); with more
 * ranks than cores the one-shot path's
 * waits yield up to 1000 times by default (a futex wake-up costs 20-25 us,
 * and yielding runs the awaited ranks; CRUN_SHM_YIELDS sets both counts).
 * A wait that had to yield or sleep halves the spin time of the next ones
 * (down to 2 us: other load is on the cores), one that ended while spinning
 * doubles it back. CRUN_SHM_WAIT=spin|yield forces a
 * policy.
 * Every wait has a deadline: `timeout` seconds of the call (<= 0 means the
 * communicator's timeout). Past it the call fails with CRUN_ETIMEDOUT naming
 * the ranks that never arrived ("no data from rank 2 after 1.0 s"); a peer
 * process that exits before posting what this rank waits for makes it fail
 * with CRUN_EPEERDIED naming it (pidfds: seen within ~20 ms). After any
 * failure the communicator is broken: every rank's next call fails with
 * CRUN_ESTATE (ranks still waiting learn of the failure within ~50 ms, with
 * the first failing rank's text), and the only thing left to do is
 * crun__shm_comm_destroy().
 *
 * Reductions use the kernels of crun/tensor.h: every dtype, every op defined
 * on it; avg sums then divides (integers: truncating); float32 sum/avg on the
 * pipelined path use the engine's fused kernel (kernels.c), which sums in the
 * same order. Results are identical on every rank (each element is reduced in
 * rank order by one rank).
 * A communicator is used by one thread at a time. pg_engine.c attaches one to
 * every cpu process group whose ranks share a host (CRUN_SHM=0: never). */
#ifndef CRUN_TRANSPORT_SHM_H
#define CRUN_TRANSPORT_SHM_H

#include <stddef.h>

#include "crun.h"

#define CRUN_SHM_MAX_RANKS 1024

typedef struct crun__shm_comm crun__shm_comm_t;

/* Creates the communicator of `rank` among `size` processes on this host,
 * meeting through `store` under keys starting with `prefix` (unique for each
 * communicator that is alive at the same time). Blocks until every rank has
 * attached or `timeout` seconds passed (<= 0: the store's timeout), which
 * also becomes the default timeout of the collectives. */
int crun__shm_comm_create(crun_store_t *store, const char *prefix, int rank, int size,
                          double timeout, crun__shm_comm_t **out);

/* crun__shm_comm_create for the ranks of a process group: its error texts
 * name rank q as the group's texts do, "rank G (group rank q)" where G =
 * global[q] is not q (a sub-group). global (size entries) is copied; NULL
 * names rank q "rank q", as crun__shm_comm_create does. */
int crun__shm_comm_create_ranks(crun_store_t *store, const char *prefix, int rank, int size,
                                const int *global, double timeout, crun__shm_comm_t **out);

/* Unmaps the segment and frees the communicator; NULL is a no-op. Does not
 * synchronise with the other ranks. */
void crun__shm_comm_destroy(crun__shm_comm_t *c);

int crun__shm_comm_rank(const crun__shm_comm_t *c);
int crun__shm_comm_size(const crun__shm_comm_t *c);

/* Names the next collective "#seq" in error texts (a process group passes
 * its own numbering); by default the engine counts its own collectives. */
void crun__shm_comm_label(crun__shm_comm_t *c, uint64_t seq);
/* Gives the next op the caller's deadline (a crun__clock_coarse() time) and
 * its whole timeout for error texts, instead of timing it from its start. */
void crun__shm_comm_deadline(crun__shm_comm_t *c, double deadline, double timeout);

/* Writes "<boot id>/<hostname>/<ipc ns>/<mount ns>/<net ns>" into buf: equal
 * exactly on the processes that can open each other's segments in /dev/shm
 * and share a network stack (one host; see pg_engine.c). */
void crun__shm_host_identity(char *buf, size_t n);

/* Sums (or op) `count` elements across ranks; every rank gets the result in
 * buf. sendbuf NULL (or == buf) means in place: buf is the input; otherwise
 * sendbuf is the input and is not modified (it must not overlap buf). */
int crun__shm_allreduce(crun__shm_comm_t *c, void *buf, const void *sendbuf, size_t count,
                        crun_dtype_t dt, crun_reduce_op_t op, double timeout);

/* A process group's in-place all_reduce, its dtype, op and buffer already
 * checked by the group (pg/coll.c): op number `label` of the group, due by
 * `deadline` (crun__clock_coarse() time; `timeout` is what the error says). */
int crun__shm_allreduce_call(crun__shm_comm_t *c, void *buf, size_t count, crun_dtype_t dt,
                             crun_reduce_op_t op, uint64_t label, double deadline, double timeout);

/* Like allreduce, but only `root` receives the result in buf; the other
 * ranks' buf is left unchanged when sendbuf is given, else unspecified. */
int crun__shm_reduce(crun__shm_comm_t *c, void *buf, const void *sendbuf, size_t count,
                     crun_dtype_t dt, crun_reduce_op_t op, int root, double timeout);

/* Copies `count` elements of root's buf into every other rank's buf. */
int crun__shm_broadcast(crun__shm_comm_t *c, void *buf, size_t count, crun_dtype_t dt,
                        int root, double timeout);

/* out (size * count elements) receives every rank's `count` input elements in
 * rank order. In place when in == out + rank * count (elements). */
int crun__shm_all_gather(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                         crun_dtype_t dt, double timeout);

/* all_gather into size separate blocks: outs[q] receives rank q's input.
 * In place when in == outs[rank]. */
int crun__shm_all_gather_v(crun__shm_comm_t *c, void *const *outs, const void *in,
                           size_t count, crun_dtype_t dt, double timeout);

/* gather to root: outs[q] (significant on root only) receives rank q's
 * input. In place when in == outs[root] on the root. */
int crun__shm_gather_v(crun__shm_comm_t *c, void *const *outs, const void *in, size_t count,
                       crun_dtype_t dt, int root, double timeout);

/* scatter from root: out on rank q receives root's ins[q] (ins is
 * significant on root only). out may be ins[root] on the root. */
int crun__shm_scatter_v(crun__shm_comm_t *c, void *out, const void *const *ins, size_t count,
                        crun_dtype_t dt, int root, double timeout);

/* in holds size blocks of `count` elements; out (count elements) receives
 * block `rank` reduced across ranks. out may be in's block `rank`. */
int crun__shm_reduce_scatter(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                             crun_dtype_t dt, crun_reduce_op_t op, double timeout);

/* reduce_scatter from size separate input blocks ins[q]; out may be
 * ins[rank]. */
int crun__shm_reduce_scatter_v(crun__shm_comm_t *c, void *out, const void *const *ins,
                               size_t count, crun_dtype_t dt, crun_reduce_op_t op,
                               double timeout);

/* in and out hold size blocks of `count` elements; block q of out receives
 * block `rank` of rank q's in. in == out (in place) is allowed. */
int crun__shm_all_to_all(crun__shm_comm_t *c, void *out, const void *in, size_t count,
                         crun_dtype_t dt, double timeout);

/* all_to_all with blocks of any length: ins[q] (in_counts[q] elements) goes
 * to rank q, outs[q] receives out_counts[q] elements from rank q, which must
 * equal what q sends here (else CRUN_EMISMATCH naming q). ins and outs may
 * not overlap except ins[rank] == outs[rank]. Costs one extra one-shot
 * exchange of the counts. */
int crun__shm_all_to_all_v(crun__shm_comm_t *c, void *const *outs, const size_t *out_counts,
                           const void *const *ins, const size_t *in_counts, crun_dtype_t dt,
                           double timeout);

/* Returns once every rank has entered the barrier. */
int crun__shm_barrier(crun__shm_comm_t *c, double timeout);

#endif /* CRUN_TRANSPORT_SHM_H */

/* crun/trace.h — seeing what a rank did: the timeline, the flight recorder
 * and per-group statistics. Include <crun.h>.
 *
 * Timeline: with CRUN_TIMELINE=path set when the library loads (crun-lua
 * --timeline sets it for its workers), every collective and p2p operation
 * (name, group, bytes, dtype, algorithm or engine, enqueue, start, end, time
 * blocked on peers), the DDP reducer's bucket launches and waits, and spans
 * (crun_trace_span) are kept in a per-process buffer of at most
 * CRUN_TIMELINE_EVENTS events (default 200,000, ~20 MB); when it is full,
 * later events are dropped and counted (the trace says how many). At exit the
 * process writes "<path>.rank<R>" (one event per line); crun-lua merges those
 * into one Chrome/Perfetto JSON trace at `path` (crun-lua --merge-timeline
 * path does it for jobs started otherwise). With the timeline off an
 * operation costs one predictable branch.
 *
 * Flight recorder: every process keeps its last CRUN_FLIGHT_RECORDER
 * (default 2,000; 0 turns it off) collective and p2p operations in a ring:
 * seq, op, group, count, bytes, dtype, state (queued, started, done,
 * failed), enqueue/start/end times (a blocking call on the shared-memory
 * engine starts when this rank's data is posted: its entry is written while
 * it waits for the peers; without the timeline, an operation that took under
 * ~20 us and did not wait reads the clock at its end one time in 8, and the
 * others' end is their start plus the last exact duration of that op on that
 * group: a clock read costs ~20 ns, against ~250 ns for a 2-rank 8-byte
 * all_reduce on shared memory). The ring is written to
 * CRUN_FLIGHT_DIR/flight_rank<R>.txt (crun-lua sets it per job; without it,
 * $TMPDIR/crun-flight-<uid>-<job>/, mode 0700, <job> from mpirun's
 * PMIX_NAMESPACE, Slurm's job and step, else the parent pid) when an
 * operation fails (timeout, dead peer, mismatch), on SIGUSR1 (installed by
 * crun_flight_arm) and on crun_flight_dump().
 *
 * "Waiting" is the time the thread running an operation sat blocked in the
 * engine for a peer: the shared-memory engine's spin/yield/sleep on a peer's
 * counter, the TCP algorithms' poll() for a socket to become readable or
 * writable (which includes the wire time of data not yet arrived). It is
 * measured only while the timeline or the flight recorder is on. */
#ifndef CRUN_TRACE_H
#define CRUN_TRACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct crun_store;
struct crun_pg;

/* Re-reads CRUN_TIMELINE, CRUN_TIMELINE_EVENTS and CRUN_FLIGHT_RECORDER
 * (enable non-zero), or turns the timeline and the flight recorder off in
 * this process (enable 0: a launcher that only forks workers). The library
 * reads them once when it loads; a process forked after changing them calls
 * this first. Events recorded so far are dropped. Not thread-safe with
 * running operations: call it before any group exists. */
void crun_trace_configure(int enable);

/* Starts the timeline now, writing to "<path>.rank<R>" at exit or flush
 * (a job that takes --timeline itself). When it already records, only the
 * path changes. path NULL stops it and drops its events (nothing is
 * written at exit). Returns 0 or CRUN_ENOMEM. */
int crun_trace_start(const char *path);

/* What is recorded: bit 1 the flight recorder, bit 2 the timeline. */
#define CRUN_TRACE_FLIGHT 1
#define CRUN_TRACE_TIMELINE 2

/* Sets what records to `mode` (CRUN_TRACE_* bits; only those configured
 * can be turned on) and returns the previous mode; mode < 0 only reads it.
 * Lets one run measure the cost of recording (jobs/bench.lua --trace-cost). */
int crun_trace_mode(int mode);

/* Returns non-zero while the timeline records. */
int crun_trace_enabled(void);

/* Records a span `name` (copied, at most 47 bytes kept) from t0_ns to t1_ns
 * (crun_clock_ns values) on the calling thread; category cat (static text,
 * NULL: "span"). A no-op when the timeline is off. Thread-safe. */
void crun_trace_span(const char *name, const char *cat, uint64_t t0_ns, uint64_t t1_ns);

/* Records an instant event `name` at t_ns. A no-op when the timeline is off. */
void crun_trace_instant(const char *name, const char *cat, uint64_t t_ns);

/* Estimates this process's clock offset to rank 0's through `store`: a few
 * set/get round trips, keeping the sample with the smallest round-trip time
 * (offset = rank 0's clock - the midpoint of the round trip). Collective over
 * `size` ranks (every rank calls it; rank 0 answers). `tag` keeps the keys of
 * two alignments apart. Blocks, at most `timeout` seconds per step. Returns 0
 * or the store's error. A no-op returning 0 when the timeline is off. */
int crun_trace_align(struct crun_store *store, const char *tag, int rank, int size, double timeout);

/* Writes "<path>.rank<R>" now (also done at exit). Returns 0, or CRUN_EIO
 * naming the file. A no-op when the timeline is off. */
int crun_trace_flush(void);

/* Starts the flight recorder's dump thread and installs its SIGUSR1 handler
 * (when SIGUSR1 has no other handler). Idempotent; a no-op when the flight
 * recorder is off. Returns 0 or CRUN_ESYS. */
int crun_flight_arm(void);

/* Writes the flight recorder's ring with `reason` in its header to
 * CRUN_FLIGHT_DIR/flight_rankN.txt (N: this rank); the path written goes to path (cap
 * bytes) when path is not NULL. Returns 0, CRUN_ESTATE when the recorder is
 * off, or CRUN_EIO naming the file. */
int crun_flight_dump(const char *reason, char *path, size_t cap);

/* Per-op statistics of one group. */
typedef struct {
  uint64_t ops;      /* operations completed (or failed) */
  uint64_t bytes;    /* this rank's input bytes (count x element size) */
  double time_s;     /* start to end, summed (short operations' ends sampled: see above) */
  double wait_s;     /* blocked on peers, summed (see above) */
} crun_pg_stat_t;

#define CRUN_PG_STAT_OPS 11 /* send, recv, broadcast, all_reduce, reduce, all_gather,
                               gather, scatter, reduce_scatter, all_to_all, barrier */

/* Copies the statistics of pg since its creation or last reset into
 * out[CRUN_PG_STAT_OPS] (index: the op's place in the list above; names from
 * crun_pg_stat_name), then zeroes them when reset is non-zero. Counting needs
 * the flight recorder or the timeline on: returns CRUN_ESTATE otherwise. */
int crun_pg_stats(struct crun_pg *pg, crun_pg_stat_t *out, int reset);

/* Returns "all_reduce" for the op at index i of crun_pg_stats, NULL past the end. */
const char *crun_pg_stat_name(int i);

#ifdef __cplusplus
}
#endif

#endif /* CRUN_TRACE_H */

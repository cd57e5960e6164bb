/* trace_int.h — the hooks through which the process group, the engines and
 * the reducer feed the timeline, the flight recorder and the per-group
 * statistics (runtime/core/trace.c; public side: crun/trace.h).
 *
 * Cost: every hook site is `if (crun__obs_on) ...`, one predictable branch
 * when everything is off. */
#ifndef CRUN_TRACE_INT_H
#define CRUN_TRACE_INT_H

#include <stdatomic.h>
#include <stdint.h>

#define CRUN__OBS_FLIGHT 1   /* the flight recorder is on */
#define CRUN__OBS_TIMELINE 2 /* the timeline records */

/* CRUN__OBS_* bits: set when the library loads, changed by crun_trace_mode
 * and crun_trace_start while other threads read them (atomic: a load is a
 * plain move on x86-64) */
extern _Atomic int crun__obs_on;

/* Nanoseconds the calling thread spent blocked on peers so far (engines add
 * to it while crun__obs_on is set); an operation's wait is the difference
 * between its end and its start on the thread that ran it. */
extern _Thread_local uint64_t crun__obs_wait_ns;

/* The algorithm or engine that ran the current operation on this thread
 * (static text), set by the backend while crun__obs_on is set. */
extern _Thread_local const char *crun__obs_algo;

/* What a work carries for the hooks. */
typedef struct {
  uint64_t id;      /* flight recorder entry (0: none) */
  uint64_t t_enq, t_start, wait0; /* ticks of core/trace.c; wait0 ns */
} crun__obs_op_t;

/* Per-op counters of a group (guarded by the recorder's lock). */
typedef struct {
  uint64_t ops, bytes, time_ns, wait_ns; /* time_ns: in the hooks' ticks (core/trace.c) */
  /* the shm one-shot path's last exact duration (ticks), its bytes, and the
   * ends estimated since (core/trace.c end_ticks) */
  uint64_t est, est_bytes, skip;
} crun__obs_stat_t;

struct crun_pg;
struct crun_work;

/* Submit: queued: the work waits for the progress thread (it gets its seq
 * when it starts, pg/work.c number()). Else it runs inline now, and its start (clock read and
 * flight-recorder entry) is held until crun__obs_posted: see below. */
void crun__obs_enqueue(struct crun_pg *pg, struct crun_work *w, int queued);
/* The engine is about to run the work on this thread. */
void crun__obs_start(struct crun_pg *pg, struct crun_work *w);

/* The inline work of this thread whose start is not recorded yet (NULL:
 * none). An engine that posts its own data before it waits for its peers'
 * (the shm engine: backend posts_obs and engine posts_obs) calls
 * crun__obs_posted before every wait, so the clock read and the entry are
 * written while the peers' data is on its way instead of before this rank's
 * post (~40 ns of a 2-rank 8-byte all_reduce). Every other path calls it
 * before it runs the work, and crun__pg_execute after it ran, so an operation
 * that waits for a peer always has its entry. The recorded start is then the
 * post, not the call's entry. */
extern _Thread_local struct crun_work *crun__obs_held;
void crun__obs_write_held(void);
static inline void crun__obs_posted(void) {
  if (crun__obs_held) crun__obs_write_held();
}
/* Set by the shared-memory engine's one-shot path (small operations, every
 * wait counted) for the operation it runs on this thread; crun__obs_end reads
 * and clears it: such an operation's end may be estimated (core/trace.c). */
extern _Thread_local int crun__obs_oneshot;
/* The work ended with rc (<0: failed); same_thread: it ended on the thread
 * that started it (its wait is measured), else it went on in the background. */
void crun__obs_end(struct crun_pg *pg, struct crun_work *w, int rc, int same_thread);
/* The group failed (first failure): the flight recorder dumps its ring. */
void crun__obs_failed(struct crun_pg *pg, int rc, const char *text);

#endif

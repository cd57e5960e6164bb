/* wait.c — posting progress and waiting for peers: spin or yield, then sleep
 * on the peer's futex bell; deadlines, dead peers, aborts and op mismatches. */
#include "transport/shm/shm_int.h"
#include "core/trace_int.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_SLEEP_SLICE_NS 50000000ull /* longest futex sleep between checks */
#define SHM_LIVE_EVERY_NS 20000000ull  /* how often sleepers look for dead peers */

const char *crun__shm_kind_name(shm_kind_t k) {
  switch (k) {
  case SHM_ALLREDUCE: return "all_reduce";
  case SHM_REDUCE: return "reduce";
  case SHM_BROADCAST: return "broadcast";
  case SHM_ALLGATHER: return "all_gather";
  case SHM_REDUCE_SCATTER: return "reduce_scatter";
  case SHM_ALLTOALL: return "all_to_all";
  case SHM_BARRIER: return "barrier";
  case SHM_GATHER: return "gather";
  case SHM_SCATTER: return "scatter";
  case SHM_ALLTOALLV: return "all_to_all";
  }
  return "?";
}

crun__who_t crun__shm_who(const crun__shm_comm_t *c, int q) {
  return crun__who(c ? c->global : NULL, c ? c->size : 0, q);
}

/* Writes "1, 3" (map: their map[] values) into buf; returns the length. */
static size_t rank_list(char *buf, size_t cap, const int *qs, int n, const int *map) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < n && off + 16 < cap; i++)
    off += (size_t)snprintf(buf + off, cap - off, "%s%d", i ? ", " : "", map ? map[qs[i]] : qs[i]);
  return off;
}

void crun__shm_ranks_text(const crun__shm_comm_t *c, const int *qs, int n, char *buf, size_t cap) {
  int shifted = 0;
  for (int i = 0; c->global && i < n && !shifted; i++) shifted = c->global[qs[i]] != qs[i];
  const char *s = n > 1 ? "s" : "";
  size_t off = (size_t)snprintf(buf, cap, "rank%s ", s);
  if (off >= cap) return;
  off += rank_list(buf + off, cap - off, qs, n, shifted ? c->global : NULL);
  if (!shifted || off + 32 >= cap) return;
  off += (size_t)snprintf(buf + off, cap - off, " (group rank%s ", s);
  off += rank_list(buf + off, cap - off, qs, n, NULL);
  snprintf(buf + off, cap - off, ")");
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void futex_wake_all(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_sleep(_Atomic uint32_t *w, uint32_t val, uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Publishes v in one of this rank's counters and wakes its sleepers, if any. */
void crun__shm_post(crun__shm_comm_t *c, _Atomic uint64_t *ctr, uint64_t v) {
  shm_ctrl_t *me = &c->ctrl[c->rank];
  /* stored only when it changed: peers read it while they wait, and a store
   * of the same value would still pull the line back from them every op */
  int cpu = sched_getcpu();
  if (atomic_load_explicit(&me->cpu, memory_order_relaxed) != cpu)
    atomic_store_explicit(&me->cpu, cpu, memory_order_relaxed);
  atomic_store(ctr, v); /* seq_cst: pairs with the sleeper's increment */
  if (atomic_load(&me->sleepers)) {
    atomic_fetch_add(&me->bell, 1);
    futex_wake_all(&me->bell);
  }
}

void crun__shm_leave(crun__shm_comm_t *c) {
  shm_ctrl_t *me = &c->ctrl[c->rank];
  atomic_store(&me->left, 1);
  atomic_fetch_add(&me->bell, 1);
  futex_wake_all(&me->bell);
}

/* Records the failure text for this rank and for every peer (abort record),
 * marks the communicator broken, and returns status. */
int crun__shm_fail(crun__shm_comm_t *c, int status, const char *fmt, ...) {
  char text[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  c->broken = 1;
  shm_header_t *h = c->hdr;
  uint32_t none = 0;
  if (atomic_compare_exchange_strong(&h->abort_claim, &none, (uint32_t)c->rank + 1)) {
    h->abort_status = status;
    size_t n = strlen(text);
    if (n >= sizeof h->abort_text) n = sizeof h->abort_text - 1;
    memcpy(h->abort_text, text, n);
    h->abort_text[n] = 0;
    atomic_store_explicit(&h->abort_rank, (uint32_t)c->rank + 1, memory_order_release);
    for (int q = 0; q < c->size; q++) {
      atomic_fetch_add(&c->ctrl[q].bell, 1);
      futex_wake_all(&c->ctrl[q].bell);
    }
  }
  /* INFO: every communicator serves a group's engine (the shm engine, or a
   * stage of the hier engine), whose failure the group logs at WARN in the
   * words the user gets (pg/work.c break_group); a WARN here repeated it, or
   * quoted a hier stage's internal call */
  CRUN_LOG(INFO, SHM, "%s", text);
  return crun_error(status, "%s", text);
}

/* crun__shm_fail with the current last error's text (its name prefix cut). */
int crun__shm_fail_last(crun__shm_comm_t *c, int status) {
  const char *t = crun_last_error();
  const char *name = crun_err_name(status);
  size_t n = strlen(name);
  if (strncmp(t, name, n) == 0 && t[n] == ':') t += n + (t[n + 1] == ' ' ? 2 : 1);
  return crun__shm_fail(c, status, "%s", t);
}

/* Fails when another rank has aborted the communicator. */
int crun__shm_check_abort(crun__shm_comm_t *c) {
  uint32_t who = atomic_load_explicit(&c->hdr->abort_rank, memory_order_acquire);
  if (!who || (int)who - 1 == c->rank) return 0;
  c->broken = 1;
  return crun_error(c->hdr->abort_status, "shm %s #%llu on %s: %s failed first: %s",
                    crun__shm_kind_name(c->kind), (unsigned long long)c->label, SHM_WHO(c, c->rank),
                    SHM_WHO(c, (int)who - 1), c->hdr->abort_text);
}

/* Returns non-zero when rank q's process has exited. */
static int peer_dead(crun__shm_comm_t *c, int q) {
  if (c->pidfd[q] >= 0) {
    struct pollfd p = {c->pidfd[q], POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  return kill((pid_t)c->pids[q], 0) != 0 && errno == ESRCH;
}

static _Atomic uint64_t *counter(crun__shm_comm_t *c, shm_ctr_t ctr, int q, uint64_t target);

/* Fails with CRUN_EPEERDIED when a rank we still wait for (short of target
 * on ctr) has exited or destroyed the group; ranks that did so after posting
 * it are fine. */
static int check_peers(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target) {
  for (int q = who < 0 ? 0 : who; q < (who < 0 ? c->size : who + 1); q++) {
    if (q == c->rank || atomic_load(counter(c, ctr, q, target)) >= target) continue;
    if (atomic_load_explicit(&c->ctrl[q].left, memory_order_acquire))
      return crun__shm_fail(c, CRUN_EPEERDIED, "shm %s #%llu on %s: %s destroyed the group "
                            "(it left without taking part)", crun__shm_kind_name(c->kind),
                            (unsigned long long)c->label, SHM_WHO(c, c->rank), SHM_WHO(c, q));
    if (peer_dead(c, q))
      return crun__shm_fail(c, CRUN_EPEERDIED, "shm %s #%llu on %s: %s (pid %d) "
                            "died", crun__shm_kind_name(c->kind),
                            (unsigned long long)c->label, SHM_WHO(c, c->rank), SHM_WHO(c, q), (int)c->pids[q]);
  }
  return 0;
}

/* Writes "all_reduce(float32[1024], sum)" for an op signature (an
 * all_to_all with per-peer counts has none to show: "all_to_all(float32
 * blocks)"; its counts are compared once the ops agree). A root is named by
 * its global rank, as the caller gave it (dist.broadcast's src). */
static void describe(const crun__shm_comm_t *c, uint64_t sig, uint64_t count, char *buf, size_t n) {
  shm_kind_t k = (shm_kind_t)(sig & 0xff);
  int root = (int)(sig >> 24) - 1;
  if (k == SHM_BARRIER) {
    snprintf(buf, n, "barrier()");
    return;
  }
  if (k == SHM_ALLTOALLV) {
    snprintf(buf, n, "all_to_all(%s blocks)", crun_dtype_name((crun_dtype_t)((sig >> 8) & 0xff)));
    return;
  }
  int off = snprintf(buf, n, "%s(%s[%llu]", crun__shm_kind_name(k),
                     crun_dtype_name((crun_dtype_t)((sig >> 8) & 0xff)), (unsigned long long)count);
  if (k == SHM_ALLREDUCE || k == SHM_REDUCE || k == SHM_REDUCE_SCATTER)
    off += snprintf(buf + off, n - (size_t)off, ", %s",
                    crun_reduce_op_name((crun_reduce_op_t)((sig >> 16) & 0xff)));
  if (root >= 0)
    off += snprintf(buf + off, n - (size_t)off, ", root %d",
                    c->global && root < c->size ? c->global[root] : root);
  snprintf(buf + off, n - (size_t)off, ")");
}

/* Fails with CRUN_EMISMATCH when rank q published a different op for opseq. */
int crun__shm_check_desc(crun__shm_comm_t *c, int q, uint64_t opseq, uint64_t sig,
                         uint64_t count) {
  (void)opseq;
  if (sig == c->sig && count == c->count) return 0;
  char theirs[128], mine[128];
  describe(c, sig, count, theirs, sizeof theirs);
  describe(c, c->sig, c->count, mine, sizeof mine);
  return crun__shm_fail(c, CRUN_EMISMATCH, "shm collective #%llu on %s: %s called %s "
                        "but %s called %s", (unsigned long long)c->label, SHM_WHO(c, c->rank),
                        SHM_WHO(c, q), theirs, SHM_WHO(c, c->rank), mine);
}

/* Checks q's op ring for the current op: catches ranks that took another
 * path (one-shot vs. pipelined) and so never post what we wait for. */
static int ring_check(crun__shm_comm_t *c, int q) {
  shm_desc_t *d = &c->ctrl[q].ring[c->opseq % SHM_RING];
  if (atomic_load_explicit(&d->opseq, memory_order_acquire) != c->opseq) return 0;
  uint64_t sig = atomic_load_explicit(&d->sig, memory_order_relaxed);
  uint64_t count = atomic_load_explicit(&d->count, memory_order_relaxed);
  if (atomic_load_explicit(&d->opseq, memory_order_acquire) != c->opseq) return 0;
  return crun__shm_check_desc(c, q, c->opseq, sig, count);
}

static _Atomic uint64_t *counter(crun__shm_comm_t *c, shm_ctr_t ctr, int q, uint64_t target) {
  if (ctr == SHM_CTR_SMALL) return &crun__shm_small_hdr(c, q, (int)(target & 1))->seq;
  return &c->ctrl[q].ctr[ctr];
}

/* Names the ranks of the wait set still short of target ("ranks 1, 2"). */
static void laggards(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target, char *buf,
                     size_t n) {
  int qs[64], k = 0; /* the text holds fewer */
  for (int q = who < 0 ? 0 : who; q < (who < 0 ? c->size : who + 1) && k < 64; q++)
    if (q != c->rank && atomic_load(counter(c, ctr, q, target)) < target) qs[k++] = q;
  crun__shm_ranks_text(c, qs, k, buf, n);
}

/* The slow checks done before each sleep: abort, dead peers, deadline. */
static int before_sleep(crun__shm_comm_t *c, shm_ctr_t ctr, int who, int q, uint64_t target,
                        uint64_t now) {
  CRUN_CHECK(crun__shm_check_abort(c));
  CRUN_CHECK(ring_check(c, q));
  if (now - c->last_live_ns >= SHM_LIVE_EVERY_NS) {
    c->last_live_ns = now;
    CRUN_CHECK(check_peers(c, ctr, who, target));
  }
  if ((double)now * 1e-9 > c->deadline) {
    char late[300];
    laggards(c, ctr, who, target, late, sizeof late);
    return crun__shm_fail(c, CRUN_ETIMEDOUT, "shm %s #%llu on %s: no data from %s after %.1f s",
                          crun__shm_kind_name(c->kind), (unsigned long long)c->label,
                          SHM_WHO(c, c->rank), late, c->op_timeout);
  }
  return 0;
}

/* Sleeps on q's bell until q posts, a slice passes, or someone aborts. */
static void sleep_on(crun__shm_comm_t *c, _Atomic uint64_t *ctr, int q, uint64_t target,
                     uint64_t now) {
  shm_ctrl_t *p = &c->ctrl[q];
  uint32_t bell = atomic_load(&p->bell);
  atomic_fetch_add(&p->sleepers, 1); /* seq_cst: pairs with the poster's store */
  if (atomic_load(ctr) < target) {
    double left = c->deadline - (double)now * 1e-9;
    uint64_t ns = left <= 0 ? 1000000 : (uint64_t)(left * 1e9) + 1000000;
    futex_sleep(&p->bell, bell, ns < SHM_SLEEP_SLICE_NS ? ns : SHM_SLEEP_SLICE_NS);
  }
  atomic_fetch_sub(&p->sleepers, 1);
}

/* Returns -1 when counter ctr of rank `who` (-1: every rank but this one)
 * has reached target, else the first rank that has not. Never blocks. */
int crun__shm_ready(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target) {
  int end = who < 0 ? c->size : who + 1;
  for (int q = who < 0 ? 0 : who; q < end; q++)
    if (q != c->rank &&
        atomic_load_explicit(counter(c, ctr, q, target), memory_order_acquire) < target)
      return q;
  return -1;
}

/* Whether a rank still short of target (among `who`, -1: all) last posted
 * from CPU `cpu`: it needs this CPU to make progress. */
static int laggard_on(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target, int cpu) {
  int end = who < 0 ? c->size : who + 1;
  for (int q = who < 0 ? 0 : who; q < end; q++)
    if (q != c->rank &&
        atomic_load_explicit(counter(c, ctr, q, target), memory_order_relaxed) < target &&
        atomic_load_explicit(&c->ctrl[q].cpu, memory_order_relaxed) == cpu)
      return 1;
  return 0;
}

/* With more ranks than cores, a direct-path wait (ENTER/DONE) whose missing
 * ranks all run on other CPUs spins instead of yielding:
 * yielding would only hand this CPU to ranks of the same op that are waiting
 * as well (each hand-off ~1 us), while the missing ones need their own CPUs.
 * Bounded by CRUN_SHM_SPIN_US; then the usual yields. Returns 1 to spin now.
 * (16 MiB all_reduce at 4 ranks on 2 cores: 12 GB/s busbw instead of 8; the
 * one-shot path's waits measured better yielding at once.) */
static int spin_for_remote(crun__shm_comm_t *c, shm_waiter_t *w, shm_ctr_t ctr, int who,
                           uint64_t target) {
  if (!c->policy_yield || (ctr != SHM_CTR_ENTER && ctr != SHM_CTR_DONE)) return 0;
  if ((w->spins & 7) == 0) {
    uint64_t now = crun_clock_ns();
    if (!w->t0) w->t0 = now;
    w->last = now;
    if ((long)(now - w->t0) >= c->spin_ns) return 0;
    int cpu = sched_getcpu();
    if (laggard_on(c, ctr, who, target, cpu)) return 0;
  }
  w->spins++;
  cpu_relax();
  return 1;
}

/* One step of backing off while rank q is short of target on ctr: a pause
 * while within the spin time (c->spin_cur, adapted by crun__shm_waited),
 * then one sched_yield per step up to the yield count (c->small_yields on
 * the one-shot path, else c->yields), then one futex sleep
 * on q's bell preceded by the slow checks. */
int crun__shm_idle(crun__shm_comm_t *c, shm_waiter_t *w, shm_ctr_t ctr, int who, int q,
                   uint64_t target) {
  crun__obs_posted(); /* a wait that is not crun__shm_wait's (the pipeline's) */
  if (spin_for_remote(c, w, ctr, who, target)) return 0;
  /* no spinning for a peer that last ran on this CPU: it needs the CPU */
  if (!w->spins && !w->t0 && !c->policy_yield)
    w->cocore = sched_getcpu() == atomic_load_explicit(&c->ctrl[q].cpu, memory_order_relaxed);
  /* one pause per call (a pause is ~40 ns to ~140 cycles: the caller re-checks
   * its condition right after), the clock every 8 calls, first after 7 pauses:
   * most one-shot waits end before it (a clock read costs 45-70 ns in a VM) */
  if (c->spin_cur > 0 && !w->cocore && (++w->spins & 7) != 0) {
    cpu_relax();
    return 0;
  }
  uint64_t now = crun_clock_ns();
  if (!w->t0) w->t0 = now;
  w->last = now;
  if (!w->cocore && (long)(now - w->t0) < c->spin_cur) {
    cpu_relax();
    return 0;
  }
  if (w->iter < (ctr >= SHM_CTR_ENTER ? c->small_yields : c->yields)) {
    w->iter++;
    sched_yield();
    return 0;
  }
  w->slept = 1;
  CRUN_CHECK(before_sleep(c, ctr, who, q, target, now));
  sleep_on(c, counter(c, ctr, q, target), q, target, now);
  return 0;
}

/* Ends a successful wait and adapts the spin time: a wait that had to yield
 * or sleep halves it (down to 2 us: other load shares the cores, and
 * spinning only delays the peer), one that ended while spinning
 * doubles it back (up to CRUN_SHM_SPIN_US). Resets the waiter. */
void crun__shm_waited(crun__shm_comm_t *c, shm_waiter_t *w) {
  /* the timeline's wait, from the clock reads the wait made anyway (short by
   * at most the 8 pauses between two reads): core/trace_int.h */
  if (crun__obs_on) crun__obs_wait_ns += w->last - w->t0;
  if (!c->policy_yield && w->spins) {
    if (w->iter || w->slept)
      c->spin_cur = c->spin_cur / 2 > 2000 ? c->spin_cur / 2 : 2000;
    else if (c->spin_cur < c->spin_ns)
      c->spin_cur = c->spin_cur * 2 < c->spin_ns ? c->spin_cur * 2 : c->spin_ns;
  }
  w->iter = 0, w->spins = 0, w->t0 = 0, w->last = 0, w->slept = 0, w->cocore = 0;
}

/* Waits until counter ctr of rank `who` (-1: every rank but this one)
 * reaches target, or fails (deadline, dead peer, abort, mismatch). */
int crun__shm_wait(crun__shm_comm_t *c, shm_ctr_t ctr, int who, uint64_t target) {
  shm_waiter_t w = {0};
  int q;
  /* this rank's data is posted: the op's start is recorded while the peers'
   * is on its way (core/trace_int.h) */
  crun__obs_posted();
  while ((q = crun__shm_ready(c, ctr, who, target)) >= 0)
    CRUN_CHECK(crun__shm_idle(c, &w, ctr, who, q, target));
  crun__shm_waited(c, &w);
  return 0;
}

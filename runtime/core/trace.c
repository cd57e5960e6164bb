/* trace.c — what a rank did: the timeline (events kept in memory, written to
 * "<CRUN_TIMELINE>.rank<R>" at exit), the flight recorder (a ring of the last
 * operations, dumped on failure or SIGUSR1) and per-group statistics. The
 * process group calls the hooks of core/trace_int.h; see crun/trace.h for
 * the contract. One lock guards everything here: the hooks hold it for a
 * few stores, never while blocking. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checked.h"
#include "core/trace_int.h"
#include "backend/backend.h"
#include "tensor/dtype_int.h"

#define OBS_DEFAULT_FLIGHT 2000
#define OBS_DEFAULT_EVENTS 200000
#define OBS_MAX_GROUPS 64
#define OBS_NAME 48

enum { EV_OP, EV_SPAN, EV_INSTANT };
enum { ST_QUEUED, ST_STARTED, ST_DONE, ST_FAILED };
static const char *state_names[] = {"queued", "started", "done", "failed"};

typedef struct {
  uint8_t type;
  int8_t kind, dt;
  int16_t group;
  int32_t peer, status;
  uint64_t seq, count, bytes, t_enq, t0, t1, wait;
  const char *algo, *cat;
  char name[OBS_NAME];
} ev_t;

typedef struct {
  uint64_t id, seq, count, bytes, t_enq, t_start, t_end, wait;
  int16_t group;
  int8_t kind, dt, state;
  int32_t peer, status;
} fr_t;

_Atomic int crun__obs_on;

/* The hooks' clock: the CPU's time stamp counter where the kernel keeps
 * time with it (clocksource "tsc": invariant and synchronized across CPUs;
 * a few ns where clock_gettime takes 20 or more), else CLOCK_MONOTONIC ns.
 * Ticks become ns through the anchor taken at configure time and a second
 * sample taken when they are written out (to_ns). */
static int g_tsc;
static uint64_t g_tsc0, g_ns0;
/* Short operations (under OBS_SHORT_NS) read the clock at their end one
 * time in OBS_SAMPLE: end_ticks below. */
#define OBS_SHORT_NS 20000.0
#define OBS_SAMPLE 8
static uint64_t g_short;
#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t ticks(void) { return g_tsc ? __rdtsc() : crun_clock_ns(); }
#else
static inline uint64_t ticks(void) { return crun_clock_ns(); }
#endif

/* Whether the kernel's clocksource is the TSC. */
static int tsc_usable(void) {
#if defined(__x86_64__)
  char b[32] = "";
  FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (f && fgets(b, sizeof b, f)) b[strcspn(b, "\n")] = 0;
  if (f) fclose(f);
  return strcmp(b, "tsc") == 0 && crun_env_int("CRUN_TRACE_TSC", 1) != 0;
#else
  return 0;
#endif
}

/* ns per tick, from the anchor to now (1 without the TSC). */
static double tick_rate(void) {
  if (!g_tsc) return 1.0;
  uint64_t t = ticks(), n = crun_clock_ns();
  return t > g_tsc0 + 1000 ? (double)(n - g_ns0) / (double)(t - g_tsc0) : 1.0;
}

/* A tick value as CLOCK_MONOTONIC ns. */
static uint64_t to_ns(uint64_t t, double rate) {
  if (!g_tsc || !t) return t;
  return g_ns0 + (uint64_t)(int64_t)((double)(int64_t)(t - g_tsc0) * rate);
}
_Thread_local uint64_t crun__obs_wait_ns;
_Thread_local const char *crun__obs_algo;

static struct {
  pthread_mutex_t mu;
  fr_t *ring;
  uint64_t nring, keep, next_id; /* ring slots (a power of two), operations a dump shows */
  ev_t *ev;
  uint64_t nev, cap, dropped;
  char *path;                 /* CRUN_TIMELINE */
  int64_t offset_ns;          /* rank 0's clock - ours */
  uint64_t rtt_ns;            /* of the sample the offset came from (0: none) */
  int rank, ngroups, flushed, armed, pipe[2];
  char groups[OBS_MAX_GROUPS][64];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .rank = -1, .pipe = {-1, -1}};

static void at_exit(void) { (void)crun_trace_flush(); }
static int g_at_exit; /* at_exit is registered */

void crun_trace_configure(int enable) {
  pthread_mutex_lock(&g.mu);
  crun__obs_on = 0;
  g_tsc = enable && tsc_usable();
  g_ns0 = crun_clock_ns();
  g_tsc0 = ticks();
  free(g.ring), free(g.ev), free(g.path);
  g.ring = NULL, g.ev = NULL, g.path = NULL;
  g.nring = g.keep = g.next_id = g.nev = g.cap = g.dropped = 0;
  long n = crun_env_int("CRUN_FLIGHT_RECORDER", OBS_DEFAULT_FLIGHT);
  if (enable && n > 0 && n <= (1l << 24)) {
    /* slots: n rounded up to a power of two, so that an entry's slot is
     * id & (slots - 1), not a division (3 per operation); a dump shows n */
    long slots = n;
    while (slots & (slots - 1)) slots += slots & -slots;
    g.ring = calloc((size_t)slots, sizeof *g.ring);
    if (g.ring) g.nring = (uint64_t)slots, g.keep = (uint64_t)n, crun__obs_on |= CRUN__OBS_FLIGHT;
  }
  const char *p = getenv("CRUN_TIMELINE");
  long cap = crun_env_int("CRUN_TIMELINE_EVENTS", OBS_DEFAULT_EVENTS);
  if (enable && p && *p && cap > 0 && cap <= (1l << 26)) {
    g.path = strdup(p);
    g.ev = malloc((size_t)cap * sizeof *g.ev); /* pages are touched as events come */
    if (g.path && g.ev) {
      g.cap = (uint64_t)cap;
      crun__obs_on |= CRUN__OBS_TIMELINE;
      if (!g_at_exit) g_at_exit = atexit(at_exit) == 0;
    }
  }
  pthread_mutex_unlock(&g.mu);
}

int crun_trace_start(const char *path) {
  if (!path) {
    pthread_mutex_lock(&g.mu);
    crun__obs_on &= ~CRUN__OBS_TIMELINE;
    free(g.path), free(g.ev);
    g.path = NULL, g.ev = NULL, g.nev = g.cap = g.dropped = 0;
    pthread_mutex_unlock(&g.mu);
    return 0;
  }
  if (!*path) return crun_error(CRUN_EINVAL, "trace_start: a file name is required");
  char *p = strdup(path);
  if (!p) return crun_error(CRUN_ENOMEM, "trace_start");
  pthread_mutex_lock(&g.mu);
  free(g.path);
  g.path = p;
  if (!g.ev) {
    long cap = crun_env_int("CRUN_TIMELINE_EVENTS", OBS_DEFAULT_EVENTS);
    if (cap <= 0 || cap > (1l << 26)) cap = OBS_DEFAULT_EVENTS;
    g.ev = malloc((size_t)cap * sizeof *g.ev);
    g.cap = g.ev ? (uint64_t)cap : 0;
  }
  if (g.ev && !g_at_exit) g_at_exit = atexit(at_exit) == 0;
  if (g.ev) crun__obs_on |= CRUN__OBS_TIMELINE;
  pthread_mutex_unlock(&g.mu);
  return g.ev ? 0 : crun_error(CRUN_ENOMEM, "trace_start: the timeline's event buffer");
}

int crun_trace_mode(int mode) {
  pthread_mutex_lock(&g.mu);
  int prev = crun__obs_on;
  if (mode >= 0)
    crun__obs_on = (mode & CRUN_TRACE_FLIGHT && g.ring ? CRUN__OBS_FLIGHT : 0) |
                   (mode & CRUN_TRACE_TIMELINE && g.ev ? CRUN__OBS_TIMELINE : 0);
  pthread_mutex_unlock(&g.mu);
  return prev;
}

/* Reads the environment once, when the library loads: nothing is started
 * here (the launcher links this library too and forks workers). */
__attribute__((constructor)) static void obs_init(void) { crun_trace_configure(1); }

/* Returns the 1-based index of pg's name in the group table (lock held). */
static int group_locked(crun_pg_t *pg) {
  if (pg->obs_group) return pg->obs_group;
  if (g.rank < 0) g.rank = pg->global[pg->rank];
  int i = g.ngroups < OBS_MAX_GROUPS ? g.ngroups++ : OBS_MAX_GROUPS - 1;
  snprintf(g.groups[i], sizeof g.groups[i], "%s", i == OBS_MAX_GROUPS - 1 ? "others" : pg->prefix);
  for (char *s = g.groups[i]; *s; s++)
    if (*s == ' ' || *s == '\t' || *s == '\n') *s = '_';
  __atomic_store_n(&pg->obs_group, i + 1, __ATOMIC_RELEASE);
  return i + 1;
}

/* pg's group index; the lock only the first time. */
static int group_of(crun_pg_t *pg) {
  int grp = __atomic_load_n(&pg->obs_group, __ATOMIC_ACQUIRE);
  if (grp) return grp;
  pthread_mutex_lock(&g.mu);
  grp = group_locked(pg);
  pthread_mutex_unlock(&g.mu);
  return grp;
}

/* Bytes of this rank's input: count x element size (all_to_all: the sum
 * of what it sends). */
static uint64_t op_bytes(const crun__coll_t *c) {
  size_t b;
  if (crun__mul_size(c->count, crun__dtype_size(c->dt), &b)) return UINT64_MAX;
  return b;
}

static int op_peer(const crun__coll_t *c) {
  if (c->kind == CRUN__COLL_RECV && c->src_out >= 0) return c->src_out;
  return c->kind == CRUN__COLL_ALL_REDUCE || c->kind == CRUN__COLL_ALL_GATHER || c->kind == CRUN__COLL_BARRIER ||
                 c->kind == CRUN__COLL_REDUCE_SCATTER || c->kind == CRUN__COLL_ALL_TO_ALL
             ? -1
             : c->root;
}

/* The ring entry of id, or NULL once a newer operation took its slot. The
 * hooks write entries without the lock (each entry has one writer at a
 * time); a dump taken meanwhile may show an entry half updated. Every field
 * is written and read with relaxed atomics (plain moves on x86-64), so that
 * a dump beside a running operation is no data race (ThreadSanitizer
 * reported write_ring_locked against crun__obs_start). */
#define FR_SET(e, f, v) __atomic_store_n(&(e)->f, (v), __ATOMIC_RELAXED)
#define FR_GET(e, f) __atomic_load_n(&(e)->f, __ATOMIC_RELAXED)
static fr_t *entry(uint64_t id) {
  if (!id || !g.nring) return NULL;
  fr_t *e = &g.ring[id & (g.nring - 1)];
  return __atomic_load_n(&e->id, __ATOMIC_RELAXED) == id ? e : NULL;
}

_Thread_local crun_work_t *crun__obs_held;

/* Writes the entry of w: queued, or (!queued) started now. */
static void record(crun_pg_t *pg, crun_work_t *w, int queued) {
  uint64_t now = ticks();
  w->obs.t_enq = now;
  if (!queued) w->obs.t_start = now;
  int grp = group_of(pg);
  if (!(crun__obs_on & CRUN__OBS_FLIGHT) || !g.nring) return;
  uint64_t id = __atomic_add_fetch(&g.next_id, 1, __ATOMIC_RELAXED);
  fr_t *e = &g.ring[id & (g.nring - 1)];
  __atomic_store_n(&e->id, 0, __ATOMIC_RELAXED);
  FR_SET(e, seq, w->c.seq), FR_SET(e, count, w->c.count), FR_SET(e, bytes, op_bytes(&w->c));
  FR_SET(e, t_enq, now), FR_SET(e, t_start, w->obs.t_start), FR_SET(e, t_end, 0), FR_SET(e, wait, 0);
  FR_SET(e, group, (int16_t)grp), FR_SET(e, kind, (int8_t)w->c.kind), FR_SET(e, dt, (int8_t)w->c.dt);
  FR_SET(e, state, (int8_t)(queued ? ST_QUEUED : ST_STARTED)), FR_SET(e, peer, op_peer(&w->c)), FR_SET(e, status, 0);
  __atomic_store_n(&e->id, id, __ATOMIC_RELEASE);
  w->obs.id = id;
}

/* A work that runs inline is held (trace_int.h): its entry is written once,
 * as started, by crun__obs_write_held, and crun__obs_start does nothing. */
void crun__obs_enqueue(crun_pg_t *pg, crun_work_t *w, int queued) {
  if (queued) {
    record(pg, w, 1);
    return;
  }
  crun__obs_posted(); /* an inline work inside another one's run: the outer one first */
  crun__obs_algo = pg->be ? pg->be->name : "?";
  w->obs.wait0 = crun__obs_wait_ns;
  crun__obs_held = w;
}

void crun__obs_write_held(void) {
  crun_work_t *w = crun__obs_held;
  crun__obs_held = NULL;
  record(w->pg, w, 0);
}

void crun__obs_start(crun_pg_t *pg, crun_work_t *w) {
  if (w->obs.t_start || w == crun__obs_held) return; /* inline: held, or written */
  crun__obs_algo = pg->be ? pg->be->name : "?";
  w->obs.wait0 = crun__obs_wait_ns;
  w->obs.t_start = ticks();
  if (!w->obs.t_enq) w->obs.t_enq = w->obs.t_start;
  fr_t *e = entry(w->obs.id);
  if (e) FR_SET(e, seq, w->c.seq), FR_SET(e, t_start, w->obs.t_start), FR_SET(e, t_enq, w->obs.t_enq),
         FR_SET(e, state, (int8_t)ST_STARTED); /* a queued collective is numbered when it starts */
}

/* Appends an event when there is room; counts it dropped otherwise (lock held). */
static ev_t *event_locked(void) {
  if (g.nev < g.cap) return &g.ev[g.nev++];
  g.dropped++;
  return NULL;
}

/* Adds to a counter that crun_pg_stats reads (and resets) from another
 * thread. A collective ends on the thread that holds the group's busy flag,
 * one at a time, so a relaxed load and store suffice there, with no locked
 * instruction (a reset that races with an end may lose that one end); a
 * send or receive may also end in the background on the transport's pump
 * thread while another one ends on the busy holder: those add atomically. */
static void stat_add(uint64_t *v, uint64_t d, int p2p) {
  if (p2p) __atomic_fetch_add(v, d, __ATOMIC_RELAXED);
  else __atomic_store_n(v, __atomic_load_n(v, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

/* Ticks in OBS_SHORT_NS (set on first use, once the tick rate is known). */
static uint64_t short_ticks(void) {
  uint64_t t = __atomic_load_n(&g_short, __ATOMIC_RELAXED);
  if (t) return t;
  double rate = tick_rate(); /* 1.0 with the TSC: too early to know; ask again next time */
  t = (uint64_t)(OBS_SHORT_NS / rate) + 1;
  if (!g_tsc || rate != 1.0) __atomic_store_n(&g_short, t, __ATOMIC_RELAXED);
  return t;
}

/* Whether an operation that moved `bytes` and did not wait may end at its
 * estimate (end_ticks): it moved as many as the group's last exact one-shot
 * operation of its kind, which was short, and the clock was read within the
 * last OBS_SAMPLE of them. */
static int estimable(const crun__obs_stat_t *s, uint64_t bytes) {
  return s->est && bytes == s->est_bytes && s->est < short_ticks() && s->skip + 1 < OBS_SAMPLE;
}

/* The end of an operation that started at t0, waited `wait` ns and moved
 * `bytes`, run by the shared-memory engine's one-shot path: the clock one
 * time in OBS_SAMPLE; else, when it did not wait and the group's last exact
 * one-shot operation of this kind moved as many bytes and took less than
 * OBS_SHORT_NS (s->est), t0 + s->est. A clock read is ~20 ns here (rdtsc is
 * microcoded; in a VM as much again) against ~250 ns for a 2-rank 8-byte
 * all_reduce, and it sits between this rank's result and its next post,
 * which its peers wait for. Only one-shot operations are estimated: their
 * engine counts every wait, and they are short (up to 32 KiB). Called by the
 * thread that ran the operation, which holds the group's busy flag: one at a
 * time per group. */
static uint64_t end_ticks(crun__obs_stat_t *s, uint64_t t0, uint64_t wait, uint64_t bytes) {
  if (!wait && estimable(s, bytes)) {
    s->skip++;
    return t0 + s->est;
  }
  uint64_t t1 = ticks();
  if (t1 > t0) s->est = t1 - t0, s->est_bytes = bytes, s->skip = 0;
  return t1;
}

_Thread_local int crun__obs_oneshot;

void crun__obs_end(crun_pg_t *pg, crun_work_t *w, int rc, int same_thread) {
  crun__coll_t *c = &w->c;
  /* The commonest end, a one-shot collective that ran on this thread,
   * passed without waiting and ends at its estimate (end_ticks), the timeline
   * off: the entry's end and the counters alone, ~60 instructions where the
   * general path below takes ~160, between this rank's result and its next
   * post. */
  if (crun__obs_oneshot && same_thread && rc >= 0 && w->obs.t_start && (unsigned)c->kind < CRUN__COLL_COUNT &&
      crun__obs_wait_ns == w->obs.wait0 && !(crun__obs_on & CRUN__OBS_TIMELINE)) {
    crun__obs_stat_t *s = &pg->obs_stats[c->kind];
    uint64_t bytes = op_bytes(c);
    if (estimable(s, bytes)) {
      s->skip++;
      crun__obs_oneshot = 0;
      fr_t *e = entry(w->obs.id);
      if (e) {
        FR_SET(e, t_end, w->obs.t_start + s->est), FR_SET(e, wait, 0), FR_SET(e, status, 0);
        FR_SET(e, state, (int8_t)ST_DONE);
      }
      stat_add(&s->ops, 1, 0), stat_add(&s->bytes, bytes, 0), stat_add(&s->time_ns, s->est, 0);
      return;
    }
  }
  uint64_t wait = same_thread && w->obs.t_start ? crun__obs_wait_ns - w->obs.wait0 : 0;
  int known = c->kind >= 0 && c->kind < CRUN__COLL_COUNT, oneshot = crun__obs_oneshot;
  crun__obs_oneshot = 0;
  uint64_t bytes = op_bytes(c);
  uint64_t t1 = known && oneshot && same_thread && w->obs.t_start && rc >= 0 && !(crun__obs_on & CRUN__OBS_TIMELINE)
                    ? end_ticks(&pg->obs_stats[c->kind], w->obs.t_start, wait, bytes)
                    : ticks();
  uint64_t t0 = w->obs.t_start ? w->obs.t_start : t1;
  const char *algo = same_thread ? crun__obs_algo : (pg->be ? pg->be->name : "?");
  fr_t *e = entry(w->obs.id);
  if (e) {
    FR_SET(e, t_end, t1), FR_SET(e, wait, wait), FR_SET(e, status, rc < 0 ? rc : 0);
    if (c->kind == CRUN__COLL_RECV) FR_SET(e, peer, op_peer(c)); /* the sender found: any other was written at the start */
    FR_SET(e, state, (int8_t)(rc < 0 ? ST_FAILED : ST_DONE));
  }
  if (known) {
    crun__obs_stat_t *s = &pg->obs_stats[c->kind];
    int p2p = c->kind == CRUN__COLL_SEND || c->kind == CRUN__COLL_RECV;
    stat_add(&s->ops, 1, p2p), stat_add(&s->bytes, bytes, p2p), stat_add(&s->time_ns, t1 - t0, p2p),
        stat_add(&s->wait_ns, wait, p2p);
  }
  if (!(crun__obs_on & CRUN__OBS_TIMELINE)) return;
  int grp = group_of(pg);
  pthread_mutex_lock(&g.mu);
  ev_t *ev = event_locked();
  if (ev)
    *ev = (ev_t){.type = EV_OP, .kind = (int8_t)c->kind, .dt = (int8_t)c->dt, .group = (int16_t)grp,
                 .peer = op_peer(c), .status = rc < 0 ? rc : 0, .seq = c->seq, .count = c->count,
                 .bytes = bytes, .t_enq = w->obs.t_enq ? w->obs.t_enq : t0, .t0 = t0, .t1 = t1,
                 .wait = wait, .algo = algo ? algo : "?"};
  pthread_mutex_unlock(&g.mu);
}

/* ---------------------------------------------------------------- timeline */

int crun_trace_enabled(void) { return (crun__obs_on & CRUN__OBS_TIMELINE) != 0; }

static void put_event(int type, const char *name, const char *cat, uint64_t t0, uint64_t t1) {
  if (!(crun__obs_on & CRUN__OBS_TIMELINE)) return;
  pthread_mutex_lock(&g.mu);
  ev_t *ev = event_locked();
  if (ev) {
    *ev = (ev_t){.type = (uint8_t)type, .t0 = t0, .t1 = t1, .cat = cat ? cat : "span"};
    snprintf(ev->name, sizeof ev->name, "%s", name ? name : "?");
    for (char *s = ev->name; *s; s++)
      if (*s == '\t' || *s == '\n') *s = ' ';
  }
  pthread_mutex_unlock(&g.mu);
}

void crun_trace_span(const char *name, const char *cat, uint64_t t0_ns, uint64_t t1_ns) {
  put_event(EV_SPAN, name, cat, t0_ns, t1_ns < t0_ns ? t0_ns : t1_ns);
}

void crun_trace_instant(const char *name, const char *cat, uint64_t t_ns) {
  put_event(EV_INSTANT, name, cat, t_ns, t_ns);
}

/* One ping-pong with rank 0 for round k: sets ping, gets pong (rank 0's
 * clock), returns the round trip and the offset sample. */
static int align_round(crun_store_t *st, const char *tag, int rank, int k, uint64_t *rtt, int64_t *off) {
  char key[160], val[32];
  crun_buf_t b = {0};
  snprintf(key, sizeof key, "crun/trace_align/%s/%d/%d/ping", tag, rank, k);
  uint64_t t1 = crun_clock_ns();
  CRUN_CHECK(crun_store_set(st, key, "1", 1));
  snprintf(key, sizeof key, "crun/trace_align/%s/%d/%d/pong", tag, rank, k);
  CRUN_CHECK(crun_store_get(st, key, &b));
  uint64_t t2 = crun_clock_ns();
  snprintf(val, sizeof val, "%.*s", (int)(b.len < 31 ? b.len : 31), (const char *)b.data);
  crun_buf_free(&b);
  uint64_t t0 = strtoull(val, NULL, 10);
  *rtt = t2 - t1;
  *off = (int64_t)(t0 - (t1 + (t2 - t1) / 2));
  return 0;
}

/* Rank 0: answers every other rank's pings, one rank at a time. */
static int align_serve(crun_store_t *st, const char *tag, int size, int rounds) {
  char key[160], val[32];
  for (int r = 1; r < size; r++)
    for (int k = 0; k < rounds; k++) {
      crun_buf_t b = {0};
      snprintf(key, sizeof key, "crun/trace_align/%s/%d/%d/ping", tag, r, k);
      CRUN_CHECK(crun_store_get(st, key, &b));
      crun_buf_free(&b);
      snprintf(key, sizeof key, "crun/trace_align/%s/%d/%d/pong", tag, r, k);
      int n = snprintf(val, sizeof val, "%llu", (unsigned long long)crun_clock_ns());
      CRUN_CHECK(crun_store_set(st, key, val, (size_t)n));
    }
  return 0;
}

int crun_trace_align(crun_store_t *store, const char *tag, int rank, int size, double timeout) {
  enum { ROUNDS = 8 };
  if (!(crun_trace_enabled())) return 0;
  if (!store || size < 1 || rank < 0 || rank >= size) return crun_error(CRUN_EINVAL, "trace_align: bad arguments");
  double old = crun_store_get_timeout(store);
  crun_store_set_timeout(store, timeout > 0 ? timeout : old);
  int rc = 0;
  uint64_t best = UINT64_MAX;
  int64_t best_off = 0;
  if (rank == 0) rc = align_serve(store, tag ? tag : "0", size, ROUNDS);
  for (int k = 0; rank > 0 && k < ROUNDS && rc == 0; k++) {
    uint64_t rtt;
    int64_t off;
    rc = align_round(store, tag ? tag : "0", rank, k, &rtt, &off);
    if (rc == 0 && rtt < best) best = rtt, best_off = off;
  }
  crun_store_set_timeout(store, old);
  if (rc < 0) return rc;
  pthread_mutex_lock(&g.mu);
  g.offset_ns = rank == 0 ? 0 : best_off;
  g.rtt_ns = rank == 0 ? 1 : best;
  g.rank = rank;
  pthread_mutex_unlock(&g.mu);
  return 0;
}

static const char *dt_name(int dt) { return dt >= 0 && dt < CRUN_DTYPE_COUNT ? crun_dtype_name((crun_dtype_t)dt) : "?"; }

/* Writes one event line (tab-separated; a span's name last: it may hold
 * spaces); an operation's times are ticks, made ns with rate. */
static void write_event(FILE *f, const ev_t *e, double rate) {
  if (e->type == EV_OP)
    fprintf(f, "O\t%s\t%d\t%llu\t%llu\t%llu\t%s\t%s\t%d\t%d\t%llu\t%llu\t%llu\t%llu\n", crun__coll_name(e->kind),
            e->group, (unsigned long long)e->seq, (unsigned long long)e->count, (unsigned long long)e->bytes,
            dt_name(e->dt), e->algo, e->peer, e->status, (unsigned long long)to_ns(e->t_enq, rate),
            (unsigned long long)to_ns(e->t0, rate), (unsigned long long)to_ns(e->t1, rate), (unsigned long long)e->wait);
  else
    fprintf(f, "%c\t%s\t%llu\t%llu\t%s\n", e->type == EV_SPAN ? 'S' : 'I', e->cat, (unsigned long long)e->t0,
            (unsigned long long)e->t1, e->name);
}

int crun_trace_flush(void) {
  pthread_mutex_lock(&g.mu);
  if (!g.ev || !g.path) {
    pthread_mutex_unlock(&g.mu);
    return 0;
  }
  int rank = g.rank >= 0 ? g.rank : (int)crun_env_int("RANK", 0);
  char file[PATH_MAX];
  snprintf(file, sizeof file, "%s.rank%d", g.path, rank);
  FILE *f = fopen(file, "w");
  int rc = 0;
  if (!f) {
    rc = crun_error(CRUN_EIO, "timeline of rank %d: cannot write %s: %s", rank, file, strerror(errno));
    goto out;
  }
  fprintf(f, "# crun-timeline 1\nP\t%d\t%d\t%lld\t%llu\t%llu\n", rank, (int)getpid(), (long long)g.offset_ns,
          (unsigned long long)g.rtt_ns, (unsigned long long)g.dropped);
  for (int i = 0; i < g.ngroups; i++) fprintf(f, "G\t%d\t%s\n", i + 1, g.groups[i]);
  double rate = tick_rate();
  for (uint64_t i = 0; i < g.nev; i++) write_event(f, &g.ev[i], rate);
  if (fclose(f) != 0) rc = crun_error(CRUN_EIO, "timeline of rank %d: writing %s failed", rank, file);
  g.flushed = 1;
out:
  pthread_mutex_unlock(&g.mu);
  return rc;
}

/* ---------------------------------------------------------------- flight recorder */

/* Creates dir and its missing parents (errors show when the file is opened). */
static void make_dirs(const char *dir) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0777);
      *s = '/';
    }
  mkdir(p, 0777);
}

/* The job this process belongs to when no crun-lua chose a dump directory:
 * mpirun's PMIx namespace, Slurm's job and step, else its parent process
 * (what a job's ranks on one host share). Only [A-Za-z0-9._-] kept. */
static void job_key(char *out, size_t cap) {
  const char *ns = getenv("PMIX_NAMESPACE"), *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  char raw[160];
  if (ns && *ns) snprintf(raw, sizeof raw, "mpi-%s", ns);
  else if (job && *job) snprintf(raw, sizeof raw, "slurm-%s.%s", job, step && *step ? step : "0");
  else snprintf(raw, sizeof raw, "ppid-%d", (int)getppid());
  size_t n = 0;
  for (const char *c = raw; *c && n + 1 < cap; c++)
    out[n++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
                       *c == '_' || *c == '-'
                   ? *c
                   : '_';
  out[n] = 0;
}

/* Whether path is a directory of this user's, not a link, that only this
 * user may write (a neighbour's or a shared one would hand them the dump). */
static int own_private_dir(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022);
}

/* CRUN_FLIGHT_DIR/flight_rank<rank>.txt (crun-lua sets it per job). Without
 * it, $TMPDIR/crun-flight-<uid>-<job>/ (mode 0700; job_key): ranks started
 * by mpirun or srun, or two such jobs at once, no longer write the same
 * $TMPDIR/flight_rank<r>.txt. A directory of that name that is not this
 * user's private one is not used: the dump then goes to a fresh one
 * (mkdtemp). */
static void dump_path(char *out, size_t cap, int rank) {
  const char *dir = getenv("CRUN_FLIGHT_DIR");
  if (dir && *dir) {
    make_dirs(dir);
    snprintf(out, cap, "%s/flight_rank%d.txt", dir, rank);
    return;
  }
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  make_dirs(tmp);
  char key[128], d[PATH_MAX - 32]; /* room for "/flight_rank<r>.txt" in out */
  job_key(key, sizeof key);
  snprintf(d, sizeof d, "%s/crun-flight-%d-%s", tmp, (int)geteuid(), key);
  if (mkdir(d, 0700) != 0 && !own_private_dir(d)) {
    snprintf(d, sizeof d, "%s/crun-flight-%d-%s-XXXXXX", tmp, (int)geteuid(), key);
    if (!mkdtemp(d)) snprintf(d, sizeof d, "%s", tmp); /* the open below names the problem */
  }
  snprintf(out, cap, "%s/flight_rank%d.txt", d, rank);
}

/* Writes the ring oldest first (lock held). */
static void write_ring_locked(FILE *f) {
  double rate = tick_rate();
  uint64_t last = __atomic_load_n(&g.next_id, __ATOMIC_RELAXED);
  uint64_t first = last >= g.keep ? last - g.keep + 1 : 1;
  for (uint64_t id = first; id && id <= last; id++) {
    fr_t *r = &g.ring[id & (g.nring - 1)];
    if (__atomic_load_n(&r->id, __ATOMIC_ACQUIRE) != id) continue;
    const fr_t copy = {.id = id, .seq = FR_GET(r, seq), .count = FR_GET(r, count), .bytes = FR_GET(r, bytes),
                       .t_enq = FR_GET(r, t_enq), .t_start = FR_GET(r, t_start), .t_end = FR_GET(r, t_end),
                       .wait = FR_GET(r, wait), .group = FR_GET(r, group), .kind = FR_GET(r, kind),
                       .dt = FR_GET(r, dt), .state = FR_GET(r, state), .peer = FR_GET(r, peer),
                       .status = FR_GET(r, status)}, *e = &copy;
    fprintf(f, "%llu\t%llu\t%s\t%s\t%s\t%llu\t%llu\t%s\t%d\t%d\t%llu\t%llu\t%llu\t%llu\n", (unsigned long long)e->id,
            (unsigned long long)e->seq, e->group > 0 ? g.groups[e->group - 1] : "?", crun__coll_name(e->kind),
            dt_name(e->dt), (unsigned long long)e->count, (unsigned long long)e->bytes, state_names[e->state],
            e->peer, e->status, (unsigned long long)to_ns(e->t_enq, rate), (unsigned long long)to_ns(e->t_start, rate),
            (unsigned long long)to_ns(e->t_end, rate), (unsigned long long)e->wait);
  }
}

int crun_flight_dump(const char *reason, char *path, size_t cap) {
  if (!(crun__obs_on & CRUN__OBS_FLIGHT)) return crun_error(CRUN_ESTATE, "flight recorder is off (CRUN_FLIGHT_RECORDER=0)");
  char file[PATH_MAX], tmp[PATH_MAX + 8], why[256];
  snprintf(why, sizeof why, "%s", reason ? reason : "request");
  for (char *s = why; *s; s++)
    if (*s == '\n' || *s == '\t') *s = ' ';
  pthread_mutex_lock(&g.mu);
  int rank = g.rank >= 0 ? g.rank : (int)crun_env_int("RANK", 0);
  dump_path(file, sizeof file, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp", file);
  /* never through a symlink planted at the temporary's name */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (fd >= 0 && !f) close(fd);
  int rc = 0;
  if (f) {
    fprintf(f, "# crun-flight 1\nR\t%d\t%d\t%llu\t%llu\t%s\n", rank, (int)getpid(), (unsigned long long)crun_clock_ns(),
            (unsigned long long)g.keep, why);
    write_ring_locked(f);
    rc = fclose(f) == 0 && rename(tmp, file) == 0 ? 0 : -1;
  }
  pthread_mutex_unlock(&g.mu);
  if (!f || rc < 0) return crun_error(CRUN_EIO, "flight recorder of rank %d: cannot write %s: %s", rank, file, strerror(errno));
  if (path) snprintf(path, cap, "%s", file);
  return 0;
}

void crun__obs_failed(crun_pg_t *pg, int rc, const char *text) {
  if (!(crun__obs_on & CRUN__OBS_FLIGHT)) return;
  pthread_mutex_lock(&g.mu);
  group_locked(pg);
  pthread_mutex_unlock(&g.mu);
  char why[200], path[PATH_MAX];
  snprintf(why, sizeof why, "%s", text ? text : crun_err_name(rc));
  if (crun_flight_dump(why, path, sizeof path) == 0)
    CRUN_LOG(WARN, PG, "flight recorder written to %s", path);
}

static void on_usr1(int sig) {
  (void)sig;
  int e = errno;
  char b = 1;
  if (g.pipe[1] >= 0 && write(g.pipe[1], &b, 1) < 0) {} /* full: a dump is due anyway */
  errno = e;
}

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer runs an asynchronous signal's handler only when the thread
 * it reached next enters a libc function that TSan intercepts (here even
 * when that thread sits in read()). A worker whose main thread waits where
 * TSan cannot see it (inside glibc's system(): os.execute("sleep 30")) ran
 * on_usr1 only when the call returned, so the launcher, which asks every
 * worker for its recorder when a rank fails, waited out its 10 s for dumps
 * before stopping the job. In TSan builds no handler is involved: the arming
 * thread blocks SIGUSR1 (threads it starts later inherit that, and so do
 * the processes the worker starts) and the dump thread takes it with
 * sigwaitinfo. Returns 0 for a request, -1 when there will be none. */
#define FLIGHT_SIGWAIT 1
static int wait_request(void) {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  while (sigwaitinfo(&usr1, NULL) < 0)
    if (errno != EINTR) return -1;
  return 0;
}
#else
/* Waits for on_usr1's byte on the pipe: 0 for a request, -1 for none more. */
#define FLIGHT_SIGWAIT 0
static int wait_request(void) {
  char b[16];
  for (;;) {
    ssize_t n = read(g.pipe[0], b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    return n > 0 ? 0 : -1;
  }
}
#endif

static void *dump_main(void *arg) {
  (void)arg;
  while (wait_request() == 0)
    if (crun_flight_dump("SIGUSR1", NULL, 0) < 0) CRUN_LOG(WARN, PG, "%s", crun_last_error());
  return NULL;
}

int crun_flight_arm(void) {
  if (!(crun__obs_on & CRUN__OBS_FLIGHT)) return 0;
  pthread_mutex_lock(&g.mu);
  int rc = 0;
  if (g.armed) goto out;
  struct sigaction old;
  if (sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) goto out;
  if (pipe2(g.pipe, O_CLOEXEC) < 0) { /* not inherited by what a script runs */
    rc = crun_error(CRUN_ESYS, "flight recorder: pipe: %s", strerror(errno));
    goto out;
  }
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  sigset_t all, prev;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &prev); /* the thread takes no signals */
  int e = pthread_create(&t, &a, dump_main, NULL);
  if (e == 0 && FLIGHT_SIGWAIT) sigaddset(&prev, SIGUSR1); /* the dump thread takes it */
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  pthread_attr_destroy(&a);
  if (e != 0) {
    close(g.pipe[0]), close(g.pipe[1]);
    g.pipe[0] = g.pipe[1] = -1;
    rc = crun_error(CRUN_ESYS, "flight recorder: cannot start its thread");
    goto out;
  }
  struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL);
  g.armed = 1;
out:
  pthread_mutex_unlock(&g.mu);
  return rc;
}

/* ---------------------------------------------------------------- statistics */

const char *crun_pg_stat_name(int i) { return i >= 0 && i < CRUN__COLL_COUNT ? crun__coll_name(i) : NULL; }

int crun_pg_stats(crun_pg_t *pg, crun_pg_stat_t *out, int reset) {
  if (!pg || !out) return crun_error(CRUN_EINVAL, "pg_stats: group and out are required");
  if (!crun__obs_on)
    return crun_error(CRUN_ESTATE, "pg_stats on %s: statistics need the flight recorder or the timeline "
                      "(CRUN_FLIGHT_RECORDER=0 and no CRUN_TIMELINE)", CRUN__WHO(pg, pg->rank));
  double rate = tick_rate();
  for (int i = 0; i < CRUN__COLL_COUNT && i < CRUN_PG_STAT_OPS; i++) {
    crun__obs_stat_t *s = &pg->obs_stats[i];
    uint64_t v[4] = {s->ops, s->bytes, s->time_ns, s->wait_ns}, *p[4] = {&s->ops, &s->bytes, &s->time_ns, &s->wait_ns};
    for (int k = 0; k < 4; k++) v[k] = reset ? __atomic_exchange_n(p[k], 0, __ATOMIC_RELAXED) : __atomic_load_n(p[k], __ATOMIC_RELAXED);
    out[i] = (crun_pg_stat_t){v[0], v[1], (double)v[2] * rate * 1e-9, (double)v[3] * 1e-9};
  }
  return 0;
}

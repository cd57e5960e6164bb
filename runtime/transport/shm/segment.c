/* segment.c — creating, attaching and unlinking the shared segment of a
 * communicator, and the per-process set-up (peer pidfds, waiting policy). */
#include "transport/shm/shm_int.h"

#include "core/checked.h"
#include "core/heap.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* v rounded up to a multiple of a into *out; non-zero on overflow. */
static int round_up_ok(size_t v, size_t a, size_t *out) {
  if (crun__add_size(v, a - 1, out)) return 1;
  *out = *out / a * a;
  return 0;
}

/* The geometry a segment's header describes: rank 0's own choice, or an
 * attaching rank's one copy of the header (read once, then only the copy is
 * used: the header lives in memory another process writes). */
typedef struct { uint32_t size, nbuf; uint64_t total, small_bytes, chunk; } shm_geom_t;

/* Offsets of the parts of a segment for the given layout. */
typedef struct { size_t pids, ctrl, small, large, total; } shm_layout_t;

/* The layout of g into *l; non-zero when a size or offset overflows size_t
 * (the header's numbers may be anything). */
static int layout_of(const shm_geom_t *g, shm_layout_t *l) {
  size_t n = g->size, t;
  l->pids = round_up(sizeof(shm_header_t), SHM_LINE);
  if (crun__mul_size(sizeof(int32_t), n, &t) || crun__add_size(l->pids, t, &t) ||
      round_up_ok(t, SHM_LINE, &l->ctrl))
    return 1;
  if (crun__mul_size(sizeof(shm_ctrl_t), n, &t) || crun__add_size(l->ctrl, t, &l->small)) return 1;
  if (crun__add_size(SHM_LINE, g->small_bytes, &t) || crun__mul_size(t, 2 * n, &t) ||
      crun__add_size(l->small, t, &t) || round_up_ok(t, 4096, &l->large))
    return 1;
  if (crun__mul_size(g->chunk, g->nbuf, &t) || crun__mul_size(t, n, &t) ||
      crun__add_size(l->large, t, &l->total))
    return 1;
  return 0;
}

/* Points the communicator's fields at the parts of its mapped segment, from
 * the checked geometry g and its layout l (never from the shared header). */
static void bind_layout(crun__shm_comm_t *c, const shm_geom_t *g, const shm_layout_t *l) {
  c->hdr = c->base;
  c->pids = (int32_t *)(void *)((char *)c->base + l->pids);
  c->ctrl = (shm_ctrl_t *)(void *)((char *)c->base + l->ctrl);
  c->small = (char *)c->base + l->small;
  c->small_bytes = g->small_bytes;
  c->small_stride = SHM_LINE + g->small_bytes;
  c->large = (char *)c->base + l->large;
  c->chunk = g->chunk;
  c->nbuf = (int)g->nbuf;
}

/* The bounds rank 0 keeps the segment's sizes in (an attaching rank refuses
 * a header outside them). */
#define SHM_SMALL_MAX ((size_t)64 << 20)
#define SHM_CHUNK_MAX ((size_t)256 << 20)
#define SHM_NBUF_MIN 2
#define SHM_NBUF_MAX 16

/* Rank 0: creates and sizes a fresh segment, fills its header, maps it. */
static int segment_create(crun__shm_comm_t *c) {
  long small_env = crun_env_int("CRUN_SHM_SMALL", 32768);
  long chunk_env = crun_env_int("CRUN_SHM_CHUNK", 512 * 1024);
  size_t small = round_up((size_t)(small_env >= 0 ? small_env : 32768), SHM_LINE);
  size_t chunk = (size_t)(chunk_env > 0 ? chunk_env : 512 * 1024);
  long nbuf = crun_env_int("CRUN_SHM_NBUF", 3);
  if (small > SHM_SMALL_MAX) small = SHM_SMALL_MAX;
  if (small < 8 * (size_t)c->size) small = 8 * (size_t)c->size; /* all_to_all_v counts */
  if (chunk < 256 * (size_t)c->size) chunk = 256 * (size_t)c->size;
  if (chunk > SHM_CHUNK_MAX) chunk = SHM_CHUNK_MAX;
  chunk = round_up(chunk, 4096);
  if (nbuf < SHM_NBUF_MIN) nbuf = SHM_NBUF_MIN;
  if (nbuf > SHM_NBUF_MAX) nbuf = SHM_NBUF_MAX;
  shm_geom_t g = {.size = (uint32_t)c->size, .nbuf = (uint32_t)nbuf, .small_bytes = small, .chunk = chunk};
  shm_layout_t l;
  if (layout_of(&g, &l))
    return crun_error(CRUN_EINVAL, "shm create on %s: the segment's size overflows "
                      "(lower CRUN_SHM_CHUNK or CRUN_SHM_SMALL)", SHM_WHO(c, 0));
  g.total = l.total;
  static _Atomic unsigned counter;
  snprintf(c->name, sizeof c->name, "/crun-shm-%d-%u-%08lx", (int)getpid(),
           atomic_fetch_add(&counter, 1), (unsigned long)(crun_clock_ns() & 0xffffffffu));
  int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return crun_error(CRUN_ESYS, "shm create on %s: shm_open('%s') failed: %s", SHM_WHO(c, 0), c->name,
                      strerror(errno));
  int rc = 0, err;
  /* reserve the pages now: a full /dev/shm must fail here, not as SIGBUS later */
  if ((err = posix_fallocate(fd, 0, (off_t)l.total)) != 0) {
    rc = crun_error(CRUN_ESYS, "shm create on %s: cannot reserve %zu bytes in /dev/shm "
                    "for '%s': %s (mount a larger /dev/shm, lower CRUN_SHM_CHUNK, or set "
                    "CRUN_SHM=0)", SHM_WHO(c, 0), l.total, c->name, strerror(err));
  } else {
    c->base = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED) {
      c->base = NULL;
      rc = crun_error(CRUN_ESYS, "shm create on %s: mmap of %zu bytes failed: %s", SHM_WHO(c, 0), l.total,
                      strerror(errno));
    }
  }
  close(fd);
  if (rc < 0) {
    shm_unlink(c->name);
    return rc;
  }
  c->len = l.total;
  shm_header_t *h = c->base;
  h->size = g.size;
  h->nbuf = g.nbuf;
  h->total = g.total;
  h->small_bytes = g.small_bytes;
  h->chunk = g.chunk;
  atomic_store(&h->attached, 0);
  atomic_store_explicit((_Atomic uint64_t *)&h->magic, SHM_MAGIC, memory_order_release);
  bind_layout(c, &g, &l);
  return 0;
}

/* Why geometry g (an attaching rank's copy of the header) cannot be this
 * group's segment of len bytes: NULL when it can, the layout into *l. */
static const char *geom_fault(const crun__shm_comm_t *c, const shm_geom_t *g, shm_layout_t *l) {
  if (g->nbuf < SHM_NBUF_MIN || g->nbuf > SHM_NBUF_MAX) return "buffer count out of range";
  if (g->chunk == 0 || g->chunk > SHM_CHUNK_MAX || g->chunk % 4096) return "chunk size out of range";
  if (g->small_bytes < 8 * (uint64_t)c->size || g->small_bytes > SHM_SMALL_MAX)
    return "one-shot slot size out of range";
  if (layout_of(g, l)) return "its sizes overflow";
  if (g->total != c->len || l->total != c->len) return "its sizes do not match the mapping";
  return NULL;
}

/* Copies the header's geometry out of shared memory, each field read once. */
static shm_geom_t geom_read(const crun__shm_comm_t *c) {
  const volatile shm_header_t *h = c->base;
  return (shm_geom_t){.size = h->size, .nbuf = h->nbuf, .total = h->total,
                      .small_bytes = h->small_bytes, .chunk = h->chunk};
}

/* Ranks > 0: opens the segment rank 0 published and checks its header. */
static int segment_attach(crun__shm_comm_t *c) {
  int fd = shm_open(c->name, O_RDWR, 0600);
  if (fd < 0)
    return crun_error(CRUN_ESYS, "shm attach on %s: shm_open('%s') failed: %s (stale "
                      "store key, or the prefix is shared by two communicators?)",
                      SHM_WHO(c, c->rank), c->name, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(shm_header_t)) {
    rc = crun_error(CRUN_EPROTO, "shm attach on %s: segment '%s' is too small", SHM_WHO(c, c->rank),
                    c->name);
  } else {
    c->len = (size_t)st.st_size;
    c->base = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED) {
      c->base = NULL;
      rc = crun_error(CRUN_ESYS, "shm attach on %s: mmap failed: %s", SHM_WHO(c, c->rank),
                      strerror(errno));
    }
  }
  close(fd);
  if (rc < 0) return rc;
  shm_header_t *h = c->base;
  if (atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != SHM_MAGIC)
    return crun_error(CRUN_EPROTO, "shm attach on %s: '%s' is not a crun segment",
                      SHM_WHO(c, c->rank), c->name);
  shm_geom_t g = geom_read(c);
  if ((int)g.size != c->size)
    return crun_error(CRUN_EMISMATCH, "shm attach on %s: %s created the group with "
                      "size %u, this rank was given size %d", SHM_WHO(c, c->rank), SHM_WHO(c, 0), g.size,
                      c->size);
  shm_layout_t l;
  const char *why = geom_fault(c, &g, &l);
  if (why)
    return crun_error(CRUN_EPROTO, "shm attach on %s: segment '%s' (%zu bytes) has a bad "
                      "header: %s (buffers %u x chunk %llu, one-shot %llu, total %llu)", SHM_WHO(c, c->rank),
                      c->name, c->len, why, g.nbuf, (unsigned long long)g.chunk,
                      (unsigned long long)g.small_bytes, (unsigned long long)g.total);
  bind_layout(c, &g, &l);
  return 0;
}

/* Names the ranks that have not written their pid yet into buf. */
static void missing_ranks(crun__shm_comm_t *c, char *buf, size_t n) {
  int qs[64], k = 0; /* the text holds fewer */
  for (int q = 0; q < c->size && k < 64; q++)
    if (atomic_load((_Atomic int32_t *)&c->pids[q]) == 0) qs[k++] = q;
  crun__shm_ranks_text(c, qs, k, buf, n);
}

/* Registers this rank and waits (polling) until every rank has attached.
 * The last rank to attach unlinks the segment name. */
static int attach_all(crun__shm_comm_t *c, double deadline) {
  /* the direct path needs one heap shared by every rank; CRUN_SHM_DIRECT=0
   * publishes no heap (the bounce path under the launcher, for testing) */
  c->ctrl[c->rank].heap = crun_env_int("CRUN_SHM_DIRECT", 1) ? crun__heap_id() : 0;
  if (sched_getaffinity(0, sizeof c->ctrl[c->rank].cpus, &c->ctrl[c->rank].cpus) != 0)
    CPU_ZERO(&c->ctrl[c->rank].cpus); /* unknown: pick_policy assumes one CPU */
  atomic_store((_Atomic int32_t *)&c->pids[c->rank], (int32_t)getpid());
  uint32_t n = atomic_fetch_add(&c->hdr->attached, 1) + 1;
  if (n == (uint32_t)c->size) shm_unlink(c->name);
  struct timespec nap = {0, 100000};
  while (atomic_load(&c->hdr->attached) < (uint32_t)c->size) {
    if (crun_clock() > deadline) {
      char who[256];
      missing_ranks(c, who, sizeof who);
      return crun_error(CRUN_ETIMEDOUT, "shm create on %s: %s did not attach "
                        "to the segment within the timeout", SHM_WHO(c, c->rank), who);
    }
    nanosleep(&nap, NULL);
  }
  c->direct = c->ctrl[c->rank].heap != 0;
  for (int q = 0; q < c->size; q++)
    if (c->ctrl[q].heap != c->ctrl[c->rank].heap) c->direct = 0;
  return 0;
}

/* Opens a pidfd per peer so a dead peer is seen at once, even while it is
 * an unreaped zombie (-1 when not available). */
static int open_pidfds(crun__shm_comm_t *c) {
  c->pidfd = malloc(sizeof(int) * (size_t)c->size);
  if (!c->pidfd) return crun_error(CRUN_ENOMEM, "shm create: out of memory");
  for (int q = 0; q < c->size; q++) {
    c->pidfd[q] = -1;
    if (q == c->rank) continue;
#ifdef SYS_pidfd_open
    /* a peer that already exited gets -1: waits then check it with kill() */
    c->pidfd[q] = (int)syscall(SYS_pidfd_open, (pid_t)c->pids[q], 0);
#endif
  }
  return 0;
}

/* Whether the group's ranks must share CPUs: more ranks than the CPUs their
 * affinity masks (published at attach) allow together, or two ranks pinned to
 * the same single CPU. The group's masks, not this rank's own: a rank that
 * crun-lua --cpu-bind pinned to one CPU is not oversubscribed when its peers
 * sit on the other CPUs. */
static int oversubscribed(const crun__shm_comm_t *c) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int q = 0; q < c->size; q++) {
    const cpu_set_t *m = &c->ctrl[q].cpus;
    if (CPU_COUNT(m) == 0) return c->size > 1; /* a mask we could not read */
    CPU_OR(&all, &all, m);
    for (int p = 0; p < q && CPU_COUNT(m) == 1; p++)
      if (CPU_COUNT(&c->ctrl[p].cpus) == 1 && CPU_EQUAL(&c->ctrl[p].cpus, m)) return 1;
  }
  return c->size > CPU_COUNT(&all);
}

/* Picks spin-then-futex or yield-then-futex from ranks vs. usable cores. */
static void pick_policy(crun__shm_comm_t *c) {
  c->oversub = oversubscribed(c);
  c->policy_yield = c->oversub;
  const char *w = getenv("CRUN_SHM_WAIT");
  if (w && strcmp(w, "spin") == 0) c->policy_yield = 0;
  if (w && strcmp(w, "yield") == 0) c->policy_yield = 1;
  c->spin_ns = crun_env_int("CRUN_SHM_SPIN_US", 50) * 1000;
  c->yields = crun_env_int("CRUN_SHM_YIELDS", 50);
  /* oversubscribed one-shot waits are short: a futex sleep (20-25 us to
   * wake) costs more than many yields, and yields run the awaited ranks */
  c->small_yields = crun_env_int("CRUN_SHM_YIELDS", c->oversub ? 1000 : 50);
  c->spin_cur = c->policy_yield ? 0 : c->spin_ns;
}

/* Rank 0 publishes the segment name; the others fetch it. */
static int exchange_name(crun__shm_comm_t *c, crun_store_t *store, const char *key,
                         double timeout) {
  if (c->rank == 0) return crun_store_set(store, key, c->name, strlen(c->name));
  const char *keys[1] = {key};
  int rc = crun_store_wait(store, keys, 1, timeout);
  if (rc == CRUN_ETIMEDOUT)
    return crun_error(CRUN_ETIMEDOUT, "shm create on %s: %s did not publish the "
                      "segment name under '%s' within %.1f s", SHM_WHO(c, c->rank), SHM_WHO(c, 0), key, timeout);
  CRUN_CHECK(rc);
  crun_buf_t v = {0};
  CRUN_CHECK(crun_store_get(store, key, &v));
  if (v.len > 0 && ((char *)v.data)[0] == '!') {
    crun_buf_free(&v);
    return crun_error(CRUN_EIO, "shm create on %s: %s could not create the shared "
                      "segment (see its error)", SHM_WHO(c, c->rank), SHM_WHO(c, 0));
  }
  if (v.len == 0 || v.len >= sizeof c->name || ((char *)v.data)[0] != '/') {
    crun_buf_free(&v);
    return crun_error(CRUN_EPROTO, "shm create on %s: store key '%s' does not hold a "
                      "segment name", SHM_WHO(c, c->rank), key);
  }
  memcpy(c->name, v.data, v.len);
  c->name[v.len] = 0;
  crun_buf_free(&v);
  return 0;
}

static int check_create_args(crun_store_t *store, const char *prefix, int rank, int size,
                             crun__shm_comm_t **out) {
  if (!out) return crun_error(CRUN_EINVAL, "shm create: out is NULL");
  *out = NULL;
  if (!store || !prefix) return crun_error(CRUN_EINVAL, "shm create: store or prefix is NULL");
  if (strlen(prefix) > 200) return crun_error(CRUN_EINVAL, "shm create: prefix too long");
  if (size < 1 || size > CRUN_SHM_MAX_RANKS)
    return crun_error(CRUN_EINVAL, "shm create: size %d out of range 1..%d", size,
                      CRUN_SHM_MAX_RANKS);
  if (rank < 0 || rank >= size)
    return crun_error(CRUN_EINVAL, "shm create: rank %d out of range 0..%d", rank, size - 1);
  return 0;
}

/* Runs the steps of create after argument checks; on failure the caller
 * destroys c (and rank 0 unlinks the name). */
static int create_steps(crun__shm_comm_t *c, crun_store_t *store, const char *prefix) {
  char key[256];
  snprintf(key, sizeof key, "%s/shm_name", prefix);
  double deadline = crun_clock() + c->timeout;
  if (c->rank == 0) {
    int rc = segment_create(c);
    if (rc < 0) {
      crun_store_set(store, key, "!", 1); /* so the others fail now, not at the timeout */
      return rc;
    }
  }
  CRUN_CHECK(exchange_name(c, store, key, c->timeout));
  if (c->rank != 0) CRUN_CHECK(segment_attach(c));
  CRUN_CHECK(attach_all(c, deadline));
  if (c->rank == 0) {
    shm_unlink(c->name); /* normally done by the last rank already */
    crun_store_delete_key(store, key, NULL);
  }
  CRUN_CHECK(open_pidfds(c));
  pick_policy(c);
  return 0;
}

int crun__shm_comm_create(crun_store_t *store, const char *prefix, int rank, int size,
                          double timeout, crun__shm_comm_t **out) {
  return crun__shm_comm_create_ranks(store, prefix, rank, size, NULL, timeout, out);
}

int crun__shm_comm_create_ranks(crun_store_t *store, const char *prefix, int rank, int size,
                                const int *global, double timeout, crun__shm_comm_t **out) {
  CRUN_CHECK(check_create_args(store, prefix, rank, size, out));
  crun__shm_comm_t *c = calloc(1, sizeof *c);
  int *map = global ? malloc(sizeof(int) * (size_t)size) : NULL;
  if (!c || (global && !map)) {
    free(c);
    free(map);
    return crun_error(CRUN_ENOMEM, "shm create: out of memory");
  }
  if (map) memcpy(map, global, sizeof(int) * (size_t)size);
  c->global = map;
  c->rank = rank;
  c->size = size;
  c->timeout = timeout > 0 ? timeout : crun_store_get_timeout(store);
  int rc = create_steps(c, store, prefix);
  if (rc < 0) {
    /* the group cannot form: whoever knows the name removes it, so a creator
     * killed before everyone attached leaves nothing behind either */
    if (c->name[0]) shm_unlink(c->name);
    crun__shm_comm_destroy(c);
    return rc;
  }
  CRUN_LOG(INFO, SHM, "rank %d/%d attached '%s' (%zu bytes, small %zu, chunk %zu x %d, %s, "
           "direct path %s)", rank, size, c->name, c->len, c->small_bytes, c->chunk, c->nbuf,
           c->policy_yield ? "yield" : "spin", c->direct ? "on" : "off");
  *out = c;
  return 0;
}

void crun__shm_comm_destroy(crun__shm_comm_t *c) {
  if (!c) return;
  if (c->base && c->ctrl) crun__shm_leave(c);
  if (c->pidfd)
    for (int q = 0; q < c->size; q++)
      if (c->pidfd[q] >= 0) close(c->pidfd[q]);
  free(c->pidfd);
  if (c->base) munmap(c->base, c->len);
  free(c->global);
  free(c);
}

int crun__shm_comm_rank(const crun__shm_comm_t *c) { return c ? c->rank : -1; }
int crun__shm_comm_size(const crun__shm_comm_t *c) { return c ? c->size : 0; }

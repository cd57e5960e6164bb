/* heap.c — the node's shared tensor heap: one shared anonymous mapping made
 * by the launcher, a slot per worker, a first-fit allocator per slot.
 *
 * A block is [header line][data]; the header holds the block's length. Free
 * blocks sit in an address-ordered list (nodes malloc'd, never in the shared
 * pages) and merge with their neighbours; the slot's unused end is a bump
 * region. Freed pages stay resident up to CRUN_HEAP_CACHE MiB (default 256)
 * so a loop that frees and allocates the same sizes pays no page faults;
 * beyond that a freed block's pages go back to the system (MADV_REMOVE).
 * The count of resident free bytes is exact: mincore says how much of a
 * freed block, and of a block taken from the free list or from pages the
 * bump region gave out before, was resident. */
#include "core/heap.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "crun.h"

#define HEAP_LINE 64
#define HEAP_PAGE 4096
#define HEAP_MAGIC 0x68656170626c6b31ull /* "heapblk1" */

typedef struct extent {
  size_t off, len;
  struct extent *next;
} extent_t;

typedef struct {
  uint64_t magic, len; /* len: the whole block, header included */
} block_hdr_t;

static struct {
  char *base;
  size_t len, slot_len;
  int nslots;
  uint64_t id;
  /* this process's slot; slot < 0: no allocations from the heap */
  int slot;
  char *lo;
  size_t bump;          /* offset of the slot's unused end */
  extent_t *free_list;  /* address-ordered, merged */
  size_t cached, cache_cap, min_bytes;
  pthread_mutex_t mu;
} H = {.slot = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

int crun__heap_reserve(int nslots) {
  if (H.base) { /* a restart: the previous attempt's pages go */
    madvise(H.base, H.len, MADV_REMOVE);
    return 0;
  }
  if (nslots < 1 || !crun_env_int("CRUN_HEAP", 1)) return -1;
  long gb = crun_env_int("CRUN_HEAP_SLOT_GB", 64);
  if (gb < 1) return -1;
  size_t slot_len = (size_t)gb << 30;
  void *p = MAP_FAILED;
  /* a smaller slot when the address space is limited (ulimit -v) */
  for (; slot_len >= ((size_t)1 << 30); slot_len /= 4) {
    p = mmap(NULL, slot_len * (size_t)nslots, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) break;
  }
  if (p == MAP_FAILED) {
    CRUN_LOG(INFO, CORE, "shared tensor heap off: cannot map %d slots", nslots);
    return -1;
  }
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = (uint64_t)crun_clock_ns();
  H.base = p;
  H.slot_len = slot_len;
  H.nslots = nslots;
  H.len = slot_len * (size_t)nslots;
  H.id = id | 1;
  CRUN_LOG(INFO, CORE, "shared tensor heap: %d slots of %zu GiB at %p", nslots,
           slot_len >> 30, p);
  return 0;
}

static void after_fork_child(void) {
  H.slot = -1; /* the parent owns the slot; a child allocates with malloc */
  pthread_mutex_init(&H.mu, NULL);
}

void crun__heap_use_slot(int slot) {
  if (!H.base || slot < 0 || slot >= H.nslots) return;
  static int registered;
  if (!registered) {
    pthread_atfork(NULL, NULL, after_fork_child);
    registered = 1;
  }
  H.slot = slot;
  H.lo = H.base + (size_t)slot * H.slot_len;
  H.bump = 0;
  H.free_list = NULL;
  H.cached = 0;
  H.cache_cap = (size_t)crun_env_int("CRUN_HEAP_CACHE", 256) << 20;
  H.min_bytes = (size_t)crun_env_int("CRUN_HEAP_MIN", 65536);
}

uint64_t crun__heap_id(void) { return H.slot >= 0 ? H.id : 0; }

int crun__heap_contains(const void *p, size_t n) {
  const char *c = p;
  return H.base && c >= H.base && n <= H.len && (size_t)(c - H.base) <= H.len - n;
}

/* First fit from the free list, else from the bump region; -1 when full. */
static long long take(size_t len) {
  for (extent_t **pp = &H.free_list; *pp; pp = &(*pp)->next) {
    extent_t *e = *pp;
    if (e->len < len) continue;
    size_t off = e->off;
    e->off += len;
    e->len -= len;
    if (!e->len) {
      *pp = e->next;
      free(e);
    }
    return (long long)off;
  }
  if (H.slot_len - H.bump < len) return -1;
  size_t off = H.bump;
  H.bump += len;
  return (long long)off;
}

/* Whether the machine can back len more bytes now (MemAvailable + SwapFree
 * from /proc/meminfo; yes when it cannot be read). The heap is mapped with
 * MAP_NORESERVE, so without this a request beyond the machine would succeed
 * and its first touch bring the OOM killer instead of a clean ENOMEM. */
static int can_back(size_t len) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return 1;
  char line[128];
  unsigned long long kb, avail = 0, swap = 0;
  int seen = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb, seen |= 1;
    else if (sscanf(line, "SwapFree: %llu kB", &kb) == 1) swap = kb, seen |= 2;
  }
  fclose(f);
  if (!(seen & 1)) return 1;
  return (unsigned long long)(len >> 10) <= avail + swap;
}

/* Bytes of the pages of [p, p + len) that are resident now (mincore), or
 * `fallback` when mincore cannot tell. */
static size_t resident_bytes(char *p, size_t len, size_t fallback) {
  static long ps;
  if (!ps) ps = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : HEAP_PAGE;
  unsigned char vec[1024];
  char *lo = (char *)((uintptr_t)p / (uintptr_t)ps * (uintptr_t)ps), *end = p + len;
  size_t n = 0;
  while (lo < end) {
    size_t pages = (size_t)(end - lo + ps - 1) / (size_t)ps;
    if (pages > sizeof vec) pages = sizeof vec;
    if (mincore(lo, pages * (size_t)ps, vec) != 0) return fallback;
    for (size_t i = 0; i < pages; i++) n += (vec[i] & 1) ? (size_t)ps : 0;
    lo += pages * (size_t)ps;
  }
  return n < len ? n : len;
}

void *crun__heap_alloc(size_t nbytes) {
  if (H.slot < 0 || nbytes < H.min_bytes || nbytes > H.slot_len) return NULL;
  size_t len = round_up(nbytes + HEAP_LINE, HEAP_PAGE);
  /* big requests only: small ones cannot exhaust a machine alone, and this
   * costs a file read (malloc then decides, under the kernel's overcommit
   * rules, as it does without the launcher) */
  if (len >= ((size_t)8 << 20) && !can_back(len)) {
    CRUN_LOG(INFO, CORE, "heap: %zu bytes is more than the machine can back now; left to malloc", nbytes);
    return NULL;
  }
  pthread_mutex_lock(&H.mu);
  long long off = H.slot < 0 ? -1 : take(len);
  if (off >= 0 && H.cached) { /* resident free pages reused: no longer cached */
    size_t r = resident_bytes(H.lo + off, len, 0);
    H.cached -= H.cached < r ? H.cached : r;
  }
  pthread_mutex_unlock(&H.mu);
  if (off < 0) return NULL;
  block_hdr_t *h = (block_hdr_t *)(void *)(H.lo + off);
  h->magic = HEAP_MAGIC;
  h->len = len;
  return (char *)h + HEAP_LINE;
}

/* Returns [off, off + len) to the free list, merging with its neighbours
 * and with the bump region. */
static void give_back(size_t off, size_t len) {
  extent_t **pp = &H.free_list, *prev = NULL;
  while (*pp && (*pp)->off < off) prev = *pp, pp = &(*pp)->next;
  extent_t *next = *pp;
  if (prev && prev->off + prev->len == off) {
    prev->len += len;
    if (next && prev->off + prev->len == next->off) {
      prev->len += next->len;
      prev->next = next->next;
      free(next);
    }
  } else if (next && off + len == next->off) {
    next->off = off;
    next->len += len;
  } else {
    extent_t *e = malloc(sizeof *e);
    if (!e) return; /* the range is lost to this slot, nothing worse */
    *e = (extent_t){off, len, next};
    *pp = e;
    prev = e;
  }
  /* the last extent reaching the bump region joins it */
  extent_t **lp = &H.free_list;
  while (*lp && (*lp)->next) lp = &(*lp)->next;
  if (*lp && (*lp)->off + (*lp)->len == H.bump) {
    H.bump = (*lp)->off;
    free(*lp);
    *lp = NULL;
  }
}

void crun__heap_release_slot(int slot) {
  if (!H.base || slot < 0 || slot >= H.nslots) return;
  madvise(H.base + (size_t)slot * H.slot_len, H.slot_len, MADV_REMOVE);
}

int crun__heap_free(void *p) {
  if (!p || !crun__heap_contains(p, 1)) return 0;
  if (H.slot < 0) return 1; /* a forked child: the parent's block, left alone */
  block_hdr_t *h = (block_hdr_t *)(void *)((char *)p - HEAP_LINE);
  if ((char *)h < H.lo || (char *)h >= H.lo + H.slot_len || h->magic != HEAP_MAGIC) {
    CRUN_LOG(WARN, CORE, "heap: free of %p, not a block of this worker's slot", p);
    return 1;
  }
  size_t off = (size_t)((char *)h - H.lo), len = h->len;
  h->magic = 0;
  pthread_mutex_lock(&H.mu);
  size_t r = resident_bytes((char *)h, len, len);
  if (H.cached + r > H.cache_cap)
    madvise(h, len, MADV_REMOVE);
  else
    H.cached += r;
  give_back(off, len);
  pthread_mutex_unlock(&H.mu);
  return 1;
}

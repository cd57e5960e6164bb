/* test_heap.c — the shared tensor heap (core/heap.h): slots at one address
 * in every forked worker, first-fit reuse and merging of freed blocks, the
 * minimum size, a full slot, forked children falling back to malloc,
 * tensors' storage landing in the heap, and the cache of freed pages. */
#include "harness.h"

#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/heap.h"

/* Forks a child running fn; returns its exit status (0 = passed). */
static int in_child(void (*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    fn();
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(off_without_reserve) {
  crun__heap_use_slot(0);
  EXPECT(crun__heap_alloc(1 << 20) == NULL);
  EXPECT(crun__heap_id() == 0);
  int x;
  EXPECT_EQ_INT(crun__heap_free(&x), 0);
}

static void *first;

static void allocator_body(void) {
  crun__heap_use_slot(1);
  EXPECT(crun__heap_id() != 0);
  EXPECT(crun__heap_alloc(100) == NULL); /* below CRUN_HEAP_MIN: malloc's */
  char *a = crun__heap_alloc(1 << 20), *b = crun__heap_alloc(1 << 20), *c = crun__heap_alloc(300000);
  EXPECT(a && b && c);
  EXPECT(((uintptr_t)a & 63) == 0);
  EXPECT(crun__heap_contains(a, 1 << 20) && crun__heap_contains(c, 300000));
  EXPECT(b >= a + (1 << 20) && c >= b + (1 << 20));
  memset(a, 1, 1 << 20);
  memset(b, 2, 1 << 20);
  /* a freed block is reused first; two freed neighbours merge */
  EXPECT_EQ_INT(crun__heap_free(a), 1);
  char *a2 = crun__heap_alloc(1 << 20);
  EXPECT(a2 == a);
  EXPECT_EQ_INT(crun__heap_free(a2), 1);
  EXPECT_EQ_INT(crun__heap_free(b), 1);
  char *ab = crun__heap_alloc((2 << 20) + 4000);
  EXPECT(ab == a);
  /* the slot's end: a request larger than the slot is refused */
  EXPECT(crun__heap_alloc((size_t)3 << 30) == NULL);
  /* a forked child may not allocate from its parent's slot */
  pid_t pid = fork();
  if (pid == 0) {
    if (crun__heap_alloc(1 << 20) != NULL || crun__heap_id() != 0) _exit(1);
    if (crun__heap_free(c) != 1) _exit(2); /* recognised, left alone */
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_EQ_INT(crun__heap_free(c), 1);
  EXPECT_EQ_INT(crun__heap_free(ab), 1);
  /* every block is back: the next one starts at the slot's beginning */
  char *again = crun__heap_alloc(1 << 20);
  EXPECT(again == a);
  EXPECT_EQ_INT(crun__heap_free(again), 1);
  /* a tensor's storage comes from the heap and holds its data */
  crun_tensor_t *t;
  EXPECT_OK(crun_tensor_new(CRUN_FLOAT32, 1, (int64_t[]){1 << 18}, &t));
  EXPECT(crun__heap_contains(crun_tensor_data(t), 1 << 20));
  crun_tensor_release(t);
}

/* What a worker writes at an address is seen by its siblings there. */
static void writer_body(void) {
  crun__heap_use_slot(0);
  first = crun__heap_alloc(1 << 16);
  EXPECT(first != NULL);
  memcpy(first, "shared!", 8);
  if (crun__heap_free(first) != 1) _exit(3);
}

TEST(slots_allocate_and_share) {
  setenv("CRUN_HEAP_SLOT_GB", "1", 1);
  EXPECT_OK(crun__heap_reserve(2));
  EXPECT_EQ_INT(in_child(allocator_body), 0);
  /* the parent (the launcher) sees a child's writes at the same address:
   * the first block of slot 0 is its base plus one header line */
  EXPECT_EQ_INT(in_child(writer_body), 0);
  int found = 0;
  crun__heap_use_slot(0);
  char *p = crun__heap_alloc(1 << 16); /* same first-fit position */
  EXPECT(p != NULL);
  found = p && memcmp(p, "shared!", 8) == 0;
  EXPECT(found);
  crun__heap_free(p);
  /* a restart drops every page: the old bytes read as zero */
  EXPECT_OK(crun__heap_reserve(2));
  EXPECT(p && p[0] == 0);
}

TEST(off_by_env) {
  setenv("CRUN_HEAP", "0", 1);
  EXPECT(crun__heap_reserve(2) < 0);
  crun__heap_use_slot(0);
  EXPECT(crun__heap_alloc(1 << 20) == NULL);
}

/* A dead worker's slot: the launcher drops its pages; other slots keep theirs. */
TEST(release_dead_slot) {
  setenv("CRUN_HEAP_SLOT_GB", "1", 1);
  EXPECT_OK(crun__heap_reserve(2));
  crun__heap_use_slot(1);
  char *keep = crun__heap_alloc(1 << 16);
  EXPECT(keep != NULL);
  memcpy(keep, "slot 1", 7);
  crun__heap_use_slot(0);
  char *dead = crun__heap_alloc(1 << 16);
  EXPECT(dead != NULL);
  memcpy(dead, "slot 0", 7);
  crun__heap_release_slot(0);
  EXPECT(dead[0] == 0 && dead[5] == 0);
  EXPECT(memcmp(keep, "slot 1", 7) == 0);
  crun__heap_release_slot(7); /* out of range: ignored */
}

/* A request beyond what the machine can back is left to malloc (which
 * refuses it under the kernel's rules) instead of a MAP_NORESERVE promise. */
TEST(refuses_what_the_machine_cannot_back) {
  setenv("CRUN_HEAP_SLOT_GB", "1024", 1);
  if (crun__heap_reserve(1) < 0) {
    printf("SKIP: cannot map a 1 TiB heap slot here\n");
    return;
  }
  crun__heap_use_slot(0);
  EXPECT(crun__heap_alloc((size_t)1 << 39) == NULL); /* 512 GiB */
  char *ok = crun__heap_alloc((size_t)16 << 20);
  EXPECT(ok != NULL);
  crun__heap_free(ok);
}

/* How many of the 4 KiB pages of [p, p + len) (p page-aligned) are resident. */
static size_t resident_pages(char *p, size_t len) {
  static unsigned char vec[4096];
  size_t pages = (len + 4095) / 4096, n = 0;
  if (pages > sizeof vec || mincore(p, pages * 4096, vec) != 0) return (size_t)-1;
  for (size_t i = 0; i < pages; i++) n += vec[i] & 1;
  return n;
}

static void cache_body(void) {
  setenv("CRUN_HEAP_CACHE", "1", 1); /* MiB */
  crun__heap_use_slot(0);
  /* freeing and taking one block again and again (from the free list or
   * from the bump region it merged into) keeps its pages: a reused page
   * leaves the count of cached bytes, so the 1 MiB cap is never reached */
  size_t n = 768 << 10;
  for (int i = 0; i < 8; i++) {
    char *a = crun__heap_alloc(n);
    EXPECT(a != NULL);
    memset(a, 1, n);
    char *blk = a - 64; /* the block's header line starts its first page */
    EXPECT_EQ_INT(crun__heap_free(a), 1);
    EXPECT_EQ_INT((long long)resident_pages(blk, n + 64), (long long)((n + 64 + 4095) / 4096));
  }
  /* a block beyond the cap gives its pages back when freed */
  size_t m = 4 << 20;
  char *big = crun__heap_alloc(m);
  EXPECT(big != NULL);
  memset(big, 2, m);
  EXPECT_EQ_INT(crun__heap_free(big), 1);
  EXPECT_EQ_INT((long long)resident_pages(big - 64, m + 64), 0);
}

TEST(cache_keeps_reused_pages) {
  setenv("CRUN_HEAP_SLOT_GB", "1", 1);
  EXPECT_OK(crun__heap_reserve(1));
  EXPECT_EQ_INT(in_child(cache_body), 0);
}

#define CRUN_TESTS(X) X(off_without_reserve) X(slots_allocate_and_share) X(off_by_env) X(release_dead_slot) \
  X(refuses_what_the_machine_cannot_back) X(cache_keeps_reused_pages)
CRUN_TEST_MAIN()

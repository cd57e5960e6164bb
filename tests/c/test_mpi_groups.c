/* test_mpi_groups.c — mpi backend group creation: each case runs this
 * program under `mpirun -np 2` (worker mode, chosen by OMPI_COMM_WORLD_SIZE;
 * the case by CRUN_TEST_MPI_CASE): two threads per rank creating a group
 * each, with the same MPI tag, one while the other is under way; a creation
 * that fails while its join message is still being sent; a stale join
 * message with the tag of a later group; a creation whose last
 * acknowledgement reaches one rank after its deadline. Passes without
 * running anything when mpirun or the mpi backend is missing. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_mpi_util.h"

#if CRUN_HAVE_MPI
#include <mpi.h>

#include "backend/mpi/mpi_int.h"
#endif

static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* A group's MPI creation tag as the mpi backend computes it (group.c's
 * group_tag): 16 + id % (MPI_TAG_UB - 16), id = fnv1a("<name>/0"), with
 * MPI_TAG_UB taken as at least 32767. */
static int group_tag(const char *name, int ub) {
  char p[48];
  snprintf(p, sizeof p, "%s/0", name);
  if (ub < 32767) ub = 32767;
  return 16 + (int)(fnv1a(p) % (uint32_t)(ub - 16));
}

typedef struct { uint32_t tag; uint32_t k; } probe_t;

static int probe_cmp(const void *x, const void *y) {
  const probe_t *a = x, *b = y;
  return a->tag != b->tag ? (a->tag < b->tag ? -1 : 1) : (a->k < b->k ? -1 : a->k > b->k);
}

/* Finds two group names "c<i>", "c<j>" with different ids but the same MPI
 * creation tag under MPI_TAG_UB `ub` (a birthday search: NPROBE names sorted
 * by tag; with Open MPI's 2^31 - 1 about 16 pairs are expected). Returns 0, or
 * -1 when none of the NPROBE names share a tag. */
enum { NPROBE = 1 << 18 };

static int colliding_names(int ub, char a[32], char b[32]) {
  probe_t *pr = malloc(NPROBE * sizeof *pr);
  char n[32], m[32];
  if (!pr) return -1;
  for (uint32_t k = 0; k < NPROBE; k++) {
    snprintf(n, sizeof n, "c%u", (unsigned)k);
    pr[k] = (probe_t){(uint32_t)group_tag(n, ub), k};
  }
  qsort(pr, NPROBE, sizeof *pr, probe_cmp);
  int found = -1;
  for (uint32_t i = 1; i < NPROBE && found < 0; i++) {
    if (pr[i].tag != pr[i - 1].tag) continue;
    snprintf(n, sizeof n, "c%u/0", (unsigned)pr[i - 1].k);
    snprintf(m, sizeof m, "c%u/0", (unsigned)pr[i].k);
    if (fnv1a(n) == fnv1a(m)) continue; /* same id: not the case under test */
    snprintf(a, 32, "c%u", (unsigned)pr[i - 1].k);
    snprintf(b, 32, "c%u", (unsigned)pr[i].k);
    found = 0;
  }
  free(pr);
  return found;
}

typedef struct { const char *name; int rank, which, rc; char err[512]; } job_t;

/* Start of thread `which` on `rank`: (which + 2 rank) STAGGER_US. Rank 0's
 * first creation holds the tag until rank 1 joins it, 2 STAGGER_US later, so
 * rank 0's second one starts while the first is under way and must wait for
 * it (claim_tag); rank 1 then does the same. Both ranks take the two
 * creations in the same order: claim_tag orders same-tag creations within
 * one process only, and in opposite orders on the two ranks each pairs its
 * hello with the other group's (EMISMATCH on both). */
enum { STAGGER_US = 100000 };

/* Creates group `name` (backend mpi) and checks one all_reduce on it. */
static void *job_main(void *arg) {
  job_t *j = arg;
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 2, .rank = j->rank, .backend = "mpi", .timeout = 10, .name = j->name};
  j->rc = crun_store_hash_new(&st);
  usleep(STAGGER_US * (j->which + 2 * j->rank)); /* see STAGGER_US */
  if (j->rc == 0) o.store = st, j->rc = crun_pg_new(&o, &pg);
  int64_t v[4];
  for (int i = 0; i < 4; i++) v[i] = -(int64_t)(100 * j->which + 10 * j->rank + i);
  if (j->rc == 0) j->rc = crun_pg_all_reduce(pg, v, 4, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
  if (j->rc < 0) snprintf(j->err, sizeof j->err, "%s", crun_last_error());
  for (int i = 0; j->rc == 0 && i < 4; i++)
    if (v[i] != -(int64_t)(200 * j->which + 10 + 2 * i)) {
      j->rc = -1;
      snprintf(j->err, sizeof j->err, "group %s: element %d is %lld, want %lld (another group's data)", j->name, i,
               (long long)v[i], (long long)-(200 * j->which + 10 + 2 * i));
    }
  if (pg) crun_pg_release(pg);
  if (st) crun_store_release(st);
  return NULL;
}

/* Worker: rounds of two groups created by two threads, the second while the
 * first is under way, whose names have the same MPI creation tag under this
 * MPI's MPI_TAG_UB: the second creation must wait for the first (group.c's
 * claim_tag), or the two hand each other's join messages and all_reduce
 * data across. */
static int worker(void) {
#if CRUN_HAVE_MPI
  int rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), bad = 0, level = 0, *ub = NULL, flag = 0;
  char a[32], b[32];
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  int tag_ub = flag && ub ? *ub : 0;
  if (colliding_names(tag_ub, a, b) < 0) {
    MPI_Finalize();
    printf("rank %d: skipped: no two of %d names share an MPI creation tag under MPI_TAG_UB %d\n", rank, NPROBE,
           tag_ub);
    return 0;
  }
  if (group_tag(a, tag_ub) != group_tag(b, tag_ub)) {
    printf("rank %d: names '%s' and '%s' have tags %d and %d, want the same\n", rank, a, b, group_tag(a, tag_ub),
           group_tag(b, tag_ub));
    bad = 1;
  }
  job_t warm = {.name = "warm", .rank = rank}; /* crun's MPI setup, collective, out of the way of the stagger */
  job_main(&warm);
  if (warm.rc < 0) printf("rank %d: creating 'warm': %s\n", rank, warm.err), bad = 1;
  for (int round = 0; round < 10 && !bad; round++) {
    char na[48], nb[48];
    MPI_Barrier(MPI_COMM_WORLD); /* the ranks' staggers start together */
    snprintf(na, sizeof na, "%s", round % 2 ? a : b);
    snprintf(nb, sizeof nb, "%s", round % 2 ? b : a);
    job_t j[2] = {{.name = na, .rank = rank, .which = 0}, {.name = nb, .rank = rank, .which = 1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, job_main, &j[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
      if (j[i].rc < 0) printf("rank %d round %d: %s\n", rank, round, j[i].err), bad = 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  if (!bad) printf("rank %d: ok (groups '%s' and '%s', MPI tag %d)\n", rank, a, b, group_tag(a, tag_ub));
  fflush(stdout);
  return bad;
#else
  printf("not available in this build\n");
  return 0;
#endif
}

/* Worker of join_send_pending (2 ranks, TCP only). Rank 0 fills its TCP
 * connection to rank 1, which makes no MPI call for 2 s, with FILL eager
 * messages, so that its join message for a group of both stays queued behind
 * them when that creation times out. MPI reads the message once rank 1
 * drains the connection: before, it was handed to MPI_Request_free and
 * leaked (LSan reports it in the address sanitizer build). A one-rank group
 * created after that sweeps it. */
enum { FILL = 512, FILL_BYTES = 32768 };

static int worker_join_pending(void) {
#if CRUN_HAVE_MPI
  int rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), level = 0, bad = 0;
  char *fill = calloc(FILL, FILL_BYTES);
  MPI_Request *sent = calloc(FILL, sizeof(MPI_Request));
  EXPECT(fill && sent);
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
  if (rank != 0) {
    MPI_Comm d[2]; /* as crun does on rank 0 when it starts its first group */
    MPI_Comm_dup(MPI_COMM_WORLD, &d[0]);
    MPI_Comm_dup(MPI_COMM_WORLD, &d[1]);
    sleep(2);
    for (int i = 0; i < FILL; i++) MPI_Recv(fill + (size_t)i * FILL_BYTES, FILL_BYTES, MPI_BYTE, 0, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm_free(&d[0]);
    MPI_Comm_free(&d[1]);
    MPI_Finalize();
    free(fill), free(sent);
    printf("rank %d: ok\n", rank);
    return 0;
  }
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  EXPECT(crun_store_hash_new(&st) == 0);
  crun_pg_opts_t one = {.world_size = 1, .rank = 0, .backend = "mpi", .timeout = 5, .name = "one", .store = st};
  if (crun_pg_new(&one, &pg) < 0) printf("rank 0: one-rank group: %s\n", crun_last_error()), bad = 1;
  if (pg) crun_pg_release(pg), pg = NULL;
  for (int i = 0; i < FILL; i++) MPI_Isend(fill + (size_t)i * FILL_BYTES, FILL_BYTES, MPI_BYTE, 1, 9, MPI_COMM_WORLD, &sent[i]);
  crun_pg_opts_t o = {.world_size = 2, .rank = 0, .backend = "mpi", .timeout = 0.5, .name = "late", .store = st};
  int rc = crun_pg_new(&o, &pg);
  const char *want = "ETIMEDOUT: creating group 'late/0' (backend mpi) on rank 0: rank 1 did not join within 0.5 s";
  if (rc != CRUN_ETIMEDOUT || strncmp(crun_last_error(), want, strlen(want)))
    printf("rank 0: creating 'late': rc %d, %s\n", rc, rc < 0 ? crun_last_error() : "no error"), bad = 1;
  if (pg) crun_pg_release(pg), pg = NULL;
  MPI_Waitall(FILL, sent, MPI_STATUSES_IGNORE);
  MPI_Barrier(MPI_COMM_WORLD);
  if ((rc = crun_pg_new(&one, &pg)) < 0) printf("rank 0: one-rank group: %s\n", crun_last_error()), bad = 1;
  if (pg) crun_pg_release(pg);
  crun_store_release(st);
  MPI_Finalize();
  free(fill), free(sent);
  if (!bad) printf("rank 0: ok\n");
  fflush(stdout);
  return bad;
#else
  printf("not available in this build\n");
  return 0;
#endif
}

#if CRUN_HAVE_MPI
/* 1 when a message from src with tag (MPI_ANY_SOURCE / MPI_ANY_TAG: any)
 * is queued on crun's join communicator. Probed three times: Open MPI's
 * probe (ob1) looks for a match before it progresses, so one probe can miss
 * what arrived since this rank's last MPI call and pass a check that should
 * fail (the backend's drains probe a miss again for the same reason). */
static int join_queued(int src, int tag) {
  MPI_Comm world, join;
  int queued = 0;
  for (int k = 0; !queued && k < 3 && crun__mpi_up(&world, &join) == 0; k++)
    MPI_Iprobe(src, tag, join, &queued, MPI_STATUS_IGNORE);
  return queued;
}
#endif

/* Worker of stale_join (2 ranks). Rank 0 creates group 'stale', which
 * times out because rank 1 makes no MPI call for 2 s; then both create group
 * 'n7tcjg3', whose MPI tag is the same (its id differs from 'stale''s by
 * MPI_TAG_UB - 16, Open MPI's 2^31 - 1). Rank 0's join message for 'stale'
 * still waits at rank 1: before, rank 1 took it as rank 0's join for
 * 'n7tcjg3' (EMISMATCH there) while rank 0 went on into
 * MPI_Comm_create_group and the watchdog aborted the job. Both must create
 * the group, and an all_reduce over it must sum both ranks' data. */
static int worker_stale_join(void) {
#if CRUN_HAVE_MPI
  int rank = atoi(getenv("OMPI_COMM_WORLD_RANK")), level = 0, bad = 0, *ub = NULL, flag = 0;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  uint32_t m = flag && ub && *ub > 32767 ? (uint32_t)*ub - 16 : 32767 - 16;
  if (fnv1a("stale/0") % m != fnv1a("n7tcjg3/0") % m) { /* another MPI: the names do not collide there */
    MPI_Finalize();
    printf("rank %d: ok (MPI_TAG_UB %d: no tag collision to test)\n", rank, flag && ub ? *ub : -1);
    return 0;
  }
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  EXPECT(crun_store_hash_new(&st) == 0);
  crun_pg_opts_t w = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = 5, .name = "warm", .store = st};
  if (crun_pg_new(&w, &pg) < 0) printf("rank %d: creating 'warm': %s\n", rank, crun_last_error()), bad = 1;
  if (pg) crun_pg_release(pg), pg = NULL; /* crun's MPI is up on both ranks */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (rank == 0) {
    crun_pg_opts_t o = {.world_size = 2, .rank = 0, .backend = "mpi", .timeout = 0.5, .name = "stale", .store = st};
    int rc = crun_pg_new(&o, &pg);
    const char *want = "ETIMEDOUT: creating group 'stale/0' (backend mpi) on rank 0: rank 1 did not join";
    if (rc != CRUN_ETIMEDOUT || strncmp(crun_last_error(), want, strlen(want)))
      printf("rank 0: creating 'stale': rc %d, %s\n", rc, rc < 0 ? crun_last_error() : "no error"), bad = 1;
    if (pg) crun_pg_release(pg), pg = NULL;
  } else {
    sleep(2); /* busy: rank 0's creation of 'stale' times out meanwhile */
  }
  crun_pg_opts_t o = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = 5, .name = "n7tcjg3", .store = st};
  int64_t v[3] = {-(3 + rank), 7 - 5 * rank, -(11 + 2 * rank)}, want[3] = {-7, 9, -24};
  int rc = crun_pg_new(&o, &pg);
  if (rc == 0) rc = crun_pg_all_reduce(pg, v, 3, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
  if (rc < 0) printf("rank %d: creating 'n7tcjg3': %s\n", rank, crun_last_error()), bad = 1;
  for (int i = 0; rc == 0 && i < 3; i++)
    if (v[i] != want[i]) printf("rank %d: element %d is %lld, want %lld\n", rank, i, (long long)v[i], (long long)want[i]), bad = 1;
  if (MPI_Wtime() - t0 > 4.5) printf("rank %d: took %.1f s\n", rank, MPI_Wtime() - t0), bad = 1;
  if (pg) crun_pg_release(pg);
  return mpi_worker_end(st, rank, bad);
#else
  printf("not available in this build\n");
  return 0;
#endif
}

#if CRUN_HAVE_MPI
/* Rank 0's sends on the join tag of the group being tested (the test's own
 * MPI_Isend, which crun's calls reach: the runtime is linked in statically).
 * The send numbered g_hold_nth there (1: the first) waits g_hold_s seconds
 * before it is started, as if the network held it. */
static int g_hold_tag = -1, g_hold_nth, g_hold_seen;
static double g_hold_s;

int MPI_Isend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm, MPI_Request *req) {
  if (tag == g_hold_tag && ++g_hold_seen == g_hold_nth) usleep((useconds_t)(g_hold_s * 1e6));
  return PMPI_Isend(buf, count, dt, dest, tag, comm, req);
}
#endif

/* Creates group `name` of both ranks (timeout t) and sums one int64 over it;
 * returns the status, printing what went wrong. */
static int pair_sum(crun_store_t *st, int rank, const char *name, double t) {
  crun_pg_t *pg = NULL;
  crun_pg_opts_t o = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = t, .name = name, .store = st};
  int64_t v = -(5 + 3 * rank);
  int rc = crun_pg_new(&o, &pg);
  if (rc == 0) rc = crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
  if (rc < 0) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  else if (v != -13) printf("rank %d: group '%s' summed %lld, want -13\n", rank, name, (long long)v), rc = -1;
  if (pg) crun_pg_release(pg);
  return rc;
}

/* Worker of join_deadline (2 ranks). Rank 1 creates group 'lateack' with a
 * 1 s timeout, rank 0 with 4 s; rank 0's acknowledgement of rank 1's join
 * message (its second message there) is held 1.5 s. So rank 0 has all it
 * needs from rank 1 at once, while rank 1's deadline passes before rank 0's
 * answer arrives. Before, rank 0 went into MPI_Comm_create_group alone and
 * the watchdog aborted the job; both ranks must fail, with ETIMEDOUT, well
 * within rank 0's timeout, and a group created next must work. Rank 0's
 * ACK and CONFIRM then wait at rank 1 for a creation that ended: the next
 * group's creation and destroy must have drained them (before, they stayed
 * queued until rank 1 next created a group with lateack's tag). */
static int worker_join_deadline(void) {
#if CRUN_HAVE_MPI
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  int rank = mpi_worker_begin(&st), bad = 0, *ub = NULL, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (pair_sum(st, rank, "warm", 5) < 0) bad = 1; /* crun's MPI is up on both ranks */
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) g_hold_tag = group_tag("lateack", flag && ub ? *ub : 0), g_hold_nth = 2, g_hold_s = 1.5;
  double t0 = MPI_Wtime();
  crun_pg_opts_t o = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = rank ? 1 : 4, .name = "lateack",
                      .store = st};
  int rc = crun_pg_new(&o, &pg), both[2] = {rc, rc};
  double took = MPI_Wtime() - t0;
  g_hold_tag = -1;
  if (pg) crun_pg_release(pg), pg = NULL;
  MPI_Allgather(&rc, 1, MPI_INT, both, 1, MPI_INT, MPI_COMM_WORLD);
  if (both[0] != CRUN_ETIMEDOUT || both[1] != CRUN_ETIMEDOUT)
    printf("rank %d: creating 'lateack' returned %d on rank 0 and %d on rank 1, want ETIMEDOUT (%d) on both%s%s\n",
           rank, both[0], both[1], CRUN_ETIMEDOUT, rc < 0 ? ": " : "", rc < 0 ? crun_last_error() : ""), bad = 1;
  if (took > 3) printf("rank %d: creating 'lateack' took %.1f s\n", rank, took), bad = 1;
  if (pair_sum(st, rank, "after", 5) < 0) bad = 1;
  if (join_queued(MPI_ANY_SOURCE, MPI_ANY_TAG)) /* what lateack left on crun's join communicator was drained */
    printf("rank %d: join messages of an ended creation are still queued\n", rank), bad = 1;
  return mpi_worker_end(st, rank, bad);
#else
  printf("not available in this build\n");
  return 0;
#endif
}

/* Worker of drain_idle (2 ranks). Rank 0's creation of 'lonely' times out
 * while rank 1 makes no MPI call for 1 s; then both create 'after'. Rank
 * 1's creation drains the join communicator first (rank 0's hello for
 * 'lonely' is there): Open MPI's MPI_Improbe (ob1) looks for a match before
 * it progresses, so the first probe after an idle second missed everything
 * that arrived meanwhile and the drain took nothing. The hello must no
 * longer be queued in MPI once 'after' exists (probed three times here). */
static int worker_drain_idle(void) {
#if CRUN_HAVE_MPI
  crun_store_t *st = NULL;
  crun_pg_t *pg = NULL;
  int rank = mpi_worker_begin(&st), bad = 0, *ub = NULL, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (pair_sum(st, rank, "warm", 5) < 0) bad = 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    crun_pg_opts_t o = {.world_size = 2, .rank = 0, .backend = "mpi", .timeout = 0.3, .name = "lonely", .store = st};
    if (crun_pg_new(&o, &pg) != CRUN_ETIMEDOUT) printf("rank 0: creating 'lonely' did not time out\n"), bad = 1;
    if (pg) crun_pg_release(pg), pg = NULL;
  } else {
    sleep(1);
  }
  crun_pg_opts_t o = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = 5, .name = "after", .store = st};
  if (crun_pg_new(&o, &pg) < 0) printf("rank %d: creating 'after': %s\n", rank, crun_last_error()), bad = 1;
  if (rank == 1 && join_queued(0, group_tag("lonely", flag && ub ? *ub : 0)))
    printf("rank 1: rank 0's hello for 'lonely' is still queued in MPI after a creation\n"), bad = 1;
  if (pg) crun_pg_release(pg);
  return mpi_worker_end(st, rank, bad);
#else
  printf("not available in this build\n");
  return 0;
#endif
}

/* Runs this program as case `name` on n ranks of mpirun (with `mca`) and
 * checks that every rank said ok. */
static void run_mpi_case(const char *name, int np, const char *mca) {
  char out[8192] = "";
  int status = mpi_run_case(name, np, mca, 120, out, sizeof out);
  if (status == -1) return;
  const char *skip = strstr(out, "skipped: ");
  if (skip && status == 0) {
    printf("SKIPPED: %.*s\n", (int)strcspn(skip + 9, "\n"), skip + 9);
    return;
  }
  for (int r = 0; r < np; r++) {
    char ok[32];
    snprintf(ok, sizeof ok, "rank %d: ok", r);
    if (!strstr(out, ok) || status != 0) crun_test_fail(__FILE__, __LINE__, "exit status %d\n%s", status, out);
  }
}

TEST(concurrent_colliding_groups) { run_mpi_case("colliding", 2, ""); }

TEST(join_send_pending) { run_mpi_case("join_pending", 2, "--mca btl self,tcp"); }

TEST(stale_join) { run_mpi_case("stale_join", 2, ""); }

TEST(join_deadline) { run_mpi_case("join_deadline", 2, ""); }

TEST(drain_idle) { run_mpi_case("drain_idle", 2, ""); }

#define CRUN_TESTS(X) X(concurrent_colliding_groups) X(join_send_pending) X(stale_join) X(join_deadline) X(drain_idle)

int main(int argc, char **argv) {
  const char *which = getenv("CRUN_TEST_MPI_CASE");
  if (getenv("OMPI_COMM_WORLD_SIZE") && which && !strcmp(which, "stale_join")) return worker_stale_join();
  if (getenv("OMPI_COMM_WORLD_SIZE") && which && !strcmp(which, "join_deadline")) return worker_join_deadline();
  if (getenv("OMPI_COMM_WORLD_SIZE") && which && !strcmp(which, "drain_idle")) return worker_drain_idle();
  if (getenv("OMPI_COMM_WORLD_SIZE")) return which && !strcmp(which, "join_pending") ? worker_join_pending() : worker();
  static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};
  return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);
}

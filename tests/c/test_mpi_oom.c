/* test_mpi_oom.c — the mpi backend out of memory, on purpose
 * (core/fault.h, CRUN_FAULT_ALLOC): each case runs this program under
 * `mpirun -np 2` (worker mode, chosen by OMPI_COMM_WORLD_SIZE; the case by
 * CRUN_TEST_MPI_CASE); rank 0 arms a fault with crun__fault_arm. Every case
 * checks the error text (ENOMEM, what, which rank), that no rank waits past
 * its timeout, and that a group created next works. Leaks show in the
 * address sanitizer build (make test-asan SAN_TESTS='-R mpi_oom'). Passes
 * without running anything when mpirun or the mpi backend is missing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"
#include "harness.h"
#include "test_mpi_util.h"

#if CRUN_HAVE_MPI
#include <mpi.h>

/* Creates group `name` of both ranks with timeout t into *pg; returns the status. */
static int pair_new(crun_store_t *st, int rank, const char *name, double t, crun_pg_t **pg) {
  crun_pg_opts_t o = {.world_size = 2, .rank = rank, .backend = "mpi", .timeout = t, .name = name, .store = st};
  *pg = NULL;
  return crun_pg_new(&o, pg);
}

/* Creates group `name` of both ranks and sums one int64 over it; returns
 * 1 when that failed (printed), else 0. */
static int pair_sum(crun_store_t *st, int rank, const char *name) {
  crun_pg_t *pg = NULL;
  int64_t v = -(5 + 3 * rank);
  int rc = pair_new(st, rank, name, 5, &pg);
  if (rc == 0) rc = crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
  if (rc < 0) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  else if (v != -13) printf("rank %d: group '%s' summed %lld, want -13\n", rank, name, (long long)v), rc = -1;
  if (pg) crun_pg_release(pg);
  return rc < 0;
}

/* 1 (printed) unless rc is `want` and the error text starts with `text`. */
static int expect_err(int rank, const char *what, int rc, int want, const char *text) {
  if (rc == want && !strncmp(crun_last_error(), text, strlen(text))) return 0;
  printf("rank %d: %s: rc %d (%s), want %s: %s...\n", rank, what, rc, rc < 0 ? crun_last_error() : "no error",
         crun_err_name(want), text);
  return 1;
}

/* 1 (printed) when more than `most` seconds passed since t0. */
static int too_slow(int rank, const char *what, double t0, double most) {
  double took = MPI_Wtime() - t0;
  if (took <= most) return 0;
  printf("rank %d: %s took %.1f s, want at most %.1f s\n", rank, what, took, most);
  return 1;
}

/* abort: rank 0's all_reduce on group `name` times out (rank 1 is not
 * there yet) with allocation `site` of its abort notice failing; rank 1
 * calls later and fails at once (rank 0's deadline passed). The groups are
 * destroyed, nothing crashes, the WARN names the group and the rank. */
static int abort_case(crun_store_t *st, int rank, const char *name, const char *site) {
  crun_pg_t *pg = NULL;
  int64_t v = 1;
  int bad = pair_new(st, rank, name, 1, &pg) < 0;
  if (bad) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (!bad && rank == 0) {
    crun__fault_arm(site);
    int rc = crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
    crun__fault_arm(NULL);
    bad |= expect_err(rank, name, rc, CRUN_ETIMEDOUT, "ETIMEDOUT: all_reduce #1 on rank 0: no data from rank 1");
  } else if (!bad) {
    usleep(1500000);
    if (crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL) == 0)
      printf("rank 1: all_reduce on '%s' after rank 0 gave up passed\n", name), bad = 1;
  }
  bad |= too_slow(rank, name, t0, 3);
  MPI_Barrier(MPI_COMM_WORLD);
  if (pg) crun_pg_release(pg);
  return bad;
}

static int worker_abort(crun_store_t *st, int rank) {
  return abort_case(st, rank, "ab1", "mpi.abort_msg") | abort_case(st, rank, "ab2", "mpi.abort_reqs") |
         pair_sum(st, rank, "after");
}

/* destroy: rank 0 destroys a failed group (its abort notice and signatures
 * sent) with allocation `site` of the retirement failing, after rank 1
 * destroyed it (so no notice of rank 1's arrives once rank 0 freed it). */
static int destroy_case(crun_store_t *st, int rank, const char *name, const char *site) {
  crun_pg_t *pg = NULL;
  int64_t v = 1;
  int bad = pair_new(st, rank, name, 0.5, &pg) < 0;
  if (bad) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  if (!bad && rank == 0 && crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL) == 0)
    printf("rank 0: all_reduce on '%s' without rank 1 passed\n", name), bad = 1;
  if (rank == 1 && pg) crun_pg_release(pg), pg = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  crun__fault_arm(rank == 0 ? site : NULL);
  if (pg) crun_pg_release(pg);
  crun__fault_arm(NULL);
  return bad | too_slow(rank, name, t0, 1.5);
}

static int worker_destroy(crun_store_t *st, int rank) {
  int bad = destroy_case(st, rank, "de1", "mpi.keep_pending") | destroy_case(st, rank, "de2", "mpi.retire");
  MPI_Barrier(MPI_COMM_WORLD);
  return bad | pair_sum(st, rank, "after");
}

/* join: rank 0 has no memory for the join handshake of group 'jo1' (or
 * for its state, 'st1'): it fails at once with ENOMEM naming the group,
 * and rank 1 times out naming rank 0 (it cannot know why) within its own
 * timeout, not in MPI until the watchdog. */
static int join_case(crun_store_t *st, int rank, const char *name, const char *site, const char *want0) {
  crun_pg_t *pg = NULL;
  char want1[160];
  snprintf(want1, sizeof want1, "ETIMEDOUT: creating group '%s/0' (backend mpi) on rank 1: rank 0 did not join "
           "within 1.0 s", name);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  crun__fault_arm(rank == 0 ? site : NULL);
  int rc = pair_new(st, rank, name, 1, &pg);
  crun__fault_arm(NULL);
  int bad = expect_err(rank, name, rc, rank ? CRUN_ETIMEDOUT : CRUN_ENOMEM, rank ? want1 : want0);
  if (pg) crun_pg_release(pg);
  return bad | too_slow(rank, name, t0, rank ? 2 : 0.5);
}

static int worker_join(crun_store_t *st, int rank) {
  int bad = join_case(st, rank, "jo1", "mpi.join:3", "ENOMEM: creating group 'jo1/0' (backend mpi) on rank 0: "
                      "no memory for the join handshake (2 members)");
  bad |= join_case(st, rank, "st1", "mpi.state", "ENOMEM: creating group 'st1/0' (backend mpi) on rank 0: no "
                   "memory for the group's state (2 members)");
  MPI_Barrier(MPI_COMM_WORLD);
  return bad | pair_sum(st, rank, "after");
}

/* room: rank 0 cannot allocate the list of full ranks while comparing the
 * join messages (no rank is full): the group is created all the same. */
static int worker_room(crun_store_t *st, int rank) {
  crun__fault_arm(rank == 0 ? "mpi.room_text" : NULL);
  int bad = pair_sum(st, rank, "room");
  crun__fault_arm(NULL);
  return bad;
}
/* stash: rank 0's hello for group 'sh1' reaches rank 1 before rank 1
 * creates it; rank 1's drain of the join communicator then has no memory to
 * keep it. The hello must not be lost (before, it was received and dropped:
 * rank 1 waited for it until its deadline and both failed). */
static int worker_stash(crun_store_t *st, int rank) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) usleep(500000), crun__fault_arm("mpi.stash");
  double t0 = MPI_Wtime();
  int bad = pair_sum(st, rank, "sh1");
  crun__fault_arm(NULL);
  return bad | too_slow(rank, "sh1", t0, 2.5);
}

/* recv: rank 1 sends n floats of `name`'s value (a buffered send: it
 * returns at once); rank 0 receives them with fault `site` armed (no
 * memory for its staging buffer: mpi.stage_recv): its recv fails with
 * ENOMEM naming the call, the peer and rank 0 (its text starts with `want`),
 * and the message must not be lost inside MPI.
 * Both then destroy the group within 1 s (its timeout is 2 s), and the next
 * send and recv between them, on a new group, deliver the right data.
 * Before, rank 0 matched the message (MPI_Improbe) before it allocated and
 * never received it: for a message MPI sends by rendezvous (over 4 KiB on
 * shared memory) rank 1's send never completed, so destroying the group
 * waited the group's timeout for it and then kept it forever. */
static int recv_case_of(crun_store_t *st, int rank, const char *name, size_t n, size_t take, const char *site,
                        int status, const char *want) {
  crun_pg_t *pg = NULL;
  float *v = malloc(n * sizeof *v);
  int bad = !v || pair_new(st, rank, name, 2, &pg) < 0;
  if (bad) printf("rank %d: group '%s': %s\n", rank, name, v ? crun_last_error() : "no memory");
  for (size_t i = 0; v && i < n; i++) v[i] = 7.0f;
  if (!bad && rank == 1 && crun_pg_send(pg, v, n, CRUN_FLOAT32, 0, NULL, NULL) < 0)
    printf("rank 1: send on '%s': %s\n", name, crun_last_error()), bad = 1;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  if (!bad && rank == 0) {
    crun__fault_arm(site);
    int rc = crun_pg_recv(pg, v, take, CRUN_FLOAT32, 1, NULL, NULL, NULL);
    crun__fault_arm(NULL);
    bad |= expect_err(rank, name, rc, status, want);
  }
  if (pg) crun_pg_release(pg);
  bad |= too_slow(rank, name, t0, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  char next[32];
  snprintf(next, sizeof next, "%s-next", name);
  bad |= !v || pair_new(st, rank, next, 1, &pg) < 0;
  for (size_t i = 0; !bad && i < n; i++) v[i] = rank ? 2.0f : -1.0f;
  int rc = bad ? -1 : rank ? crun_pg_send(pg, v, n, CRUN_FLOAT32, 0, NULL, NULL)
                           : crun_pg_recv(pg, v, n, CRUN_FLOAT32, 1, NULL, NULL, NULL);
  if (!bad && rc < 0) printf("rank %d: group '%s': %s\n", rank, next, crun_last_error()), bad = 1;
  for (size_t i = 0; !bad && i < n; i++)
    if (v[i] != 2.0f) printf("rank 0: group '%s' received %g at %zu, want 2\n", next, v[i], i), bad = 1;
  if (pg) crun_pg_release(pg);
  free(v);
  return bad;
}

static int recv_case(crun_store_t *st, int rank, const char *name, size_t n, const char *site, const char *want) {
  return recv_case_of(st, rank, name, n, n, site, CRUN_ENOMEM, want);
}

static int worker_stage_recv(crun_store_t *st, int rank) {
  static const char want[] = "ENOMEM: recv from rank 1 (tag 0) on rank 0: no memory for its staging buffer";
  int bad = recv_case(st, rank, "rv1", 2, "mpi.stage_recv", want);
  bad |= recv_case(st, rank, "rv2", 1536, "mpi.stage_recv", want);
  return bad | pair_sum(st, rank, "after");
}

/* recv_type: as recv_case, for a message too large for the staging buffer
 * (256 KiB: MPI sends it by rendezvous over shared memory and TCP alike),
 * received in place through a struct datatype whose creation fails (fault
 * site mpi.msg_type). Rank 0's recv fails with ENOMEM naming the call, rank
 * 0 and the sender, and the message is received and dropped. Before, the
 * message MPI_Improbe had matched was never received: rank 1's send never
 * completed, its destroy waited the group's timeout (2 s) for it, and rank 0
 * reported an EIO from MPI_Mrecv, which it had not called. */
static int worker_recv_type(crun_store_t *st, int rank) {
  int bad = recv_case(st, rank, "rt1", 65536, "mpi.msg_type", "ENOMEM: recv from rank 1 (tag 0) on rank 0: "
                      "MPI_Type_create_struct failed: MPI_ERR_NO_MEM: out of memory; the message from rank 1 "
                      "(262160 bytes) was received and dropped");
  return bad | pair_sum(st, rank, "after");
}

/* One collective of a stage case on pg; returns its status. */
typedef int (*stage_call_fn)(crun_pg_t *pg, int rank);

/* stage: rank 0 has no memory for a staging buffer of call `what` on group
 * `name` (allocation `site`): both ranks fail at once with ENOMEM naming the
 * call and rank 0 (rank 1 from rank 0's abort notice), well within the
 * call's 2 s timeout. Before, rank 0 allocated after the signature exchange
 * and rank 1, through it, waited inside the MPI collective until the
 * watchdog aborted the job. */
static int stage_case_on(crun_store_t *st, int rank, const char *name, const char *site, const char *site1,
                         stage_call_fn call, const char *what) {
  crun_pg_t *pg = NULL;
  char want[128];
  snprintf(want, sizeof want, "ENOMEM: %s on rank 0: no memory for its staging buffer", what);
  int bad = pair_new(st, rank, name, 2, &pg) < 0;
  if (bad) printf("rank %d: group '%s': %s\n", rank, name, crun_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  crun__fault_arm(rank == 0 ? site : site1);
  int rc = bad ? CRUN_ENOMEM : call(pg, rank);
  crun__fault_arm(NULL);
  if (!bad) bad |= expect_err(rank, name, rc, CRUN_ENOMEM, want);
  if (!bad && rank == 1 && !strstr(crun_last_error(), "[reported by rank 0; rank 1 was in "))
    printf("rank 1: %s: not from rank 0's notice: %s\n", name, crun_last_error()), bad = 1;
  bad |= too_slow(rank, name, t0, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (pg) crun_pg_release(pg);
  return bad;
}

/* stage_case_on with no fault armed on rank 1. */
static int stage_case(crun_store_t *st, int rank, const char *name, const char *site, stage_call_fn call,
                      const char *what) {
  return stage_case_on(st, rank, name, site, NULL, call, what);
}

static int half_all_reduce(crun_pg_t *pg, int rank) {
  uint16_t v[4] = {0x3c00, 0x3c00, 0x3c00, (uint16_t)(0x3c00 + rank)}; /* float16 1.0 */
  return crun_pg_all_reduce(pg, v, 4, CRUN_FLOAT16, CRUN_OP_SUM, NULL, NULL);
}

static int half_reduce_scatter(crun_pg_t *pg, int rank) {
  uint16_t a[3] = {0x3c00, 0x3c00, 0x3c00}, b[3] = {0x3c00, 0x3c00, (uint16_t)(0x3c00 + rank)}, out[3];
  const void *ins[2] = {a, b};
  return crun_pg_reduce_scatter(pg, out, ins, 3, CRUN_BFLOAT16, CRUN_OP_SUM, NULL, NULL);
}

/* all_gather into two blocks that are not back to back (in reverse order). */
static int list_all_gather(crun_pg_t *pg, int rank) {
  int32_t in[2] = {rank, rank}, blocks[5];
  void *outs[2] = {blocks + 3, blocks};
  return crun_pg_all_gather(pg, outs, in, 2, CRUN_INT32, NULL, NULL);
}

static int list_scatter(crun_pg_t *pg, int rank) {
  int32_t blocks[5] = {1, 2, 3, 4, 5}, out[2];
  const void *ins[2] = {blocks + 3, blocks};
  (void)rank;
  return crun_pg_scatter(pg, out, ins, 2, CRUN_INT32, 0, NULL, NULL);
}

/* all_to_all of 1 element to rank 0 and 2 to rank 1 from each rank. */
static int a2a(crun_pg_t *pg, int rank) {
  int32_t in[3] = {rank, rank, rank}, out[4];
  size_t in_counts[2] = {1, 2}, out_counts[2] = {rank ? 2u : 1u, rank ? 2u : 1u};
  const void *ins[2] = {in, in + 1};
  void *outs[2] = {out, out + 2};
  return crun_pg_all_to_all(pg, outs, out_counts, ins, in_counts, CRUN_INT32, NULL, NULL);
}

/* notice: as stage_case (root 0 of a scatter fails for want of a staging
 * buffer; rank 1, not the root, needs none), with every checked allocation
 * of rank 1 failing while it waits in the signature exchange ("*:2+": all
 * but its first, the post of its signature receive, mpi.sig_irecv): rank 1
 * still fails with rank 0's error, from its abort notice. Before, rank 1
 * had no memory to receive the notice (a calloc of its length) and failed
 * with an ENOMEM of its own ("no memory to receive rank 0's abort notice")
 * that hid why the call failed; the notice stayed queued in MPI. */
static int worker_notice(crun_store_t *st, int rank) {
  int bad = stage_case_on(st, rank, "nt1", "mpi.stage_list", "*:2+", list_scatter, "scatter #1");
  return bad | pair_sum(st, rank, "after");
}

static int worker_stage_half(crun_store_t *st, int rank) {
  int bad = stage_case(st, rank, "hf1", "mpi.stage_half", half_all_reduce, "all_reduce #1");
  bad |= stage_case(st, rank, "hf2", "mpi.stage_half:2", half_reduce_scatter, "reduce_scatter #1");
  return bad | pair_sum(st, rank, "after");
}

static int worker_stage_list(crun_store_t *st, int rank) {
  int bad = stage_case(st, rank, "ls1", "mpi.stage_list", list_all_gather, "all_gather #1");
  bad |= stage_case(st, rank, "ls2", "mpi.stage_list", list_scatter, "scatter #1");
  return bad | pair_sum(st, rank, "after");
}

static int worker_stage_a2a(crun_store_t *st, int rank) {
  int bad = stage_case(st, rank, "aa1", "mpi.stage_a2a", a2a, "all_to_all #1");
  bad |= stage_case(st, rank, "aa2", "mpi.stage_a2a:2", a2a, "all_to_all #1");
  return bad | pair_sum(st, rank, "after");
}

/* sig: rank 0 cannot post its receive of rank 1's call signature (fault
 * site mpi.sig_irecv: MPI_Irecv fails with MPI_ERR_NO_MEM): rank 0's
 * all_reduce fails with ENOMEM naming MPI_Irecv, the peer and rank 0, and
 * rank 1's with that text, from rank 0's abort notice, both at once.
 * Before, the failed receive left its request null, read as a signature
 * that had arrived: rank 0 compared rank 1's last signature (none) with its
 * call and reported an EMISMATCH that no rank had made. */
static int sig_sum(crun_pg_t *pg, int rank) {
  int64_t v = rank;
  return crun_pg_all_reduce(pg, &v, 1, CRUN_INT64, CRUN_OP_SUM, NULL, NULL);
}

static int worker_sig(crun_store_t *st, int rank) {
  static const char want[] = "ENOMEM: all_reduce #1 on rank 0: MPI_Irecv of the call signature from rank 1 "
                             "failed: MPI_ERR_NO_MEM: out of memory";
  crun_pg_t *pg = NULL;
  int bad = pair_new(st, rank, "sg1", 2, &pg) < 0;
  if (bad) printf("rank %d: group 'sg1': %s\n", rank, crun_last_error());
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  crun__fault_arm(rank == 0 ? "mpi.sig_irecv" : NULL);
  int rc = bad ? CRUN_ENOMEM : sig_sum(pg, rank);
  crun__fault_arm(NULL);
  if (!bad) bad |= expect_err(rank, "sg1", rc, CRUN_ENOMEM, want);
  if (!bad && rank == 1 && !strstr(crun_last_error(), "[reported by rank 0; rank 1 was in "))
    printf("rank 1: sg1: not from rank 0's notice: %s\n", crun_last_error()), bad = 1;
  bad |= too_slow(rank, "sg1", t0, 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (pg) crun_pg_release(pg);
  return bad | pair_sum(st, rank, "after");
}

/* sink: rank 1 sends 65536 floats (256 KiB: a rendezvous send), rank 0
 * receives 100 with faults `site` armed in crun__mpi_mrecv_head, which must
 * receive a message of another size whole: its datatypes cannot be made
 * (mpi.sink_base: the shared SINK-byte block of extent 0; mpi.sink_type:
 * the per-message struct), so it falls back (a heap copy of the message, or
 * the shared block alone, which loses the header). Rank 0's recv fails with
 * the status and text `want`, the message is received (rank 1's destroy
 * does not wait for its send), and a group created next works (recv_case_of's
 * steps, receiving 100 where 65536 come). Before, the
 * return codes of MPI_Type_contiguous and MPI_Type_create_resized were not
 * checked: a failure went on with handles never set. */
static int sink_case(crun_store_t *st, int rank, const char *name, const char *site, const char *want) {
  return recv_case_of(st, rank, name, 65536, 100, site, CRUN_EMISMATCH, want);
}

static int worker_sink(crun_store_t *st, int rank) {
  int bad = sink_case(st, rank, "sk1", "mpi.sink_base,mpi.sink_type", "EMISMATCH: recv from rank 1 (tag 0) on rank "
                      "0 expected float32[100], rank 1 sent float32[65536] (tag 0)");
  bad |= sink_case(st, rank, "sk2", "mpi.sink_type", "EMISMATCH: recv from rank 1 (tag 0) on rank 0 expected "
                   "float32[100], rank 1 sent 262160 bytes; its header was not read (MPI_Type_create_struct "
                   "failed: MPI_ERR_NO_MEM: out of memory): the message was received and dropped");
  return bad | pair_sum(st, rank, "after");
}
#endif

/* Runs case `which` on this rank, after a first group of both ranks (crun's
 * MPI set up on both); prints "rank R: ok" when it passed. */
static int worker(const char *which) {
#if CRUN_HAVE_MPI
  crun_store_t *st = NULL;
  int rank = mpi_worker_begin(&st), bad = 0;
  bad = pair_sum(st, rank, "warm");
  MPI_Barrier(MPI_COMM_WORLD);
  if (!strcmp(which, "abort")) bad |= worker_abort(st, rank);
  else if (!strcmp(which, "destroy")) bad |= worker_destroy(st, rank);
  else if (!strcmp(which, "join")) bad |= worker_join(st, rank);
  else if (!strcmp(which, "room")) bad |= worker_room(st, rank);
  else if (!strcmp(which, "stash")) bad |= worker_stash(st, rank);
  else if (!strcmp(which, "stage_half")) bad |= worker_stage_half(st, rank);
  else if (!strcmp(which, "stage_list")) bad |= worker_stage_list(st, rank);
  else if (!strcmp(which, "stage_a2a")) bad |= worker_stage_a2a(st, rank);
  else if (!strcmp(which, "stage_recv")) bad |= worker_stage_recv(st, rank);
  else if (!strcmp(which, "recv_type")) bad |= worker_recv_type(st, rank);
  else if (!strcmp(which, "notice")) bad |= worker_notice(st, rank);
  else if (!strcmp(which, "sig")) bad |= worker_sig(st, rank);
  else if (!strcmp(which, "sink")) bad |= worker_sink(st, rank);
  else printf("rank %d: no case %s\n", rank, which), bad = 1;
  return mpi_worker_end(st, rank, bad);
#else
  (void)which;
  printf("not available in this build\n");
  return 0;
#endif
}

/* Runs this program as case `name` on 2 ranks of mpirun and checks that
 * both said ok and that the output has each of want[] (NULL-ended). */
static void run_mpi_case(const char *name, const char *const *want) {
  static char out[65536];
  int status = mpi_run_case(name, 2, "", 60, out, sizeof out);
  if (status == -1) return;
  if (status != 0 || !strstr(out, "rank 0: ok") || !strstr(out, "rank 1: ok"))
    crun_test_fail(__FILE__, __LINE__, "exit status %d\n%s", status, out);
  for (; want && *want; want++)
    if (!strstr(out, *want)) crun_test_fail(__FILE__, __LINE__, "no '%s' in the output:\n%s", *want, out);
}

/* The fault spec: the n-th, the n-th and later, every, "*", malformed. */
TEST(fault_spec) {
  EXPECT_OK(crun__fault_arm("t.a:2,t.b,t.c:2+"));
  int got[4][3];
  for (int i = 0; i < 4; i++)
    got[i][0] = crun__fault_alloc("t.a"), got[i][1] = crun__fault_alloc("t.b"), got[i][2] = crun__fault_alloc("t.c");
  EXPECT(!got[0][0] && got[1][0] && !got[2][0] && !got[3][0]);
  EXPECT(got[0][1] && got[1][1] && got[2][1] && got[3][1]);
  EXPECT(!got[0][2] && got[1][2] && got[2][2] && got[3][2]);
  EXPECT(!crun__fault_alloc("t.other"));
  EXPECT_OK(crun__fault_arm("*:3"));
  EXPECT(!crun__fault_alloc("x") && !crun__fault_alloc("y") && crun__fault_alloc("z") && !crun__fault_alloc("x"));
  EXPECT_STATUS(crun__fault_arm("t.a:0"), CRUN_EINVAL);
  EXPECT_STATUS(crun__fault_arm("t.a:x"), CRUN_EINVAL);
  EXPECT_STATUS(crun__fault_arm(":1"), CRUN_EINVAL);
  EXPECT_OK(crun__fault_arm(NULL));
  EXPECT(!crun__fault_alloc("t.b"));
  void *m = CRUN__FAULT_MALLOC("t.b", 16);
  EXPECT(m != NULL);
  free(m);
}

TEST(abort_no_memory) {
  static const char *const want[] = {
      "ENOMEM: mpi group 'ab1/0' on rank 0: no memory for its abort notice's message; its peers are not told why it "
      "failed: ETIMEDOUT: all_reduce #1 on rank 0",
      "ENOMEM: mpi group 'ab2/0' on rank 0: no memory for its abort notice's request array", NULL};
  run_mpi_case("abort", want);
}

TEST(destroy_no_memory) {
  static const char *const want[] = {
      "ENOMEM: destroying mpi group 'de1/0' on rank 0: no memory to retire its communicators",
      "ENOMEM: destroying mpi group 'de2/0' on rank 0: no memory to retire its communicators", NULL};
  run_mpi_case("destroy", want);
}

TEST(join_no_memory) { run_mpi_case("join", NULL); }

TEST(room_text_no_memory) { run_mpi_case("room", NULL); }

TEST(stash_no_memory) { run_mpi_case("stash", NULL); }

TEST(stage_half_no_memory) { run_mpi_case("stage_half", NULL); }

TEST(stage_list_no_memory) { run_mpi_case("stage_list", NULL); }

TEST(stage_a2a_no_memory) { run_mpi_case("stage_a2a", NULL); }

TEST(stage_recv_no_memory) { run_mpi_case("stage_recv", NULL); }

TEST(recv_type_no_memory) { run_mpi_case("recv_type", NULL); }

TEST(notice_no_memory) { run_mpi_case("notice", NULL); }

TEST(sig_irecv_fails) { run_mpi_case("sig", NULL); }

TEST(sink_type_no_memory) { run_mpi_case("sink", NULL); }

#define CRUN_TESTS(X) X(fault_spec) X(abort_no_memory) X(destroy_no_memory) X(join_no_memory) \
  X(room_text_no_memory) X(stash_no_memory) X(stage_half_no_memory) X(stage_list_no_memory) X(stage_a2a_no_memory) \
  X(stage_recv_no_memory) X(recv_type_no_memory) X(notice_no_memory) X(sig_irecv_fails) X(sink_type_no_memory)

int main(int argc, char **argv) {
  const char *which = getenv("CRUN_TEST_MPI_CASE");
  if (getenv("OMPI_COMM_WORLD_SIZE") && which) return worker(which);
  static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};
  return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);
}

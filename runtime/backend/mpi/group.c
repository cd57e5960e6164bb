/* group.c — a group's communicators: a handshake with a deadline among the
 * members (every member must create the group, in the same order), then
 * MPI_Comm_create_group over their MPI ranks; abort notices between members;
 * teardown. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/mpi/mpi_int.h"
#include "core/fault.h"

void *crun__mpi_stage(crun__mpi_t *b, int i, size_t n, const char *site) {
  if (n > b->stage_cap[i]) {
    free(b->stage[i]);
    b->stage[i] = CRUN__FAULT_MALLOC(site, n);
    b->stage_cap[i] = b->stage[i] ? n : 0;
  }
  return b->stage[i] ? b->stage[i] : (n ? NULL : b);
}

/* A world size above 1 needs a process manager that started every rank (a
 * worker crun-lua spawned, CRUN_LAUNCHER=1, is not one even under mpirun). */
static int check_launch(const crun_pg_t *pg) {
  int by_mpi = (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) && !getenv("CRUN_LAUNCHER");
  if (pg->size < 2 || crun__mpi_alive() || by_mpi) return 0;
  return crun_error(CRUN_EINVAL, "backend mpi on %s: world_size is %d but this process was not started by "
                    "mpirun (no OMPI_COMM_WORLD_SIZE or PMI_SIZE); run `mpirun -np %d crun-lua script.lua` "
                    "or use backend \"cpu\"", CRUN__WHO(pg, pg->rank), pg->size, pg->size);
}

/* Checks the group's ranks against MPI's view of the world. */
static int check_world(const crun_pg_t *pg, MPI_Comm world) {
  int wrank = 0, wsize = 0;
  MPI_Comm_rank(world, &wrank);
  MPI_Comm_size(world, &wsize);
  for (int i = 0; i < pg->size; i++)
    if (pg->global[i] >= wsize)
      return crun_error(CRUN_EINVAL, "backend mpi on %s: the group needs rank %d but MPI has only %d "
                        "processes (start the job with mpirun -np %d)", CRUN__WHO(pg, pg->rank), pg->global[i], wsize,
                        pg->size);
  if (pg->global[pg->rank] != wrank)
    return crun_error(CRUN_EINVAL, "backend mpi: this process is rank %d for crun but rank %d for MPI; with "
                      "backend mpi the ranks are the ones mpirun assigns (leave RANK unset)",
                      pg->global[pg->rank], wrank);
  return 0;
}

/* Cancels the join receives still pending (recvs[0..n-1]), so none writes
 * into the join's buffer after it is freed. */
static void cancel_recvs(MPI_Request *recvs, int n) {
  for (int i = 0; i < n; i++) {
    if (recvs[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&recvs[i]);
    MPI_Wait(&recvs[i], MPI_STATUS_IGNORE);
  }
}

/* Groups of this process whose communicators are not freed (alive, or
 * destroyed and retired). Each holds two of MPI's communicator context ids,
 * which run out (Open MPI 4: about 65000 per process, and a creation past
 * them crashed in MPI); so creating a group is refused on every member once
 * one of them holds max_groups(). */
static atomic_int g_groups;

/* CRUN_MPI_MAX_GROUPS, default 32000 (64000 communicators). */
static int max_groups(void) {
  long m = crun_env_int("CRUN_MPI_MAX_GROUPS", 32000);
  return m < 1 ? 1 : m > 32000 ? 32000 : (int)m;
}

/* The ERANGE of a creation refused because `who` (group ranks) hold max_groups(). */
static int no_room(const crun_pg_t *pg, const char *who) {
  return crun_error(CRUN_ERANGE, "creating group '%s' (backend mpi) on %s: the limit of %d MPI groups per "
                    "process is reached on %s (CRUN_MPI_MAX_GROUPS; each group takes two of MPI's communicator "
                    "ids, about 65000 per process); destroy the groups no longer used", pg->prefix,
                    CRUN__WHO(pg, pg->rank),
                    max_groups(), who);
}

/* Join message words: kind, the sender's attempt (a number no other
 * creation in its process used), the receiver's attempt the message answers
 * (ACK, CONFIRM, REFUSE; 0 when the sender does not know it), then, in a
 * hello, group id, hash of the rank list, size, room (1 when the sender may
 * create one more group) and the sender's timeout in ms. */
enum { JOIN_KIND, JOIN_SEQ, JOIN_ACKED, JOIN_ID, JOIN_HASH, JOIN_SIZE, JOIN_ROOM, JOIN_WAIT, JOIN_WORDS };
/* HELLO: the sender is creating the group; ACK: it received the receiver's
 * hello; CONFIRM: it has every member's hello and ACK and will enter
 * MPI_Comm_create_group once every member confirmed; REFUSE: it gave up
 * (its deadline passed, or a member refused) and will not. */
enum { JOIN_HELLO = 1, JOIN_ACK = 2, JOIN_CONFIRM = 3, JOIN_REFUSE = 4 };

/* Compares the members' join messages with ours, then their room. */
static int join_compare(const crun_pg_t *pg, const int64_t *mine, const int64_t *theirs) {
  for (int i = 0; i < pg->size; i++) {
    const int64_t *t = theirs + JOIN_WORDS * i;
    if (i == pg->rank || (t[JOIN_ID] == mine[JOIN_ID] && t[JOIN_HASH] == mine[JOIN_HASH] &&
                          t[JOIN_SIZE] == mine[JOIN_SIZE])) continue;
    return crun_error(CRUN_EMISMATCH, "creating group '%s' (backend mpi) on %s: %s is creating another "
                      "group (%lld ranks) at the same time; every rank must create the same groups, with the "
                      "same rank lists, in the same order", pg->prefix, CRUN__WHO(pg, pg->rank), CRUN__WHO(pg, i),
                      (long long)t[JOIN_SIZE]);
  }
  int n = 0;
  for (int i = 0; i < pg->size; i++) n += !(i == pg->rank ? mine : theirs + JOIN_WORDS * i)[JOIN_ROOM];
  if (!n) return 0; /* (before, no memory for the list below refused the group as if a rank were full) */
  int *full = CRUN__FAULT_MALLOC("mpi.room_text", sizeof(int) * (size_t)pg->size);
  char who[256] = "some ranks";
  n = 0;
  for (int i = 0; full && i < pg->size; i++)
    if (!(i == pg->rank ? mine : theirs + JOIN_WORDS * i)[JOIN_ROOM]) full[n++] = i;
  if (full) crun__pg_ranks_text(pg, who, sizeof who, full, n);
  free(full);
  return no_room(pg, who);
}

/* A group's creation tag, for its join messages and MPI_Comm_create_group:
 * from its id, so every member computes the same, and spread over MPI's
 * whole tag range (ub: MPI_TAG_UB of the join and world communicators). */
static int group_tag(const crun_pg_t *pg, int ub) { return 16 + (int)(pg->group_id % (uint32_t)(ub - 16)); }

/* Tags of the creations in progress in this process. MPI matches two
 * concurrent MPI_Comm_create_group calls on one communicator by tag alone,
 * and the join messages too: two groups created at once by two threads with
 * one tag paired one rank's group with the other's on its peer (each
 * all_reduce summed the other group's data). A creation whose tag is in use
 * here waits for that one to finish. */
typedef struct claim { int tag; struct claim *next; } claim_t;
static pthread_mutex_t g_claims_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_claims_cv = PTHREAD_COND_INITIALIZER;
static claim_t *g_claims;

static int tag_busy(int tag) {
  for (claim_t *c = g_claims; c; c = c->next)
    if (c->tag == tag) return 1;
  return 0;
}

/* Takes tag c->tag for pg's creation, waiting up to pg's timeout while
 * another creation in this process holds it. */
static int claim_tag(const crun_pg_t *pg, claim_t *c) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  double t = pg->timeout < 1e6 ? pg->timeout : 1e6;
  until.tv_sec += (time_t)t;
  until.tv_nsec += (long)((t - (double)(time_t)t) * 1e9);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  int rc = 0;
  pthread_mutex_lock(&g_claims_lock);
  while (tag_busy(c->tag) && rc == 0) rc = pthread_cond_timedwait(&g_claims_cv, &g_claims_lock, &until);
  if (!tag_busy(c->tag)) c->next = g_claims, g_claims = c, rc = 0;
  pthread_mutex_unlock(&g_claims_lock);
  if (rc == 0) return 0;
  return crun_error(CRUN_ETIMEDOUT, "creating group '%s' (backend mpi) on %s: another group this process is "
                    "creating has the same MPI tag %d and did not finish within %.1f s", pg->prefix, CRUN__WHO(pg, pg->rank),
                    c->tag, pg->timeout);
}

static void release_tag(claim_t *c) {
  pthread_mutex_lock(&g_claims_lock);
  for (claim_t **p = &g_claims; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  pthread_cond_broadcast(&g_claims_cv);
  pthread_mutex_unlock(&g_claims_lock);
}

/* Join messages whose sends had not completed when their creation returned
 * (it failed: a member never joined, or, over TCP, one that had not yet
 * connected to this rank and was not calling MPI). MPI may still read such a
 * message, so it stays here with its send requests until they complete, and
 * is freed then (reclaim, at each group creation and destroy). Before, it
 * was handed to MPI_Request_free and leaked. */
typedef struct join_out {
  int64_t *msg;
  MPI_Request *reqs;   /* n sends */
  int n;
  struct join_out *next;
} join_out_t;
static pthread_mutex_t g_joins_lock = PTHREAD_MUTEX_INITIALIZER;
static join_out_t *g_joins;

/* Frees the kept join messages whose sends completed (MPI is alive). */
static void sweep_joins(void) {
  pthread_mutex_lock(&g_joins_lock);
  for (join_out_t **q = &g_joins; *q;) {
    join_out_t *j = *q;
    int done = 0;
    if (MPI_Testall(j->n, j->reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || !done) {
      q = &j->next;
      continue;
    }
    *q = j->next;
    free(j->msg), free(j->reqs), free(j);
  }
  pthread_mutex_unlock(&g_joins_lock);
}

/* Frees msg once the n sends reading it (sends[0..n-1]) completed: at once
 * when they have, else by sweep_joins; takes msg and, when it keeps them,
 * the requests (then returns 1: the caller must not free `sends`). */
static int keep_join(int64_t *msg, MPI_Request *sends, int n) {
  int pending = 0;
  for (int i = 0; i < n; i++) pending |= sends[i] != MPI_REQUEST_NULL;
  join_out_t *j = pending ? CRUN__FAULT_MALLOC("mpi.join_keep", sizeof *j) : NULL;
  if (!pending) return free(msg), 0;
  if (!j) { /* no memory for the record: MPI finishes the sends, msg stays (a few words a member) */
    for (int i = 0; i < n; i++)
      if (sends[i] != MPI_REQUEST_NULL) MPI_Request_free(&sends[i]);
    return 0;
  }
  j->msg = msg, j->reqs = sends, j->n = n;
  pthread_mutex_lock(&g_joins_lock);
  j->next = g_joins, g_joins = j;
  pthread_mutex_unlock(&g_joins_lock);
  return 1;
}

/* Join messages that arrived after their creation here ended (an ACK or
 * CONFIRM of a failed attempt, a peer's REFUSE, the hello of a peer whose
 * creation failed) stayed queued in MPI until this rank next created a
 * group with that tag, which could be never. So while no creation of this
 * process is under way (none can be expecting one), drain_joins receives
 * whatever waits on the join communicator (at each group creation and
 * destroy): it drops ACKs, CONFIRMs and REFUSEs (they answer attempts of
 * ours that ended), and keeps only the latest hello from each sender and
 * tag (it may be the current one of a creation this rank has yet to make),
 * dropping it when its sender's REFUSE of it comes; the creation with that
 * tag takes it from here (stash_take). At most STASH_MAX hellos are kept.
 * All under g_claims_lock. */
typedef struct stash { int src, tag; int64_t msg[JOIN_WORDS]; struct stash *next; } stash_t;
enum { STASH_MAX = 1024, DRAIN_MAX = 256 };
static stash_t *g_stash;
static int g_nstash;

/* Files message m from MPI rank src on tag into the stash (see above), in
 * `spare` when it keeps m; returns spare when it did not (NULL when it did). */
static stash_t *stash_put(int src, int tag, const int64_t *m, stash_t *spare) {
  stash_t **q = &g_stash;
  while (*q && !((*q)->src == src && (*q)->tag == tag)) q = &(*q)->next;
  if (*q && (m[JOIN_KIND] == JOIN_HELLO || (m[JOIN_KIND] == JOIN_REFUSE && (*q)->msg[JOIN_SEQ] == m[JOIN_SEQ]))) {
    stash_t *old = *q;
    *q = old->next, g_nstash--;
    free(old);
  }
  if (m[JOIN_KIND] != JOIN_HELLO || g_nstash >= STASH_MAX) return spare;
  stash_t *h = spare;
  h->src = src, h->tag = tag, h->next = g_stash, g_stash = h, g_nstash++;
  memcpy(h->msg, m, sizeof h->msg);
  return NULL;
}

/* MPI_Improbe of any message on c. Open MPI's (ob1) looks for a match
 * before it progresses, so the first probe after a while without MPI calls
 * misses everything that arrived meanwhile: before, a drain after an idle
 * spell took nothing (join messages stayed queued until a later one). A
 * miss is probed once more, after that progress. */
static int improbe_any(MPI_Comm c, int *flag, MPI_Message *m, MPI_Status *st) {
  int rc = MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, flag, m, st);
  if (rc == MPI_SUCCESS && !*flag) rc = MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, flag, m, st);
  return rc;
}

/* Logs (WARN) that message `what` (n bytes from rank src, tag) could not be
 * received whole (rc, rx: crun__mpi_mrecv_head's) and what became of it. */
static void lost(int src, int tag, MPI_Count n, int rc, const crun__mpi_rx_t *rx, const char *what) {
  char why[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  MPI_Error_string(rc, why, &len);
  CRUN_LOG(WARN, PG, "%s: %s of %lld bytes from rank %d (tag %d) could not be received: %s failed: %s; %s",
           crun_err_name(crun__mpi_status(rc)), what, (long long)n, src, tag, rx->call, why,
           rx->taken ? "it is dropped" : "it stays matched in MPI, and its sender's send may never complete");
}

/* Receives and files what waits on the join communicator, when no creation
 * of this process is under way (MPI is alive). The stash entry is allocated
 * before a message is received: without memory the rest stays queued in MPI,
 * where the creation with its tag receives it (before, a hello received
 * then was dropped, and its creation here waited for it until its deadline). */
static void drain_joins(MPI_Comm join) {
  stash_t *spare = NULL;
  pthread_mutex_lock(&g_claims_lock);
  for (int k = 0; !g_claims && k < DRAIN_MAX; k++) {
    if (!spare && !(spare = CRUN__FAULT_MALLOC("mpi.stash", sizeof *spare))) break;
    int flag = 0;
    int64_t w[JOIN_WORDS] = {0};
    MPI_Count n = 0;
    MPI_Message m;
    MPI_Status st;
    if (improbe_any(join, &flag, &m, &st) != MPI_SUCCESS || !flag) break;
    MPI_Get_elements_x(&st, MPI_BYTE, &n);
    crun__mpi_rx_t rx;
    int rc = crun__mpi_mrecv_head(&m, n, w, sizeof w, &rx);
    if (rc != MPI_SUCCESS) { /* a join message is a few words, received whole on the stack */
      lost(st.MPI_SOURCE, st.MPI_TAG, n, rc, &rx, "a join message");
      if (rx.taken) continue;
      break; /* it stays matched; the rest stays queued for a later drain */
    }
    if (n == (MPI_Count)sizeof w) spare = stash_put(st.MPI_SOURCE, st.MPI_TAG, w, spare);
  }
  pthread_mutex_unlock(&g_claims_lock);
  free(spare);
}

/* Attempts of this process to create a group (JOIN_SEQ). */
static atomic_llong g_attempts;

/* One creation's handshake. A hello whose creation failed (a member never
 * joined it) stays queued at that member, and MPI matches join messages by
 * tag alone: a later creation there with the same tag took it as the
 * current hello, so one rank failed (EMISMATCH) or went on while its peer
 * did not, and blocked in MPI_Comm_create_group until the watchdog aborted
 * the job. So every hello is acknowledged, and the ACK names the
 * acknowledger's own attempt: a hello older than that is stale and dropped.
 *
 * Having every member's hello and ACK does not tell a rank that its peers
 * have theirs: the last ACK a peer waits for may arrive after that peer's
 * deadline. Before, a rank went into MPI_Comm_create_group then, alone, and
 * the watchdog aborted the job. So a rank that has them sends CONFIRM to
 * every member and enters only once every member confirmed; a rank whose
 * deadline passes first sends REFUSE instead (it never confirmed), so a
 * confirmed rank waiting for it fails too. A rank that confirmed waits for
 * the others' word up to the longest member's timeout (each reaches CONFIRM
 * or REFUSE within its own: every member started before its hello came). */
typedef struct {
  int n, me;
  const crun_pg_t *pg;  /* the group being created: its texts name ranks by it */
  int64_t seq;          /* this attempt */
  int64_t *out;         /* out[0]: hello; out[(1 + p) W]: ACK to p; out[(1 + n + p) W]: CONFIRM/REFUSE to p */
  int64_t *in;          /* in[p W]: receive buffer for p */
  int64_t *theirs;      /* theirs[p W]: p's latest hello */
  int64_t *peer_seq;    /* p's attempt, from its ACK of ours; 0: not known yet */
  char *owed;           /* owed[p]: out's ACK to p waits for the previous one's send */
  char *fin;            /* fin[p]: p's CONFIRM or REFUSE of this attempt; 0 until it came */
  MPI_Request *reqs;    /* receives [0, n), hellos [n, 2n), ACKs [2n, 3n), CONFIRM/REFUSE [3n, 4n) */
} join_t;

/* Takes the message just received from p. */
static void join_take(join_t *j, int p) {
  const int64_t *m = j->in + JOIN_WORDS * p;
  int64_t k = m[JOIN_KIND];
  if (k == JOIN_ACK && m[JOIN_ACKED] == j->seq) j->peer_seq[p] = m[JOIN_SEQ];
  if ((k == JOIN_CONFIRM || k == JOIN_REFUSE) &&
      (m[JOIN_ACKED] == j->seq || (j->peer_seq[p] && m[JOIN_SEQ] == j->peer_seq[p])))
    j->fin[p] = (char)k;
  if (k != JOIN_HELLO) return; /* an ACK or word of an earlier attempt of ours: dropped */
  memcpy(j->theirs + JOIN_WORDS * p, m, sizeof(int64_t) * JOIN_WORDS);
  int64_t *ack = j->out + JOIN_WORDS * (1 + p);
  ack[JOIN_KIND] = JOIN_ACK, ack[JOIN_SEQ] = j->seq, ack[JOIN_ACKED] = m[JOIN_SEQ];
  j->owed[p] = 1;
}

/* Takes the stashed hellos of the members on tag (drain_joins), in front of
 * anything still queued in MPI (which came after them). */
static void stash_take(join_t *j, const int *global, int tag) {
  pthread_mutex_lock(&g_claims_lock);
  for (stash_t **q = &g_stash; *q;) {
    stash_t *h = *q;
    int p = 0;
    while (p < j->n && (p == j->me || global[p] != h->src)) p++;
    if (h->tag != tag || p == j->n) {
      q = &h->next;
      continue;
    }
    memcpy(j->in + JOIN_WORDS * p, h->msg, sizeof h->msg);
    join_take(j, p);
    *q = h->next, g_nstash--;
    free(h);
  }
  pthread_mutex_unlock(&g_claims_lock);
}

/* 1 when p's current hello is here and p acknowledged ours (drops p's
 * stale hello: one older than the attempt its ACK names). */
static int join_done(join_t *j, int p) {
  int64_t *t = j->theirs + JOIN_WORDS * p;
  if (j->peer_seq[p] && t[JOIN_KIND] == JOIN_HELLO && t[JOIN_SEQ] < j->peer_seq[p]) t[JOIN_KIND] = 0;
  return j->peer_seq[p] && t[JOIN_KIND] == JOIN_HELLO && t[JOIN_SEQ] == j->peer_seq[p];
}

/* 1 when nothing more is needed from or owed to p before confirming. */
static int join_complete(join_t *j, int p) { return p == j->me || (join_done(j, p) && !j->owed[p]); }

/* One pass over the peers: takes what arrived, reposts the receives of the
 * peers whose CONFIRM or REFUSE has not come, sends the ACKs owed. Returns 0,
 * or <0 when MPI failed. */
static int join_pump(join_t *j, MPI_Comm join, const int *global, int tag) {
  int rc = MPI_SUCCESS;
  for (int p = 0; p < j->n && rc == MPI_SUCCESS; p++) {
    int got = 0, sent = 0;
    if (p == j->me) continue;
    if (j->reqs[p] != MPI_REQUEST_NULL && (rc = MPI_Test(&j->reqs[p], &got, MPI_STATUS_IGNORE)) == MPI_SUCCESS && got)
      join_take(j, p);
    if (rc == MPI_SUCCESS && !j->fin[p] && j->reqs[p] == MPI_REQUEST_NULL)
      rc = MPI_Irecv(j->in + JOIN_WORDS * p, JOIN_WORDS, MPI_INT64_T, global[p], tag, join, &j->reqs[p]);
    MPI_Request *ack = &j->reqs[2 * j->n + p];
    if (rc == MPI_SUCCESS && j->owed[p] && (rc = MPI_Test(ack, &sent, MPI_STATUS_IGNORE)) == MPI_SUCCESS && sent) {
      rc = MPI_Isend(j->out + JOIN_WORDS * (1 + p), JOIN_WORDS, MPI_INT64_T, global[p], tag, join, ack);
      j->owed[p] = 0;
    }
  }
  return rc == MPI_SUCCESS ? 0 : crun__mpi_fail(rc, "group handshake", j->pg, j->me, "MPI_Test");
}

/* Sends `kind` (JOIN_CONFIRM or JOIN_REFUSE) to every other member, naming
 * its attempt when known. */
static int join_final(join_t *j, MPI_Comm join, const int *global, int tag, int kind) {
  for (int p = 0; p < j->n; p++) {
    int64_t *m = j->out + JOIN_WORDS * (1 + j->n + p), *t = j->theirs + JOIN_WORDS * p;
    if (p == j->me) continue;
    m[JOIN_KIND] = kind, m[JOIN_SEQ] = j->seq;
    m[JOIN_ACKED] = j->peer_seq[p] ? j->peer_seq[p] : t[JOIN_KIND] == JOIN_HELLO ? t[JOIN_SEQ] : 0;
    if (MPI_Isend(m, JOIN_WORDS, MPI_INT64_T, global[p], tag, join, &j->reqs[3 * j->n + p]) != MPI_SUCCESS)
      return crun_error(CRUN_EIO, "group handshake on %s: MPI_Isend failed", CRUN__WHO(j->pg, j->me));
  }
  return 0;
}

/* The members for which `want` holds, as text in who[256]; returns how many. */
static int join_who(join_t *j, int (*want)(join_t *, int), char who[256]) {
  int *r = malloc(sizeof(int) * (size_t)j->n), k = 0;
  for (int p = 0; p < j->n; p++)
    if (want(j, p)) {
      if (r) r[k] = p;
      k++;
    }
  snprintf(who, 256, "some ranks");
  if (r && k) crun__pg_ranks_text(j->pg, who, 256, r, k);
  free(r);
  return k;
}

static int join_missing(join_t *j, int p) { return !join_complete(j, p); }
static int join_refused(join_t *j, int p) { return j->fin[p] == JOIN_REFUSE; }
static int join_unconfirmed(join_t *j, int p) { return p != j->me && j->fin[p] != JOIN_CONFIRM; }

/* The ETIMEDOUT of a creation: `who` did not join or confirm (`how`) within `timeout`. */
static int join_timeout(const crun_pg_t *pg, const char *who, const char *how, double timeout) {
  return crun_error(CRUN_ETIMEDOUT, "creating group '%s' (backend mpi) on %s: %s %s within %.1f s; "
                    "every member must create the group, in the same order on every rank",
                    pg->prefix, CRUN__WHO(pg, pg->rank), who, how, timeout);
}

/* The ETIMEDOUT of a creation that `who` refused. */
static int join_gave_up(const crun_pg_t *pg, const char *who) {
  return crun_error(CRUN_ETIMEDOUT, "creating group '%s' (backend mpi) on %s: %s gave up (not every member "
                    "joined within its timeout); every member must create the group, in the same order on every "
                    "rank", pg->prefix, CRUN__WHO(pg, pg->rank), who);
}

/* Exchanges hellos and ACKs with every other member until each one's
 * current hello came and it acknowledged ours (0), the deadline passes (1),
 * or a member that has not acknowledged ours refused (2). */
static int join_exchange(join_t *j, MPI_Comm join, const int *global, int tag, double deadline) {
  crun__mpi_spin_t spin = {0};
  for (int p = 0; p < j->n; p++) {
    MPI_Request *hello = &j->reqs[j->n + p];
    if (p != j->me && MPI_Isend(j->out, JOIN_WORDS, MPI_INT64_T, global[p], tag, join, hello) != MPI_SUCCESS)
      return crun_error(CRUN_EIO, "group handshake on %s: MPI_Isend failed", CRUN__WHO(j->pg, j->me));
  }
  stash_take(j, global, tag);
  for (;;) {
    CRUN_CHECK(join_pump(j, join, global, tag));
    int left = 0;
    for (int p = 0; p < j->n; p++) {
      if (j->fin[p] == JOIN_REFUSE && !join_done(j, p)) return 2;
      left += !join_complete(j, p);
    }
    if (!left) return 0;
    if (crun_clock() >= deadline) return 1;
    crun__mpi_relax(&spin);
  }
}

/* Waits for every other member's CONFIRM (0) until `wait` seconds from now;
 * fails when one refused or did not answer in time.
 *
 * The window that remains, and why it stays: `wait` is the longest member
 * timeout + 1 s. A member's CONFIRM (or REFUSE) is sent within its own
 * timeout, so only a message delayed more than 1 s past that (a sender
 * stopped or descheduled between its decision and its MPI_Isend, a host
 * swapping, a TCP link stalled) reaches this rank after it gave up. Then:
 * this rank returns ETIMEDOUT ("rank p did not confirm the group"), while p,
 * which has every CONFIRM including this rank's, enters
 * MPI_Comm_create_group alone and stays there until the watchdog aborts the
 * job after p's timeout ("creating a group (MPI_Comm_create_group) on rank p
 * is still inside MPI past its deadline", exit 124). No further round can
 * close it (agreement over messages with no bound on their delay is the two
 * generals' problem: whatever message is last may be late), and p cannot
 * back out: MPI_Comm_create_group cannot be cancelled and Open MPI 4.1 has no
 * non-blocking form of it. Waiting for ever here instead would trade that
 * bounded abort for an unbounded hang when p died. */
static int join_confirmed(join_t *j, const crun_pg_t *pg, MPI_Comm join, int tag, double wait) {
  crun__mpi_spin_t spin = {0};
  double deadline = crun_clock() + wait;
  char who[256];
  for (;;) {
    CRUN_CHECK(join_pump(j, join, pg->global, tag));
    if (join_who(j, join_refused, who)) return join_gave_up(pg, who);
    if (!join_who(j, join_unconfirmed, who)) return 0;
    if (crun_clock() >= deadline) return join_timeout(pg, who, "did not confirm the group", wait);
    crun__mpi_relax(&spin);
  }
}

/* The longest timeout among the members (their hellos carry theirs), in s. */
static double join_longest(join_t *j, double mine) {
  for (int p = 0; p < j->n; p++)
    if (p != j->me && (double)j->theirs[JOIN_WORDS * p + JOIN_WAIT] / 1e3 > mine)
      mine = (double)j->theirs[JOIN_WORDS * p + JOIN_WAIT] / 1e3;
  return mine;
}

/* Runs the handshake in j (allocated, out[0] filled): exchange, comparison,
 * then CONFIRM and the others' CONFIRMs, or REFUSE when this rank gives up. */
static int join_run(join_t *j, const crun_pg_t *pg, MPI_Comm join, int tag) {
  char who[256];
  int rc = join_exchange(j, join, pg->global, tag, crun_clock() + pg->timeout);
  if (rc < 0) return rc;
  if (rc == 1) join_who(j, join_missing, who), rc = join_timeout(pg, who, "did not join", pg->timeout);
  else if (rc == 2) join_who(j, join_refused, who), rc = join_gave_up(pg, who);
  else rc = join_compare(pg, j->out, j->theirs);
  if (rc < 0) return join_final(j, join, pg->global, tag, JOIN_REFUSE), rc;
  CRUN_CHECK(join_final(j, join, pg->global, tag, JOIN_CONFIRM));
  return join_confirmed(j, pg, join, tag, join_longest(j, pg->timeout) + 1);
}

/* Every member sends (group id, hash of the rank list, size, room, timeout)
 * to every other, with the group's tag, and waits for theirs, their ACKs and
 * their CONFIRMs until the group's timeout (join_t). Returns with no receive
 * pending; a send still pending keeps its message alive (keep_join). */
static int join_members(const crun_pg_t *pg, MPI_Comm join, int tag) {
  int n = pg->size, rc = 0, room = atomic_load(&g_groups) < max_groups();
  if (n < 2) return room ? 0 : no_room(pg, "this rank");
  size_t w = JOIN_WORDS * (size_t)n;
  join_t j = {.n = n, .me = pg->rank, .pg = pg, .seq = atomic_fetch_add(&g_attempts, 1) + 1};
  j.out = CRUN__FAULT_CALLOC("mpi.join", 2 * w + JOIN_WORDS, sizeof(int64_t));
  j.in = CRUN__FAULT_CALLOC("mpi.join", w, sizeof(int64_t));
  j.theirs = CRUN__FAULT_CALLOC("mpi.join", w, sizeof(int64_t));
  j.peer_seq = CRUN__FAULT_CALLOC("mpi.join", (size_t)n, sizeof(int64_t));
  j.owed = CRUN__FAULT_CALLOC("mpi.join", (size_t)n, 1), j.fin = CRUN__FAULT_CALLOC("mpi.join", (size_t)n, 1);
  j.reqs = CRUN__FAULT_MALLOC("mpi.join", sizeof(MPI_Request) * 4 * (size_t)n);
  for (int i = 0; j.reqs && i < 4 * n; i++) j.reqs[i] = MPI_REQUEST_NULL;
  if (j.out && j.in && j.theirs && j.peer_seq && j.owed && j.fin && j.reqs) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)pg->global[i]) * 1099511628211ull;
    int64_t *mine = j.out;
    mine[JOIN_KIND] = JOIN_HELLO, mine[JOIN_SEQ] = j.seq, mine[JOIN_ID] = pg->group_id;
    mine[JOIN_HASH] = (int64_t)h, mine[JOIN_SIZE] = n, mine[JOIN_ROOM] = room;
    mine[JOIN_WAIT] = (int64_t)(pg->timeout < 1e9 ? pg->timeout * 1e3 : 1e12);
    rc = join_run(&j, pg, join, tag);
    cancel_recvs(j.reqs, n); /* nothing may write into j.in once freed */
  } else {
    rc = crun_error(CRUN_ENOMEM, "creating group '%s' (backend mpi) on %s: no memory for the join handshake "
                    "(%d members); no member can create the group", pg->prefix, CRUN__WHO(pg, pg->rank), n);
  }
  free(j.in), free(j.theirs), free(j.peer_seq), free(j.owed), free(j.fin);
  if (!j.reqs || !j.out) return free(j.reqs), free(j.out), rc;
  memmove(j.reqs, j.reqs + n, sizeof(MPI_Request) * 3 * (size_t)n); /* the hellos, ACKs, CONFIRMs/REFUSEs */
  if (!keep_join(j.out, j.reqs, 3 * n)) free(j.reqs);
  return rc;
}

/* Makes comm (over the members' MPI ranks, in group order) and ctrl. */
static int make_comms(crun__mpi_t *b, MPI_Comm world, int tag) {
  crun_pg_t *pg = b->pg;
  MPI_Group wg, g;
  MPI_Comm_group(world, &wg);
  MPI_Group_incl(wg, pg->size, pg->global, &g);
  crun__mpi_watch_begin(&b->watch, pg->timeout, "creating a group", "MPI_Comm_create_group");
  int rc = MPI_Comm_create_group(world, g, tag, &b->comm);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(b->comm, &b->ctrl);
  crun__mpi_watch_end(&b->watch);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  if (rc != MPI_SUCCESS) return crun__mpi_fail(rc, "creating a group", pg, pg->rank, "MPI_Comm_create_group");
  MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(b->ctrl, MPI_ERRORS_RETURN);
  int r = -1;
  MPI_Comm_rank(b->comm, &r);
  if (r != pg->rank) return crun_error(CRUN_EPROTO, "backend mpi: group rank %d got MPI rank %d", pg->rank, r);
  return 0;
}

static void state_free(crun__mpi_t *b) {
  if (b) free(b->sig_out), free(b->sig_in), free(b->reqs), free(b->a2a_lay), free(b);
}

/* Allocates the per-peer arrays of a group's state. */
static crun__mpi_t *state_new(crun_pg_t *pg) {
  crun__mpi_t *b = CRUN__FAULT_CALLOC("mpi.state", 1, sizeof *b);
  if (!b) return NULL;
  size_t n = (size_t)pg->size;
  b->pg = pg, b->rank = pg->rank, b->size = pg->size;
  b->comm = b->ctrl = MPI_COMM_NULL;
  b->check = crun_env_int("CRUN_MPI_CHECK", 1) != 0;
  b->sig_out = calloc(n * CRUN__SIG_WORDS, sizeof(int64_t));
  b->sig_in = calloc(n * CRUN__SIG_WORDS, sizeof(int64_t));
  b->reqs = malloc(2 * n * sizeof(MPI_Request));
  b->a2a_lay = malloc(4 * n * sizeof(int)); /* here, not per call: see coll.c's reserve */
  snprintf(b->watch.who, sizeof b->watch.who, "%s", CRUN__WHO(pg, pg->rank));
  for (size_t p = 0; b->sig_in && p < n; p++) b->sig_in[p * CRUN__SIG_WORDS + CRUN__SIG_KIND] = -1;
  for (size_t p = 0; b->reqs && p < 2 * n; p++) b->reqs[p] = MPI_REQUEST_NULL; /* read at destroy (keep_pending) */
  if (b->sig_out && b->sig_in && b->reqs && b->a2a_lay) return b;
  state_free(b);
  return NULL;
}

static void mpi_destroy(void *state);
static void reclaim(MPI_Comm join);

static int mpi_create(crun_pg_t *pg, void **state) {
  MPI_Comm world, join;
  CRUN_CHECK(check_launch(pg));
  CRUN_CHECK(crun__mpi_up(&world, &join));
  CRUN_CHECK(check_world(pg, world));
  reclaim(join);
  /* before the handshake: once this rank confirmed, its peers enter
   * MPI_Comm_create_group, and a failure here left them there until the
   * watchdog aborted the job */
  crun__mpi_t *b = state_new(pg);
  if (!b)
    return crun_error(CRUN_ENOMEM, "creating group '%s' (backend mpi) on %s: no memory for the group's state "
                      "(%d members)", pg->prefix, CRUN__WHO(pg, pg->rank), pg->size);
  claim_t claim = {.tag = group_tag(pg, crun__mpi_tag_ub(join))};
  int rc = claim_tag(pg, &claim);
  if (rc < 0) return state_free(b), rc;
  rc = join_members(pg, join, claim.tag);
  if (rc < 0) {
    release_tag(&claim);
    state_free(b);
    if (crun__mpi_alive()) drain_joins(join); /* what of this attempt already came */
    return rc;
  }
  crun__mpi_watch_add(&b->watch);
  atomic_fetch_add(&g_groups, 1);
  b->counted = 1;
  rc = make_comms(b, world, claim.tag);
  release_tag(&claim);
  if (rc < 0) {
    mpi_destroy(b);
    return rc;
  }
  CRUN_LOG(INFO, PG, "mpi group '%s': rank %d of %d, signature check %s", pg->prefix, pg->rank, pg->size,
           b->check ? "on" : "off");
  *state = b;
  return 0;
}

/* Bytes of an abort notice kept: mpi_abort sends "<status>|" and at most
 * 2000 bytes of text. */
#define NOTICE_MAX 2048

/* Receives matched abort notice m (status st) whole, into a buffer on the
 * stack (a longer one is cut), and records the peer's error from it. */
static int take_notice(crun__mpi_t *b, MPI_Message *m, const MPI_Status *st, const char *desc) {
  char msg[NOTICE_MAX + 1] = "";
  MPI_Count n = 0;
  MPI_Get_elements_x(st, MPI_BYTE, &n);
  /* a notice (at most 2 KiB) is received whole on the stack */
  int mrc = crun__mpi_mrecv_head(m, n, msg, NOTICE_MAX, NULL);
  if (mrc != MPI_SUCCESS) msg[0] = 0;
  char *bar = strchr(msg, '|');
  int status = bar ? atoi(msg) : CRUN_EIO;
  if (status >= 0 || !strcmp(crun_err_name(status), "EUNKNOWN")) status = CRUN_EIO;
  const char *text = bar ? bar + 1 : mrc == MPI_SUCCESS ? msg : "its abort notice could not be received";
  const char *sp = strstr(text, ": ");
  if (sp && !strncmp(text, crun_err_name(status), (size_t)(sp - text))) text = sp + 2;
  b->peer_aborted = 1;
  return crun_error(status, "%s [reported by %s; %s was in %s]", text, CRUN__WHO(b->pg, st->MPI_SOURCE),
                    CRUN__WHO(b->pg, b->rank), desc);
}

/* The notice is matched (MPI_Improbe) and received with no allocation:
 * before, its buffer was calloc'd after an MPI_Iprobe, and without memory
 * the call failed with an ENOMEM of its own that hid the peer's error,
 * leaving the notice queued. */
int crun__mpi_poll_abort(crun__mpi_t *b, const char *desc) {
  int flag = 0;
  MPI_Message m;
  MPI_Status st;
  if (b->size < 2 || MPI_Improbe(MPI_ANY_SOURCE, CRUN__MPI_TAG_ABORT, b->ctrl, &flag, &m, &st) != MPI_SUCCESS ||
      !flag)
    return 0;
  return take_notice(b, &m, &st, desc);
}

int crun__mpi_poll_left(crun__mpi_t *b, int p, const char *desc) {
  int flag = 0;
  if (p == b->rank || MPI_Iprobe(p, CRUN__MPI_TAG_LEFT, b->ctrl, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
    return 0;
  return crun_error(CRUN_EPEERDIED, "%s on %s: %s destroyed the group and will not join", desc, CRUN__WHO(b->pg, b->rank), CRUN__WHO(b->pg, p));
}

/* Tells every peer that this rank destroyed the group: one empty message on
 * ctrl each (a live peer waiting for this rank's signature probes for it, so
 * it fails at once instead of at its deadline) and one on comm (tag
 * crun__mpi_tag_ub, which user messages cannot use). Each is the last this
 * rank sends on its communicator: a peer that retired the group too and has
 * received both from every rank knows that nothing more will come
 * (sweep_retired). */
static void notify_left(crun__mpi_t *b) {
  static const char none = 0;   /* the sends may outlive the group */
  int ub = crun__mpi_tag_ub(b->comm);
  for (int p = 0; p < b->size; p++) {
    MPI_Request r = MPI_REQUEST_NULL, q = MPI_REQUEST_NULL;
    if (p == b->rank) continue;
    if (MPI_Isend(&none, 0, MPI_CHAR, p, CRUN__MPI_TAG_LEFT, b->ctrl, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    if (MPI_Isend(&none, 0, MPI_CHAR, p, ub, b->comm, &q) == MPI_SUCCESS) MPI_Request_free(&q);
  }
}

/* Sends "<status>|<text>" to every peer without waiting (best effort). */
static void mpi_abort(void *state, int status, const char *text) {
  crun__mpi_t *b = state;
  if (!b || b->peer_aborted || b->abort_msg || b->size < 2 || !crun__mpi_alive()) return;
  const char *cut = strstr(text, " [reported by rank");
  int len = (int)(cut ? (size_t)(cut - text) : strlen(text));
  if (len > 2000) len = 2000;
  b->abort_msg = CRUN__FAULT_MALLOC("mpi.abort_msg", (size_t)len + 16);
  b->abort_reqs = CRUN__FAULT_MALLOC("mpi.abort_reqs", sizeof(MPI_Request) * (size_t)b->size);
  if (!b->abort_msg || !b->abort_reqs) { /* neither kept: a later abort tries again, and nothing leaks */
    const char *what = b->abort_msg ? "request array" : "message";
    free(b->abort_msg), free(b->abort_reqs);
    b->abort_msg = NULL, b->abort_reqs = NULL;
    CRUN_LOG(WARN, PG, "ENOMEM: mpi group '%s' on %s: no memory for its abort notice's %s; its peers are not "
             "told why it failed: %.*s", b->pg->prefix, CRUN__WHO(b->pg, b->rank), what, len, text);
    return;
  }
  int n = snprintf(b->abort_msg, (size_t)len + 16, "%d|%.*s", status, len, text);
  for (int p = 0; p < b->size; p++) {
    b->abort_reqs[p] = MPI_REQUEST_NULL;
    if (p != b->rank) MPI_Isend(b->abort_msg, n + 1, MPI_CHAR, p, CRUN__MPI_TAG_ABORT, b->ctrl, &b->abort_reqs[p]);
  }
}

/* Every wait of the backend polls for abort notices (crun__mpi_wait): a peer
 * of any call learns of this rank's failure while it waits. */
static int mpi_abort_reaches(void *state, const crun__coll_t *c) {
  (void)c;
  return state != NULL;
}

/* A destroyed group's communicators and its sends still in flight. MPI
 * cannot take back a message its receiver never matched (a signature sent
 * before a peer refused the call, an abort notice, a "left" notice, a user
 * send never received), and Open MPI hands such a message, when it arrives
 * after its communicator was freed, to the next communicator given the same
 * context id: a later group then read the dead group's traffic as its own
 * (EMISMATCH "rank 0 sent all_to_all #1") or, when it had fewer ranks,
 * crashed in MPI_Comm_dup (mca_pml_ob1_add_comm). So a destroyed group's
 * communicators are retired here: sweep_retired receives and drops whatever
 * still arrives on them, and frees them once every peer's two "left"
 * notices (notify_left: its last messages there) came and this rank's own
 * sends completed. A group whose peers never destroy it stays retired until
 * MPI_Finalize (holding a context id; see max_groups). */
typedef struct retired {
  MPI_Comm comm, ctrl;
  int size, rank, gone;      /* gone: peers whose both notices came */
  unsigned char *seen;       /* seen[p]: 1 = p's notice on ctrl came, 2 = on comm, 3 = both */
  MPI_Request *reqs;         /* sends still pending: 2 x nreqs, abort notices then signatures */
  int nreqs;
  void *bufs[2];             /* what they read (abort notice, signatures): freed once they completed */
  crun__mpi_send_t *sends;   /* user sends still pending (p2p.c), freed once they completed */
  int counted;               /* holds one of g_groups */
  struct retired *next;
} retired_t;

static pthread_mutex_t g_retired_lock = PTHREAD_MUTEX_INITIALIZER;
static retired_t *g_retired;

/* Receives and drops what arrived on a retired communicator (at most 64
 * messages a call), noting the peers' "left" notices (tag `left`) in seen[]
 * as `bit`. A message is received whole into a small sink
 * (crun__mpi_mrecv_head): Open MPI writes a message's full length even into
 * a receive that truncates it. (Before, a message past 2^31-1 bytes, or one
 * whose scratch copy could not be allocated, was received into NULL.) */
static void drain(retired_t *r, MPI_Comm c, int left, unsigned char bit) {
  for (int k = 0; k < 64; k++) {
    int flag = 0;
    MPI_Count n = 0;
    MPI_Message m;
    MPI_Status st;
    if (improbe_any(c, &flag, &m, &st) != MPI_SUCCESS || !flag) return;
    MPI_Get_elements_x(&st, MPI_BYTE, &n);
    crun__mpi_rx_t rx;
    int rc = crun__mpi_mrecv_head(&m, n, NULL, 0, &rx);
    if (rc != MPI_SUCCESS) lost(st.MPI_SOURCE, st.MPI_TAG, n, rc, &rx, "a message on a retired mpi group");
    if (!rx.taken) return; /* the others would fail alike: they stay queued for the next sweep */
    int p = st.MPI_SOURCE;
    if (st.MPI_TAG != left || p < 0 || p >= r->size || (r->seen[p] & bit)) continue;
    r->seen[p] |= bit;
    if (r->seen[p] == 3) r->gone++;
  }
}

/* Frees the buffers of retired r's sends once they completed; returns 1
 * when none is pending. */
static int sends_done(retired_t *r) {
  int done = 1;
  if (!r->reqs) return 1;
  if (MPI_Testall(2 * r->nreqs, r->reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || !done) return 0;
  free(r->bufs[0]), free(r->bufs[1]), free(r->reqs);
  r->bufs[0] = r->bufs[1] = NULL, r->reqs = NULL;
  return 1;
}

/* Drains every retired group and frees those every peer left whose sends
 * completed (callers hold g_retired_lock; MPI is alive). */
static void sweep_retired(void) {
  for (retired_t **q = &g_retired; *q;) {
    retired_t *r = *q;
    drain(r, r->ctrl, CRUN__MPI_TAG_LEFT, 1);
    drain(r, r->comm, crun__mpi_tag_ub(r->comm), 2);
    int idle = crun__mpi_sends_reap(&r->sends) & sends_done(r);
    if (!idle || !r->seen || r->gone < r->size - 1) {
      q = &r->next;
      continue;
    }
    *q = r->next;
    MPI_Comm_free(&r->ctrl);
    MPI_Comm_free(&r->comm);
    if (r->counted) atomic_fetch_sub(&g_groups, 1);
    free(r->seen);
    free(r);
  }
}

/* Sweeps the kept join messages, the join messages queued here and the
 * retired groups (before a group is created: frees what it can). */
static void reclaim(MPI_Comm join) {
  if (!crun__mpi_alive()) return;
  sweep_joins();
  drain_joins(join);
  pthread_mutex_lock(&g_retired_lock);
  if (g_retired) sweep_retired();
  pthread_mutex_unlock(&g_retired_lock);
}

/* How long a destroy waits for b's sends (the group's timeout, at most 10 s). */
static double send_wait(const crun__mpi_t *b) { return b->pg->timeout < 10 ? b->pg->timeout : 10; }

/* Hands the requests reqs[0..n-1] still pending to MPI (MPI_Request_free);
 * returns 1 when there was one (then their buffer must never be freed). */
static int let_go(MPI_Request *reqs, int n) {
  int pending = 0;
  for (int p = 0; reqs && p < n; p++)
    if (reqs[p] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[p]), pending = 1;
  return pending;
}

/* When there is no memory to keep b's sends still pending (its abort
 * notice, the signatures of a failed check) with a retired group: waits up
 * to send_wait(b) for them; a buffer one of them still reads then is left
 * allocated (leaked: a few bytes a peer) and its requests to MPI, so no send
 * ever reads freed memory. (Before, mpi_destroy freed the buffers under the
 * pending MPI_Isends.) */
static void settle_pending(crun__mpi_t *b) {
  int n = b->size, done_a = 1, done_s = 1;
  MPI_Request *ab = b->abort_msg ? b->abort_reqs : NULL;
  crun__mpi_spin_t spin = {0};
  double end = crun_clock() + send_wait(b);
  for (;;) {
    if (ab && MPI_Testall(n, ab, &done_a, MPI_STATUSES_IGNORE) != MPI_SUCCESS) done_a = 0;
    if (MPI_Testall(n, b->reqs + n, &done_s, MPI_STATUSES_IGNORE) != MPI_SUCCESS) done_s = 0;
    if ((done_a && done_s) || crun_clock() >= end) break;
    crun__mpi_relax(&spin);
  }
  int kept = 0;
  if (let_go(ab, n)) b->abort_msg = NULL, kept = 1;
  if (let_go(b->reqs + n, n)) b->sig_out = NULL, kept = 1;
  CRUN_LOG(WARN, PG, "ENOMEM: destroying mpi group '%s' on %s: no memory to retire its communicators; %s",
           b->pg->prefix, CRUN__WHO(b->pg, b->rank), kept ? "sends still pending keep their buffers (leaked)" : "its sends completed");
}

/* Takes b's sends still pending (its abort notice; the signatures of a
 * failed check, check.c) and their buffers into r; returns
 * 0 when none is pending (then the buffers stay with b). */
static int keep_pending(retired_t *r, crun__mpi_t *b) {
  int n = b->size, pending = 0;
  MPI_Request *q = CRUN__FAULT_MALLOC("mpi.keep_pending", sizeof(MPI_Request) * 2 * (size_t)n);
  if (!q) return settle_pending(b), 0;
  for (int p = 0; p < n; p++) {
    q[p] = b->abort_msg && b->abort_reqs ? b->abort_reqs[p] : MPI_REQUEST_NULL; /* both: mpi_abort set them */
    q[n + p] = b->reqs[n + p];
    pending |= q[p] != MPI_REQUEST_NULL || q[n + p] != MPI_REQUEST_NULL;
  }
  if (!pending) return free(q), 0;
  r->reqs = q, r->nreqs = n;
  r->bufs[0] = b->abort_msg, r->bufs[1] = b->sig_out;
  b->abort_msg = NULL, b->sig_out = NULL;
  return 1;
}

/* Moves b's communicators and pending sends to the retired list. */
static void retire(crun__mpi_t *b) {
  retired_t *r = CRUN__FAULT_CALLOC("mpi.retire", 1, sizeof *r);
  if (!r) { /* no memory: mpi_destroy frees the communicators (strays may then reach a later group) */
    settle_pending(b);
    return;
  }
  r->comm = b->comm, r->ctrl = b->ctrl;
  r->size = b->size, r->rank = b->rank;
  r->seen = calloc((size_t)b->size, 1); /* NULL (no memory): never freed, as before */
  if (r->seen) r->seen[b->rank] = 3;
  b->comm = b->ctrl = MPI_COMM_NULL;
  r->counted = b->counted, b->counted = 0;
  r->sends = b->sends, b->sends = NULL;
  keep_pending(r, b);
  pthread_mutex_lock(&g_retired_lock);
  r->next = g_retired, g_retired = r;
  sweep_retired();
  pthread_mutex_unlock(&g_retired_lock);
}

static void mpi_destroy(void *state) {
  crun__mpi_t *b = state;
  if (!b) return;
  int alive = crun__mpi_alive();
  crun__mpi_watch_remove(&b->watch);
  if (alive) crun__mpi_sends_drain(b, send_wait(b));
  MPI_Comm world, join;
  if (alive && crun__mpi_up(&world, &join) == 0) sweep_joins(), drain_joins(join);
  if (alive && b->ctrl != MPI_COMM_NULL && b->size > 1) notify_left(b);
  if (alive && b->comm != MPI_COMM_NULL && b->size > 1) retire(b);
  if (alive && b->ctrl != MPI_COMM_NULL) MPI_Comm_free(&b->ctrl); /* one rank: nothing can be in flight */
  if (alive && b->comm != MPI_COMM_NULL) MPI_Comm_free(&b->comm);
  if (b->counted) atomic_fetch_sub(&g_groups, 1);
  for (crun__mpi_send_t *s = b->sends; alive && s; s = s->next) /* not retired (no memory): MPI finishes them, */
    MPI_Request_free(&s->req);                                    /* their memory stays (MPI may read it) */
  free(b->abort_msg), free(b->abort_reqs);
  free(b->stage[0]), free(b->stage[1]);
  free(b->sig_out), free(b->sig_in), free(b->reqs), free(b->a2a_lay);
  free(b);
}

const crun_backend_vtable_t crun__backend_mpi = {
    .name = "mpi", .create = mpi_create, .abort = mpi_abort, .destroy = mpi_destroy,
    .abort_reaches = mpi_abort_reaches, .private_board = 1,
    .send = crun__mpi_send, .recv = crun__mpi_recv, .broadcast = crun__mpi_coll,
    .all_reduce = crun__mpi_coll, .reduce = crun__mpi_coll, .all_gather = crun__mpi_coll,
    .gather = crun__mpi_coll, .scatter = crun__mpi_coll, .reduce_scatter = crun__mpi_coll,
    .all_to_all = crun__mpi_coll, .barrier = crun__mpi_coll};

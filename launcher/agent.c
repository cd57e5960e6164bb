/* agent.c — the node agent: node 0 serves the TCP store in-process; on
 * multi-node jobs every node's agent meets the others on that store.
 * Static rendezvous (--node-rank): node 0 serves at --master-addr:port.
 * c10d (--rdzv-backend c10d): the first agent to bind --rdzv-endpoint serves
 * the store there (until every client has left: other jobs may use it), the
 * others connect; rdzv.c forms the round and assigns node ranks; the attempt
 * keys below then live under "crun/rdzv/<run id>/".
 *
 * Keys (all under "crun/launch/", or the c10d prefix):
 *   node/<r>            "<nproc> <role> <host> <pid>" of node r, set once when it
 *                       joins (host and pid tell a second agent with the same
 *                       --node-rank from the first)
 *   attempt/<k>/joined  counter; the last node to arrive sets attempt/<k>/go
 *   attempt/<k>/failed  "<node>:<code>" of the first node whose workers failed
 *   attempt/<k>/done    counter; the last node to finish sets attempt/<k>/alldone
 *   attempt/<k>/ack/<r> node r (not 0) is past that barrier; node 0 waits for
 *                       every ack before it may stop the store
 *   left                "<node> <host> <pid>" of the first node whose crun-lua
 *                       ended before the job succeeded (a signal, an error, its
 *                       --max-restarts spent): the others stop waiting for it
 * While attempt k runs, a watcher thread (with its own connection) waits for
 * attempt/<k>/failed and wakes the supervise loop through a pipe, so a failure
 * on any node stops the workers of every node. It does the same when the
 * store goes away (node 0 died).
 * Shutdown: at the job's end node 0 keeps serving until every other node has
 * closed its connections (at most LINGER s), after their acks: a node's last
 * set (its ack, sent without waiting) is confirmed by one more round trip when
 * it closes its client, and a store stopped in between would cut that short
 * (a WARN ECONNRESET on a job that succeeded). A node whose job succeeded
 * closes its clients right after its ack, so it writes nothing after that.
 *
 * c10d jobs are elastic: each attempt is one rendezvous round R (rdzv.c),
 * with these keys under "crun/rdzv/<run id>/<R>/":
 *   hb/<node>   counter each agent of the round adds to every beat
 *               (heartbeat_timeout / 4, at most 1 s); a member whose counter
 *               has not moved for heartbeat_timeout (by the observer's own
 *               clock: nothing compares clocks of two hosts) is lost
 *   failed      "<node> <code>" of the first node whose workers failed
 *   change      why the membership changed: a node lost, or nodes waiting
 *               to join (joined > closed while the round is below MAX)
 *   end/<node>  the node's exit code for the round, once its workers ended
 *   gone/<node> set by a member whose crun-lua ends before the job did (a
 *               signal, an error): the others count it lost at once rather
 *               than after heartbeat_timeout
 *   verdict     how the round ended (see rdzv.c), set by the first agent
 *               that sees every member ended or lost
 * The watcher thread beats and polls those; any of failed, change, a lost
 * member or a waiting node stops this node's workers. The verdict then says
 * what follows: the job is done, it failed, or round R + 1 opens with the
 * survivors and the waiting nodes (a worker failure counts against
 * --max-restarts there, a membership change does not). */
#include "launcher.h"
#include "store/store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEY_PREFIX "crun/launch/"
#define WATCH_SLICE 0.25
#define LEFT_GRACE 2.0 /* s: a killed node's peers report their own errors first */
#define SLICE 1.0
#define LINGER 10.0 /* s: after every node's ack, node 0 serves until the others closed their clients */

struct crun__agent {
  const crun__opts_t *o;
  const char *host;            /* where the store is: --master-addr or the c10d endpoint */
  int node_rank, nnodes;       /* from --node-rank/--nnodes, or the c10d round */
  char prefix[CRUN_LAUNCH_RUN_ID_MAX + 16];
  crun_store_server_t *server; /* node 0 only */
  pid_t server_pid;            /* node 0 of a TSan build: the store's own process */
  crun_store_t *store;         /* multi-node: the agent's client */
  crun_store_t *watch_store;   /* multi-node: the watcher's client */
  int fail_pipe[2];
  pthread_t watcher;
  int watching;
  atomic_int stop_watch;
  int attempt;
  int port;
  int joined;                  /* static: this agent holds its node rank (join() took it) */
  int succeeded;               /* static: every node's workers succeeded */
  int acked;                   /* static, node 0: every node acknowledged the last attempt's end */
  /* c10d */
  int round;                   /* the round this node runs */
  int restarts;                /* worker failures restarted so far (the verdicts') */
  crun__node_t *members;       /* the round's nodes, by node rank */
  int64_t *seen;               /* each member's last heartbeat count seen ... */
  double *seen_at;             /* ... and when it last moved (own clock) */
  char *gone;                  /* each member's gone/<node> seen */
  int done;                    /* the job succeeded (a "done" verdict) */
  double last_beat;
  /* why the watcher stopped the workers: written by the watcher thread, read
   * by the supervise loop once the wake-up pipe is readable, both under
   * wake_mu (the pipe alone orders nothing in C's memory model, and
   * ThreadSanitizer reported the read against the watcher's write) */
  pthread_mutex_t wake_mu;
  char wake[CRUN_VERDICT_MAX];
};

/* Sets a->wake (under wake_mu). */
__attribute__((format(printf, 2, 3))) static void set_wake(crun__agent_t *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&a->wake_mu);
  vsnprintf(a->wake, sizeof a->wake, fmt, ap);
  pthread_mutex_unlock(&a->wake_mu);
  va_end(ap);
}

/* The text of the last error without its leading "ENAME: ". */
static const char *bare_error(void) {
  const char *e = crun_last_error(), *sep = strstr(e, ": ");
  return sep && sep - e < 16 ? sep + 2 : e;
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
/* ThreadSanitizer cannot follow a fork from a process that has threads: a
 * child keeps the parent's threads in its registry and dies at its first
 * pthread_create ("dup thread with used id"). LeakSanitizer in a child
 * forked beside a running thread cannot see that thread's stack, and
 * reports the blocks only it pointed to (the store server's replies in
 * flight) as leaks of the worker. A sanitizer build therefore serves
 * the store from a forked process of its own, so that the launcher has no
 * thread when it forks the workers. The process starts the server, reports
 * (status, port, error text) through a pipe, then waits for SIGTERM (blocked
 * in the launcher, so inherited blocked) and dies with the launcher. A c10d
 * endpoint's process is told to drain instead (SIGUSR1): it serves until the
 * other runs' clients have left, as serve_others does in-process; node 0 of
 * a static job that every node acknowledged drains the same way, for at
 * most LINGER s, as linger does in-process. */
typedef struct { int rc, port; char err[256]; } served_t;

/* In the store's process: serves until SIGTERM, or after SIGUSR1 until no
 * client is left (or SIGTERM, or `limit` s when limit >= 0); never returns. */
static void store_process(const char *host, int port, double limit, int wfd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  sigset_t sigs, term;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  sigprocmask(SIG_BLOCK, &sigs, NULL); /* before the report: the launcher signals only after it */
  served_t r = {0};
  crun_store_server_t *srv = NULL;
  r.rc = crun_store_server_start(host, port, &srv);
  if (r.rc == 0) r.port = crun_store_server_port(srv);
  else snprintf(r.err, sizeof r.err, "%s", crun_last_error());
  if (write(wfd, &r, sizeof r) != (ssize_t)sizeof r || r.rc < 0) _exit(1);
  close(wfd);
  int sig = 0;
  sigwait(&sigs, &sig);
  if (sig == SIGUSR1) {
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    double said = limit < 0 ? crun_clock() + 1.0 : -1, end = crun_clock() + limit;
    const struct timespec slice = {0, 5 * 1000 * 1000};
    int n;
    while ((n = crun__store_server_clients(srv)) > 0 && (limit < 0 || crun_clock() < end) &&
           sigtimedwait(&term, NULL, &slice) != SIGTERM) {
      if (said > 0 && crun_clock() >= said) {
        fprintf(stderr, "crun-lua: still serving the rendezvous store at %s:%d for %d connection(s) "
                        "(other nodes or runs) until they leave (Ctrl-C stops it)\n", host, r.port, n);
        said = -1;
      }
    }
  }
  crun_store_server_stop(srv);
  _exit(0);
}

/* Forks the store's process and reads its report (crun_store_server_start's
 * status, with its error text recorded here). */
static int start_server(crun__agent_t *a, const char *host, int port) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return crun_error(CRUN_ESYS, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return crun_error(CRUN_ESYS, "fork of the store process: %s", strerror(errno));
  }
  if (pid == 0) store_process(host, port, a->o->c10d ? -1.0 : LINGER, p[1]);
  close(p[1]);
  a->server_pid = pid;
  served_t r = {.rc = CRUN_ESYS};
  ssize_t n;
  while ((n = read(p[0], &r, sizeof r)) < 0 && errno == EINTR) {}
  close(p[0]);
  if (n != (ssize_t)sizeof r || r.rc < 0) { /* it exits: reap it */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    a->server_pid = 0;
    if (n != (ssize_t)sizeof r) return crun_error(CRUN_ESYS, "the store process died before serving");
    return crun_error(r.rc, "%s", r.err);
  }
  a->port = r.port;
  return 0;
}

/* Stops the store's process (SIGTERM, then reaps it unless the supervise
 * loop already did). A c10d endpoint's process, and node 0's of a static job
 * every node acknowledged, drain first: SIGUSR1, then it ends when the other
 * clients have left (static: within LINGER s); a signal to the launcher cuts
 * that short with SIGTERM. */
static void stop_server(crun__agent_t *a) {
  if (a->server) crun_store_server_stop(a->server); /* a c10d endpoint served in-process */
  a->server = NULL;
  if (a->server_pid <= 0) return;
  if ((a->o->c10d || a->acked) && kill(a->server_pid, SIGUSR1) == 0) {
    pid_t got;
    while ((got = waitpid(a->server_pid, NULL, WNOHANG)) == 0 && !crun__signals_pending()) usleep(20000);
    if (got == a->server_pid || (got < 0 && errno == ECHILD)) {
      a->server_pid = 0;
      return;
    }
  }
  kill(a->server_pid, SIGTERM);
  while (waitpid(a->server_pid, NULL, 0) < 0 && errno == EINTR) {}
  a->server_pid = 0;
}
#else
/* Starts the store server on this process's loop thread. */
static int start_server(crun__agent_t *a, const char *host, int port) {
  int rc = crun_store_server_start(host, port, &a->server);
  if (rc == 0) a->port = crun_store_server_port(a->server);
  return rc;
}

static void stop_server(crun__agent_t *a) {
  if (a->server) crun_store_server_stop(a->server);
  a->server = NULL;
}
#endif

/* Starts the store server of node 0 on --master-addr:--master-port. */
static int serve_store(crun__agent_t *a) {
  const crun__opts_t *o = a->o;
  int rc = start_server(a, o->master_addr, o->master_port);
  if (rc == CRUN_EADDRINUSE)
    return crun_error(rc, "cannot serve the store on %s:%d: the address is already in use "
                          "(another job?); choose another --master-port, or 0 for a free one",
                      o->master_addr, o->master_port);
  if (rc < 0) return crun_error(rc, "cannot serve the store on %s:%d: %s", o->master_addr,
                                o->master_port, bare_error());
  return 0;
}

/* Connects one client to node 0's store, retrying until the rendezvous
 * deadline (in one-second tries, so that Ctrl-C ends the wait). A wrong
 * secret and a host name that does not exist (EINVAL) fail at once. */
static int connect_store(crun__agent_t *a, crun_store_t **out) {
  const crun__opts_t *o = a->o;
  double timeout = o->c10d ? o->join_timeout : o->rdzv_timeout;
  crun_store_tcp_opts_t to = {.host = a->host, .port = a->port, .timeout = timeout,
                              .connect_timeout = SLICE};
  double deadline = crun_clock() + timeout;
  int rc;
  while ((rc = crun_store_tcp_new(&to, out)) < 0 && rc != CRUN_EACCES && rc != CRUN_EINVAL &&
         crun_clock() < deadline) {
    if (crun__signals_pending()) return crun_error(CRUN_EINTR, "rendezvous: interrupted by a signal");
    struct timespec pause = {0, 50 * 1000000L}; /* a try that failed at once (no route) is not a busy loop */
    nanosleep(&pause, NULL);
  }
  if (rc == CRUN_EINVAL && o->c10d)
    return crun_error(rc, "rendezvous '%s': --rdzv-endpoint %s: %s", o->run_id, a->host, bare_error());
  if (rc == CRUN_EINVAL)
    return crun_error(rc, "node %d: --master-addr %s: %s", o->node_rank, a->host, bare_error());
  if (rc < 0 && o->c10d)
    return crun_error(rc, "rendezvous '%s': cannot reach the store at %s:%d within %g s: %s", o->run_id,
                      a->host, a->port, timeout, bare_error());
  if (rc < 0)
    return crun_error(rc, "node %d cannot reach the store of node 0 at %s:%d within %g s: %s",
                      o->node_rank, a->host, a->port, timeout, bare_error());
  return 0;
}

/* Formats the agent's key prefix + the rest into buf. */
static const char *akey(const crun__agent_t *a, char *buf, size_t n, const char *fmt, int x) {
  int o = snprintf(buf, n, "%s", a->prefix);
  snprintf(buf + o, n - (size_t)o, fmt, x);
  return buf;
}
#define key(buf, n, fmt, x) akey(a, buf, n, fmt, x) /* every caller holds its agent in `a` */

/* Registers this node; fails when another node took the same node rank. */
static int join(crun__agent_t *a) {
  char k[160], val[200], host[64] = "?";
  gethostname(host, sizeof host - 1);
  host[strcspn(host, " \t\n")] = 0;
  int len = snprintf(val, sizeof val, "%d %s %s %ld", a->o->nproc, a->o->role, host[0] ? host : "?",
                     (long)getpid());
  crun_buf_t got = {0};
  int rc = crun_store_compare_set(a->store, key(k, sizeof k, "node/%d", a->o->node_rank), "", 0, val,
                                  (size_t)len, &got);
  if (rc < 0) return crun_error(rc, "rendezvous: joining as node %d: %s", a->o->node_rank, bare_error());
  int same = got.len == (size_t)len && memcmp(got.data, val, (size_t)len) == 0;
  if (!same)
    rc = crun_error(CRUN_EINVAL, "rendezvous: node rank %d joined twice: the node of '%.*s' (<workers> <role> "
                                   "<host> <pid>) has it already (two crun-lua with the same --node-rank?)",
                      a->o->node_rank, (int)(got.len < 120 ? got.len : 120), (const char *)got.data);
  crun_buf_free(&got);
  return same ? 0 : rc;
}

/* crun_store_wait in slices until `timeout`, returning CRUN_EINTR early when
 * SIGINT/SIGTERM/SIGHUP is pending (they are blocked while the agent waits). */
static int wait_sliced(crun_store_t *st, const char **keys, size_t n, double timeout) {
  double deadline = crun_clock() + timeout;
  for (;;) {
    double left = deadline - crun_clock();
    int rc = crun_store_wait(st, keys, n, left < SLICE ? (left > 0.001 ? left : 0.001) : SLICE);
    if (rc != CRUN_ETIMEDOUT) return rc;
    if (crun__signals_pending()) return crun_error(CRUN_EINTR, "interrupted by a signal");
    if (crun_clock() >= deadline) return rc;
  }
}

/* Names the nodes whose keys are missing, for the timeout message. */
static void missing_nodes(crun__agent_t *a, char *out, size_t n) {
  size_t o = 0;
  out[0] = 0;
  for (int r = 0; r < a->nnodes && o + 16 < n; r++) {
    char k[160];
    const char *kp = key(k, sizeof k, "node/%d", r);
    int exists = 0;
    if (crun_store_check(a->store, &kp, 1, &exists) == 0 && !exists)
      o += (size_t)snprintf(out + o, n - o, "%s%d", o ? ", " : "", r);
  }
}

/* Waits for every node, then places this node's ranks after the lower nodes'. */
static int meet(crun__agent_t *a, crun__placement_t *base) {
  const crun__opts_t *o = a->o;
  int nn = o->nnodes, rc = 0;
  char (*keys)[160] = calloc((size_t)nn, sizeof *keys);
  const char **kp = calloc((size_t)nn, sizeof *kp);
  crun_buf_t *vals = calloc((size_t)nn, sizeof *vals);
  crun__node_t *nodes = calloc((size_t)nn, sizeof *nodes);
  if (!keys || !kp || !vals || !nodes) { rc = crun_error(CRUN_ENOMEM, "rendezvous: out of memory"); goto out; }
  for (int r = 0; r < nn; r++) kp[r] = key(keys[r], sizeof keys[r], "node/%d", r);
  rc = wait_sliced(a->store, kp, (size_t)nn, o->rdzv_timeout);
  if (rc == CRUN_ETIMEDOUT) {
    char miss[512];
    missing_nodes(a, miss, sizeof miss);
    rc = crun_error(rc, "rendezvous at %s:%d: node(s) %s of %d did not join within %g s "
                        "(start crun-lua --nnodes %d --node-rank R on each node)",
                    a->host, a->port, miss, nn, o->rdzv_timeout, nn);
    goto out;
  }
  if (rc < 0 || (rc = crun_store_multi_get(a->store, kp, (size_t)nn, vals)) < 0) {
    rc = crun_error(rc, "rendezvous at %s:%d: %s", a->host, a->port, bare_error());
    goto out;
  }
  for (int r = 0; r < nn; r++) {
    char text[96] = {0};
    memcpy(text, vals[r].data, vals[r].len < sizeof text - 1 ? vals[r].len : sizeof text - 1);
    if (sscanf(text, "%d %63s", &nodes[r].nproc, nodes[r].role) != 2 || nodes[r].nproc <= 0 ||
        nodes[r].nproc > CRUN_LAUNCH_MAX_NPROC) { /* so that no sum of them overflows */
      rc = crun_error(CRUN_EPROTO, "rendezvous: node %d registered '%s', not '<workers> <role>'", r, text);
      goto out;
    }
  }
  crun__round_t round;
  crun__round_place(nodes, nn, o->node_rank, &round);
  base->rank = round.rank_base;
  base->world_size = round.world_size;
  base->role_rank = round.role_rank_base;
  base->role_world_size = round.role_world_size;
out:
  for (int r = 0; vals && r < nn; r++) crun_buf_free(&vals[r]);
  free(keys);
  free(kp);
  free(vals);
  free(nodes);
  return rc;
}

/* c10d: serves the endpoint when it is free here; when another process
 * serves it (or the address is not this host's) the agent only connects. */
static void try_serve(crun__agent_t *a) {
  if (start_server(a, a->host, a->port) < 0)
    CRUN_LOG(INFO, LAUNCH, "rendezvous '%s': not serving %s:%d (%s); connecting to it", a->o->run_id,
             a->host, a->port, crun_last_error());
}

/* c10d: joins round `round` (< 0: the job's current one), takes its
 * placement, and resets the members' heartbeat records. Node 0 says how
 * the round closed: round 0 as torchrun's rendezvous, later ones with why
 * they opened. */
static int c10d_round(crun__agent_t *a, int round, crun__placement_t *base) {
  const crun__opts_t *o = a->o;
  crun__round_t r;
  CRUN_CHECK(crun__rdzv_join(o, a->store, round, &r));
  free(a->members);
  free(a->seen);
  free(a->seen_at);
  free(a->gone);
  a->members = r.nodes;
  a->seen = calloc((size_t)r.nnodes, sizeof *a->seen);
  a->seen_at = calloc((size_t)r.nnodes, sizeof *a->seen_at);
  a->gone = calloc((size_t)r.nnodes, 1);
  if (!a->seen || !a->seen_at || !a->gone) return crun_error(CRUN_ENOMEM, "rendezvous: out of memory");
  double now = crun_clock();
  for (int m = 0; m < r.nnodes; m++) {
    a->seen[m] = -1;
    a->seen_at[m] = now;
  }
  a->round = r.round;
  a->restarts = r.restarts;
  a->node_rank = r.node_rank;
  a->nnodes = r.nnodes;
  a->last_beat = -1;
  *base = (crun__placement_t){.rank = r.rank_base, .world_size = r.world_size,
                              .local_world_size = o->nproc, .group_rank = r.node_rank,
                              .group_world_size = r.nnodes, .role_rank = r.role_rank_base,
                              .role_world_size = r.role_world_size, .master_addr = a->host,
                              .master_port = a->port, .restart_count = r.restarts, .round = r.round};
  if (a->node_rank == 0 && r.round == 0)
    fprintf(stderr, "crun-lua: rendezvous '%s' at %s:%d closed: %d node(s), world size %d\n",
            o->run_id, a->host, a->port, a->nnodes, base->world_size);
  else if (a->node_rank == 0)
    fprintf(stderr, "crun-lua: rendezvous '%s' round %d: %d node(s), world size %d (%s)\n", o->run_id,
            r.round, a->nnodes, base->world_size, r.why);
  CRUN_LOG(INFO, LAUNCH, "round %d: node %d of %d, ranks %d..%d of %d", r.round, a->node_rank, a->nnodes,
           base->rank, base->rank + o->nproc - 1, base->world_size);
  return 0;
}

/* c10d: meets the other nodes of the run id at the endpoint (rdzv.c). */
static int c10d_meet(crun__agent_t *a, crun__placement_t *base) {
  try_serve(a);
  CRUN_CHECK(connect_store(a, &a->store));
  CRUN_CHECK(connect_store(a, &a->watch_store));
  return c10d_round(a, -1, base);
}

int crun__agent_start(const crun__opts_t *o, crun__placement_t *base, crun__agent_t **out) {
  crun__agent_t *a = calloc(1, sizeof *a);
  if (!a) return crun_error(CRUN_ENOMEM, "out of memory");
  a->o = o;
  pthread_mutex_init(&a->wake_mu, NULL);
  a->fail_pipe[0] = a->fail_pipe[1] = -1;
  a->host = o->c10d ? o->rdzv_host : o->master_addr;
  a->port = o->c10d ? o->rdzv_port : o->master_port;
  a->node_rank = o->node_rank;
  a->nnodes = o->nnodes;
  if (o->c10d) snprintf(a->prefix, sizeof a->prefix, "crun/rdzv/%s/", o->run_id);
  else snprintf(a->prefix, sizeof a->prefix, "%s", KEY_PREFIX);
  *base = (crun__placement_t){.rank = 0, .world_size = o->nproc, .local_world_size = o->nproc,
                              .group_rank = o->node_rank, .group_world_size = o->nnodes,
                              .role_world_size = o->nproc, .master_addr = a->host};
  int rc = 0;
  if (pipe2(a->fail_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
    rc = crun_error(CRUN_ESYS, "pipe: %s", strerror(errno));
  if (rc == 0 && o->c10d) {
    rc = c10d_meet(a, base);
  } else if (rc == 0) {
    rc = o->node_rank == 0 ? serve_store(a) : 0;
    if (rc == 0 && o->nnodes > 1) {
      if (rc == 0) rc = connect_store(a, &a->store);
      if (rc == 0) rc = connect_store(a, &a->watch_store);
      if (rc == 0) rc = join(a);
      a->joined = rc == 0;
      if (rc == 0) rc = meet(a, base);
    }
  }
  base->master_port = a->port;
  if (rc < 0) {
    crun__agent_stop(a);
    return rc;
  }
  CRUN_LOG(INFO, LAUNCH, "node %d of %d: ranks %d..%d of %d, store %s:%d", a->node_rank, a->nnodes,
           base->rank, base->rank + o->nproc - 1, base->world_size, a->host, a->port);
  *out = a;
  return 0;
}

/* Whether the agent takes part in a protocol with other nodes: static jobs
 * of several nodes, and every c10d job (a node may join or leave). */
static int multi(const crun__agent_t *a) { return a->o->c10d || a->nnodes > 1; }

/* c10d: the current round's key fmt (with x) into buf. */
static const char *rk(const crun__agent_t *a, char *buf, size_t n, const char *fmt, long long x) {
  return crun__rdzv_key(buf, n, a->o, a->round, fmt, x);
}

/* c10d: seconds between two beats of this node's heartbeat. */
static double beat_interval(const crun__opts_t *o) {
  double i = o->heartbeat_timeout / 4;
  return i < 1.0 ? i : 1.0;
}

/* c10d: adds a beat to this node's heartbeat counter when one is due. */
static int beat(crun__agent_t *a, crun_store_t *st) {
  double now = crun_clock();
  if (a->last_beat >= 0 && now - a->last_beat < beat_interval(a->o)) return 0;
  char k[200];
  int64_t v;
  CRUN_CHECK(crun_store_add(st, rk(a, k, sizeof k, "hb/%lld", a->node_rank), 1, &v));
  a->last_beat = now;
  return 0;
}

/* c10d: looks at member m's heartbeat; *quiet 1 when it said it left
 * (gone/<m>) or its heartbeat has not moved for heartbeat_timeout since this
 * agent began to look. */
static int silent(crun__agent_t *a, crun_store_t *st, int m, int *quiet) {
  char k[200];
  int64_t v = 0;
  if (!a->gone[m]) {
    const char *kp = rk(a, k, sizeof k, "gone/%lld", m);
    int found = 0;
    CRUN_CHECK(crun_store_check(st, &kp, 1, &found));
    a->gone[m] = (char)found;
  }
  CRUN_CHECK(crun_store_add(st, rk(a, k, sizeof k, "hb/%lld", m), 0, &v));
  double now = crun_clock();
  if (v != a->seen[m]) {
    a->seen[m] = v;
    a->seen_at[m] = now;
  }
  *quiet = a->gone[m] || now - a->seen_at[m] >= a->o->heartbeat_timeout;
  return 0;
}

/* "node 2 (h2, pid 77)" for member m. */
static void node_name(const crun__agent_t *a, int m, char *buf, size_t n) {
  snprintf(buf, n, "node %d (%s, pid %ld)", m, a->members[m].host, a->members[m].pid);
}

/* "node 2 (h2, pid 77) lost: no heartbeat for 3 s", or "... left the job:
 * its crun-lua ended" for a member that said so (gone/<m>). */
static void node_lost(const crun__agent_t *a, int m, char *buf, size_t n) {
  char name[160];
  node_name(a, m, name, sizeof name);
  if (a->gone[m]) snprintf(buf, n, "%s left the job: its crun-lua ended", name);
  else snprintf(buf, n, "%s lost: no heartbeat for %g s", name, a->o->heartbeat_timeout);
}

/* Reads key as text into buf when it exists (*found). */
static int get_text(crun_store_t *st, const char *key, char *buf, size_t n, int *found) {
  buf[0] = 0;
  CRUN_CHECK(crun_store_check(st, &key, 1, found));
  if (!*found) return 0;
  crun_buf_t b = {0};
  CRUN_CHECK(crun_store_get(st, key, &b));
  size_t len = b.len < n - 1 ? b.len : n - 1;
  memcpy(buf, b.data, len);
  buf[len] = 0;
  crun_buf_free(&b);
  return 0;
}

/* Sets key to text unless it holds something already. */
static int set_once(crun_store_t *st, const char *key, const char *text) {
  crun_buf_t got = {0};
  int rc = crun_store_compare_set(st, key, "", 0, text, strlen(text), &got);
  crun_buf_free(&got);
  return rc;
}

/* c10d: one look of the watcher at the round: beats, then returns 1 with
 * the reason in a->wake when this node's workers must stop (a failure
 * elsewhere, a membership change, a node waiting to join, a lost member). */
static int c10d_look(crun__agent_t *a, crun_store_t *st) {
  const crun__opts_t *o = a->o;
  char k[200], text[CRUN_VERDICT_MAX];
  int found = 0;
  CRUN_CHECK(beat(a, st));
  CRUN_CHECK(get_text(st, rk(a, k, sizeof k, "failed", 0), text, sizeof text, &found));
  if (found) {
    int node = -1, code = 0;
    sscanf(text, "%d %d", &node, &code);
    set_wake(a, "the workers of node %d failed (exit code %d)", node, code);
    return 1;
  }
  CRUN_CHECK(get_text(st, rk(a, k, sizeof k, "change", 0), text, sizeof text, &found));
  if (!found) {
    int64_t joined = 0;
    CRUN_CHECK(crun_store_add(st, rk(a, k, sizeof k, "joined", 0), 0, &joined));
    if (joined > a->nnodes && a->nnodes < o->nnodes) {
      snprintf(text, sizeof text, "%lld node(s) waiting to join", (long long)(joined - a->nnodes));
      found = 1;
    }
    for (int m = 0; !found && m < a->nnodes; m++) {
      int quiet = 0;
      if (m != a->node_rank) CRUN_CHECK(silent(a, st, m, &quiet));
      if (!quiet) continue;
      node_lost(a, m, text, sizeof text);
      found = 1;
    }
    if (found) CRUN_CHECK(set_once(st, rk(a, k, sizeof k, "change", 0), text));
  }
  if (found) set_wake(a, "%s", text);
  return found;
}

/* The watcher thread of c10d jobs: looks at the round every slice; once it
 * woke the supervise loop it only beats, so that stopping the workers (up
 * to the grace period) does not make this node look lost. */
static void *watch_c10d(void *arg) {
  crun__agent_t *a = arg;
  double slice = beat_interval(a->o) < WATCH_SLICE ? beat_interval(a->o) : WATCH_SLICE;
  int woke = 0, store_ok = 1;
  while (!atomic_load(&a->stop_watch)) {
    if (woke) {
      if (store_ok && beat(a, a->watch_store) < 0) store_ok = 0;
      usleep((useconds_t)(slice * 1e6));
      continue;
    }
    int rc = c10d_look(a, a->watch_store);
    if (rc == 0) {
      usleep((useconds_t)(slice * 1e6));
      continue;
    }
    if (rc < 0) {
      set_wake(a, "lost the rendezvous store: %s", crun_last_error());
      store_ok = 0;
    }
    if (write(a->fail_pipe[1], "!", 1) < 0) CRUN_LOG(WARN, LAUNCH, "wake-up pipe: %s", strerror(errno));
    woke = 1;
  }
  return NULL;
}

/* Static: says in a->wake which node failed the attempt, from its failed key
 * "<node>:<code>" (or "<node>:left"). */
static void name_failure(crun__agent_t *a, const char *failed) {
  int node = -1;
  char what[16] = "";
  if (sscanf(failed, "%d:%15s", &node, what) != 2) set_wake(a, "another node failed (it said '%s')", failed);
  else if (!strcmp(what, "left")) set_wake(a, "node %d left the job", node);
  else set_wake(a, "the workers of node %d failed (exit code %s)", node, what);
}

/* The watcher thread: wakes the supervise loop when attempt k failed anywhere. */
static void *watch_main(void *arg) {
  crun__agent_t *a = arg;
  char k[160], lk[160], who[160];
  const char *kp = key(k, sizeof k, "attempt/%d/failed", a->attempt);
  key(lk, sizeof lk, "left", 0);
  double left_at = -1;
  while (!atomic_load(&a->stop_watch)) {
    int rc = crun_store_wait(a->watch_store, &kp, 1, WATCH_SLICE);
    int found = 0;
    if (rc == CRUN_ETIMEDOUT && get_text(a->watch_store, lk, who, sizeof who, &found) == 0 && found) {
      /* a node's crun-lua was killed (its watchdog said so): the workers
       * that talk to its ranks fail by themselves at once, with their own
       * errors; those that do not are stopped after LEFT_GRACE */
      if (left_at < 0) left_at = crun_clock();
      if (crun_clock() - left_at < LEFT_GRACE) continue;
      set_wake(a, "node %s (<node> <host> <pid>) left the job", who);
      if (write(a->fail_pipe[1], "!", 1) < 0) CRUN_LOG(WARN, LAUNCH, "wake-up pipe: %s", strerror(errno));
      break;
    }
    if (rc == CRUN_ETIMEDOUT) continue;
    char failed[32];
    if (rc < 0) CRUN_LOG(WARN, LAUNCH, "lost the store of node 0: %s", crun_last_error());
    if (rc < 0) set_wake(a, "%s", "lost the store of node 0");
    else if (get_text(a->watch_store, kp, failed, sizeof failed, &found) == 0 && found) name_failure(a, failed);
    else set_wake(a, "%s", "another node failed or went away");
    if (write(a->fail_pipe[1], "!", 1) < 0) CRUN_LOG(WARN, LAUNCH, "wake-up pipe: %s", strerror(errno));
    break;
  }
  return NULL;
}

/* Waits (at most `timeout`) for `flag` in slices, ending early with
 * CRUN_EINTR on a pending signal and with CRUN_EPEERDIED (naming it) when a
 * node left the job, which would never arrive. */
static int wait_or_left(crun__agent_t *a, const char *flag, double timeout, const char *what) {
  double deadline = crun_clock() + timeout;
  char k[160], who[160];
  const char *lk = key(k, sizeof k, "left", 0);
  for (;;) {
    double left = deadline - crun_clock();
    int rc = crun_store_wait(a->store, &flag, 1, left < SLICE ? (left > 0.001 ? left : 0.001) : SLICE);
    if (rc != CRUN_ETIMEDOUT) return rc;
    int found = 0;
    if (get_text(a->store, lk, who, sizeof who, &found) == 0 && found)
      return crun_error(CRUN_EPEERDIED, "%s: node %s (<node> <host> <pid>) left the job (its crun-lua ended: "
                        "a signal, an error, or its --max-restarts spent); not waiting for it", what, who);
    if (crun__signals_pending()) return crun_error(CRUN_EINTR, "interrupted by a signal");
    if (crun_clock() >= deadline) return rc;
  }
}

/* Adds one to counter `ck`; the last of nnodes sets `flag`; then everyone
 * waits for `flag`, in slices so that SIGINT/SIGTERM end the wait, and a
 * node that left the job ends it too. */
static int node_barrier(crun__agent_t *a, const char *ck, const char *flag, const char *what) {
  const crun__opts_t *o = a->o;
  int64_t n = 0;
  int rc = crun_store_add(a->store, ck, 1, &n);
  if (rc == 0 && n == a->nnodes) rc = crun_store_set(a->store, flag, "1", 1);
  if (rc == 0) rc = wait_or_left(a, flag, o->rdzv_timeout, what);
  if (rc == CRUN_EPEERDIED || rc == CRUN_EINTR) return rc;
  if (rc == CRUN_ETIMEDOUT) {
    crun_store_add(a->store, ck, 0, &n);
    return crun_error(rc, "%s: only %lld of %d nodes arrived within %g s", what, (long long)n,
                      a->nnodes, o->rdzv_timeout);
  }
  if (rc < 0) return crun_error(rc, "%s: %s", what, bare_error());
  return 0;
}

int crun__agent_begin_attempt(crun__agent_t *a, int attempt, crun__placement_t *base) {
  set_wake(a, "%s", "");
  a->acked = 0;
  if (a->o->c10d) {
    if (attempt > 0) CRUN_CHECK(c10d_round(a, a->round + 1, base));
    a->attempt = attempt;
    return 0;
  }
  base->restart_count = attempt;
  if (a->nnodes == 1) return 0;
  char ck[160], flag[160], what[64];
  snprintf(what, sizeof what, "attempt %d on node %d", attempt, a->node_rank);
  CRUN_CHECK(node_barrier(a, key(ck, sizeof ck, "attempt/%d/joined", attempt),
                          key(flag, sizeof flag, "attempt/%d/go", attempt), what));
  a->attempt = attempt;
  return 0;
}

int crun__agent_watch(crun__agent_t *a) {
  if (!a || !multi(a) || a->watching) return 0;
  atomic_store(&a->stop_watch, 0);
  if (pthread_create(&a->watcher, NULL, a->o->c10d ? watch_c10d : watch_main, a) != 0)
    return crun_error(CRUN_ESYS, "attempt %d on node %d: cannot start the watcher thread", a->attempt,
                      a->node_rank);
  a->watching = 1;
  return 0;
}

void crun__agent_wake_reason(crun__agent_t *a, char *buf, size_t n) {
  if (!n) return;
  buf[0] = 0;
  if (!a) return;
  pthread_mutex_lock(&a->wake_mu);
  snprintf(buf, n, "%s", a->wake);
  pthread_mutex_unlock(&a->wake_mu);
}

/* Closes the agent's store clients (a close confirms the sets sent without
 * waiting first); the agent writes nothing after this. */
static void release_clients(crun__agent_t *a) {
  if (a->watch_store) crun_store_release(a->watch_store);
  if (a->store) crun_store_release(a->store);
  a->watch_store = a->store = NULL;
}

/* Stops the watcher thread and empties the wake-up pipe. */
static void stop_watcher(crun__agent_t *a) {
  if (!a->watching) return;
  atomic_store(&a->stop_watch, 1);
  pthread_join(a->watcher, NULL);
  a->watching = 0;
  char drain[64];
  while (read(a->fail_pipe[0], drain, sizeof drain) > 0) {}
}

/* After the end barrier: other nodes tell node 0 they are done with the
 * store for this attempt, and node 0 waits for that, so that it never stops
 * the server while another node still waits on it (a->acked then: at the
 * job's end it also waits for their clients to close, see linger). */
static int acknowledge(crun__agent_t *a, int attempt) {
  char k[160];
  int nn = a->nnodes;
  if (a->node_rank != 0) {
    snprintf(k, sizeof k, "%sattempt/%d/ack/%d", a->prefix, attempt, a->node_rank);
    int rc = crun_store_set(a->store, k, "1", 1);
    return rc < 0 ? crun_error(rc, "end of attempt %d: %s", attempt, bare_error()) : 0;
  }
  char (*keys)[160] = calloc((size_t)nn, sizeof *keys);
  const char **kp = calloc((size_t)nn, sizeof *kp);
  int rc = keys && kp ? 0 : crun_error(CRUN_ENOMEM, "out of memory");
  for (int r = 1; rc == 0 && r < nn; r++) {
    snprintf(keys[r], sizeof keys[r], "%sattempt/%d/ack/%d", a->prefix, attempt, r);
    kp[r - 1] = keys[r];
  }
  if (rc == 0) rc = wait_sliced(a->store, kp, (size_t)nn - 1, a->o->rdzv_timeout);
  a->acked = rc == 0;
  if (rc < 0 && rc != CRUN_ENOMEM)
    rc = crun_error(rc, "end of attempt %d: not every node confirmed within %g s: %s", attempt,
                    a->o->rdzv_timeout, bare_error());
  free(keys);
  free(kp);
  return rc;
}

/* c10d: once every member of the round ended or is lost, sets the round's
 * verdict (unless another agent did first); *decided 0 while a member still
 * runs. */
static int c10d_decide(crun__agent_t *a, int *decided) {
  const crun__opts_t *o = a->o;
  int n = a->nnodes, nlost = 0, all_ok = 1, bad_node = -1, bad_code = 0, found = 0;
  char k[200], text[CRUN_VERDICT_MAX], lost[256] = "", names[CRUN_VERDICT_MAX / 2] = "";
  size_t lo = 0, no = 0;
  *decided = 0;
  for (int m = 0; m < n; m++) {
    CRUN_CHECK(get_text(a->store, rk(a, k, sizeof k, "end/%lld", m), text, sizeof text, &found));
    if (found) {
      int c = atoi(text);
      if (c != 0 && bad_node < 0) {
        bad_node = m;
        bad_code = c;
      }
      all_ok &= c == 0;
      continue;
    }
    int quiet = 0;
    CRUN_CHECK(silent(a, a->store, m, &quiet));
    if (!quiet) return 0; /* it still runs */
    all_ok = 0;
    nlost++;
    if (lo + 16 < sizeof lost) lo += (size_t)snprintf(lost + lo, sizeof lost - lo, "%s%d", lo ? "," : "", m);
    char name[240];
    node_lost(a, m, name, sizeof name);
    if (no + strlen(name) + 4 < sizeof names)
      no += (size_t)snprintf(names + no, sizeof names - no, "%s%s", no ? ", " : "", name);
  }
  char change[CRUN_VERDICT_MAX], failed[64], verdict[CRUN_VERDICT_MAX + 512];
  int has_change = 0, has_failed = 0;
  int64_t joined = 0;
  CRUN_CHECK(get_text(a->store, rk(a, k, sizeof k, "change", 0), change, sizeof change, &has_change));
  CRUN_CHECK(get_text(a->store, rk(a, k, sizeof k, "failed", 0), failed, sizeof failed, &has_failed));
  CRUN_CHECK(crun_store_add(a->store, rk(a, k, sizeof k, "joined", 0), 0, &joined));
  int waiting = joined > n ? (int)(joined - n) : 0, left = n - nlost;
  if (all_ok) {
    snprintf(verdict, sizeof verdict, "done %d 0 - every node succeeded", a->restarts);
  } else if (nlost || has_change) {
    char why[CRUN_VERDICT_MAX / 2 + 64];
    if (nlost) snprintf(why, sizeof why, "%s", names);
    else snprintf(why, sizeof why, "%.*s", CRUN_VERDICT_MAX / 2, change);
    if (left < o->min_nodes)
      snprintf(verdict, sizeof verdict, "end %d 0 %s %s; %d node(s) left, fewer than the minimum %d "
               "(--nnodes %d:%d)", a->restarts, lost, why, left, o->min_nodes, o->min_nodes, o->nnodes);
    else
      snprintf(verdict, sizeof verdict, "next %d %d %s %s", a->restarts, left + waiting, nlost ? lost : "-", why);
  } else {
    if (has_failed) sscanf(failed, "%d %d", &bad_node, &bad_code);
    if (a->restarts >= o->max_restarts)
      snprintf(verdict, sizeof verdict, "end %d 0 - the workers of node %d failed (exit code %d); no "
               "restarts left (--max-restarts %d)", a->restarts, bad_node, bad_code, o->max_restarts);
    else
      snprintf(verdict, sizeof verdict, "next %d %d - restart %d of %d: the workers of node %d failed "
               "(exit code %d)", a->restarts + 1, n + waiting, a->restarts + 1, o->max_restarts, bad_node,
               bad_code);
  }
  CRUN_CHECK(set_once(a->store, rk(a, k, sizeof k, "verdict", 0), verdict));
  *decided = 1;
  return 0;
}

/* Whether node rank m is in the list "1,3". */
static int listed(const char *list, int m) {
  for (const char *p = list; *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) return 0;
    if (v == m) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* c10d: records how this node's round ended, waits (beating) until every
 * member ended or is lost, and follows the verdict. */
static int c10d_end(crun__agent_t *a, int code, int stopped, crun__next_t *next) {
  const crun__opts_t *o = a->o;
  char k[200], val[32], text[CRUN_VERDICT_MAX + 64];
  int rc = 0, found = 0, decided = 0;
  if (code != 0 && !stopped) {
    snprintf(val, sizeof val, "%d %d", a->node_rank, code);
    rc = set_once(a->store, rk(a, k, sizeof k, "failed", 0), val);
  }
  snprintf(val, sizeof val, "%d", code);
  if (rc == 0) rc = crun_store_set(a->store, rk(a, k, sizeof k, "end/%lld", a->node_rank), val, strlen(val));
  double deadline = crun_clock() + o->rdzv_timeout;
  while (rc == 0) {
    if ((rc = beat(a, a->store)) < 0) break;
    if ((rc = get_text(a->store, rk(a, k, sizeof k, "verdict", 0), text, sizeof text, &found)) < 0 || found) break;
    if ((rc = c10d_decide(a, &decided)) < 0 || decided) continue;
    if (crun_clock() >= deadline)
      rc = crun_error(CRUN_ETIMEDOUT, "not every node ended within --rdzv-timeout %g s", o->rdzv_timeout);
    else if (crun__signals_pending())
      rc = crun_error(CRUN_EINTR, "interrupted by a signal");
    else
      usleep(50000);
  }
  crun__verdict_t v;
  if (rc == 0) rc = crun__verdict_parse(text, strlen(text), &v);
  *next = CRUN__NEXT_FAIL;
  if (rc < 0)
    return crun_error(rc, "rendezvous '%s' round %d, node %d: %s", o->run_id, a->round, a->node_rank,
                      bare_error());
  CRUN_LOG(INFO, LAUNCH, "round %d ended: %s", a->round, text);
  if (listed(v.lost, a->node_rank))
    return crun_error(CRUN_ESTATE, "rendezvous '%s' round %d: this node (node %d) was declared lost (%s); "
                      "the job went on without it", o->run_id, a->round, a->node_rank, v.text);
  if (!strcmp(v.kind, "done")) *next = CRUN__NEXT_DONE, a->done = 1;
  else if (!strcmp(v.kind, "next")) *next = v.restarts > a->restarts ? CRUN__NEXT_RESTART : CRUN__NEXT_ROUND;
  else if (strcmp(v.lost, "-")) /* too few nodes left */
    return crun_error(CRUN_ESTATE, "rendezvous '%s' round %d: %s", o->run_id, a->round, v.text);
  return 0;
}

int crun__agent_end_attempt(crun__agent_t *a, int attempt, int code, int stopped, crun__next_t *next) {
  *next = code == 0 ? CRUN__NEXT_DONE : attempt < a->o->max_restarts ? CRUN__NEXT_RESTART : CRUN__NEXT_FAIL;
  if (!multi(a)) return 0;
  stop_watcher(a);
  if (a->o->c10d) return c10d_end(a, code, stopped, next);
  char fk[160], ck[160], flag[160], what[64], val[32];
  key(fk, sizeof fk, "attempt/%d/failed", attempt);
  if (code != 0) {
    int len = snprintf(val, sizeof val, "%d:%d", a->node_rank, code);
    crun_buf_t got = {0};
    if (crun_store_compare_set(a->store, fk, "", 0, val, (size_t)len, &got) == 0) crun_buf_free(&got);
  }
  snprintf(what, sizeof what, "end of attempt %d on node %d", attempt, a->node_rank);
  CRUN_CHECK(node_barrier(a, key(ck, sizeof ck, "attempt/%d/done", attempt),
                          key(flag, sizeof flag, "attempt/%d/alldone", attempt), what));
  int failed = 0;
  CRUN_CHECK(get_text(a->store, fk, val, sizeof val, &failed));
  if (failed && code == 0) name_failure(a, val);
  *next = !failed ? CRUN__NEXT_DONE : attempt < a->o->max_restarts ? CRUN__NEXT_RESTART : CRUN__NEXT_FAIL;
  a->succeeded = *next == CRUN__NEXT_DONE;
  CRUN_CHECK(acknowledge(a, attempt));
  if (a->succeeded && a->node_rank != 0) release_clients(a); /* said done: nothing more to write */
  return 0;
}

int crun__agent_failure_fd(crun__agent_t *a) {
  return a && multi(a) ? a->fail_pipe[0] : -1;
}

/* Static, node 0, once every node acknowledged the job's end: serves until
 * the other nodes closed their clients (their last sets, sent without
 * waiting, are confirmed by a round trip at the close), at most LINGER s or
 * until a signal. Nothing to wait for in-process with a sanitizer build (its
 * store process drains by itself, see stop_server). */
static void linger(crun__agent_t *a) {
  double end = crun_clock() + LINGER;
  int n;
  while ((n = crun__store_server_clients(a->server)) > 0 && !crun__signals_pending()) {
    if (crun_clock() >= end) {
      CRUN_LOG(INFO, LAUNCH, "stopping the store with %d connection(s) still open %g s after every "
               "node acknowledged the end of the job", n, LINGER);
      return;
    }
    usleep(5000);
  }
}

/* c10d: the endpoint's store may serve other jobs (other run ids), and the
 * other nodes of this one when this node leaves early, too; keeps serving
 * while any client is connected, interruptible by a signal.
 * A client that dies is disconnected by its kernel, so this ends when the
 * other jobs end; it is said once on stderr when it lasts. */
static void serve_others(crun__agent_t *a) {
  double said = crun_clock() + 1.0;
  int n;
  while ((n = crun__store_server_clients(a->server)) > 0 && !crun__signals_pending()) {
    if (said > 0 && crun_clock() >= said) {
      fprintf(stderr, "crun-lua: %s; still serving the rendezvous store at %s:%d for %d connection(s) "
                      "(other nodes or runs) until they leave (Ctrl-C stops it)\n",
              a->done ? "job done" : "this node left the job", a->host, a->port, n);
      said = -1;
    }
    usleep(20000);
  }
}

/* This node's crun-lua ends before the job succeeded. Static: it fails the
 * current attempt (the other nodes' watchers stop their workers) and says it
 * left, so that no node waits rdzv_timeout for it at a barrier (not an agent
 * refused at join: it never held its node rank). c10d: a member of a round
 * sets gone/<node>, so that the others count it lost at once, not after
 * heartbeat_timeout. Best effort: the store may be gone already. */
static void leave(crun__agent_t *a) {
  char k[200], val[160], host[64] = "?";
  if (a->o->c10d && a->store && a->members && !a->done) {
    crun_store_set(a->store, rk(a, k, sizeof k, "gone/%lld", a->node_rank), "1", 1);
    return;
  }
  if (a->o->c10d || a->nnodes < 2 || !a->store || !a->joined || a->succeeded) return;
  gethostname(host, sizeof host - 1);
  host[strcspn(host, " \t\n")] = 0;
  snprintf(val, sizeof val, "%d:left", a->node_rank);
  set_once(a->store, key(k, sizeof k, "attempt/%d/failed", a->attempt), val);
  snprintf(val, sizeof val, "%d %s %ld", a->node_rank, host, (long)getpid());
  set_once(a->store, key(k, sizeof k, "left", 0), val);
}

int crun__agent_left_dead(const crun__opts_t *o, long pid) {
  if (o->c10d || o->nnodes < 2 || o->node_rank == 0) return 0; /* node 0's store died with it */
  crun_store_tcp_opts_t to = {.host = o->master_addr, .port = o->master_port, .timeout = 2.0,
                              .connect_timeout = 1.0};
  crun_store_t *st = NULL;
  CRUN_CHECK(crun_store_tcp_new(&to, &st));
  char val[160], host[64] = "?";
  gethostname(host, sizeof host - 1);
  host[strcspn(host, " \t\n")] = 0;
  snprintf(val, sizeof val, "%d %s %ld", o->node_rank, host, pid);
  int rc = set_once(st, KEY_PREFIX "left", val);
  crun_store_release(st);
  return rc;
}

void crun__agent_stop(crun__agent_t *a) {
  if (!a) return;
  stop_watcher(a);
  leave(a);
  release_clients(a);
  if (a->server && a->o->c10d) serve_others(a);
  else if (a->server && a->acked) linger(a);
  stop_server(a);
  if (a->fail_pipe[0] >= 0) close(a->fail_pipe[0]);
  if (a->fail_pipe[1] >= 0) close(a->fail_pipe[1]);
  free(a->members);
  free(a->seen);
  free(a->seen_at);
  free(a->gone);
  pthread_mutex_destroy(&a->wake_mu);
  free(a);
}

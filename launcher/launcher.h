/* launcher.h — the parts of crun-lua and how they meet.
 *
 *   main.c       options, --help/--version, picks a mode (launch, in-process, REPL)
 *   supervise.c  watchdog, fork of the workers, one poll loop (pipes, signals,
 *                deadlines), kill on failure, restarts, the exit summary
 *   output.c     whole-line prefixing of worker output, log files, stderr tails
 *   worker.c     the worker side: environment and one Lua state running the script
 *   agent.c      the store server of node 0 and the multi-node rendezvous
 *   repl.c       the interactive mode (-i); plugged in through crun__repl_run
 *   cgroup.c     a cgroup v2 per attempt, so descendants that setsid end too
 *
 * Internal names carry the crun__ prefix; nothing here is public API. */
#ifndef CRUN_LAUNCHER_H
#define CRUN_LAUNCHER_H

#include <stddef.h>
#include <sys/types.h>

#include "crun.h"

#define CRUN_LAUNCH_DEFAULT_PORT 29500
#define CRUN_LAUNCH_DEFAULT_C10D_PORT 29400 /* torchrun's for --rdzv-endpoint HOST */
#define CRUN_LAUNCH_DEFAULT_LAST_CALL 30.0
#define CRUN_LAUNCH_DEFAULT_CLOSE 30.0
#define CRUN_LAUNCH_DEFAULT_HEARTBEAT 15.0 /* torch: 3 missed keep-alives of 5 s */
#define CRUN_LAUNCH_RUN_ID_MAX 64
#define CRUN_LAUNCH_MAX_NPROC 4096  /* -n; MAX_NPROC * MAX_NODES stays below INT_MAX */
#define CRUN_LAUNCH_MAX_NODES 65536 /* --nnodes */
#define CRUN_LAUNCH_DEFAULT_GRACE 3.0
#define CRUN_LAUNCH_DEFAULT_RDZV_TIMEOUT 300.0
#define CRUN_LAUNCH_TAIL_LINES 32

typedef struct crun__agent crun__agent_t;

/* Everything the command line says, after validation. */
typedef struct {
  int nproc;                /* -n: workers on this node */
  int nnodes;               /* --nnodes N, or MAX of --nnodes MIN:MAX */
  int min_nodes;            /* MIN of --nnodes MIN:MAX (= nnodes for N) */
  int node_rank;            /* --node-rank */
  const char *master_addr;  /* --master-addr */
  int master_port;          /* --master-port; 0 picks a free port */
  int max_restarts;         /* --max-restarts */
  const char *log_dir;      /* --log-dir, NULL when not given */
  const char *redirects;    /* --redirects: torchrun's selector (0-3 or LR:S,...), NULL: none */
  const char *tee;          /* --tee: the same; a bare --tee is "3" */
  const char *ranks_filter; /* --local-ranks-filter: "0,2", NULL: every local rank */
  const char *role;         /* --role (default "default") */
  int c10d;                 /* --rdzv-backend c10d */
  const char *rdzv_host;    /* --rdzv-endpoint HOST (c10d) */
  int rdzv_port;            /* its PORT (default 29400) */
  const char *run_id;       /* --rdzv-id (default "none") */
  double join_timeout;      /* --rdzv-conf join_timeout (default --rdzv-timeout) */
  double last_call_timeout; /* --rdzv-conf last_call_timeout */
  double close_timeout;     /* --rdzv-conf close_timeout */
  double heartbeat_timeout; /* --rdzv-conf heartbeat_timeout: a node silent this long is lost */
  int standalone;           /* --standalone */
  double monitor_interval;  /* --monitor-interval: accepted; supervision is event-driven */
  int module;               /* -m: script names a Lua module, o->script its resolved path */
  const char *script_name;  /* the script as given (the module name with -m) */
  const char *backend;      /* --backend, NULL when not given */
  const char *timeline;     /* --timeline, NULL when not given */
  const char *merge_timeline; /* --merge-timeline: merge and exit */
  int no_prefix;            /* --no-prefix */
  int repl;                 /* -i */
  int no_python;            /* --no-python: the "script" is a program each worker execs */
  double grace;             /* --grace-period: SIGTERM -> SIGKILL, seconds */
  const char *cpu_bind;     /* --cpu-bind: auto, core or none (NULL: auto) */
  double rdzv_timeout;      /* --rdzv-timeout: nodes must join within, seconds */
  const char *script;       /* the script path (NULL with -i and no script) */
  int argc;                 /* the launcher's whole argv, for Lua's `arg` */
  char **argv;
  int script_index;         /* argv[script_index] == script */
} crun__opts_t;

/* Where one worker stands in the job (what its environment will say). */
typedef struct {
  int rank, local_rank, world_size, local_world_size, group_rank;
  int group_world_size;     /* nodes in the job */
  int role_rank, role_world_size; /* among the workers of this node's --role */
  int restart_count;
  int round;                /* c10d: the rendezvous round (the workers' store prefix) */
  const char *master_addr;
  int master_port;
} crun__placement_t;

/* ---- worker.c */

/* Sets RANK, LOCAL_RANK, ..., MASTER_PORT, CRUN_RESTART_COUNT, CRUN_BACKEND,
 * CRUN_LAUNCHER, torchrun's TORCHELASTIC_* / GROUP_WORLD_SIZE / ROLE_* and
 * OMP_NUM_THREADS=1 (unless already set, and only for more than one worker
 * per node, as torchrun) in this process. */
void crun__worker_setenv(const crun__opts_t *o, const crun__placement_t *p);

/* Runs o->script in a fresh Lua state (the one crun__script_check prepared,
 * if it ran in this process or before the fork) with crun preloaded and `arg` set as
 * the lua interpreter does. Returns the process exit code: 0 on success, the
 * os.exit() code, or 1 after printing a Lua error with its traceback. */
int crun__worker_run(const crun__opts_t *o);
/* --no-python: CRUN_EINVAL unless prog names an executable file (on PATH when it has no '/'). */
int crun__program_check(const char *prog);

/* -m: finds module `name` on package.path (crun's lua dir first, LUA_PATH
 * honoured) and writes its file's path into path. Returns 0 or CRUN_EINVAL
 * with the places searched in crun_last_error(). */
int crun__module_find(const char *name, char *path, size_t n);

/* Reads the script once (workers and restarts load these same bytes, so a
 * pipe or /dev/stdin works) and parses it without running it, so that a
 * missing file or a syntax error is reported once by the launcher instead of
 * by every rank. The state it parsed in (libraries open, package.path set,
 * the script compiled) is kept: crun__worker_run in a process forked after
 * it starts from a copy of it instead of building its own.
 * Returns 0 or CRUN_EINVAL with the Lua message in crun_last_error(). */
int crun__script_check(const char *script);

/* Fills *p from OMPI_COMM_WORLD_*, PMI_* or SLURM_* when this process is
 * already one rank of a job started by mpirun/srun. Returns 1 when it is, 0
 * when not, or CRUN_EINVAL when those variables are malformed. */
int crun__engine_detect(crun__placement_t *p);

/* ---- output.c */

typedef struct {
  int fd;              /* read end of the worker's pipe; -1 once at EOF */
  int console_fd;      /* 1 or 2, or -1 when not shown */
  int log_fd;          /* per-rank log file, or -1 */
  int keep_tail;       /* remember the last lines (stderr) */
  char prefix[24];
  size_t prefix_len;
  char *buf;           /* the partial line not yet shown */
  size_t len, cap;
  char *tail[CRUN_LAUNCH_TAIL_LINES]; /* ring of the last complete lines */
  int tail_next, tail_count;
} crun__stream_t;

/* Prepares a stream reading fd; prefix may be "" (no prefix). */
void crun__stream_init(crun__stream_t *s, int fd, int console_fd, int log_fd,
                       const char *prefix, int keep_tail);

/* Reads what is available on s->fd (one read), shows whole lines and logs
 * every byte. Returns 1 while open, 0 at EOF (partial line flushed, fd closed). */
int crun__stream_pump(crun__stream_t *s);

/* Shows the partial line (if any) and closes the fd; the tail stays. */
void crun__stream_finish(crun__stream_t *s);

/* Copies up to `max` of the last tail lines of s, oldest first, into out
 * (pointers into s, valid until s is freed). Lines after a Lua traceback's
 * "stack traceback:" header are skipped so a traceback is shown only once. */
int crun__stream_tail(const crun__stream_t *s, const char **out, int max);

/* Closes the fd (when open) and frees the buffers. */
void crun__stream_free(crun__stream_t *s);

/* torchrun's stream selector for --redirects and --tee: "0".."3" for every
 * local rank (1 stdout, 2 stderr, 3 both), or a map "LR:S,LR:S" (ranks not
 * named get 0). Returns the selector of local_rank (0..3), or -1 when spec is
 * malformed (local_rank < 0 only validates). */
int crun__std_select(const char *spec, int local_rank);

/* --local-ranks-filter: whether local_rank is in the list "0,2,5" (1 or 0),
 * or -1 when the list is malformed (local_rank < 0 only validates). */
int crun__rank_listed(const char *list, int local_rank);

/* Writes all of buf to fd, retrying on EINTR and short writes. */
void crun__write_all(int fd, const char *buf, size_t len);

/* ---- supervise.c */

/* Runs the job on this node: spawns o->nproc workers placed by `base`
 * (rank = base->rank + local rank), supervises them, restarts up to
 * o->max_restarts times, prints the summary. Returns the exit code. */
int crun__supervise(const crun__opts_t *o, const crun__placement_t *base,
                    crun__agent_t *agent);

/* Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP (they are read from a signalfd)
 * and ignores SIGPIPE. Call before any thread starts, so that no thread
 * takes these signals away from the signalfd. */
void crun__signals_block(void);

/* Returns SIGINT, SIGTERM or SIGHUP when one is pending (blocked), else 0. */
int crun__signals_pending(void);

/* ---- cgroup.c */

#define CRUN_CGROUP_PATH 2048

typedef struct {
  int on;                          /* the job's cgroup exists */
  char job[CRUN_CGROUP_PATH];      /* <own cgroup>/crun-<launcher pid> */
  char attempt[CRUN_CGROUP_PATH];  /* job/a<k> while an attempt runs, else "" */
} crun__cgroup_t;

/* Finds the job's cgroup path under the launcher's own (cgroup v2), without
 * creating it (the watchdog learns the path first). Returns 0, 1 when
 * CRUN_CGROUP=0 turned it off, or -1 with the reason in why. */
int crun__cgroup_open(crun__cgroup_t *cg, char *why, size_t wn);

/* Creates the job's cgroup found by crun__cgroup_open; 0 or -1 with why. */
int crun__cgroup_create(crun__cgroup_t *cg, char *why, size_t wn);

/* Creates attempt k's cgroup; -1 with the reason in why (the attempt then
 * runs without one). */
int crun__cgroup_begin(crun__cgroup_t *cg, int attempt, char *why, size_t wn);

/* Starts, on a thread of its own, a move of the launcher into the cgroup it
 * is already in (nothing changes), so that the kernel's wait for an RCU
 * grace period, which the first move into a cgroup after a quiet while
 * costs (~9 ms on a 2-core AMD EPYC VM), runs while the launcher starts the
 * store and forks; the workers' own moves a few ms later then share it or
 * find it passed. Best effort, never blocks the caller; nothing with
 * CRUN_CGROUP=0 or in a sanitizer build (whose launcher forks thread-less). */
void crun__cgroup_prewarm(void);

/* In a worker: moves this process into the attempt's cgroup (0 or -errno). */
int crun__cgroup_enter(const crun__cgroup_t *cg);

/* Sends sig to every process in the cgroup dir ("" or NULL: nothing) but
 * those of process group `except` (0: none), which were signalled already. */
void crun__cgroup_signal(const char *dir, int sig, pid_t except);

/* After an attempt: kills what is left in its cgroup, waits (bounded) until
 * it is empty, removes it. */
void crun__cgroup_end(crun__cgroup_t *cg);

/* Empties and removes every attempt's cgroup and the job's (the watchdog
 * calls it when the launcher is gone, the launcher at its end). */
void crun__cgroup_close(crun__cgroup_t *cg);

/* ---- agent.c */

/* Starts the store server (node 0) and meets the other nodes on it. Fills
 * base with this node's first global rank, the world size and the master
 * port actually used. Returns 0 or a crun status naming what failed. */
int crun__agent_start(const crun__opts_t *o, crun__placement_t *base, crun__agent_t **out);

/* Before attempt `attempt` (0-based): on static multi-node jobs, every node
 * waits here for the others; on c10d jobs, attempts after the first join
 * the next rendezvous round and update *base (ranks, sizes, restart count,
 * round). Returns 0 or a crun status. */
int crun__agent_begin_attempt(crun__agent_t *a, int attempt, crun__placement_t *base);

/* Multi-node: starts the thread that wakes the supervise loop (the failure
 * fd) when the attempt failed on another node; called once the attempt's
 * workers are forked. A no-op on one node. */
int crun__agent_watch(crun__agent_t *a);

/* What follows an attempt. */
typedef enum {
  CRUN__NEXT_DONE,    /* every node succeeded: the job is over */
  CRUN__NEXT_RESTART, /* a worker failed: a restart, counted against --max-restarts */
  CRUN__NEXT_ROUND,   /* c10d: the membership changed; a new round, not counted */
  CRUN__NEXT_FAIL     /* the job failed (restarts spent, too few nodes, lost) */
} crun__next_t;

/* Reports this node's outcome of an attempt (exit code, 0 = success;
 * `stopped` 1 when the workers were stopped because of another node or a
 * membership change rather than failing on their own) and learns what
 * follows into *next. On c10d jobs the nodes agree on it through the round's
 * verdict; node 0 of the next round prints why it opened. A CRUN__NEXT_FAIL
 * that is not a worker failure comes with its reason in crun_last_error()
 * and a return of 1. On static jobs, when this node's workers succeeded
 * but another node's failed, crun__agent_wake_reason then names that node.
 * Returns 0, 1, or a crun status. */
int crun__agent_end_attempt(crun__agent_t *a, int attempt, int code, int stopped, crun__next_t *next);

/* Copies why the watcher stopped the workers ("" when it did not) into buf. */
void crun__agent_wake_reason(crun__agent_t *a, char *buf, size_t n);

/* Returns an fd that becomes readable when another node reported a failure
 * of the current attempt, or -1 on single-node jobs. */
int crun__agent_failure_fd(crun__agent_t *a);

/* Static multi-node, in the watchdog of a node (not 0) whose crun-lua (pid)
 * was killed: says the node left, on a store connection of its own, so that
 * the other nodes do not wait for it at their next barrier (their workers
 * see its workers, killed by the watchdog, gone and report it themselves).
 * Returns 0 or a crun status; a no-op elsewhere. */
int crun__agent_left_dead(const crun__opts_t *o, long pid);

/* Stops the server and frees the agent (NULL is fine). */
void crun__agent_stop(crun__agent_t *a);

/* ---- rdzv.c: torchrun's c10d rendezvous, in rounds (membership changes) */

#define CRUN_VERDICT_MAX 600

/* One node as the rendezvous saw it. */
typedef struct {
  int nproc;
  char role[64];
  char host[64];  /* its hostname ("?" for static jobs) */
  long pid;       /* its agent's pid */
} crun__node_t;

/* Where this node stands once the round closed. */
typedef struct {
  int round;                           /* the round's number (0 first) */
  int node_rank, nnodes;               /* this node's index; the nodes of the round */
  int rank_base, world_size;           /* its first global rank; every worker */
  int role_rank_base, role_world_size; /* the same among the nodes of its --role */
  int restarts;                        /* worker failures restarted before this round */
  crun__node_t *nodes;                 /* the members, by node rank (caller frees) */
  char why[CRUN_VERDICT_MAX];          /* why the round opened ("" for round 0) */
} crun__round_t;

/* How a round ended (the verdict key, rdzv.c). */
typedef struct {
  char kind[16];   /* done, next or end */
  int restarts;    /* worker failures restarted so far */
  int expect;      /* next: the nodes the next round waits for */
  char lost[256];  /* node ranks declared lost, "1,3", or "-" */
  char text[CRUN_VERDICT_MAX]; /* why */
} crun__verdict_t;

/* Parses a verdict "<kind> <restarts> <expect> <lost> <text>" into v;
 * 0 or CRUN_EPROTO. */
int crun__verdict_parse(const char *text, size_t len, crun__verdict_t *v);

/* "crun/rdzv/<run id>/<round>/" + fmt (with x) into buf. */
const char *crun__rdzv_key(char *buf, size_t n, const crun__opts_t *o, int round, const char *fmt,
                           long long x);

/* Places node `me` of nodes[0..n) node-major: fills out's ranks and sizes. */
void crun__round_place(const crun__node_t *nodes, int n, int me, crun__round_t *out);

/* Joins round `round` of o->run_id on st (a client of the endpoint's
 * store), or with round < 0 the job's current round; node ranks are first
 * come (the order the agents joined). Blocks until the round closes
 * (o->nnodes joined, or as many as the previous verdict expects, or
 * o->min_nodes joined and last_call_timeout passed) and every member
 * registered, at most join_timeout + close_timeout. A node that comes after
 * the round closed waits for its verdict and joins the next round (at most
 * join_timeout in all). Returns 0 (out->nodes then needs free) or a crun
 * status naming what failed (CRUN_ESTATE when the job already ended). */
int crun__rdzv_join(const crun__opts_t *o, crun_store_t *st, int round, crun__round_t *out);

/* ---- worker.c: the Lua state of a worker and of the -i front */

struct lua_State;

/* A new Lua state with the standard libraries, package.preload["crun.core"]
 * and package.path with the crun lua dir first; NULL when out of memory. */
struct lua_State *crun__lua_state_new(void);

/* lua_pcall message handler: the error text followed by a traceback. */
int crun__lua_msghandler(struct lua_State *L);

/* ---- repl.c */

/* Runs the interactive mode (-i). Returns the exit code. */
int crun__repl_run(const crun__opts_t *o);

/* ---- repl_worker.c (a worker under -i; called by crun__worker_run) */

/* Before the script: Ctrl-C handling, announces the worker on the store.
 * Returns LUA_OK, or a Lua status with the message on the stack. */
int crun__repl_worker_begin(struct lua_State *L);

/* After the script (script_rc its status, its message on the stack when not
 * LUA_OK): runs chunks until the session ends. Returns LUA_OK, or a Lua
 * status with the message on the stack. */
int crun__repl_worker_loop(struct lua_State *L, int script_rc);

/* ---- trace_merge.c: the timeline and the flight recorder (crun/trace.h) */

/* main: turns recording off in the launcher itself; --timeline PATH sets
 * CRUN_TIMELINE (made absolute) for the workers. */
void crun__obs_launcher_setup(const char *timeline);

/* Before attempt k: CRUN_FLIGHT_DIR = <log_dir>/attempt_<k>, or (no --log-dir
 * and none set) $TMPDIR/crun-flight-<launcher pid>-XXXXXX, made 0700 by
 * mkdtemp at the first attempt. */
void crun__obs_attempt_env(const char *log_dir, int attempt);

/* In a forked worker: reads the recording settings, arms SIGUSR1. */
void crun__obs_worker_init(void);

/* Sends SIGUSR1 to the running workers (pids[i] of global rank ranks[i]),
 * waits (at most 10 s) for their dumps, then prints the analysis of every
 * rank's dump newer than since (a crun_clock_ns value; 0: this request). */
void crun__obs_dump_all(const pid_t *pids, const int *ranks, const int *running, int n, uint64_t since,
                        const char *why);

/* At the end: removes the dump directory crun-lua chose ($TMPDIR/crun-flight-<pid>-XXXXXX)
 * unless an analysis named it. */
void crun__obs_cleanup(void);

/* What the recorder writes in a dump directory: 1 for a dump
 * ("flight_rank<r>.txt"), 2 for one a rank was still writing when it ended
 * ("flight_rank<r>.txt.tmp": a rank killed then leaves it), 0 for any other name. */
int crun__obs_dump_name(const char *name);

/* Merges path.rank<r> (r < world; world < 0: every such file in path's
 * directory) into the trace at path and prints the summary. Returns 0, or 1
 * when nothing could be merged. */
int crun__obs_merge(const char *path, int world);

/* The same for a node of a multi-node job: every node merges what it sees,
 * and on a file system the nodes share the first one takes every part, so
 * finding none is not a failure here (said, and 0 returned). */
int crun__obs_merge_shared(const char *path, int world);

#endif /* CRUN_LAUNCHER_H */

/* supervise.c — fork the workers of this node, watch them, stop them.
 *
 * One attempt: the launcher forks nproc workers (no exec: each child sets up
 * its environment and runs the script in a fresh Lua state). All workers of
 * an attempt share one process group, so kill(-pgid) reaches grandchildren
 * too. One poll loop reads every worker pipe and a signalfd (SIGCHLD, SIGINT,
 * SIGTERM, SIGHUP). The first worker that exits non-zero or dies by a signal
 * stops the attempt: SIGTERM to the group at once, SIGKILL after the grace
 * period. A signal to the launcher is forwarded to the group the same way.
 *
 * Workers die with the launcher: PR_SET_PDEATHSIG(SIGKILL) in each worker,
 * and a watchdog process (its own session, outside the workers' group) that
 * holds the read end of a pipe from the launcher and SIGKILLs the current
 * group when that pipe reaches EOF, i.e. when the launcher is gone however it
 * ended. That also takes grandchildren, which PDEATHSIG does not reach. */
#include "launcher.h"
#include "core/heap.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CRUN_DRAIN_SECONDS 2.0
#define CRUN_SUMMARY_TAIL 5

typedef struct {
  int local_rank, rank;
  pid_t pid;
  int running;  /* forked and not yet reaped */
  int status;   /* wait status once reaped */
  int own_death; /* died by a signal crun-lua had not sent (after another failure) */
  crun__stream_t out, err;
} proc_t;

/* The first failure of one attempt, kept for the final summary. */
typedef struct {
  int rank;       /* -1: no local failure */
  pid_t pid;
  int status;     /* wait status */
  int remote;     /* stopped because of another node (failure, membership change) */
  char why[CRUN_VERDICT_MAX]; /* remote: the reason the agent gave */
} failure_t;

typedef struct {
  const crun__opts_t *o;
  crun__placement_t base;
  crun__agent_t *agent;
  proc_t *procs;
  int sfd;               /* signalfd */
  int watch_fd;          /* write end of the watchdog pipe */
  pid_t watch_pid;
  pid_t self;
  crun__cgroup_t cg;     /* the job's cgroup (cgroup.c); cg.on 0: none */
  pid_t pgid;            /* the current attempt's process group */
  int stopping;          /* 0 running, 1 SIGTERM sent, 2 SIGKILL sent */
  double kill_at;        /* when SIGTERM turns into SIGKILL */
  double drain_until;    /* all workers reaped: stop waiting for pipes then */
  double stop_at;        /* CRUN_STOP_DELAY: stop the survivors then (-1: not due) */
  int signal_seen;       /* a signal the launcher received, 0 if none */
  unsigned sent;         /* signals sent to the workers this attempt (1u << sig) */
  failure_t fail;        /* of the current attempt */
  uint64_t started_ns;   /* when the current attempt started (crun_clock_ns) */
} sup_t;

/* Asks the running workers for their flight recorders and prints the
 * analysis (trace_merge.c); since: dumps older are stale (0: this request). */
static void flight_dump(sup_t *s, const char *why, uint64_t since) {
  int n = s->o->nproc, *ranks = calloc((size_t)n, sizeof(int)), *running = calloc((size_t)n, sizeof(int));
  pid_t *pids = calloc((size_t)n, sizeof(pid_t));
  for (int i = 0; ranks && running && pids && i < n; i++)
    pids[i] = s->procs[i].pid, ranks[i] = s->procs[i].rank, running[i] = s->procs[i].running;
  if (ranks && running && pids) crun__obs_dump_all(pids, ranks, running, n, since, why);
  free(ranks), free(running), free(pids);
}

/* Returns "SIGSEGV" style names. */
static const char *signame(int sig, char *buf, size_t n) {
  const char *abbrev = sigabbrev_np(sig);
  if (abbrev) snprintf(buf, n, "SIG%s", abbrev);
  else snprintf(buf, n, "signal %d", sig);
  return buf;
}

/* The process exit code that stands for a wait status. */
static int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/* "exited with code 3" / "was killed by signal SIGKILL". */
static const char *status_text(int status, char *buf, size_t n) {
  char sb[32];
  if (WIFSIGNALED(status))
    snprintf(buf, n, "was killed by signal %s%s", signame(WTERMSIG(status), sb, sizeof sb),
             WCOREDUMP(status) ? " (core dumped)" : "");
  else
    snprintf(buf, n, "exited with code %d", status_code(status));
  return buf;
}

/* Prints one launcher line to stderr. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(buf, sizeof buf, "crun-lua: ");
  n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  crun__write_all(2, buf, (size_t)n);
}

static pid_t g_main_tid; /* the thread that blocks the handled signals and reads them */

/* A handled signal that reached another thread (one a library started before
 * the launcher could block them: OpenBLAS starts its pool when it is loaded)
 * is passed on to the main thread, which blocks it, so that the signalfd and
 * crun__signals_pending see it instead of the default action ending the
 * launcher without stopping its workers or saying why. */
static void forward_to_main(int sig) {
  int saved = errno;
  syscall(SYS_tgkill, getpid(), g_main_tid, sig);
  errno = saved;
}

/* ---------------------------------------------------------------- watchdog */

/* Unlinks /dev/shm/crun-shm-<pid>-* of the given (dead) workers: a rank 0
 * killed between creating its group's segment and the last rank attaching
 * (a signal's default action runs no cleanup) leaves the name behind; the
 * pid in the name says whose it was (runtime/transport/shm/segment.c). */
static void shm_sweep(const pid_t *pids, int n) {
  if (n <= 0) return;
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "crun-shm-", 9) != 0) continue;
    char *end;
    long pid = strtol(e->d_name + 9, &end, 10);
    if (end == e->d_name + 9 || *end != '-') continue;
    for (int i = 0; i < n; i++)
      if (pids[i] == (pid_t)pid) {
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0)
          CRUN_LOG(INFO, LAUNCH, "removed %s left by worker pid %ld", name, pid);
        break;
      }
  }
  closedir(d);
}

/* Removes the partial dumps (flight_rank<r>.txt.tmp: ranks killed while
 * they wrote) in dir; they are of no use to anyone. */
static void partial_dumps_sweep(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  char path[PATH_MAX + 300];
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (crun__obs_dump_name(e->d_name) == 2 && snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
      unlink(path);
  closedir(d);
}

/* Removes $TMPDIR/crun-flight-<launcher>-XXXXXX, the dump directory
 * crun-lua chose (launcher/trace_merge.c), when it holds no dump: a launcher
 * killed before its own cleanup leaves it. Partial dumps go first; rmdir
 * leaves one holding dumps, which are kept for the user, and anything that
 * is not a directory. */
static void flight_sweep(pid_t launcher) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  char prefix[48], path[PATH_MAX];
  int np = snprintf(prefix, sizeof prefix, "crun-flight-%d-", (int)launcher);
  DIR *d = opendir(tmp);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, (size_t)np) == 0 && strlen(e->d_name) == (size_t)np + 6 &&
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name) < (int)sizeof path) {
      partial_dumps_sweep(path);
      rmdir(path);
    }
  closedir(d);
}

/* Whether pid has ended (gone, or a zombie nobody reaped yet). */
static int pid_ended(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = 0;
  const char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

/* The watchdog's whole life: remember the latest group and its workers
 * (a message -pgid starts an attempt, a positive pid adds a worker, 0 says
 * the launcher ends by itself); at EOF
 * kill the group, wait (bounded) until the workers are gone, and remove the
 * shared-memory names they may have left and the launcher's dump directory
 * when it is empty. */
static void watchdog_main(int rfd, crun__cgroup_t *cg, pid_t launcher, const crun__opts_t *o) {
  pid_t pgid = 0, next, *pids = NULL;
  int n = 0, cap = 0, attempt = -1, clean = 0;
  for (;;) {
    ssize_t r = read(rfd, &next, sizeof next);
    if (r < 0 && errno == EINTR) continue;
    if (r != (ssize_t)sizeof next) break;
    if (next == 0) {
      clean = 1; /* watchdog_stop: the launcher ends by itself */
    } else if (next < 0) {
      pgid = -next;
      n = 0;
      attempt++;
    } else if (n < cap || (pids = realloc(pids, sizeof *pids * (size_t)(cap = cap * 2 + 16)))) {
      pids[n++] = next;
    }
  }
  if (pgid > 0) kill(-pgid, SIGKILL);
  /* EOF without watchdog_stop's 0: the launcher was killed; tell the other
   * nodes, which would wait --rdzv-timeout for it */
  if (attempt >= 0 && !clean) crun__agent_left_dead(o, (long)launcher);
  crun__cgroup_close(cg); /* descendants that left the group */
  double until = crun_clock() + 5.0;
  for (int i = 0; i < n; i++)
    while (!pid_ended(pids[i]) && crun_clock() < until) usleep(2000);
  shm_sweep(pids, n);
  flight_sweep(launcher);
  _exit(0);
}

/* Forks the watchdog into its own session; it ignores terminal signals. */
static int watchdog_start(sup_t *s) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return crun_error(CRUN_ESYS, "pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    return crun_error(CRUN_ESYS, "fork of the watchdog: %s", strerror(errno));
  }
  if (pid == 0) {
    setsid();
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    prctl(PR_SET_NAME, "crun-lua-watch");
    int keep = dup2(p[0], 3);
    close_range(4, ~0U, 0);
    watchdog_main(keep, &s->cg, s->self, s->o);
  }
  close(p[0]);
  s->watch_fd = p[1];
  s->watch_pid = pid;
  return 0;
}

/* Tells the watchdog what to kill if the launcher dies: -pgid starts an
 * attempt's group, a positive pid adds one of its workers. */
static void watchdog_set(sup_t *s, pid_t pgid) {
  if (s->watch_fd >= 0 && write(s->watch_fd, &pgid, sizeof pgid) != (ssize_t)sizeof pgid)
    CRUN_LOG(WARN, LAUNCH, "cannot reach the watchdog: %s", strerror(errno));
}

/* Closes the pipe (the watchdog kills the last group, then exits) and reaps it. */
static void watchdog_stop(sup_t *s) {
  if (s->watch_fd < 0) return;
  watchdog_set(s, 0); /* "ending by myself" */
  close(s->watch_fd);
  s->watch_fd = -1;
  while (waitpid(s->watch_pid, NULL, 0) < 0 && errno == EINTR) {}
}

/* ---------------------------------------------------------------- spawning */

/* What a path that is not a regular file is, for messages. */
static const char *kind_of(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a fifo";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

/* Creates dir and any parent it lacks (as torchrun's os.makedirs); 0, or -1
 * with errno set. */
static int mkdir_parents(const char *dir) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0777) < 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  return mkdir(p, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

/* Opens <log_dir>/attempt_<k>/rank_<r>.<what> for writing; -1 on failure
 * with the reason recorded. Nothing is followed or truncated in place: the
 * attempt directory is opened O_NOFOLLOW, the file created O_EXCL|O_NOFOLLOW;
 * a regular file left by an earlier job is unlinked and created anew (a hard
 * link to it keeps its content), anything else there (a symbolic link, a
 * fifo, a device) is refused. */
static int open_log(const crun__opts_t *o, int attempt, int rank, const char *what) {
  char path[4096], name[64];
  int dfd = -1, fd = -1;
  snprintf(path, sizeof path, "%s/attempt_%d", o->log_dir, attempt);
  if (mkdir_parents(o->log_dir) < 0) {
    crun_error(CRUN_ESYS, "cannot create the log directory %s: %s", o->log_dir, strerror(errno));
    return -1;
  }
  if (mkdir(path, 0777) < 0 && errno != EEXIST) goto fail;
  dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      crun_error(CRUN_EINVAL, "cannot create log files in %s: it is not a directory (a "
                 "symbolic link there is not followed)", path);
      return -1;
    }
    goto fail;
  }
  snprintf(name, sizeof name, "rank_%d.%s", rank, what);
  snprintf(path, sizeof path, "%s/attempt_%d/%s", o->log_dir, attempt, name);
  for (int tries = 0; tries < 2 && fd < 0; tries++) {
    fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) break;
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      close(dfd);
      crun_error(CRUN_EINVAL, "cannot create log file %s: it is %s, not a regular file "
                 "(refusing to follow or replace it)", path, kind_of(st.st_mode));
      return -1;
    }
    if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT) break;
  }
  if (fd >= 0) {
    close(dfd);
    return fd;
  }
fail:
  crun_error(CRUN_ESYS, "cannot create log file %s: %s", path, strerror(errno));
  if (dfd >= 0) close(dfd);
  return -1;
}

/* --cpu-bind: pins local rank i to the (i mod n)-th of the n CPUs the
 * launcher may use. auto pins when the workers are at least as many as those
 * CPUs: every core is taken anyway, and a fixed, even spread keeps ranks from
 * piling onto one core (with 8 ranks on 2 cores an uneven 5/3 split doubled
 * small-message latency); with fewer workers the kernel keeps them free to
 * move, and their helper threads free to use the spare cores. */
static void bind_cpu(const crun__opts_t *o, int local_rank) {
  const char *mode = o->cpu_bind ? o->cpu_bind : "auto";
  if (!strcmp(mode, "none")) return;
  cpu_set_t usable, one;
  if (sched_getaffinity(0, sizeof usable, &usable) != 0) return;
  int n = CPU_COUNT(&usable);
  if (n < 1 || (!strcmp(mode, "auto") && o->nproc < n)) return;
  int k = local_rank % n;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &usable) || k-- > 0) continue;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
      CRUN_LOG(WARN, LAUNCH, "cannot pin local rank %d to CPU %d: %s", local_rank, cpu,
               strerror(errno));
    return;
  }
}

/* In the child: join the group, die with the launcher, wire stdio, run. */
static void child_main(sup_t *s, proc_t *p, int out_w, int err_w, int attempt) {
  setpgid(0, s->pgid);
  crun__cgroup_enter(&s->cg); /* before anything can be started */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != s->self) _exit(128 + SIGKILL); /* the launcher is already gone */
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  dup2(out_w, 1);
  dup2(err_w, 2);
  close_range(3, ~0U, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGINT, SIG_DFL); /* even when started in the background by a shell */
  signal(SIGTERM, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  struct sigaction hup;
  if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler == forward_to_main) signal(SIGHUP, SIG_DFL);
  setvbuf(stdout, NULL, _IOLBF, 0);
  crun__placement_t pl = s->base;
  pl.rank = s->base.rank + p->local_rank;
  pl.local_rank = p->local_rank;
  pl.role_rank = s->base.role_rank + p->local_rank;
  pl.restart_count = s->base.restart_count;
  (void)attempt;
  crun__heap_use_slot(p->local_rank);
  bind_cpu(s->o, p->local_rank);
  crun__worker_setenv(s->o, &pl);
  signal(SIGUSR1, SIG_IGN); /* not the launcher's handler; the runtime's replaces it */
  crun__obs_worker_init();
  int rc = crun__worker_run(s->o);
  (void)crun_trace_flush();
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check(); /* _exit skips LeakSanitizer's check at exit */
#endif
  _exit(rc);
}

/* Where a local rank's streams go (bit 1 stdout, bit 2 stderr), as torchrun:
 * --redirects sends a stream to its log file only, --tee to the console and
 * the log file; --log-dir alone redirects both (crun's older behaviour);
 * --local-ranks-filter hides the console of ranks not listed. */
typedef struct {
  int file, console;
} routes_t;

static routes_t routes_of(const crun__opts_t *o, int local_rank) {
  int redir = o->redirects ? crun__std_select(o->redirects, local_rank) : 0;
  int tee = o->tee ? crun__std_select(o->tee, local_rank) : 0;
  if (o->log_dir && !o->redirects && !o->tee) redir = 3;
  routes_t r = {.file = o->log_dir ? (redir | tee) & 3 : 0, .console = 3 & ~(redir & ~tee)};
  if (o->ranks_filter && crun__rank_listed(o->ranks_filter, local_rank) != 1) r.console = 0;
  return r;
}

/* Forks worker p with its two pipes and its log files. */
static int spawn_one(sup_t *s, proc_t *p, int attempt) {
  const crun__opts_t *o = s->o;
  int out[2], err[2];
  int log_out = -1, log_err = -1;
  routes_t rt = routes_of(o, p->local_rank);
  if ((rt.file & 1) && (log_out = open_log(o, attempt, p->rank, "stdout")) < 0) return CRUN_ESYS;
  if ((rt.file & 2) && (log_err = open_log(o, attempt, p->rank, "stderr")) < 0) {
    if (log_out >= 0) close(log_out);
    return CRUN_ESYS;
  }
  if (pipe2(out, O_CLOEXEC) < 0) goto fail;
  if (pipe2(err, O_CLOEXEC) < 0) { close(out[0]); close(out[1]); goto fail; }
  pid_t pid = fork();
  if (pid < 0) { close(out[0]); close(out[1]); close(err[0]); close(err[1]); goto fail; }
  if (pid == 0) child_main(s, p, out[1], err[1], attempt);
  if (s->pgid == 0) s->pgid = pid;
  setpgid(pid, s->pgid);
  close(out[1]);
  close(err[1]);
  p->pid = pid;
  p->running = 1;
  char prefix[24] = "";
  if (!o->no_prefix) snprintf(prefix, sizeof prefix, "[%d] ", p->rank);
  crun__stream_init(&p->out, out[0], (rt.console & 1) ? 1 : -1, log_out, prefix, 0);
  crun__stream_init(&p->err, err[0], (rt.console & 2) ? 2 : -1, log_err, prefix, 1);
  return 0;
fail:
  if (log_out >= 0) close(log_out);
  if (log_err >= 0) close(log_err);
  return crun_error(CRUN_ESYS, "cannot start rank %d: %s", p->rank, strerror(errno));
}

/* ---------------------------------------------------------------- stopping */

/* Sends sig to every worker of the attempt (and their children). */
static void signal_group(sup_t *s, int sig) {
  if (sig > 0 && sig < 32) s->sent |= 1u << sig;
  if (s->pgid > 0) kill(-s->pgid, sig);
  crun__cgroup_signal(s->cg.attempt, sig, s->pgid); /* also those that left the group */
}

/* Starts stopping the attempt: sig now, SIGKILL after the grace period. */
static void begin_stop(sup_t *s, int sig) {
  if (s->stopping >= 1) {
    if (sig != SIGTERM || s->signal_seen) { signal_group(s, SIGKILL); s->stopping = 2; }
    return;
  }
  signal_group(s, sig);
  s->stopping = 1;
  s->kill_at = crun_clock() + s->o->grace;
}

/* Reaps every exited worker; the first failure stops the others. */
static void reap(sup_t *s) {
  int status;
  pid_t pid;
  proc_t *first = NULL; /* the failure that stops the attempt, of this batch */
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < s->o->nproc; i++) {
      proc_t *p = &s->procs[i];
      if (p->pid != pid || !p->running) continue;
      p->running = 0;
      p->status = status;
      crun__heap_release_slot(p->local_rank); /* its tensors died with it */
      CRUN_LOG(INFO, LAUNCH, "rank %d (pid %d) %s", p->rank, (int)pid,
               WIFSIGNALED(status) ? "died by a signal" : "exited");
      int failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (!failed) continue;
      int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      p->own_death = sig && !(sig < 32 && (s->sent & (1u << sig)));
      /* a rank killed by a signal is the likelier cause than the peers that
       * exited after seeing it die (EPEERDIED): within one batch it wins */
      if (!first || (sig && !WIFSIGNALED(first->status))) first = p;
    }
  }
  if (first && !s->stopping && s->fail.rank < 0 && !s->signal_seen) {
    s->fail.rank = first->rank;
    s->fail.pid = first->pid;
    s->fail.status = first->status;
    double delay = crun_env_double("CRUN_STOP_DELAY", 0);
    if (s->o->repl) {} /* -i: the prompt goes on without it */
    else if (delay > 0) s->stop_at = crun_clock() + delay; /* survivors may end on their own */
    else {
      char why[64];
      snprintf(why, sizeof why, "rank %d failed", first->rank);
      flight_dump(s, why, s->started_ns);
      begin_stop(s, SIGTERM);
    }
  }
}

/* Handles what the signalfd has: children exiting or a signal to forward. */
static void on_signals(sup_t *s) {
  struct signalfd_siginfo si;
  while (read(s->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
    int sig = (int)si.ssi_signo;
    if (sig == SIGCHLD) continue;
    if (sig == SIGUSR1) { /* a look at every rank's recent operations; the job goes on */
      flight_dump(s, "SIGUSR1", 0);
      continue;
    }
    char sb[32];
    if (!s->signal_seen) {
      s->signal_seen = sig;
      say("received %s; stopping %d worker%s", signame(sig, sb, sizeof sb), s->o->nproc,
          s->o->nproc == 1 ? "" : "s");
      begin_stop(s, sig);
    } else {
      begin_stop(s, SIGKILL);
    }
  }
  reap(s);
}

/* ---------------------------------------------------------------- the loop */

/* Counts workers still running and streams still open. */
static void count_live(sup_t *s, int *running, int *open) {
  *running = *open = 0;
  for (int i = 0; i < s->o->nproc; i++) {
    *running += s->procs[i].running;
    *open += (s->procs[i].out.fd >= 0) + (s->procs[i].err.fd >= 0);
  }
}

/* Milliseconds until the nearest deadline, -1 for none. */
static int poll_timeout(sup_t *s, int running) {
  double now = crun_clock(), until = -1;
  if (s->stopping == 1) until = s->kill_at;
  if (!s->stopping && s->stop_at >= 0) until = s->stop_at;
  if (!running) until = s->drain_until;
  if (until < 0) return -1;
  double ms = (until - now) * 1e3;
  return ms <= 0 ? 0 : (int)ms + 1;
}

/* Acts on passed deadlines: SIGKILL after the grace period; after the drain
 * period, gives up on pipes that children of the workers keep open. */
static void on_deadlines(sup_t *s, int running) {
  double now = crun_clock();
  if (!s->stopping && s->stop_at >= 0 && now >= s->stop_at) {
    say("CRUN_STOP_DELAY over: stopping the workers still running");
    begin_stop(s, SIGTERM);
  }
  if (s->stopping == 1 && now >= s->kill_at) {
    CRUN_LOG(INFO, LAUNCH, "grace period over; sending SIGKILL");
    signal_group(s, SIGKILL);
    s->stopping = 2;
  }
  if (!running && now >= s->drain_until)
    for (int i = 0; i < s->o->nproc; i++) {
      crun__stream_finish(&s->procs[i].out);
      crun__stream_finish(&s->procs[i].err);
    }
}

/* Polls the signalfd, the remote-failure fd and every open pipe once. */
static void poll_once(sup_t *s, struct pollfd *fds, int running) {
  int n = 0, remote_fd = crun__agent_failure_fd(s->agent);
  fds[n++] = (struct pollfd){.fd = s->sfd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = s->stopping ? -1 : remote_fd, .events = POLLIN};
  for (int i = 0; i < s->o->nproc; i++) {
    fds[n++] = (struct pollfd){.fd = s->procs[i].out.fd, .events = POLLIN};
    fds[n++] = (struct pollfd){.fd = s->procs[i].err.fd, .events = POLLIN};
  }
  int rc = poll(fds, (nfds_t)n, poll_timeout(s, running));
  if (rc > 0) {
    for (int i = 0; i < s->o->nproc; i++) {
      if (fds[2 + 2 * i].revents) crun__stream_pump(&s->procs[i].out);
      if (fds[3 + 2 * i].revents) crun__stream_pump(&s->procs[i].err);
    }
    if (fds[0].revents) on_signals(s);
    if (fds[1].revents && !s->stopping) {
      s->fail.remote = 1;
      crun__agent_wake_reason(s->agent, s->fail.why, sizeof s->fail.why);
      begin_stop(s, SIGTERM);
    }
  }
}

/* One line naming a failure: "rank 3 (pid 42) exited with code 7". */
static const char *failure_text(const failure_t *f, char *buf, size_t n) {
  char st[96];
  if (f->rank < 0 && f->remote && f->why[0]) {
    snprintf(buf, n, "stopped: %.*s", (int)(n > 16 ? n - 16 : 0), f->why);
    return buf;
  }
  if (f->rank < 0 && f->remote)
    snprintf(buf, n, "stopped: %s", f->why[0] ? f->why : "another node failed or went away");
  else if (f->rank < 0) snprintf(buf, n, "succeeded");
  else snprintf(buf, n, "rank %d (pid %d) %s", f->rank, (int)f->pid, status_text(f->status, st, sizeof st));
  return buf;
}

/* Prints the first failure of the attempt with the last lines of its stderr
 * (a Lua traceback is left out: the worker printed it already). */
static void report_failure(sup_t *s, int attempt) {
  char ft[CRUN_VERDICT_MAX + 100];
  if (s->fail.rank < 0 && !s->fail.remote) return;
  say("attempt %d failed: %s", attempt, failure_text(&s->fail, ft, sizeof ft));
  if (s->fail.rank < 0) return;
  proc_t *p = &s->procs[s->fail.rank - s->base.rank];
  const char *lines[CRUN_SUMMARY_TAIL];
  int n = crun__stream_tail(&p->err, lines, CRUN_SUMMARY_TAIL);
  if (n == 0) say("  rank %d wrote nothing to stderr", p->rank);
  else say("  last stderr lines of rank %d:", p->rank);
  for (int i = 0; i < n; i++) say("  | %s", lines[i]);
  char st[96];
  for (int i = 0; i < s->o->nproc; i++) /* other ranks that died on their own */
    if (s->procs[i].own_death && s->procs[i].rank != s->fail.rank)
      say("  also: rank %d (pid %d) %s", s->procs[i].rank, (int)s->procs[i].pid,
          status_text(s->procs[i].status, st, sizeof st));
}

/* Runs one attempt to its end; returns this node's exit code for it. */
static int run_attempt(sup_t *s, int attempt, struct pollfd *fds) {
  s->pgid = 0;
  s->stopping = 0;
  s->stop_at = -1;
  s->sent = 0;
  s->fail = (failure_t){.rank = -1};
  char why[CRUN_CGROUP_PATH + 128];
  if (s->cg.on && crun__cgroup_begin(&s->cg, attempt, why, sizeof why) < 0)
    say("warning: %s; descendants of the workers that leave their process group (setsid) "
        "may outlive attempt %d", why, attempt);
  fflush(NULL);
  int rc = 0;
  crun__heap_reserve(s->o->nproc); /* the workers' shared tensor heap (core/heap.h) */
  crun__obs_attempt_env(s->o->log_dir, attempt);
  s->started_ns = crun_clock_ns();
  for (int i = 0; i < s->o->nproc; i++) {
    s->procs[i] = (proc_t){.local_rank = i, .rank = s->base.rank + i};
    s->procs[i].out.fd = s->procs[i].err.fd = -1;
  }
  for (int i = 0; i < s->o->nproc && rc == 0; i++) {
    rc = spawn_one(s, &s->procs[i], attempt);
    if (rc == 0 && i == 0) watchdog_set(s, -s->pgid);
    if (rc == 0) watchdog_set(s, s->procs[i].pid);
  }
  /* only now the thread that watches the other nodes: a worker forked
   * beside a running thread inherits locks and heap blocks it holds */
  if (rc == 0) rc = crun__agent_watch(s->agent);
  if (rc < 0) {
    say("%s", crun_last_error());
    begin_stop(s, SIGKILL);
  }
  int running, open;
  count_live(s, &running, &open);
  s->drain_until = -1;
  while (running || open) {
    poll_once(s, fds, running);
    count_live(s, &running, &open);
    if (!running && s->drain_until < 0) {
      signal_group(s, SIGKILL); /* children the workers left behind */
      s->drain_until = crun_clock() + CRUN_DRAIN_SECONDS;
    }
    on_deadlines(s, running);
    count_live(s, &running, &open);
  }
  crun__cgroup_end(&s->cg); /* what the workers left behind, setsid or not */
  report_failure(s, attempt);
  pid_t *dead = malloc(sizeof *dead * (size_t)s->o->nproc);
  int ndead = 0;
  for (int i = 0; dead && i < s->o->nproc; i++)
    if (s->procs[i].pid > 0) dead[ndead++] = s->procs[i].pid;
  shm_sweep(dead, ndead); /* every worker is reaped: their names are free */
  free(dead);
  for (int i = 0; i < s->o->nproc; i++) {
    crun__stream_free(&s->procs[i].out);
    crun__stream_free(&s->procs[i].err);
  }
  if (rc < 0) return 1;
  if (s->fail.rank >= 0) return status_code(s->fail.status);
  if (s->signal_seen) return 128 + s->signal_seen;
  return s->fail.remote ? 1 : 0;
}

/* The signals the loop handles: SIGCHLD, SIGINT, SIGTERM, and SIGHUP unless
 * it is ignored (nohup keeps working). */
static void handled_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGCHLD);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGUSR1); /* flight recorder dumps (trace_merge.c) */
  struct sigaction hup;
  sigaction(SIGHUP, NULL, &hup);
  if (hup.sa_handler != SIG_IGN) sigaddset(set, SIGHUP);
}

void crun__signals_block(void) {
  sigset_t set;
  handled_signals(&set);
  g_main_tid = (pid_t)syscall(SYS_gettid);
  struct sigaction sa = {.sa_handler = forward_to_main, .sa_flags = SA_RESTART}, old;
  sigfillset(&sa.sa_mask);
  for (int sig = 1; sig < 32; sig++) /* an ignored signal stays ignored (a background job's SIGINT) */
    if (sigismember(&set, sig) && sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_IGN)
      sigaction(sig, &sa, NULL);
  sigprocmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
}

int crun__signals_pending(void) {
  sigset_t pend;
  sigpending(&pend);
  if (sigismember(&pend, SIGINT)) return SIGINT;
  if (sigismember(&pend, SIGTERM)) return SIGTERM;
  if (sigismember(&pend, SIGHUP)) return SIGHUP;
  return 0;
}

/* Opens the signalfd for the handled signals (blocked by crun__signals_block). */
static int signals_setup(sup_t *s) {
  sigset_t set;
  handled_signals(&set);
  s->sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (s->sfd < 0) return crun_error(CRUN_ESYS, "signalfd: %s", strerror(errno));
  return 0;
}

/* Raises the soft limit on open files when 2 pipes per worker need it. */
static void ensure_fd_limit(int nproc) {
  struct rlimit rl;
  rlim_t need = (rlim_t)nproc * 2 + 64;
  if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= need) return;
  rl.rlim_cur = rl.rlim_max < need ? rl.rlim_max : need;
  setrlimit(RLIMIT_NOFILE, &rl);
}

/* The closing list shows this many attempts at each end (each attempt's
 * failure was reported when it happened). */
#define SUMMARY_ENDS 5

/* The closing lines: the attempts when there were several (the first and
 * last SUMMARY_ENDS of a long run), and the code. */
static void final_summary(sup_t *s, const failure_t *hist, int attempts, int code) {
  char ft[CRUN_VERDICT_MAX + 100], sb[32];
  if (attempts > 1) {
    say("%s after %d attempt%s:", code == 0 ? "job succeeded" : "job failed", attempts,
        attempts == 1 ? "" : "s");
    int elide = attempts > 2 * SUMMARY_ENDS + 1;
    for (int i = 0; i < attempts; i++) {
      if (elide && i == SUMMARY_ENDS)
        say("  ... attempts %d to %d (%d more), each reported above when it ended", i,
            attempts - SUMMARY_ENDS - 1, attempts - 2 * SUMMARY_ENDS);
      if (elide && i >= SUMMARY_ENDS && i < attempts - SUMMARY_ENDS) continue;
      say("  attempt %d: %s", i, failure_text(&hist[i], ft, sizeof ft));
    }
  }
  if (s->signal_seen)
    say("stopped by %s; exit code %d", signame(s->signal_seen, sb, sizeof sb), code);
  else if (code != 0 && hist[attempts - 1].rank >= 0)
    say("exit code %d (from rank %d)", code, hist[attempts - 1].rank);
  else if (code != 0)
    say("exit code %d", code);
}

/* Runs attempts until one succeeds, restarts run out, the job fails or a
 * signal came. A worker failure restarts up to --max-restarts times; a c10d
 * membership change starts a new round without counting. */
static int run_attempts(sup_t *s, failure_t **hist, int *cap, int *attempts, struct pollfd *fds) {
  int code = 1;
  for (int attempt = 0;; attempt++) {
    if (attempt >= *cap) {
      failure_t *more = realloc(*hist, sizeof *more * (size_t)(*cap * 2));
      if (!more) {
        say("out of memory for the attempts' history");
        return code ? code : 1;
      }
      *hist = more;
      *cap *= 2;
    }
    int rc = crun__agent_begin_attempt(s->agent, attempt, &s->base);
    if (rc < 0) {
      say("%s", crun_last_error());
      int sig = crun__signals_pending();
      return sig ? 128 + sig : 1;
    }
    code = run_attempt(s, attempt, fds);
    (*hist)[attempt] = s->fail;
    *attempts = attempt + 1;
    if (s->signal_seen) return code;
    crun__next_t next;
    rc = crun__agent_end_attempt(s->agent, attempt, code, s->fail.rank < 0 && s->fail.remote, &next);
    if (rc != 0) {
      say("%s", crun_last_error());
      return code ? code : 1;
    }
    if (next == CRUN__NEXT_DONE) return 0;
    if (code == 0) { /* this node's workers succeeded; another node's did not */
      code = 1;
      (*hist)[attempt].remote = 1;
      char why[CRUN_VERDICT_MAX];
      crun__agent_wake_reason(s->agent, why, sizeof why);
      if (why[0]) say("attempt %d failed: %s", attempt, why);
    }
    if (next == CRUN__NEXT_FAIL) return code;
    if (next == CRUN__NEXT_RESTART && !s->o->c10d)
      say("restarting all workers (restart %d of %d)", attempt + 1, s->o->max_restarts);
  }
}

int crun__supervise(const crun__opts_t *o, const crun__placement_t *base, crun__agent_t *agent) {
  sup_t s = {.o = o, .base = *base, .agent = agent, .sfd = -1, .watch_fd = -1, .self = getpid()};
  s.procs = calloc((size_t)o->nproc, sizeof *s.procs);
  struct pollfd *fds = calloc((size_t)o->nproc * 2 + 2, sizeof *fds);
  int cap = o->max_restarts < 7 ? 8 : o->max_restarts + 1;
  failure_t *hist = calloc((size_t)cap, sizeof *hist);
  int code = 1, attempts = 0;
  if (!s.procs || !fds || !hist) {
    say("out of memory for %d workers", o->nproc);
    goto out;
  }
  ensure_fd_limit(o->nproc);
  char why[CRUN_CGROUP_PATH + 128];
  int cg = crun__cgroup_open(&s.cg, why, sizeof why); /* the watchdog learns the path */
  if (signals_setup(&s) < 0 || watchdog_start(&s) < 0) {
    say("%s", crun_last_error());
    goto out;
  }
  if (cg < 0 || (cg == 0 && crun__cgroup_create(&s.cg, why, sizeof why) < 0))
    say("warning: no cgroup for the workers (%s): descendants that leave the workers' "
        "process group (setsid) may outlive the job; CRUN_CGROUP=0 silences this", why);
  code = run_attempts(&s, &hist, &cap, &attempts, fds);
  if (attempts > 0) final_summary(&s, hist, attempts, code);
out:
  watchdog_stop(&s);
  crun__cgroup_close(&s.cg);
  if (s.sfd >= 0) close(s.sfd);
  free(s.procs);
  free(fds);
  free(hist);
  return code;
}

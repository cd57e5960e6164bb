/* cgroup.c — one cgroup v2 per attempt, so that the job's descendants end
 * with it even when they left the workers' process group (setsid, daemons).
 *
 * Layout: <the launcher's own cgroup>/crun-<launcher pid>/a<attempt>. Each
 * worker moves itself into its attempt's cgroup before it runs anything, so
 * everything it starts is counted there. Stopping an attempt signals every
 * process of the cgroup (cgroup.kill for SIGKILL when the kernel has it,
 * else each pid of cgroup.procs); at its end the cgroup is emptied and
 * removed. The watchdog empties and removes the whole crun-<pid> subtree
 * when the launcher dies. Where no cgroup v2 is mounted or it cannot be
 * written (not root, no delegation), crun__cgroup_open says why and the
 * launcher falls back to killing the process group. CRUN_CGROUP=0 turns it
 * off without a warning. */
#include "launcher.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CG_EMPTY_SECONDS 3.0

/* Writes text to dir/file; 0 or -errno. */
static int cg_write(const char *dir, const char *file, const char *text) {
  char path[CRUN_CGROUP_PATH + 32];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, text, strlen(text));
  int e = n < 0 ? errno : 0;
  close(fd);
  return n < 0 ? -e : 0;
}

/* Finds where cgroup2 is mounted (/sys/fs/cgroup or /sys/fs/cgroup/unified)
 * and this process's cgroup in it; fills base with their concatenation. */
static int cg_base(char *base, size_t n, char *why, size_t wn) {
  char mnt[512] = "", line[4096], own[1024] = "";
  FILE *f = fopen("/proc/self/mountinfo", "re");
  if (!f) { snprintf(why, wn, "cannot read /proc/self/mountinfo: %s", strerror(errno)); return -1; }
  while (fgets(line, sizeof line, f)) {
    /* id parent maj:min root mountpoint options ... - fstype source superopts */
    char *dash = strstr(line, " - ");
    char root[1024], point[512], fstype[64];
    if (!dash || sscanf(line, "%*s %*s %*s %1023s %511s", root, point) != 2) continue;
    if (sscanf(dash + 3, "%63s", fstype) != 1 || strcmp(fstype, "cgroup2") != 0) continue;
    snprintf(mnt, sizeof mnt, "%s", point);
    break;
  }
  fclose(f);
  if (!mnt[0]) { snprintf(why, wn, "no cgroup v2 file system is mounted"); return -1; }
  f = fopen("/proc/self/cgroup", "re");
  if (!f) { snprintf(why, wn, "cannot read /proc/self/cgroup: %s", strerror(errno)); return -1; }
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "0::", 3) == 0) {
      size_t len = strcspn(line + 3, "\n");
      if (len >= sizeof own) len = sizeof own - 1;
      memcpy(own, line + 3, len);
      own[len] = 0;
    }
  fclose(f);
  if (!own[0]) { snprintf(why, wn, "this process is in no cgroup v2"); return -1; }
  if (!strcmp(own, "/")) own[0] = 0;
  if ((size_t)snprintf(base, n, "%s%s", mnt, own) >= n) {
    snprintf(why, wn, "cgroup path too long");
    return -1;
  }
  return 0;
}

static void cg_sweep(const char *base);

/* The prewarm thread: writes "0" (this process) to its own cgroup.procs.
 * It takes no lock of crun's own (no CRUN_LOG): the launcher forks workers
 * while it may still run, and a child must not inherit a held log mutex
 * (glibc's fork keeps malloc and stdio consistent, not crun's locks). */
static void *prewarm_main(void *arg) {
  (void)arg;
  char base[CRUN_CGROUP_PATH - 32], why[256];
  if (cg_base(base, sizeof base, why, sizeof why) == 0) (void)cg_write(base, "cgroup.procs", "0");
  return NULL;
}

void crun__cgroup_prewarm(void) {
  const char *env = getenv("CRUN_CGROUP");
  if (env && !strcmp(env, "0")) return;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  /* a sanitizer build forks the store's process and the workers from a
   * launcher with no thread (agent.c): under TSan a child forked while this
   * thread lived died at its first pthread_create ("dup thread with used
   * id") or reported a race on what the thread had read */
  return;
#endif
  pthread_attr_t a;
  pthread_t t;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay the main thread's (signalfd) */
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &a, prewarm_main, NULL) != 0)
    CRUN_LOG(INFO, LAUNCH, "cgroup prewarm: no thread (the workers' moves wait as before)");
  pthread_attr_destroy(&a);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int crun__cgroup_open(crun__cgroup_t *cg, char *why, size_t wn) {
  memset(cg, 0, sizeof *cg);
  const char *env = getenv("CRUN_CGROUP");
  if (env && !strcmp(env, "0")) {
    snprintf(why, wn, "CRUN_CGROUP=0");
    return 1;
  }
  char base[CRUN_CGROUP_PATH - 32];
  if (cg_base(base, sizeof base, why, wn) < 0) return -1;
  cg_sweep(base);
  if ((size_t)snprintf(cg->job, sizeof cg->job, "%s/crun-%d", base, (int)getpid()) >= sizeof cg->job) {
    snprintf(why, wn, "cgroup path too long");
    return -1;
  }
  CRUN_LOG(INFO, LAUNCH, "the job's cgroup: %s", cg->job);
  return 0;
}

int crun__cgroup_create(crun__cgroup_t *cg, char *why, size_t wn) {
  if (!cg->job[0]) return -1;
  if (mkdir(cg->job, 0755) < 0 && errno != EEXIST) {
    snprintf(why, wn, "cannot create %s: %s", cg->job, strerror(errno));
    cg->job[0] = 0;
    return -1;
  }
  cg->on = 1;
  return 0;
}

int crun__cgroup_begin(crun__cgroup_t *cg, int attempt, char *why, size_t wn) {
  cg->attempt[0] = 0;
  if (!cg->on) return -1;
  char dir[CRUN_CGROUP_PATH + 16];
  if ((size_t)snprintf(dir, sizeof dir, "%s/a%d", cg->job, attempt) >= sizeof cg->attempt) {
    snprintf(why, wn, "cgroup path too long");
    return -1;
  }
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
    snprintf(why, wn, "cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  char procs[CRUN_CGROUP_PATH + 32];
  snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
  if (access(procs, W_OK) != 0) {
    snprintf(why, wn, "cannot write %s: %s", procs, strerror(errno));
    rmdir(dir);
    return -1;
  }
  memcpy(cg->attempt, dir, strlen(dir) + 1);
  return 0;
}

int crun__cgroup_enter(const crun__cgroup_t *cg) {
  if (!cg->attempt[0]) return 0;
  return cg_write(cg->attempt, "cgroup.procs", "0");
}

/* Sends sig to every process listed in dir/cgroup.procs but those of
 * process group `except` (0: none; they got it already); returns how many. */
static int cg_signal_procs(const char *dir, int sig, pid_t except) {
  char path[CRUN_CGROUP_PATH + 16];
  snprintf(path, sizeof path, "%s/cgroup.procs", dir);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  int n = 0;
  long pid;
  while (fscanf(f, "%ld", &pid) == 1)
    if (pid > 1 && pid != getpid() && (except <= 0 || getpgid((pid_t)pid) != except) &&
        kill((pid_t)pid, sig) == 0)
      n++;
  fclose(f);
  return n;
}

void crun__cgroup_signal(const char *dir, int sig, pid_t except) {
  if (!dir || !dir[0]) return;
  if (sig == SIGKILL && cg_write(dir, "cgroup.kill", "1") == 0) return;
  cg_signal_procs(dir, sig, except);
}

/* Whether dir holds no process (in it or below it). */
static int cg_empty(const char *dir) {
  char path[CRUN_CGROUP_PATH + 16], line[64];
  snprintf(path, sizeof path, "%s/cgroup.events", dir);
  FILE *f = fopen(path, "re");
  if (!f) return 1; /* gone */
  int empty = 0, seen = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "populated ", 10) == 0) { seen = 1; empty = line[10] == '0'; }
  fclose(f);
  if (!seen) { /* no cgroup.events: look at cgroup.procs */
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    f = fopen(path, "re");
    if (!f) return 1;
    long pid;
    empty = fscanf(f, "%ld", &pid) != 1;
    fclose(f);
  }
  return empty;
}

/* SIGKILLs everything in dir until it is empty (bounded); removes it. */
static int cg_drain(const char *dir) {
  double until = crun_clock() + CG_EMPTY_SECONDS;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (;;) {
    crun__cgroup_signal(dir, SIGKILL, 0);
    if (cg_empty(dir) || crun_clock() > until) break;
    nanosleep(&nap, NULL);
  }
  if (rmdir(dir) == 0 || errno == ENOENT) return 0;
  CRUN_LOG(WARN, LAUNCH, "cannot remove cgroup %s: %s", dir, strerror(errno));
  return -1;
}

void crun__cgroup_end(crun__cgroup_t *cg) {
  if (!cg->attempt[0]) return;
  cg_drain(cg->attempt);
  cg->attempt[0] = 0;
}

void crun__cgroup_close(crun__cgroup_t *cg) {
  if (!cg->job[0]) return;
  DIR *d = opendir(cg->job);
  if (d) {
    struct dirent *e;
    char dir[CRUN_CGROUP_PATH + 300];
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] != 'a' || e->d_type != DT_DIR) continue;
      snprintf(dir, sizeof dir, "%s/%s", cg->job, e->d_name);
      cg_drain(dir);
    }
    closedir(d);
  }
  cg_drain(cg->job);
  cg->on = 0;
  cg->job[0] = 0;
}

/* Removes what launchers that were SIGKILLed together with their watchdog
 * (timeout -s KILL on the process group, the OOM killer) left in base: every
 * crun-<pid> whose pid is no longer alive, its leftover processes killed. A
 * live pid is never touched, so a running job beside this one keeps its own. */
static void cg_sweep(const char *base) {
  DIR *d = opendir(base);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    if (strncmp(e->d_name, "crun-", 5) != 0 || e->d_type != DT_DIR) continue;
    long pid = strtol(e->d_name + 5, &end, 10);
    if (*end || pid <= 1 || pid == (long)getpid()) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    crun__cgroup_t stale = {0};
    if ((size_t)snprintf(stale.job, sizeof stale.job, "%s/%s", base, e->d_name) >= sizeof stale.job) continue;
    CRUN_LOG(INFO, LAUNCH, "removing the cgroup %s of launcher %ld, which ended without removing it",
             stale.job, pid);
    crun__cgroup_close(&stale);
  }
  closedir(d);
}

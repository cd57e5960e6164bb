/* env.c — the MPI library's lifetime in the process (MPI_Init_thread with
 * MPI_THREAD_MULTIPLE, MPI_Finalize at a clean exit), error texts, the
 * waiting policy of polling loops, and the watchdog of blocking MPI calls. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/mpi/mpi_int.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_up, g_we_init, g_oversub;
static MPI_Comm g_world = MPI_COMM_NULL, g_join = MPI_COMM_NULL;
static crun__mpi_watch_t *g_watches;

static const char *level_name(int level) {
  switch (level) {
  case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
  case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
  case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
  case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

/* Finalizes MPI at a clean exit only: a rank that exits with an error skips
 * MPI_Finalize, so mpirun sees it and ends the job instead of waiting. */
static void finalize_at_exit(int status, void *arg) {
  (void)arg;
  int fin = 0;
  MPI_Finalized(&fin);
  if (status == 0 && !fin) MPI_Finalize();
}

/* Counts the ranks mpirun put on this host against the cores we may use. */
static int host_oversubscribed(void) {
  long local = crun_env_int("OMPI_COMM_WORLD_LOCAL_SIZE", crun_env_int("LOCAL_WORLD_SIZE", 1));
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return local > cores;
}

/* Starts MPI (or adopts the program's) and checks the thread level. */
static int start_mpi(void) {
  int inited = 0, fin = 0, level = 0;
  MPI_Finalized(&fin);
  if (fin) return crun_error(CRUN_ESTATE, "mpi backend: MPI was already finalized in this process and cannot start again");
  MPI_Initialized(&inited);
  if (!inited) {
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
    if (rc != MPI_SUCCESS) return crun_error(CRUN_EIO, "mpi backend: MPI_Init_thread failed (error %d)", rc);
    g_we_init = 1;
    on_exit(finalize_at_exit, NULL);
  } else {
    MPI_Query_thread(&level);
  }
  if (level < MPI_THREAD_MULTIPLE)
    return crun_error(CRUN_ENOTSUP, "mpi backend: MPI provides %s but crun needs MPI_THREAD_MULTIPLE (groups run "
                      "collectives on their own progress threads); %s", level_name(level),
                      g_we_init ? "use an MPI library built with thread support"
                                : "initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let crun do it");
  return 0;
}

static void *watchdog_main(void *arg);

/* When this code lives in a loaded module (crun/core.so under lua5.4), keeps
 * the module mapped for good: the exit handler and the watchdog thread run
 * after lua_close would unload it. */
static void pin_module(void) {
  Dl_info info;
  if (dladdr((void *)pin_module, &info) && info.dli_fname && !dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE))
    CRUN_LOG(INFO, PG, "mpi backend: %s stays as loaded (%s)", info.dli_fname, dlerror());
}

int crun__mpi_up(MPI_Comm *world, MPI_Comm *join) {
  int rc = 0;
  pthread_mutex_lock(&g_lock);
  if (!g_up) {
    pin_module();
    rc = start_mpi();
    if (rc == 0 && (MPI_Comm_dup(MPI_COMM_WORLD, &g_world) != MPI_SUCCESS ||
                    MPI_Comm_dup(MPI_COMM_WORLD, &g_join) != MPI_SUCCESS))
      rc = crun_error(CRUN_EIO, "mpi backend: MPI_Comm_dup(MPI_COMM_WORLD) failed");
    if (rc == 0) {
      MPI_Comm_set_errhandler(g_world, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(g_join, MPI_ERRORS_RETURN);
      g_oversub = host_oversubscribed();
      pthread_t t;
      if (pthread_create(&t, NULL, watchdog_main, NULL) == 0) pthread_detach(t);
      g_up = 1;
    }
  }
  *world = g_world;
  *join = g_join;
  pthread_mutex_unlock(&g_lock);
  return rc;
}

int crun__mpi_tag_ub(MPI_Comm c) {
  int *ub = NULL, flag = 0;
  MPI_Comm_get_attr(c, MPI_TAG_UB, &ub, &flag);
  return flag && ub && *ub > 32767 ? *ub : 32767;
}

int crun__mpi_alive(void) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  return inited && !fin;
}

int crun__mpi_status(int mpirc) {
  int cls = 0;
  MPI_Error_class(mpirc, &cls);
  return cls == MPI_ERR_TRUNCATE ? CRUN_EMISMATCH : cls == MPI_ERR_NO_MEM ? CRUN_ENOMEM : CRUN_EIO;
}

int crun__mpi_fail(int mpirc, const char *desc, const crun_pg_t *pg, int rank, const char *call) {
  char text[MPI_MAX_ERROR_STRING + 1] = "";
  int len = 0;
  MPI_Error_string(mpirc, text, &len);
  return crun_error(crun__mpi_status(mpirc), "%s on %s: %s failed: %s", desc, CRUN__WHO(pg, rank), call, text);
}

void crun__mpi_relax(crun__mpi_spin_t *s) {
  if (s->spins++ == 0) s->start = crun_clock();
  if (!g_oversub && s->spins < 2000) return;
  if (s->spins % 64 || crun_clock() - s->start < 0.01) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50 * 1000};
  nanosleep(&ts, NULL);
}

/* Tests every pending request once more so finished ones read as NULL. */
static void settle(MPI_Request *reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
    }
}

/* Fails when a peer we still wait for (reqs[p], p < nrecv) destroyed the
 * group. MPI_Testall leaves the requests that did complete as they are while
 * others are pending, so a non-null reqs[p] is no proof that p's message is
 * missing: with p's notice seen, reqs[p] is tested on its own. p sent its
 * message before its notice, on the same communicator, so once the notice
 * is visible that message has been matched: p did join this call (and then
 * destroyed the group, its part done) unless reqs[p] is still open. */
static int peers_left(crun__mpi_t *b, MPI_Request *reqs, int nrecv, const char *desc) {
  for (int p = 0; p < nrecv; p++) {
    int rc = reqs[p] != MPI_REQUEST_NULL ? crun__mpi_poll_left(b, p, desc) : 0;
    int came = 0;
    if (rc < 0 && MPI_Test(&reqs[p], &came, MPI_STATUS_IGNORE) == MPI_SUCCESS && came) continue;
    if (rc < 0) return rc;
  }
  return 0;
}

int crun__mpi_wait(crun__mpi_t *b, MPI_Request *reqs, int n, int nrecv, double deadline, const char *desc) {
  crun__mpi_spin_t spin = {0};
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return crun__mpi_fail(rc, desc, b ? b->pg : NULL, b ? b->rank : -1, "MPI_Testall");
    if (done) return 0;
    if (b && (rc = crun__mpi_poll_abort(b, desc)) < 0) return rc;
    if (b && spin.spins % 256 == 255 && (rc = peers_left(b, reqs, nrecv, desc)) < 0) return rc;
    if (crun_clock() >= deadline) {
      settle(reqs, n);
      return 1;
    }
    crun__mpi_relax(&spin);
  }
}

/* ---------------------------------------------------------------- watchdog */

void crun__mpi_watch_add(crun__mpi_watch_t *w) {
  atomic_store(&w->deadline, 0.0);
  pthread_mutex_lock(&g_lock);
  w->next = g_watches;
  g_watches = w;
  pthread_mutex_unlock(&g_lock);
}

void crun__mpi_watch_remove(crun__mpi_watch_t *w) {
  pthread_mutex_lock(&g_lock);
  for (crun__mpi_watch_t **p = &g_watches; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  pthread_mutex_unlock(&g_lock);
}

void crun__mpi_watch_begin(crun__mpi_watch_t *w, double timeout, const char *desc, const char *call) {
  snprintf(w->what, sizeof w->what, "%s (%s)", desc, call);
  atomic_store(&w->deadline, crun_clock() + (timeout > 0 ? timeout : CRUN_PG_DEFAULT_TIMEOUT));
}

void crun__mpi_watch_end(crun__mpi_watch_t *w) { atomic_store(&w->deadline, 0.0); }

/* Every 200 ms: a blocking MPI call past its deadline cannot be cancelled,
 * so the job is aborted with a message naming the call (like NCCL's watchdog). */
static void *watchdog_main(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double now = crun_clock();
    pthread_mutex_lock(&g_lock);
    for (crun__mpi_watch_t *w = g_watches; w; w = w->next) {
      double d = atomic_load(&w->deadline);
      if (d <= 0 || now < d) continue;
      CRUN_LOG(WARN, COLL, "ETIMEDOUT: %s on %s is still inside MPI past its deadline; a peer "
               "never joined the operation or stopped inside it, and MPI cannot cancel it: aborting "
               "the MPI job", w->what, w->who);
      MPI_Abort(MPI_COMM_WORLD, 124);
    }
    pthread_mutex_unlock(&g_lock);
  }
  return NULL;
}

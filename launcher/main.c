/* main.c — crun-lua's command line: options, --help, --version, and the
 * choice between launching workers, running in-process under mpirun/srun,
 * and the interactive mode. */
#include "launcher.h"
#include "core/auth.h"

#include <lua.h>

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: crun-lua [options] script.lua [args]\n"
    "       crun-lua [options] -m module [args]         (a module found on package.path)\n"
    "       crun-lua [options] -i [script.lua [args]]    (interactive)\n"
    "\n"
    "Runs script.lua on N ranks. Each rank is a process with its own Lua 5.4\n"
    "state in which `require \"crun\"` works, `arg` is set as the lua\n"
    "interpreter sets it, and the environment holds RANK, LOCAL_RANK,\n"
    "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,\n"
    "ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,\n"
    "TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, CRUN_RESTART_COUNT, CRUN_LAUNCHER=1\n"
    "and OMP_NUM_THREADS=1 (unless set; as torchrun, only with -n above 1). The launcher\n"
    "of node 0 serves the TCP store at\n"
    "MASTER_ADDR:MASTER_PORT (c10d: the --rdzv-endpoint; CRUN_STORE_PREFIX keeps each run's\n"
    "keys apart there, and each restart's: crun/restart/<k>).\n"
    "\n"
    "options (torchrun's; each also spelled with underscores, --nproc_per_node):\n"
    "  -n, --nproc-per-node N  workers on this node (default 1); auto: the GPUs when CUDA\n"
    "                          devices exist, else the CPUs; cpu: the CPUs; gpu: the GPUs\n"
    "                          (an error without any)\n"
    "  --nnodes N|MIN:MAX      nodes in the job (default 1); start one crun-lua per node.\n"
    "                          MIN:MAX needs --rdzv-backend c10d and is elastic: a node that\n"
    "                          arrives below MAX, or a node lost (silent for heartbeat_timeout;\n"
    "                          at once when its crun-lua ends: a signal, an error),\n"
    "                          restarts every node's workers in a new round of the new size\n"
    "                          (fewer than MIN left: the job fails naming the lost nodes);\n"
    "                          such changes do not count against --max-restarts\n"
    "  --node-rank R           this node's index, 0..nnodes-1 (default 0); ranks are node-major\n"
    "                          (static rendezvous; c10d assigns node ranks itself)\n"
    "  --master-addr HOST      address of node 0's store (default 127.0.0.1)\n"
    "  --master-port P         its port (default 29500; 0 picks a free port, single node only)\n"
    "  --rdzv-backend B        static (default: --node-rank and node 0's store at\n"
    "                          --master-addr/--rdzv-endpoint) or c10d: the first agent to reach\n"
    "                          --rdzv-endpoint serves the store there (as long as any client\n"
    "                          uses it), the others connect (an agent also joins a store served\n"
    "                          there by another process); node ranks are first come: the order\n"
    "                          in which the agents joined the round\n"
    "  --rdzv-endpoint H[:P]   c10d: the store's address (port default 29400);\n"
    "                          static: the same as --master-addr H --master-port P\n"
    "  --rdzv-id ID            the job's run id (letters, digits, . _ -; default none): jobs\n"
    "                          with other ids on one endpoint never mix; TORCHELASTIC_RUN_ID\n"
    "  --rdzv-conf K=V,...     join_timeout (s, default --rdzv-timeout), last_call_timeout\n"
    "                          (s to wait for more nodes once MIN joined, default 30),\n"
    "                          close_timeout (s for every member to register, default 30),\n"
    "                          heartbeat_timeout (s without a node's heartbeat before it is\n"
    "                          lost, default 15, at least 0.1)\n"
    "  --standalone            one node, its store on a free port, a fresh run id; no\n"
    "                          endpoint needed\n"
    "  --rdzv-timeout S        seconds for every node to join (default 300)\n"
    "  --max-restarts N        restart all workers up to N times after a worker failure\n"
    "                          (default 0)\n"
    "  --monitor-interval S    accepted for torchrun's sake: crun-lua supervises by events\n"
    "                          (signalfd, pipes), not by polling, so it has no effect\n"
    "  --role NAME             the workers' role (default \"default\"): ROLE_NAME, and\n"
    "                          ROLE_RANK/ROLE_WORLD_SIZE count the nodes of that role\n"
    "  --grace-period S        seconds between SIGTERM and SIGKILL when stopping (default 3)\n"
    "  --log-dir DIR           log files DIR/attempt_<k>/rank_<r>.stdout and .stderr (DIR is\n"
    "                          created, parents too, as needed; k counts\n"
    "                          attempts from 0: restarts and c10d rounds); alone: every stream goes there, not shown\n"
    "  -r, --redirects SEL     streams that go to the log files only; SEL is 0 (none),\n"
    "                          1 (stdout), 2 (stderr), 3 (both), or per local rank: 0:1,1:2\n"
    "  -t, --tee [SEL]         streams shown and also written to the log files (same SEL;\n"
    "                          bare --tee: 3). Without --log-dir, a fresh directory under\n"
    "                          $TMPDIR (or /tmp) holds them; crun-lua prints its name\n"
    "  --local-ranks-filter L  show only these local ranks' output (\"0,2\"); log files\n"
    "                          still get every rank's\n"
    "  --backend NAME          sets CRUN_BACKEND for the workers: auto, cpu, mpi or nccl\n"
    "                          (nccl: CUDA tensors; auto on a GPU machine: cpu for host\n"
    "                          tensors and nccl for CUDA ones; CRUN_NCCL_CHECK=0 skips\n"
    "                          nccl's pre-call signature check)\n"
    "  --cpu-bind MODE         core: pin local rank i to the i-th usable CPU (round robin);\n"
    "                          none: leave placement to the kernel; auto (default): core\n"
    "                          when the workers are at least as many as the usable CPUs\n"
    "  --timeline FILE         record every rank's collectives, p2p ops, DDP buckets and spans;\n"
    "                          merged at the end into FILE, a Chrome/Perfetto JSON trace\n"
    "                          (its directory must exist; a failed merge fails the job)\n"
    "  --merge-timeline FILE   only merge every FILE.rank<r> (written by ranks run with\n"
    "                          CRUN_TIMELINE=FILE) into FILE, then exit\n"
    "  --no-prefix             do not prefix worker lines with \"[rank] \"\n"
    "  -m, --module            run the module named in place of the script, found on\n"
    "                          package.path (LUA_PATH honoured), as python -m does\n"
    "  --start-method M        accepted for torchrun's sake (spawn, fork or forkserver): each\n"
    "                          worker is forked with a fresh Lua state, whatever M says\n"
    "  --no-python             the script is a program (a C program linking libcrunrt, a shell\n"
    "                          script): each worker execs it, with its arguments and the\n"
    "                          variables below, as torchrun --no-python (found on PATH when\n"
    "                          it has no '/')\n"
    "  --run-path              accepted for torchrun's sake: a script is always run by its\n"
    "                          path (-m finds one on package.path), so it has no effect\n"
    "  -i                      interactive mode: a prompt whose lines run on every rank\n"
    "                          (after the script, if one is given; -n N without a script\n"
    "                          also opens it); the store then takes a free port unless\n"
    "                          --master-port is given, and there are no restarts\n"
    "  -h, --help              this text\n"
    "  --version               the crun version\n"
    "As torchrun, each option takes its default from PET_<NAME> (PET_NPROC_PER_NODE,\n"
    "PET_NNODES, PET_MASTER_ADDR, ...; a flag from a non-zero PET_STANDALONE=1).\n"
    "Options may also be written --name=value, and -n, -r, -t with the value\n"
    "attached (-n4, -r3, -t0:3).\n"
    "\n"
    "Output: every line a worker prints is shown whole, prefixed with its rank;\n"
    "worker stdout goes to stdout, stderr to stderr. Workers read /dev/null.\n"
    "When a worker fails (non-zero exit or a signal) the others get SIGTERM, then\n"
    "SIGKILL after the grace period; crun-lua names the failing rank and exits with\n"
    "its code (128+signal for a signal). Ctrl-C and SIGTERM reach every worker.\n"
    "CRUN_STOP_DELAY=S lets the others run up to S seconds after a failure first, so\n"
    "that they report their own errors (EPEERDIED, ETIMEDOUT); the fault-injection\n"
    "job (jobs/fault_inject.lua) uses it.\n"
    "CUDA: a worker's first use of a device (crun.cuda, t:cuda()) selects device\n"
    "LOCAL_RANK modulo the device count; CRUN_CUDA_DEVICE=N picks N instead and\n"
    "crun.cuda.set_device() changes it. Without a device, CUDA calls fail with\n"
    "ENOTSUP naming the reason (crun.cuda.unavailable_reason()).\n"
    "Flight recorder: each rank keeps its last CRUN_FLIGHT_RECORDER (2000; 0: off)\n"
    "operations; when a worker fails, or on SIGUSR1 to crun-lua (the job goes on),\n"
    "every rank writes them to the log dir (attempt_<k>/flight_rank<r>.txt; else\n"
    "$TMPDIR/crun-flight-<pid>-XXXXXX) and crun-lua says which ranks are behind, on which\n"
    "op, and where the ranks' sequences first differ.\n"
    "Under mpirun or srun (OMPI_COMM_WORLD_*, PMI_*, SLURM_* set) and without -n or\n"
    "--nnodes, the script runs in-process as the rank those tools gave.\n"
    "Nodes of a multi-node job share one secret: export the same CRUN_TOKEN on each.\n"
    "\n"
    "examples:\n"
    "  crun-lua -n 4 train.lua --epochs 3       4 ranks on this machine\n"
    "  crun-lua --standalone -n auto train.lua  one per GPU (or CPU), any free port\n"
    "  crun-lua -n 8 --master-port 0 hello.lua  any free port for the store\n"
    "  crun-lua -n 2 --log-dir logs --tee job.lua\n"
    "  crun-lua -n 4 --redirects 3 --tee 0:3 job.lua   only local rank 0 shown, all logged\n"
    "  crun-lua -n 4 --max-restarts 3 train.lua restart from a checkpoint after a crash\n"
    "  crun-lua --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -n 8 train.lua   (on node 0)\n"
    "  crun-lua --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -n 8 train.lua   (on node 1)\n"
    "  crun-lua --nnodes 1:4 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 \\\n"
    "           --rdzv-id job7 -n 8 train.lua                                    (on every node)\n"
    "  mpirun -np 4 crun-lua job.lua            ranks from mpirun, no spawning\n";

/* The PET_* variable whose value is being applied, if any (named in errors). */
static const char *g_from_env;

/* Prints a usage error and returns the exit code for it. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "crun-lua: ");
  vfprintf(stderr, fmt, ap);
  if (g_from_env) fprintf(stderr, " (%s in the environment)", g_from_env);
  fprintf(stderr, "\n(see crun-lua --help)\n");
  va_end(ap);
  return EXIT_USAGE;
}

/* Parses an integer option value within [min, max]; -1 on a bad value. */
static int parse_int(const char *opt, const char *v, long min, long max, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < min || x > max) {
    usage_error("%s: expected an integer in %ld..%ld, got '%s'", opt, min, max, v);
    return -1;
  }
  *out = (int)x;
  return 0;
}

/* Parses a number of seconds >= 0; -1 on a bad value. */
static int parse_seconds(const char *opt, const char *v, double *out) {
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end || !(x >= 0) || x > 1e9) {
    usage_error("%s: expected a number of seconds, got '%s'", opt, v);
    return -1;
  }
  *out = x;
  return 0;
}

/* Copies the option name of arg ("--nproc_per_node=4" -> "--nproc-per-node")
 * into name and returns the inline value ("4") or NULL. A short option that
 * takes a value may have it attached, as argparse allows: "-n4", "-r3",
 * "-t0:3", "-r=3". */
static const char *split_option(const char *arg, char *name, size_t n) {
  if (arg[1] && arg[1] != '-' && strchr("nrt", arg[1]) && arg[2]) {
    snprintf(name, n, "-%c", arg[1]);
    return arg + 2 + (arg[2] == '=');
  }
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  if (len >= n) len = n - 1;
  for (size_t i = 0; i < len; i++) name[i] = (i >= 2 && arg[i] == '_') ? '-' : arg[i];
  name[len] = 0;
  return eq ? eq + 1 : NULL;
}

/* Options that take a value, and flags. */
static const char *const valued[] = {"-n", "--nproc-per-node", "--nnodes", "--node-rank",
                                     "--master-addr", "--master-port", "--max-restarts",
                                     "--log-dir", "--backend", "--grace-period",
                                     "--rdzv-timeout", "--cpu-bind", "--rdzv-backend",
                                     "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
                                     "--monitor-interval", "-r", "--redirects",
                                     "--local-ranks-filter", "--role", "--timeline",
                                     "--merge-timeline", "--start-method", NULL};

static int is_valued(const char *name) {
  for (int i = 0; valued[i]; i++)
    if (strcmp(name, valued[i]) == 0) return 1;
  return 0;
}

/* Counts the GPUs CUDA would show: the NVIDIA driver's devices
 * (/proc/driver/nvidia/gpus), limited by CUDA_VISIBLE_DEVICES when set. */
static int count_gpus(void) {
  int n = 0;
  DIR *d = opendir("/proc/driver/nvidia/gpus");
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (!vis || n == 0) return n;
  int listed = 0; /* as CUDA: the list ends at the first entry that is not a device */
  for (const char *p = vis; *p && *p != '-';) {
    size_t len = strcspn(p, ",");
    if (len == 0) break;
    listed++;
    p += len + (p[len] == ',');
  }
  return listed < n ? listed : n;
}

/* -n auto|cpu|gpu|N, as torchrun: auto is the GPUs when CUDA devices exist, else
 * the CPUs (os.cpu_count(): the CPUs online); gpu without one is an error. */
static int parse_nproc(const char *opt, const char *v, int *out) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int gpus = strcmp(v, "auto") && strcmp(v, "gpu") ? 0 : count_gpus();
  long n = !strcmp(v, "cpu") ? cpus : !strcmp(v, "gpu") ? gpus : !strcmp(v, "auto") ? (gpus ? gpus : cpus) : -1;
  if (n < 0) return parse_int(opt, v, 1, CRUN_LAUNCH_MAX_NPROC, out);
  if (n == 0 && !strcmp(v, "gpu")) {
    usage_error("%s gpu: no CUDA device found (no /proc/driver/nvidia/gpus entry, or "
                "CUDA_VISIBLE_DEVICES hides them all); use auto, cpu or a number", opt);
    return -1;
  }
  *out = (int)(n < 1 ? 1 : n > CRUN_LAUNCH_MAX_NPROC ? CRUN_LAUNCH_MAX_NPROC : n);
  return 0;
}

/* --nnodes N or MIN:MAX. */
static int parse_nnodes(const char *opt, const char *v, crun__opts_t *o) {
  const char *colon = strchr(v, ':');
  if (!colon) {
    if (parse_int(opt, v, 1, CRUN_LAUNCH_MAX_NODES, &o->nnodes)) return -1;
    o->min_nodes = o->nnodes;
    return 0;
  }
  char min[32];
  size_t len = (size_t)(colon - v);
  if (len >= sizeof min) len = sizeof min - 1;
  memcpy(min, v, len);
  min[len] = 0;
  if (parse_int(opt, min, 1, CRUN_LAUNCH_MAX_NODES, &o->min_nodes) ||
      parse_int(opt, colon + 1, 1, CRUN_LAUNCH_MAX_NODES, &o->nnodes))
    return -1;
  if (o->min_nodes > o->nnodes) {
    usage_error("%s %s: MIN is above MAX", opt, v);
    return -1;
  }
  return 0;
}

/* --rdzv-endpoint HOST[:PORT] or [IPV6]:PORT into o (the host is kept in a
 * static buffer: there is one endpoint per process). */
static int parse_endpoint(const char *opt, const char *v, crun__opts_t *o) {
  static char host[256];
  const char *port = NULL;
  size_t len;
  if (v[0] == '[') {
    const char *close = strchr(v, ']');
    if (!close || (close[1] && close[1] != ':')) return usage_error("%s: bad address '%s'", opt, v);
    len = (size_t)(close - v - 1);
    v++;
    port = close[1] ? close + 2 : NULL;
  } else {
    const char *colon = strrchr(v, ':');
    if (colon && strchr(v, ':') != colon) colon = NULL; /* a bare IPv6 address */
    len = colon ? (size_t)(colon - v) : strlen(v);
    port = colon ? colon + 1 : NULL;
  }
  if (len == 0 || len >= sizeof host) return usage_error("%s: bad address '%s' (expected HOST[:PORT])", opt, v);
  memcpy(host, v, len);
  host[len] = 0;
  o->rdzv_host = host;
  o->rdzv_port = -1;
  if (port && parse_int(opt, port, 0, 65535, &o->rdzv_port)) return EXIT_USAGE;
  return 0;
}

/* --rdzv-id: what keys on a shared store may carry. */
static int check_run_id(const char *opt, const char *v) {
  size_t n = strlen(v);
  if (n == 0 || n > CRUN_LAUNCH_RUN_ID_MAX || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                     "0123456789._-") != n)
    return usage_error("%s: '%s' is not a run id (1..%d letters, digits, '.', '_' or '-')", opt, v,
                       CRUN_LAUNCH_RUN_ID_MAX);
  return 0;
}

/* --rdzv-conf key=value,...: the timeouts of the c10d round, in seconds. */
static int parse_rdzv_conf(const char *opt, const char *v, crun__opts_t *o) {
  char buf[512];
  if (strlen(v) >= sizeof buf) return usage_error("%s: value too long", opt);
  strcpy(buf, v);
  for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq) return usage_error("%s: '%s' is not key=value", opt, kv);
    *eq = 0;
    double *slot = !strcmp(kv, "join_timeout") ? &o->join_timeout
                 : !strcmp(kv, "last_call_timeout") ? &o->last_call_timeout
                 : !strcmp(kv, "close_timeout") ? &o->close_timeout
                 : !strcmp(kv, "heartbeat_timeout") ? &o->heartbeat_timeout : NULL;
    if (!slot)
      return usage_error("%s: unknown key '%s' (known: join_timeout, last_call_timeout, "
                         "close_timeout, heartbeat_timeout)", opt, kv);
    char name[96];
    snprintf(name, sizeof name, "%s %s", opt, kv);
    if (parse_seconds(name, eq + 1, slot)) return EXIT_USAGE;
  }
  return 0;
}

/* Checks a --redirects/--tee selector or a --local-ranks-filter list. */
static int check_selector(const char *opt, const char *v, int is_filter) {
  if (is_filter ? crun__rank_listed(v, -1) >= 0 : crun__std_select(v, -1) >= 0) return 0;
  if (is_filter)
    return usage_error("%s: expected local ranks separated by commas (e.g. 0,2), got '%s'", opt, v);
  return usage_error("%s: expected 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per local rank "
                     "map like 0:1,1:2, got '%s'", opt, v);
}

/* Applies the torchrun rendezvous and output options; 1 when name is not one. */
static int apply_torchrun(crun__opts_t *o, const char *name, const char *v, int *layout) {
  if (!strcmp(name, "--rdzv-backend")) {
    if (strcmp(v, "c10d") && strcmp(v, "static"))
      return usage_error("--rdzv-backend: unknown backend '%s' (expected c10d or static)", v);
    o->c10d = !strcmp(v, "c10d");
    *layout = 1;
  } else if (!strcmp(name, "--rdzv-endpoint")) return parse_endpoint(name, v, o);
  else if (!strcmp(name, "--rdzv-id")) {
    if (check_run_id(name, v)) return EXIT_USAGE;
    o->run_id = v;
  } else if (!strcmp(name, "--rdzv-conf")) return parse_rdzv_conf(name, v, o);
  else if (!strcmp(name, "--monitor-interval")) return parse_seconds(name, v, &o->monitor_interval) ? EXIT_USAGE : 0;
  else if (!strcmp(name, "--start-method")) { /* workers are always forked, each with a fresh Lua state */
    if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
      return usage_error("--start-method: unknown method '%s' (expected spawn, fork or forkserver)", v);
  }
  else if (!strcmp(name, "-r") || !strcmp(name, "--redirects")) {
    if (check_selector("--redirects", v, 0)) return EXIT_USAGE;
    o->redirects = v;
  } else if (!strcmp(name, "--local-ranks-filter")) {
    if (check_selector(name, v, 1)) return EXIT_USAGE;
    o->ranks_filter = v;
  } else if (!strcmp(name, "--role")) {
    if (!*v || strlen(v) >= sizeof ((crun__node_t *)0)->role || strpbrk(v, " \t\n"))
      return usage_error("--role: '%s' is not a role name (1..63 characters, no spaces)", v);
    o->role = v;
  } else return 1;
  return 0;
}

/* Applies one option with its value; returns 0, or an exit code. */
static int apply_valued(crun__opts_t *o, const char *name, const char *v, int *layout) {
  if (!strcmp(name, "-n") || !strcmp(name, "--nproc-per-node")) {
    *layout = 1;
    return parse_nproc(name, v, &o->nproc) ? EXIT_USAGE : 0;
  }
  if (!strcmp(name, "--nnodes")) {
    *layout = 1;
    return parse_nnodes(name, v, o) ? EXIT_USAGE : 0;
  }
  if (!strcmp(name, "--node-rank")) return parse_int(name, v, 0, 65535, &o->node_rank) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--master-port")) return parse_int(name, v, 0, 65535, &o->master_port) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--max-restarts")) return parse_int(name, v, 0, 1000000, &o->max_restarts) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--grace-period")) return parse_seconds(name, v, &o->grace) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--rdzv-timeout")) return parse_seconds(name, v, &o->rdzv_timeout) ? EXIT_USAGE : 0;
  int rc = apply_torchrun(o, name, v, layout);
  if (rc != 1) return rc;
  if (!strcmp(name, "--master-addr")) {
    if (!*v) return usage_error("%s: empty address", name);
    o->master_addr = v;
  } else if (!strcmp(name, "--log-dir")) {
    if (!*v) return usage_error("%s: empty directory name", name);
    o->log_dir = v;
  } else if (!strcmp(name, "--timeline") || !strcmp(name, "--merge-timeline")) {
    if (!*v) return usage_error("%s: empty file name", name);
    if (name[2] == 't') o->timeline = v;
    else o->merge_timeline = v;
  } else if (!strcmp(name, "--cpu-bind")) {
    if (strcmp(v, "auto") && strcmp(v, "core") && strcmp(v, "none"))
      return usage_error("--cpu-bind: unknown mode '%s' (expected auto, core or none)", v);
    o->cpu_bind = v;
  } else if (!strcmp(name, "--backend")) {
    if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "mpi") && strcmp(v, "nccl"))
      return usage_error("--backend: unknown backend '%s' (expected auto, cpu, mpi or nccl)", v);
    o->backend = v;
  }
  return 0;
}

/* Applies a flag; returns 0, -1 for "exit 0 now" (help, version), or an exit code. */
static int apply_flag(crun__opts_t *o, const char *name) {
  if (!strcmp(name, "--no-prefix")) o->no_prefix = 1;
  else if (!strcmp(name, "-i")) o->repl = 1;
  else if (!strcmp(name, "-m") || !strcmp(name, "--module")) o->module = 1;
  else if (!strcmp(name, "--standalone")) o->standalone = 1;
  else if (!strcmp(name, "--run-path")) return 0; /* a script is always run by path */
  else if (!strcmp(name, "--no-python")) o->no_python = 1;
  else if (!strcmp(name, "-h") || !strcmp(name, "--help")) { fputs(usage_text, stdout); return -1; }
  else if (!strcmp(name, "--version")) {
    printf("crun-lua %s (%s)\n", CRUN_VERSION_STRING, LUA_RELEASE);
    return -1;
  } else return usage_error("unknown option '%s'", name);
  return 0;
}

/* --tee takes a selector when one follows ("--tee 3", "--tee=0:1"); a bare
 * --tee (crun's older form) means both streams. Returns how many argv
 * entries the value used (0 or 1), or -1 on a bad inline value. */
static int apply_tee(crun__opts_t *o, const char *inline_v, const char *next) {
  if (inline_v) {
    if (check_selector("--tee", inline_v, 0)) return -1;
    o->tee = inline_v;
    return 0;
  }
  if (next && crun__std_select(next, -1) >= 0) {
    o->tee = next;
    return 1;
  }
  o->tee = "3";
  return 0;
}

/* torchrun takes each option's default from PET_<OPTION> (Kubeflow's
 * PyTorchJob sets PET_NNODES, PET_NPROC_PER_NODE, PET_MASTER_ADDR, ...); flags
 * from a PET_ value that is a non-zero integer. Applied before argv, which
 * wins. Returns 0 or an exit code. */
static int apply_pet_env(crun__opts_t *o, int *layout) {
  static const char *const names[] = {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint",
                                      "--rdzv-id", "--rdzv-conf", "--max-restarts", "--monitor-interval",
                                      "--role", "--log-dir", "--redirects", "--tee", "--node-rank",
                                      "--master-addr", "--master-port", "--standalone", "--module",
                                      "--run-path", "--start-method", "--no-python", NULL};
  int rc = 0;
  for (int i = 0; names[i] && rc == 0; i++) {
    char var[64] = "PET_";
    for (size_t k = 2; names[i][k] && k < 58; k++)
      var[k + 2] = names[i][k] == '-' ? '_' : (char)(names[i][k] - 'a' + 'A'), var[k + 3] = 0;
    const char *v = getenv(var);
    if (!v || !*v) continue;
    g_from_env = var;
    if (!strcmp(names[i], "--tee")) rc = apply_tee(o, v, NULL) < 0 ? EXIT_USAGE : 0;
    else if (is_valued(names[i])) rc = apply_valued(o, names[i], v, layout);
    else if (strtol(v, NULL, 10) != 0) rc = apply_flag(o, names[i]);
    g_from_env = NULL;
  }
  return rc;
}

/* Parses argv into o. Returns 0 to go on, -1 to exit 0, or an exit code.
 * *layout is set when -n, --nnodes or --rdzv-backend was given. */
static int parse_args(crun__opts_t *o, int argc, char **argv, int *layout) {
  int i = 1;
  int rc0 = apply_pet_env(o, layout);
  if (rc0) return rc0;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] == 0) break;
    if (!strcmp(a, "--")) { i++; break; }
    char name[64];
    const char *v = split_option(a, name, sizeof name);
    int rc;
    if (!strcmp(name, "--tee") || !strcmp(name, "-t")) {
      if ((rc = apply_tee(o, v, i + 1 < argc ? argv[i + 1] : NULL)) < 0) return EXIT_USAGE;
      i += rc;
      continue;
    }
    if (is_valued(name)) {
      if (!v && i + 1 >= argc) return usage_error("option %s needs a value", name);
      rc = apply_valued(o, name, v ? v : argv[++i], layout);
    } else {
      if (v) return usage_error("option %s takes no value", name);
      rc = apply_flag(o, name);
    }
    if (rc) return rc;
  }
  if (i < argc) {
    o->script = o->script_name = argv[i];
    o->script_index = i;
  }
  return 0;
}

/* Checks the rendezvous options against each other. Returns 0 or an exit code. */
static int check_rdzv(crun__opts_t *o) {
  if (o->standalone) {
    if (o->nnodes != 1) return usage_error("--standalone runs one node; drop --nnodes %d", o->nnodes);
    if (o->rdzv_host || o->c10d)
      fprintf(stderr, "crun-lua: --standalone: ignoring --rdzv-backend/--rdzv-endpoint (one node, "
                      "a free port)\n");
    o->c10d = 0;
    o->rdzv_host = NULL;
    o->master_port = 0;
    return 0;
  }
  if (o->min_nodes != o->nnodes && !o->c10d)
    return usage_error("--nnodes %d:%d: a range needs --rdzv-backend c10d", o->min_nodes, o->nnodes);
  if (!o->c10d) {
    if (o->rdzv_host) { /* static: torchrun takes the endpoint as node 0's address */
      o->master_addr = o->rdzv_host;
      if (o->rdzv_port >= 0) o->master_port = o->rdzv_port;
    }
    return 0;
  }
  if (!o->rdzv_host) return usage_error("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
  if (o->rdzv_port < 0) o->rdzv_port = CRUN_LAUNCH_DEFAULT_C10D_PORT;
  if (o->rdzv_port == 0)
    return usage_error("--rdzv-endpoint %s:0: the other nodes could not know the port; give one",
                       o->rdzv_host);
  if (o->repl) return usage_error("-i runs one node; it does not take --rdzv-backend c10d");
  return 0;
}

/* --timeline FILE: the ranks write FILE.rank<r> next to FILE and crun-lua
 * FILE at the end, so its directory must exist and take files; checked
 * before any rank runs rather than after the job. Returns 0 or an exit code. */
static int check_timeline(const char *file) {
  char dir[4096];
  struct stat st;
  if (!file) return 0;
  snprintf(dir, sizeof dir, "%s", file);
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  if (stat(file, &st) == 0 && S_ISDIR(st.st_mode))
    return usage_error("--timeline %s: that is a directory; give a file name", file);
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK | X_OK) != 0)
    return usage_error("--timeline %s: the directory %s %s", file, dir,
                       stat(dir, &st) != 0 ? "does not exist" : !S_ISDIR(st.st_mode) ? "is not a directory"
                                                                                      : "is not writable");
  return 0;
}

/* The recorders' sizes in the environment: a value the ranks would not take
 * (not a number, 0 or too many events; past 2^24 operations) turned the
 * timeline or the flight recorder off in every rank without a word, so it is
 * refused here, before any rank runs. Returns 0 or an exit code. */
static int check_obs_env(void) {
  static const struct { const char *name; long min, max; } vars[] = {
      {"CRUN_TIMELINE_EVENTS", 1, 1l << 26}, {"CRUN_FLIGHT_RECORDER", 0, 1l << 24}};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i].name);
    int n;
    if (v && *v && parse_int(vars[i].name, v, vars[i].min, vars[i].max, &n)) return EXIT_USAGE;
  }
  /* read by the supervisor only once a worker failed: inf or nan would then
   * leave the survivors running (or stop them at once) without a word */
  const char *d = getenv("CRUN_STOP_DELAY");
  double delay;
  if (d && *d && parse_seconds("CRUN_STOP_DELAY", d, &delay)) return EXIT_USAGE;
  return 0;
}

/* Checks the options against each other. Returns 0 or an exit code. */
static int check_opts(crun__opts_t *o) {
  int rc = check_rdzv(o);
  if (rc || (rc = check_timeline(o->timeline)) || (rc = check_obs_env())) return rc;
  if (!o->c10d && o->node_rank >= o->nnodes)
    return usage_error("--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
  if (!o->c10d && o->nnodes > 1 && o->master_port == 0)
    return usage_error("--master-port 0 picks a port only node 0 would know; "
                       "give a fixed port with --nnodes > 1");
  if (o->join_timeout < 0) o->join_timeout = o->rdzv_timeout;
  if (!(o->heartbeat_timeout >= 0.1))
    return usage_error("--rdzv-conf heartbeat_timeout: %g s is below 0.1 s (nodes beat every heartbeat_timeout / 4: "
                       "every node would count as lost)", o->heartbeat_timeout);
  if (o->no_python && (o->module || o->repl))
    return usage_error("--no-python runs a program on every worker; it does not go with %s", o->module ? "-m" : "-i");
  if (o->module && o->repl) return usage_error("-m runs a module; it does not go with -i");
  if (o->module && !o->script) return usage_error("-m needs a module name");
  if (!o->script && !o->repl) return usage_error("no script given");
  return 0;
}

/* Gives the log files a directory when --redirects/--tee ask for them and
 * --log-dir does not say where (torchrun takes a fresh temporary one too). */
static int ensure_log_dir(crun__opts_t *o) {
  if (o->log_dir || (!o->redirects && !o->tee)) return 0;
  static char dir[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/crun-lua-logs-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "crun-lua: ESYS: cannot create a log directory %s for --redirects/--tee: %s "
                    "(give one with --log-dir)\n", dir, strerror(errno));
    return 1;
  }
  fprintf(stderr, "crun-lua: worker log files in %s\n", dir);
  o->log_dir = dir;
  return 0;
}

/* -m: replaces the module name by the path of its file. */
static int resolve_module(crun__opts_t *o) {
  static char path[4096];
  if (!o->module) return 0;
  if (crun__module_find(o->script_name, path, sizeof path) < 0) {
    fprintf(stderr, "crun-lua: -m: %s\n", crun_last_error() + strlen("EINVAL: "));
    return 1;
  }
  o->script = path;
  return 0;
}

/* A fresh run id for --standalone (torchrun takes a uuid). */
static void fresh_run_id(crun__opts_t *o) {
  static char id[33];
  char hex[65];
  crun__auth_new_token(hex);
  memcpy(id, hex, 32);
  id[32] = 0;
  o->run_id = id;
}

/* Runs the script in this process as the rank mpirun/srun assigned; the
 * store at --master-addr/--master-port, else MASTER_ADDR/MASTER_PORT (unset
 * or empty: 127.0.0.1:29500; a MASTER_PORT that is not a port is refused). */
static int run_in_process(const crun__opts_t *o, crun__placement_t *p) {
  const char *addr = o->master_addr ? o->master_addr : getenv("MASTER_ADDR");
  const char *port = getenv("MASTER_PORT");
  p->master_addr = addr && *addr ? addr : "127.0.0.1";
  p->master_port = o->master_port >= 0 ? o->master_port : CRUN_LAUNCH_DEFAULT_PORT;
  if (o->master_port < 0 && port && *port && parse_int("MASTER_PORT", port, 0, 65535, &p->master_port))
    return EXIT_USAGE;
  p->restart_count = 0;
  if (p->group_world_size < 1) /* mpirun: as many nodes as full local groups (srun says) */
    p->group_world_size = p->world_size / (p->local_world_size > 0 ? p->local_world_size : 1);
  crun__worker_setenv(o, p);
  unsetenv("CRUN_LAUNCHER"); /* no launcher serves a store here: rank 0 hosts it */
  crun__obs_worker_init(); /* this process is the rank */
  return crun__worker_run(o);
}

/* Gives the job its secret (core/auth.h): CRUN_TOKEN as the user set it,
 * else a fresh one for a one-node job. The workers and the store server
 * inherit it through the environment; it never appears on a command line.
 * Nodes of a multi-node job must share one, so the user sets it there. */
static int ensure_token(const crun__opts_t *o) {
  const char *t = getenv("CRUN_TOKEN");
  if (t && *t) return 0;
  if (o->nnodes > 1)
    return usage_error("--nnodes %d: every node needs the same secret in CRUN_TOKEN (e.g. run "
                       "'export CRUN_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d \" \\n\")' once and "
                       "pass it to each node's environment)", o->nnodes);
  char hex[65];
  crun__auth_new_token(hex);
  setenv("CRUN_TOKEN", hex, 1);
  return 0;
}

/* Starts the node agent, supervises the workers, stops the agent. */
static int launch(const crun__opts_t *o) {
  crun__placement_t base = {0};
  crun__agent_t *agent = NULL;
  crun__signals_block();
  crun__cgroup_prewarm(); /* its grace period runs while the store starts */
  if (crun__agent_start(o, &base, &agent) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error());
    int sig = crun__signals_pending();
    return sig ? 128 + sig : 1;
  }
  int code = crun__supervise(o, &base, agent);
  crun__agent_stop(agent);
  crun__obs_cleanup();
  const char *tl = getenv("CRUN_TIMELINE");
  int merged = !tl || !*tl ? 0
             : base.group_world_size > 1 ? crun__obs_merge_shared(tl, base.world_size)
                                         : crun__obs_merge(tl, base.world_size);
  if (merged != 0 && code == 0) code = 1;
  return code;
}

int main(int argc, char **argv) {
  crun__opts_t o = {.nproc = 1, .nnodes = 1, .min_nodes = 1, .master_port = -1,
                    .grace = CRUN_LAUNCH_DEFAULT_GRACE, .rdzv_timeout = CRUN_LAUNCH_DEFAULT_RDZV_TIMEOUT,
                    .role = "default", .run_id = "none", .join_timeout = -1,
                    .last_call_timeout = CRUN_LAUNCH_DEFAULT_LAST_CALL,
                    .close_timeout = CRUN_LAUNCH_DEFAULT_CLOSE,
                    .heartbeat_timeout = CRUN_LAUNCH_DEFAULT_HEARTBEAT, .argc = argc, .argv = argv};
  int layout = 0;
  int rc = parse_args(&o, argc, argv, &layout);
  if (rc) return rc < 0 ? 0 : rc;
  crun__obs_launcher_setup(o.timeline);
  if (o.merge_timeline) return crun__obs_merge(o.merge_timeline, -1); /* whatever ranks wrote parts */
  if (!o.script && layout && !o.module) o.repl = 1; /* crun-lua -n 4: the REPL */
  if ((rc = check_opts(&o))) return rc;
  if (o.standalone && !strcmp(o.run_id, "none")) fresh_run_id(&o);
  if ((rc = resolve_module(&o))) return rc;
  if (o.repl) return o.nnodes == 1 && (rc = ensure_token(&o)) ? rc : crun__repl_run(&o); /* -i is one node */
  if (o.no_python ? crun__program_check(o.script) < 0 : crun__script_check(o.script) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error() + strlen("EINVAL: "));
    return 1;
  }
  crun__placement_t p = {0};
  int engine = layout ? 0 : crun__engine_detect(&p);
  if (engine < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error());
    return EXIT_USAGE;
  }
  if (engine) return run_in_process(&o, &p);
  if (o.master_port < 0) o.master_port = CRUN_LAUNCH_DEFAULT_PORT;
  if (!o.master_addr) o.master_addr = "127.0.0.1";
  if ((rc = ensure_token(&o)) || (rc = ensure_log_dir(&o))) return rc;
  return launch(&o);
}

/* main.c — crun-lua's command line: options, --help, --version, and the
 * choice between launching workers, running in-process under mpirun/srun,
 * and the interactive mode. */
#include "launcher.h"
#include "core/auth.h"

#include <lua.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 2

static const char usage_text[] =
    "usage: crun-lua [options] script.lua [args]\n"
    "       crun-lua [options] -i [script.lua [args]]    (interactive)\n"
    "\n"
    "Runs script.lua on N ranks. Each rank is a process with its own Lua 5.4\n"
    "state in which `require \"crun\"` works, `arg` is set as the lua\n"
    "interpreter sets it, and the environment holds RANK, LOCAL_RANK,\n"
    "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,\n"
    "CRUN_RESTART_COUNT, CRUN_LAUNCHER=1 and OMP_NUM_THREADS=1 (unless set).\n"
    "The launcher of node 0 serves the TCP store at MASTER_ADDR:MASTER_PORT.\n"
    "\n"
    "options:\n"
    "  -n, --nproc-per-node N  workers on this node (default 1)\n"
    "  --nnodes N              nodes in the job (default 1); start one crun-lua per node\n"
    "  --node-rank R           this node's index, 0..nnodes-1 (default 0); ranks are node-major\n"
    "  --master-addr HOST      address of node 0's store (default 127.0.0.1)\n"
    "  --master-port P         its port (default 29500; 0 picks a free port, single node only)\n"
    "  --rdzv-timeout S        seconds for every node to join (default 300)\n"
    "  --max-restarts N        restart all workers up to N times after a failure (default 0)\n"
    "  --grace-period S        seconds between SIGTERM and SIGKILL when stopping (default 3)\n"
    "  --log-dir DIR           write DIR/attempt_<k>/rank_<r>.stdout and .stderr instead of\n"
    "                          showing worker output (k counts restarts from 0)\n"
    "  --tee                   with --log-dir: show the output too\n"
    "  --backend NAME          sets CRUN_BACKEND for the workers: auto, cpu, mpi or nccl\n"
  "  --cpu-bind MODE         core: pin local rank i to the i-th usable CPU (round robin);\n"
  "                          none: leave placement to the kernel; auto (default): core\n"
  "                          when the workers are at least as many as the usable CPUs\n"
    "  --no-prefix             do not prefix worker lines with \"[rank] \"\n"
    "  -i                      interactive mode: a prompt whose lines run on every rank\n"
    "                          (after the script, if one is given; -n N without a script\n"
    "                          also opens it); the store then takes a free port unless\n"
    "                          --master-port is given, and there are no restarts\n"
    "  -h, --help              this text\n"
    "  --version               the crun version\n"
    "Options may also be written --name=value, and torchrun's --nproc_per_node style.\n"
    "\n"
    "Output: every line a worker prints is shown whole, prefixed with its rank;\n"
    "worker stdout goes to stdout, stderr to stderr. Workers read /dev/null.\n"
    "When a worker fails (non-zero exit or a signal) the others get SIGTERM, then\n"
    "SIGKILL after the grace period; crun-lua names the failing rank and exits with\n"
    "its code (128+signal for a signal). Ctrl-C and SIGTERM reach every worker.\n"
    "CRUN_STOP_DELAY=S lets the others run up to S seconds after a failure first, so\n"
    "that they report their own errors (EPEERDIED, ETIMEDOUT); the fault-injection\n"
    "job (jobs/fault_inject.lua) uses it.\n"
    "Under mpirun or srun (OMPI_COMM_WORLD_*, PMI_*, SLURM_* set) and without -n or\n"
    "--nnodes, the script runs in-process as the rank those tools gave.\n"
    "\n"
    "examples:\n"
    "  crun-lua -n 4 train.lua --epochs 3       4 ranks on this machine\n"
    "  crun-lua -n 8 --master-port 0 hello.lua  any free port for the store\n"
    "  crun-lua -n 2 --log-dir logs --tee job.lua\n"
    "  crun-lua -n 4 --max-restarts 3 train.lua restart from a checkpoint after a crash\n"
    "  crun-lua --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -n 8 train.lua   (on node 0)\n"
    "  crun-lua --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -n 8 train.lua   (on node 1)\n"
    "  mpirun -np 4 crun-lua job.lua            ranks from mpirun, no spawning\n";

/* Prints a usage error and returns the exit code for it. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "crun-lua: ");
  vfprintf(stderr, fmt, ap);
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
 * into name and returns the inline value ("4") or NULL. */
static const char *split_option(const char *arg, char *name, size_t n) {
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  if (len >= n) len = n - 1;
  for (size_t i = 0; i < len; i++) name[i] = (i >= 2 && arg[i] == '_') ? '-' : arg[i];
  name[len] = 0;
  if (strncmp(arg, "-n", 2) == 0 && arg[1] == 'n' && arg[2] && arg[2] != '=' && !eq) {
    name[2] = 0; /* "-n4" */
    return arg + 2;
  }
  return eq ? eq + 1 : NULL;
}

/* Options that take a value, and flags. */
static const char *const valued[] = {"-n", "--nproc-per-node", "--nnodes", "--node-rank",
                                     "--master-addr", "--master-port", "--max-restarts",
                                     "--log-dir", "--backend", "--grace-period",
                                     "--rdzv-timeout", "--cpu-bind", NULL};

static int is_valued(const char *name) {
  for (int i = 0; valued[i]; i++)
    if (strcmp(name, valued[i]) == 0) return 1;
  return 0;
}

/* Applies one option with its value; returns 0, or an exit code. */
static int apply_valued(crun__opts_t *o, const char *name, const char *v, int *layout) {
  if (!strcmp(name, "-n") || !strcmp(name, "--nproc-per-node")) {
    *layout = 1;
    return parse_int(name, v, 1, 4096, &o->nproc) ? EXIT_USAGE : 0;
  }
  if (!strcmp(name, "--nnodes")) {
    *layout = 1;
    return parse_int(name, v, 1, 65536, &o->nnodes) ? EXIT_USAGE : 0;
  }
  if (!strcmp(name, "--node-rank")) return parse_int(name, v, 0, 65535, &o->node_rank) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--master-port")) return parse_int(name, v, 0, 65535, &o->master_port) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--max-restarts")) return parse_int(name, v, 0, 1000000, &o->max_restarts) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--grace-period")) return parse_seconds(name, v, &o->grace) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--rdzv-timeout")) return parse_seconds(name, v, &o->rdzv_timeout) ? EXIT_USAGE : 0;
  if (!strcmp(name, "--master-addr")) {
    if (!*v) return usage_error("%s: empty address", name);
    o->master_addr = v;
  } else if (!strcmp(name, "--log-dir")) {
    if (!*v) return usage_error("%s: empty directory name", name);
    o->log_dir = v;
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
  if (!strcmp(name, "--tee")) o->tee = 1;
  else if (!strcmp(name, "--no-prefix")) o->no_prefix = 1;
  else if (!strcmp(name, "-i")) o->repl = 1;
  else if (!strcmp(name, "-h") || !strcmp(name, "--help")) { fputs(usage_text, stdout); return -1; }
  else if (!strcmp(name, "--version")) {
    printf("crun-lua %s (%s)\n", CRUN_VERSION_STRING, LUA_RELEASE);
    return -1;
  } else return usage_error("unknown option '%s'", name);
  return 0;
}

/* Parses argv into o. Returns 0 to go on, -1 to exit 0, or an exit code.
 * *layout is set when -n or --nnodes was given. */
static int parse_args(crun__opts_t *o, int argc, char **argv, int *layout) {
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] == 0) break;
    if (!strcmp(a, "--")) { i++; break; }
    char name[64];
    const char *v = split_option(a, name, sizeof name);
    int rc;
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
    o->script = argv[i];
    o->script_index = i;
  }
  return 0;
}

/* Checks the options against each other. Returns 0 or an exit code. */
static int check_opts(const crun__opts_t *o) {
  if (o->node_rank >= o->nnodes)
    return usage_error("--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
  if (o->nnodes > 1 && o->master_port == 0)
    return usage_error("--master-port 0 picks a port only node 0 would know; "
                       "give a fixed port with --nnodes > 1");
  if (o->tee && !o->log_dir) return usage_error("--tee needs --log-dir");
  if (!o->script && !o->repl) return usage_error("no script given");
  return 0;
}

/* Runs the script in this process as the rank mpirun/srun assigned. */
static int run_in_process(const crun__opts_t *o, crun__placement_t *p) {
  const char *addr = o->master_addr ? o->master_addr : getenv("MASTER_ADDR");
  p->master_addr = addr && *addr ? addr : "127.0.0.1";
  p->master_port = o->master_port >= 0 ? o->master_port
                                       : (int)crun_env_int("MASTER_PORT", CRUN_LAUNCH_DEFAULT_PORT);
  p->restart_count = 0;
  crun__worker_setenv(o, p);
  unsetenv("CRUN_LAUNCHER"); /* no launcher serves a store here: rank 0 hosts it */
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
  if (crun__agent_start(o, &base, &agent) < 0) {
    fprintf(stderr, "crun-lua: %s\n", crun_last_error());
    int sig = crun__signals_pending();
    return sig ? 128 + sig : 1;
  }
  int code = crun__supervise(o, &base, agent);
  crun__agent_stop(agent);
  return code;
}

int main(int argc, char **argv) {
  crun__opts_t o = {.nproc = 1, .nnodes = 1, .master_port = -1, .grace = CRUN_LAUNCH_DEFAULT_GRACE,
                    .rdzv_timeout = CRUN_LAUNCH_DEFAULT_RDZV_TIMEOUT, .argc = argc, .argv = argv};
  int layout = 0;
  int rc = parse_args(&o, argc, argv, &layout);
  if (rc) return rc < 0 ? 0 : rc;
  if (!o.script && layout) o.repl = 1; /* crun-lua -n 4: the REPL */
  if ((rc = check_opts(&o))) return rc;
  if (o.repl) return o.nnodes == 1 && (rc = ensure_token(&o)) ? rc : crun__repl_run(&o); /* -i is one node */
  if (crun__script_check(o.script) < 0) {
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
  if ((rc = ensure_token(&o))) return rc;
  return launch(&o);
}

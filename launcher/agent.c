/* agent.c — the node agent (interim: single node, no store server yet). */
#include "launcher.h"

struct crun__agent {
  int unused;
};

static crun__agent_t single;

int crun__agent_start(const crun__opts_t *o, crun__placement_t *base, crun__agent_t **out) {
  if (o->nnodes > 1) return crun_error(CRUN_ENOTSUP, "--nnodes > 1 needs the TCP store (not built yet)");
  base->rank = 0;
  base->world_size = o->nproc;
  base->local_world_size = o->nproc;
  base->group_rank = 0;
  base->master_addr = o->master_addr;
  base->master_port = o->master_port;
  *out = &single;
  return 0;
}

int crun__agent_begin_attempt(crun__agent_t *a, int attempt) { (void)a; (void)attempt; return 0; }

int crun__agent_end_attempt(crun__agent_t *a, int attempt, int code, int *job_failed) {
  (void)a; (void)attempt;
  *job_failed = code != 0;
  return 0;
}

int crun__agent_failure_fd(crun__agent_t *a) { (void)a; return -1; }

void crun__agent_stop(crun__agent_t *a) { (void)a; }

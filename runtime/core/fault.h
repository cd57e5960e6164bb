/* fault.h — test-only allocation-failure injection (internal).
 *
 * An allocation that can fail in a way no test could otherwise reach is
 * written CRUN__FAULT_MALLOC("site", n) (or _CALLOC): it is malloc unless
 * the fault at `site` is armed, then NULL. Sites are named "<area>.<what>"
 * ("mpi.abort_msg"); `grep -rn CRUN__FAULT_ runtime/` lists them.
 *
 * Armed by CRUN_FAULT_ALLOC, read once (at the first check):
 *   CRUN_FAULT_ALLOC=entry[,entry...]   at most 8 entries
 *   entry = site        every allocation at site fails
 *         | site:n      only the n-th at site fails (1: the first)
 *         | site:n+     the n-th and every later one fails
 * site "*" matches every site, so "*:3" fails the third checked allocation
 * of the process. A fault that fires logs "fault injected: ..." at INFO (PG).
 * Tests in C may re-arm with crun__fault_arm(spec) (NULL or "": disarm).
 *
 * Unarmed, a check costs one relaxed load and a predicted-not-taken branch;
 * the slow path runs only until the variable is read and while armed. */
#ifndef CRUN_CORE_FAULT_H
#define CRUN_CORE_FAULT_H

#include <stdatomic.h>
#include <stdlib.h>

/* 0: CRUN_FAULT_ALLOC not read yet; 1: unarmed; 2: armed. */
extern _Atomic int crun__fault_state;

/* The slow path of crun__fault_alloc: reads the variable once, then counts
 * the call at `site`; returns 1 when this allocation must fail. */
int crun__fault_hit(const char *site);

/* Replaces the armed faults with spec (CRUN_FAULT_ALLOC's syntax; NULL or
 * "": none), resetting their counts. Returns 0, or CRUN_EINVAL (recorded)
 * for a malformed spec, which arms nothing. For tests. */
int crun__fault_arm(const char *spec);

/* 1 when the allocation at `site` must fail (see above). */
static inline int crun__fault_alloc(const char *site) {
  return __builtin_expect(atomic_load_explicit(&crun__fault_state, memory_order_relaxed) != 1, 0) &&
         crun__fault_hit(site);
}

#define CRUN__FAULT_MALLOC(site, n) (crun__fault_alloc(site) ? NULL : malloc(n))
#define CRUN__FAULT_CALLOC(site, n, size) (crun__fault_alloc(site) ? NULL : calloc((n), (size)))

#endif

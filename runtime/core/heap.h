/* heap.h — the node's shared tensor heap (internal to runtime/).
 *
 * crun-lua maps one large MAP_SHARED|MAP_ANONYMOUS|MAP_NORESERVE region
 * before it forks the workers of an attempt, so the region sits at the same
 * address in every worker of the node. It is split into one slot per local
 * rank; each worker allocates the storage of its large tensors (at least
 * CRUN_HEAP_MIN bytes, default 64 KiB) from its own slot. A pointer into the
 * heap is then valid, unchanged, in every other worker of the node: the
 * shared-memory collective engine reads its peers' tensors and writes their
 * results in place, with no copy through a bounce buffer.
 *
 * Nothing of it is a file: no name in /dev/shm, pages return to the system
 * when the last process of the node exits (and at each restart, when the
 * launcher drops the previous attempt's pages). A worker that forks loses its
 * slot in the child (the child allocates with malloc). Without the launcher
 * (lua5.4, mpirun, C programs), or with CRUN_HEAP=0, the heap is off and
 * every allocation goes to malloc. Virtual size per slot: CRUN_HEAP_SLOT_GB
 * (default 64); the pages actually touched are what counts. */
#ifndef CRUN_CORE_HEAP_H
#define CRUN_CORE_HEAP_H

#include <stddef.h>
#include <stdint.h>

/* In the launcher, before forking: maps the region for `nslots` workers (or
 * drops every page of the previous attempt when it is mapped already).
 * Returns 0, or -1 when the heap stays off (CRUN_HEAP=0, mmap refused). */
int crun__heap_reserve(int nslots);

/* In a worker right after fork: takes slot `slot` for its allocations. */
void crun__heap_use_slot(int slot);

/* Allocates nbytes (64-byte aligned) from this process's slot; NULL when the
 * heap is off, nbytes is below the minimum, or the slot is full. */
void *crun__heap_alloc(size_t nbytes);

/* In the launcher, once slot's worker exited: drops every page of its slot
 * (the mapping stays, so a peer still reading it sees zeros, never a fault). */
void crun__heap_release_slot(int slot);

/* Frees p if it came from crun__heap_alloc and returns 1; 0 otherwise. */
int crun__heap_free(void *p);

/* The heap's identity (random, non-zero; equal in every worker of one node's
 * attempt), or 0 when this process has no heap. */
uint64_t crun__heap_id(void);

/* Whether [p, p + n) lies inside the heap's region (any slot). */
int crun__heap_contains(const void *p, size_t n);

#endif /* CRUN_CORE_HEAP_H */

/* clock_int.h — the coarse clock the hot paths set deadlines with.
 *
 * A collective's deadline is seconds away, but reading CLOCK_MONOTONIC costs
 * 45-70 ns in a VM (measured on the project's AMD EPYC VM, kvm/tsc), and a
 * small all_reduce read it three times (the group's deadline, the engine's
 * remaining time, the engine's own deadline): about a third of a 2-rank 8-byte
 * all_reduce. CLOCK_MONOTONIC_COARSE is read from the vDSO without the TSC
 * (~10 ns) and lags the precise clock by at most one tick (1-10 ms), so a
 * deadline set from it fires at most one tick early; deadlines are compared
 * with either clock. */
#ifndef CRUN_CLOCK_INT_H
#define CRUN_CLOCK_INT_H

/* CLOCK_MONOTONIC_COARSE in seconds (CLOCK_MONOTONIC where it is missing). */
double crun__clock_coarse(void);

/* The longest timeout anything takes (about 31 years): a longer one, or
 * inf, is clamped to it, so every deadline stays a finite time (the
 * nanoseconds of inf overflow a uint64_t and a timespec). */
#define CRUN__MAX_TIMEOUT 1e9

/* A group or operation timeout as used: NaN or <= 0 is `def` (the default),
 * more than CRUN__MAX_TIMEOUT is CRUN__MAX_TIMEOUT. */
static inline double crun__timeout_or(double seconds, double def) {
  return !(seconds > 0) ? def : seconds > CRUN__MAX_TIMEOUT ? CRUN__MAX_TIMEOUT : seconds;
}

#endif

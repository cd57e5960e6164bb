/* crun/core.h — status codes, errors, logging, clocks. Include <crun.h>. */
#ifndef CRUN_CORE_H
#define CRUN_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CRUN_VERSION_MAJOR 0
#define CRUN_VERSION_MINOR 1
#define CRUN_VERSION_PATCH 0
#define CRUN_VERSION_STRING "0.1.0"

/* Every status code, once: X(name, value, message). Codes are negative. */
#define CRUN_STATUS_MAP(X)                                                   \
  X(OK,           0,  "success")                                             \
  X(EINVAL,      -1,  "invalid argument")                                    \
  X(ENOMEM,      -2,  "out of memory")                                       \
  X(ETIMEDOUT,   -3,  "timed out")                                           \
  X(ENOTFOUND,   -4,  "key not found")                                       \
  X(ECONNRESET,  -5,  "connection reset by peer")                            \
  X(ECONNREFUSED,-6,  "connection refused")                                  \
  X(EADDRINUSE,  -7,  "address already in use")                              \
  X(EIO,         -8,  "input/output error")                                  \
  X(EPROTO,      -9,  "protocol error")                                      \
  X(EMISMATCH,  -10,  "collective mismatch between ranks")                   \
  X(ENOTSUP,    -11,  "operation not supported")                             \
  X(ECLOSED,    -12,  "object is closed")                                    \
  X(ERANGE,     -13,  "value out of range")                                  \
  X(ESTATE,     -14,  "invalid state for this operation")                    \
  X(EINTR,      -15,  "interrupted")                                         \
  X(EPEERDIED,  -16,  "peer process died")                                   \
  X(ESYS,       -17,  "system call failed")                                  \
  X(EACCES,     -18,  "permission denied")

typedef enum {
#define CRUN_X_ENUM(name, value, msg) CRUN_##name = (value),
  CRUN_STATUS_MAP(CRUN_X_ENUM)
#undef CRUN_X_ENUM
} crun_status;

/* Returns the fixed message of a status code ("timed out"); never NULL. */
const char *crun_strerror(int status);

/* Returns the name of a status code ("ETIMEDOUT"); "EUNKNOWN" for others. */
const char *crun_err_name(int status);

/* Returns the detail text of the last failure on this thread; "" if none.
 * The text starts with the status name, e.g. "ETIMEDOUT: get 'k' ...". */
const char *crun_last_error(void);

/* Records a failure for this thread and returns `status` (printf-style text;
 * the status name is prepended). Use as `return crun_error(CRUN_EINVAL, ...)`. */
int crun_error(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Log levels and subsystems for CRUN_DEBUG / CRUN_DEBUG_SUBSYS. */
typedef enum { CRUN_LOG_NONE = 0, CRUN_LOG_WARN, CRUN_LOG_INFO, CRUN_LOG_TRACE } crun_log_level_t;

#define CRUN_SUBSYS_MAP(X) X(CORE) X(STORE) X(PG) X(COLL) X(NET) X(SHM) X(DDP) X(LAUNCH) X(LUA)
typedef enum {
#define CRUN_X_SUB(name) CRUN_SUB_##name,
  CRUN_SUBSYS_MAP(CRUN_X_SUB)
#undef CRUN_X_SUB
  CRUN_SUB_COUNT
} crun_subsys_t;

/* Reads CRUN_DEBUG, CRUN_DEBUG_SUBSYS and CRUN_DEBUG_FILE again (done lazily
 * on first log call; call after changing the environment). */
void crun_log_init(void);

/* Sets the rank printed as the prefix of every log line; -1 for unknown. */
void crun_log_set_rank(int rank);

/* Returns non-zero when a message of `level` in `sub` would be printed. */
int crun_log_enabled(crun_log_level_t level, crun_subsys_t sub);

/* Prints one log line, prefixed "crun[rank] LEVEL SUBSYS:". Thread-safe. */
void crun_log(crun_log_level_t level, crun_subsys_t sub, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CRUN_LOG(level, sub, ...)                                             \
  do {                                                                        \
    if (crun_log_enabled(CRUN_LOG_##level, CRUN_SUB_##sub))                   \
      crun_log(CRUN_LOG_##level, CRUN_SUB_##sub, __VA_ARGS__);                \
  } while (0)

/* Propagates a failing status, leaving a TRACE breadcrumb of where it passed. */
#define CRUN_CHECK(call)                                                      \
  do {                                                                        \
    int crun__rc = (call);                                                    \
    if (crun__rc < 0) {                                                       \
      CRUN_LOG(TRACE, CORE, "%s:%d: %s -> %s", __FILE__, __LINE__, #call,     \
               crun_err_name(crun__rc));                                      \
      return crun__rc;                                                        \
    }                                                                         \
  } while (0)

#define CRUN_CHECK_GOTO(call, rc, label)                                      \
  do {                                                                        \
    (rc) = (call);                                                            \
    if ((rc) < 0) {                                                           \
      CRUN_LOG(TRACE, CORE, "%s:%d: %s -> %s", __FILE__, __LINE__, #call,     \
               crun_err_name(rc));                                            \
      goto label;                                                             \
    }                                                                         \
  } while (0)

/* Monotonic clock in seconds. */
double crun_clock(void);

/* Monotonic clock in nanoseconds. */
uint64_t crun_clock_ns(void);

/* Reads an integer / float environment variable, `def` when unset or bad. */
long crun_env_int(const char *name, long def);
double crun_env_double(const char *name, double def);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_CORE_H */

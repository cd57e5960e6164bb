/* status.c — status names and messages from the one table, and the
 * thread-local last-error text. */
#include "crun.h"
#include "core/who.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

/* Returns the fixed message of a status code. */
const char *crun_strerror(int status) {
  switch (status) {
#define CRUN_X_MSG(name, value, msg) case value: return msg;
    CRUN_STATUS_MAP(CRUN_X_MSG)
#undef CRUN_X_MSG
  }
  return "unknown error";
}

/* Returns the symbolic name of a status code. */
const char *crun_err_name(int status) {
  switch (status) {
#define CRUN_X_NAME(name, value, msg) case value: return #name;
    CRUN_STATUS_MAP(CRUN_X_NAME)
#undef CRUN_X_NAME
  }
  return "EUNKNOWN";
}

const char *crun_last_error(void) { return last_error; }

/* Records "<NAME>: <text>" as this thread's last error and returns status. */
int crun_error(int status, const char *fmt, ...) {
  char text[sizeof last_error - 32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  snprintf(last_error, sizeof last_error, "%s: %s", crun_err_name(status), text);
  CRUN_LOG(TRACE, CORE, "error recorded: %s", last_error);
  return status;
}

crun__who_t crun__who(const int *global, int n, int r) {
  crun__who_t w;
  int g = global && r >= 0 && r < n ? global[r] : r;
  if (g == r) snprintf(w.s, sizeof w.s, "rank %d", r);
  else snprintf(w.s, sizeof w.s, "rank %d (group rank %d)", g, r);
  return w;
}

/* gzip.c — reads a gzip-compressed (or plain) data file through zlib, for
 * crun.data's real data sets (the UCI digits CSV ships as digits.csv.gz). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/checked.h"
#include "train/check.h"

int crun_gunzip_file(const char *path, size_t max_bytes, char **out, size_t *len) {
  *out = NULL, *len = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) return crun_error(CRUN_EIO, "gunzip: cannot open %s: %s", path, strerror(errno ? errno : ENOENT));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  int rc = 0;
  if (!buf) { gzclose(f); return crun_error(CRUN_ENOMEM, "gunzip %s: %zu bytes", path, cap); }
  for (;;) {
    if (n == cap) {
      size_t ncap;
      char *nb;
      if (crun__mul_size(cap, 2, &ncap) || !(nb = realloc(buf, ncap))) {
        rc = crun_error(CRUN_ENOMEM, "gunzip %s: cannot grow the buffer past %zu bytes", path, cap);
        break;
      }
      buf = nb, cap = ncap;
    }
    size_t want = cap - n > (1u << 30) ? (1u << 30) : cap - n;
    int got = gzread(f, buf + n, (unsigned)want);
    if (got < 0) {
      int zerr;
      const char *msg = gzerror(f, &zerr);
      rc = crun_error(CRUN_EIO, "gunzip %s: %s", path, msg ? msg : "read error");
      break;
    }
    if (got == 0) break;
    n += (size_t)got;
    if (n > max_bytes) {
      rc = crun_error(CRUN_ERANGE, "gunzip %s: more than %zu bytes of data", path, max_bytes);
      break;
    }
  }
  gzclose(f);
  if (rc < 0) { free(buf); return rc; }
  *out = buf, *len = n;
  return 0;
}

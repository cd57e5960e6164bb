/* metrics.c — crun.metrics' SummaryWriter: TensorBoard event files (records
 * framed as length, masked CRC-32C of the length, data, masked CRC-32C of the
 * data; Event/Summary messages encoded by protobuf-c from proto/tfevent.proto)
 * and the same scalars as CSV. Built only when protobuf-c was found at
 * configure time (CRUN_HAVE_PROTOBUF_C); otherwise core.have_metrics is false. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crun_lua.h"

#if CRUN_HAVE_PROTOBUF_C
#include "core/checked.h"
#include "core/crc32c.h"
#include "tfevent.pb-c.h"

#define WRITER_MT "crun.SummaryWriter"
#define HIST_MAX_BINS 10000

static int writer_count; /* writers opened by this process: file names stay unique */

typedef struct {
  FILE *ev, *csv;
  char *ev_path, *csv_path;
} writer_t;

static double wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p: creates dir and its missing parents (mode 0777 & umask). */
static int mkdirs(const char *dir) {
  char *p = strdup(dir);
  if (!p) return ENOMEM;
  int rc = 0;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0777) != 0 && errno != EEXIST) rc = errno;
    *s = c;
    if (c == '\0' || rc) break;
  }
  free(p);
  return rc;
}

static writer_t *check_writer(lua_State *L) {
  writer_t *w = crun_l_checkudata(L, 1, WRITER_MT);
  if (!w->ev) crun_l_error(L, "EINVAL: SummaryWriter: used after close");
  return w;
}

/* Writes one record: u64 length (little-endian), masked CRC-32C of those 8
 * bytes, the data, masked CRC-32C of the data. Returns 0 or errno. */
static int write_record(FILE *f, const uint8_t *data, size_t n) {
  uint8_t head[12];
  uint64_t len = n;
  for (int i = 0; i < 8; i++) head[i] = (uint8_t)(len >> (8 * i));
  uint32_t c = crun__crc32c_mask(crun__crc32c(0, head, 8));
  for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
  uint8_t tail[4];
  c = crun__crc32c_mask(crun__crc32c(0, data, n));
  for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(c >> (8 * i));
  if (fwrite(head, 1, 12, f) != 12 || fwrite(data, 1, n, f) != n || fwrite(tail, 1, 4, f) != 4)
    return errno ? errno : EIO;
  return 0;
}

/* Encodes ev and writes it as one record; raises EIO/ENOMEM on failure. */
static void write_event(lua_State *L, writer_t *w, const CrunTb__Event *ev) {
  size_t n = crun_tb__event__get_packed_size(ev);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) crun_l_error(L, "ENOMEM: SummaryWriter: %I bytes for an event", (lua_Integer)n);
  crun_tb__event__pack(ev, buf);
  errno = 0;
  int rc = write_record(w->ev, buf, n);
  free(buf);
  if (rc) crun_l_error(L, "EIO: SummaryWriter: writing %s: %s", w->ev_path, strerror(rc));
}

/* Adds s to b as one CSV field (quoted, with doubled quotes, when it holds
 * a comma, a quote or a line break). */
static void csv_field(luaL_Buffer *b, const char *s) {
  if (!strpbrk(s, ",\"\r\n")) {
    luaL_addstring(b, s);
    return;
  }
  luaL_addchar(b, '"');
  for (; *s; s++) {
    if (*s == '"') luaL_addchar(b, '"');
    luaL_addchar(b, *s);
  }
  luaL_addchar(b, '"');
}

/* Opens dir/name with mode ("wb", or "ab" for the CSV that several writers
 * and runs share); raises EIO naming the path on failure. */
static FILE *open_in(lua_State *L, const char *dir, const char *name, const char *mode, char **path_out) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *path = malloc(n);
  if (!path) crun_l_error(L, "ENOMEM: SummaryWriter: path");
  snprintf(path, n, "%s/%s", dir, name);
  FILE *f = fopen(path, mode);
  if (!f) {
    int e = errno;
    lua_pushstring(L, path);
    free(path);
    crun_l_error(L, "EIO: SummaryWriter: cannot create %s: %s", lua_tostring(L, -1), strerror(e));
  }
  *path_out = path;
  return f;
}

/* core.summary_writer(logdir, suffix) -> writer: creates logdir (with its
 * parents), events.out.tfevents.<seconds>.<host>.<pid>.<n><suffix> with its first
 * record (file_version "brain.Event:2") and scalars<suffix>.csv with its
 * header. Raises EIO when a file cannot be created. */
static int l_summary_writer(lua_State *L) {
  const char *dir = crun_l_checkstring(L, 1);
  const char *suffix = crun_l_optstring(L, 2, "");
  crun_l_argcheck(L, dir[0] != '\0', 1, "empty log directory");
  crun_l_argcheck(L, !strchr(suffix, '/'), 2, "suffix holds a '/'");
  int rc = mkdirs(dir);
  if (rc) crun_l_error(L, "EIO: SummaryWriter: cannot create directory %s: %s", dir, strerror(rc));
  writer_t *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  luaL_setmetatable(L, WRITER_MT);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  double now = wall_time();
  const char *ev_name = lua_pushfstring(L, "events.out.tfevents.%I.%s.%d.%d%s", (lua_Integer)now, host, (int)getpid(), ++writer_count, suffix);
  w->ev = open_in(L, dir, ev_name, "wb", &w->ev_path);
  const char *csv_name = lua_pushfstring(L, "scalars%s.csv", suffix);
  w->csv = open_in(L, dir, csv_name, "ab", &w->csv_path);
  lua_pop(L, 2);
  /* appended to, a whole row per write (unbuffered, O_APPEND): writers of
   * one directory (two in a process, every rank, a rerun) keep every row */
  setvbuf(w->csv, NULL, _IONBF, 0);
  struct stat st;
  if (fstat(fileno(w->csv), &st) == 0 && st.st_size == 0) fputs("tag,step,value,wall_time\n", w->csv);
  CrunTb__Event ev = CRUN_TB__EVENT__INIT;
  ev.wall_time = now;
  ev.what_case = CRUN_TB__EVENT__WHAT_FILE_VERSION;
  ev.file_version = "brain.Event:2";
  write_event(L, w, &ev);
  return 1;
}

/* Writes the summary of one value as an Event at step. */
static void write_summary(lua_State *L, writer_t *w, CrunTb__Summary__Value *v, lua_Integer step, double t) {
  CrunTb__Summary__Value *vs[1] = {v};
  CrunTb__Summary sum = CRUN_TB__SUMMARY__INIT;
  sum.n_value = 1;
  sum.value = vs;
  CrunTb__Event ev = CRUN_TB__EVENT__INIT;
  ev.wall_time = t;
  ev.step = step;
  ev.what_case = CRUN_TB__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  write_event(L, w, &ev);
}

/* w:add_scalar(tag, value, step [, wall_time]): one simple_value event (a
 * 32-bit float, as TensorBoard stores it) and one CSV line tag,step,value,
 * wall_time (the value as given, 17 significant digits). The event is
 * buffered (flush() or close() makes it visible); the CSV line is written at
 * once, in one piece. Non-blocking apart from the file writes. */
static int m_add_scalar(lua_State *L) {
  writer_t *w = check_writer(L);
  const char *tag = crun_l_checkstring(L, 2);
  double value = crun_l_checknumber(L, 3);
  lua_Integer step = crun_l_checkinteger(L, 4);
  double t = crun_l_optnumber(L, 5, wall_time());
  crun_l_argcheck(L, tag[0] != '\0', 2, "empty tag");
  CrunTb__Summary__Value v = CRUN_TB__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = CRUN_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  write_summary(L, w, &v, step, t);
  luaL_Buffer b;
  char num[96];
  luaL_buffinit(L, &b);
  csv_field(&b, tag);
  snprintf(num, sizeof num, ",%lld,%.17g,%.6f\n", (long long)step, value, t);
  luaL_addstring(&b, num);
  luaL_pushresult(&b);
  size_t len;
  const char *row = lua_tolstring(L, -1, &len);
  if (fwrite(row, 1, len, w->csv) != len)
    crun_l_error(L, "EIO: SummaryWriter: writing %s: %s", w->csv_path, strerror(errno));
  return 0;
}

/* Reads the values at idx (a crun.Tensor of any dtype, or a sequence of
 * numbers) into a new array of *n doubles; raises EINVAL for a non-number
 * or a non-finite value, naming its index (1-based). Caller frees. */
static double *gather_values(lua_State *L, int idx, size_t *n) {
  double *v;
  if (lua_istable(L, idx)) {
    lua_Integer len = luaL_len(L, idx);
    size_t bytes;
    if (len < 0 || crun__mul_size((size_t)len, sizeof(double), &bytes) || !(v = malloc(bytes ? bytes : 1)))
      crun_l_error(L, "ENOMEM: add_histogram: %I values", len);
    for (lua_Integer i = 1; i <= len; i++) {
      lua_geti(L, idx, i);
      int ok;
      v[i - 1] = lua_tonumberx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok) {
        free(v);
        crun_l_error(L, "EINVAL: add_histogram: value %I is not a number", i);
      }
    }
    *n = (size_t)len;
  } else {
    crun_tensor_t *t = crun_l_check_tensor(L, idx), *c = NULL;
    CRUN_L_CHECK(L, crun_tensor_contiguous(t, &c));
    int64_t numel = crun_tensor_numel(c);
    size_t bytes;
    if (crun__mul_size((size_t)numel, sizeof(double), &bytes) || !(v = malloc(bytes ? bytes : 1))) {
      crun_tensor_release(c);
      crun_l_error(L, "ENOMEM: add_histogram: %I values", (lua_Integer)numel);
    }
    for (int64_t i = 0; i < numel; i++) v[i] = crun_elem_get_double(crun_tensor_dtype(c), crun_tensor_data(c), i);
    crun_tensor_release(c);
    *n = (size_t)numel;
  }
  for (size_t i = 0; i < *n; i++)
    if (!isfinite(v[i])) {
      double x = v[i];
      free(v);
      crun_l_error(L, "EINVAL: add_histogram: value %I is %s (only finite values can be binned)",
                   (lua_Integer)i + 1, isnan(x) ? "nan" : "inf");
    }
  return v;
}

/* Fills h from v[0..n): min, max, num, sum, sum of squares, and `bins`
 * equal-width buckets over [min, max] (bucket_limit[i] = right edge of
 * bucket i; one bucket when every value is equal; none when n is 0). */
static void histogram(const double *v, size_t n, int bins, CrunTb__HistogramProto *h, double *limit, double *count) {
  double lo = n ? v[0] : 0, hi = lo, s = 0, s2 = 0;
  for (size_t i = 0; i < n; i++) {
    lo = v[i] < lo ? v[i] : lo;
    hi = v[i] > hi ? v[i] : hi;
    s += v[i];
    s2 += v[i] * v[i];
  }
  if (n == 0) bins = 0;
  else if (hi == lo) bins = 1;
  /* in halves: hi - lo overflows to inf for values spanning more than
   * DBL_MAX (-1e308 and 1e308), and inf / inf made the bucket NaN, cast to
   * int as INT_MIN (an index far before count[]); halving is exact for
   * normal doubles, so the buckets of every other input are unchanged */
  double half = bins ? (hi / 2 - lo / 2) / bins : 0;
  for (int b = 0; b < bins; b++) {
    limit[b] = b == bins - 1 ? hi : 2 * (lo / 2 + half * (b + 1));
    count[b] = 0;
  }
  for (size_t i = 0; i < n; i++) {
    double f = half > 0 ? (v[i] / 2 - lo / 2) / half : 0;
    int b = f > 0 ? (f < bins ? (int)f : bins - 1) : 0;
    count[b] += 1;
  }
  h->min = lo, h->max = hi, h->num = (double)n, h->sum = s, h->sum_squares = s2;
  h->n_bucket_limit = h->n_bucket = (size_t)bins;
  h->bucket_limit = limit, h->bucket = count;
}

/* w:add_histogram(tag, values, step [, bins=30 [, wall_time]]): one histo
 * event of values (a crun.Tensor or a sequence of numbers, all finite).
 * Nothing goes to the CSV. Buffered like add_scalar. */
static int m_add_histogram(lua_State *L) {
  writer_t *w = check_writer(L);
  const char *tag = crun_l_checkstring(L, 2);
  crun_l_argcheck(L, tag[0] != '\0', 2, "empty tag");
  lua_Integer step = crun_l_checkinteger(L, 4);
  int bins = (int)crun_l_check_range(L, crun_l_optinteger(L, 5, 30), 1, HIST_MAX_BINS, "add_histogram", "bins");
  double t = crun_l_optnumber(L, 6, wall_time());
  /* the buckets live in a userdata, so an error raised below frees them */
  double *limit = lua_newuserdatauv(L, 2 * (size_t)bins * sizeof(double), 0);
  size_t n;
  double *v = gather_values(L, 3, &n);
  CrunTb__HistogramProto h = CRUN_TB__HISTOGRAM_PROTO__INIT;
  histogram(v, n, bins, &h, limit, limit + bins);
  free(v);
  CrunTb__Summary__Value sv = CRUN_TB__SUMMARY__VALUE__INIT;
  sv.tag = (char *)tag;
  sv.value_case = CRUN_TB__SUMMARY__VALUE__VALUE_HISTO;
  sv.histo = &h;
  write_summary(L, w, &sv, step, t);
  return 0;
}

/* w:flush(): hands both files' buffers to the kernel; raises EIO. */
static int m_flush(lua_State *L) {
  writer_t *w = check_writer(L);
  if (fflush(w->ev) != 0 || fflush(w->csv) != 0)
    crun_l_error(L, "EIO: SummaryWriter: flushing %s: %s", w->ev_path, strerror(errno));
  return 0;
}

/* w:close(): flushes and closes both files (idempotent; also __close);
 * raises EIO when the last writes fail. */
static int m_close(lua_State *L) {
  writer_t *w = crun_l_checkudata(L, 1, WRITER_MT);
  if (!w->ev) return 0;
  int bad = fclose(w->ev) != 0;
  bad |= fclose(w->csv) != 0;
  int e = errno;
  w->ev = w->csv = NULL;
  lua_pushstring(L, w->ev_path);
  free(w->ev_path);
  free(w->csv_path);
  w->ev_path = w->csv_path = NULL;
  if (bad) crun_l_error(L, "EIO: SummaryWriter: closing %s: %s", lua_tostring(L, -1), strerror(e));
  return 0;
}

/* __gc: closes a writer the script forgot, without raising (a failed last
 * write can only be reported by close() or <close>). */
static int m_gc(lua_State *L) {
  writer_t *w = lua_touserdata(L, 1);
  if (w && w->ev) {
    fclose(w->ev);
    if (w->csv) fclose(w->csv); /* NULL when creating the CSV failed */
    w->ev = w->csv = NULL;
    free(w->ev_path);
    free(w->csv_path);
    w->ev_path = w->csv_path = NULL;
  }
  return 0;
}

/* w:paths() -> event file path, CSV path (raises after close). */
static int m_paths(lua_State *L) {
  writer_t *w = check_writer(L);
  lua_pushstring(L, w->ev_path);
  lua_pushstring(L, w->csv_path);
  return 2;
}

static int m_tostring(lua_State *L) {
  writer_t *w = crun_l_checkudata(L, 1, WRITER_MT);
  lua_pushfstring(L, "crun.SummaryWriter(%s)", w->ev ? w->ev_path : "closed");
  return 1;
}

void crun_l_open_metrics(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"add_scalar", m_add_scalar}, {"add_histogram", m_add_histogram}, {"flush", m_flush},
      {"close", m_close}, {"paths", m_paths}, {"__gc", m_gc}, {"__close", m_close},
      {"__tostring", m_tostring}, {NULL, NULL}};
  crun_l_newclass(L, WRITER_MT, methods);
  lua_pushcfunction(L, l_summary_writer);
  lua_setfield(L, -2, "summary_writer");
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "have_metrics");
}

#else

void crun_l_open_metrics(lua_State *L) {
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "have_metrics");
}

#endif

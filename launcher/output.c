/* output.c — what workers print, as the user sees it.
 *
 * Each worker stream (stdout or stderr) is a pipe read by the launcher. Bytes
 * go to the rank's log file as they come; the console gets whole lines only,
 * each prefixed "[rank] ", so lines of different ranks never mix. A partial
 * line waits for its newline, for EOF (then a newline is added) or until it
 * reaches CRUN_LINE_MAX bytes (then it is shown as a line of its own). */
#include "launcher.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CRUN_LINE_MAX (64 * 1024)
#define CRUN_TAIL_LINE_MAX 512

void crun__write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return; /* the reader went away: nothing useful to do */
    buf += n;
    len -= (size_t)n;
  }
}

void crun__stream_init(crun__stream_t *s, int fd, int console_fd, int log_fd,
                       const char *prefix, int keep_tail) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->console_fd = console_fd;
  s->log_fd = log_fd;
  s->keep_tail = keep_tail;
  size_t n = strlen(prefix);
  if (n >= sizeof s->prefix) n = sizeof s->prefix - 1;
  memcpy(s->prefix, prefix, n);
  s->prefix_len = n;
}

/* Remembers one complete line (without its newline) in the tail ring. */
static void tail_push(crun__stream_t *s, const char *line, size_t len) {
  if (!s->keep_tail) return;
  if (len > CRUN_TAIL_LINE_MAX) len = CRUN_TAIL_LINE_MAX;
  char *copy = malloc(len + 1);
  if (!copy) return;
  memcpy(copy, line, len);
  copy[len] = 0;
  free(s->tail[s->tail_next]);
  s->tail[s->tail_next] = copy;
  s->tail_next = (s->tail_next + 1) % CRUN_LAUNCH_TAIL_LINES;
  if (s->tail_count < CRUN_LAUNCH_TAIL_LINES) s->tail_count++;
}

/* Shows the complete lines data[0..len) (len ends just after a newline, or
 * `add_newline` terminates the last one) with one write to the console. */
static void show_lines(crun__stream_t *s, const char *data, size_t len, int add_newline) {
  size_t lines = add_newline ? 1 : 0;
  for (size_t i = 0; i < len; i++) lines += data[i] == '\n';
  size_t cap = len + lines * s->prefix_len + 1;
  char *out = s->console_fd >= 0 ? malloc(cap) : NULL;
  size_t o = 0, start = 0;
  for (size_t i = 0; i <= len; i++) {
    int end = i < len ? data[i] == '\n' : (add_newline && i > start);
    if (!end) continue;
    tail_push(s, data + start, i - start);
    if (out) {
      memcpy(out + o, s->prefix, s->prefix_len);
      o += s->prefix_len;
      memcpy(out + o, data + start, i - start);
      o += i - start;
      out[o++] = '\n';
    }
    start = i + 1;
  }
  if (out) crun__write_all(s->console_fd, out, o);
  free(out);
}

/* Appends bytes to the partial-line buffer; returns -1 when out of memory. */
static int buf_append(crun__stream_t *s, const char *data, size_t len) {
  if (s->len + len > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + len) cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) return -1;
    s->buf = b;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, data, len);
  s->len += len;
  return 0;
}

/* Shows every complete line held in the buffer and keeps the rest. */
static void flush_complete(crun__stream_t *s, int at_eof) {
  size_t cut = 0;
  for (size_t i = s->len; i > 0; i--)
    if (s->buf[i - 1] == '\n') { cut = i; break; }
  if (cut == 0 && !at_eof && s->len < CRUN_LINE_MAX) return;
  if (cut > 0) show_lines(s, s->buf, cut, 0);
  if (s->len > cut) memmove(s->buf, s->buf + cut, s->len - cut);
  s->len -= cut;
  if (s->len > 0 && (at_eof || s->len >= CRUN_LINE_MAX)) {
    show_lines(s, s->buf, s->len, 1);
    s->len = 0;
  }
}

int crun__stream_pump(crun__stream_t *s) {
  if (s->fd < 0) return 0;
  char chunk[16384];
  ssize_t n = read(s->fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
  if (n <= 0) {
    crun__stream_finish(s);
    return 0;
  }
  if (s->log_fd >= 0) crun__write_all(s->log_fd, chunk, (size_t)n);
  if (buf_append(s, chunk, (size_t)n) < 0) {
    show_lines(s, chunk, (size_t)n, 1); /* no memory: show it rather than drop it */
    return 1;
  }
  flush_complete(s, 0);
  return 1;
}

void crun__stream_finish(crun__stream_t *s) {
  if (s->fd < 0) return;
  flush_complete(s, 1);
  close(s->fd);
  s->fd = -1;
}

int crun__stream_tail(const crun__stream_t *s, const char **out, int max) {
  const char *all[CRUN_LAUNCH_TAIL_LINES];
  int n = 0;
  for (int i = 0; i < s->tail_count; i++) {
    int idx = (s->tail_next - s->tail_count + i + CRUN_LAUNCH_TAIL_LINES) % CRUN_LAUNCH_TAIL_LINES;
    all[n++] = s->tail[idx];
  }
  for (int i = n - 1; i >= 0; i--) /* a traceback ends the useful part */
    if (strcmp(all[i], "stack traceback:") == 0) { n = i; break; }
  int first = n > max ? n - max : 0;
  for (int i = first; i < n; i++) out[i - first] = all[i];
  return n - first;
}

void crun__stream_free(crun__stream_t *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
  for (int i = 0; i < CRUN_LAUNCH_TAIL_LINES; i++) {
    free(s->tail[i]);
    s->tail[i] = NULL;
  }
  s->tail_count = s->tail_next = 0;
}

/* Reads a decimal integer in [0, max] at *p, advancing *p; -1 when none. */
static long read_num(const char **p, long max) {
  const char *s = *p;
  long v = 0;
  if (*s < '0' || *s > '9') return -1;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (*s++ - '0');
    if (v > max) return -1;
  }
  *p = s;
  return v;
}

int crun__std_select(const char *spec, int local_rank) {
  const char *p = spec;
  if (p[0] >= '0' && p[0] <= '3' && p[1] == 0) return p[0] - '0';
  int found = 0;
  for (;;) { /* LR:S[,LR:S]... */
    long lr = read_num(&p, 1 << 20);
    if (lr < 0 || *p++ != ':') return -1;
    long sel = read_num(&p, 3);
    if (sel < 0) return -1;
    if (lr == local_rank) found = (int)sel;
    if (*p == 0) return found;
    if (*p++ != ',') return -1;
  }
}

int crun__rank_listed(const char *list, int local_rank) {
  const char *p = list;
  int found = 0;
  for (;;) {
    long lr = read_num(&p, 1 << 20);
    if (lr < 0) return -1;
    found |= lr == local_rank;
    if (*p == 0) return found;
    if (*p++ != ',') return -1;
  }
}

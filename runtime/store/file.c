/* file.c — a store shared by the processes of one host through one file.
 *
 * The file is an append-only log: an 8-byte magic, then records
 *   u8 type | u32 klen | u32 vlen | key | value
 * (host byte order: the file never leaves the host). Types: 'S' set,
 * 'A' append, 'D' delete, 'Q' queue push, 'P' queue pop (drops the head of
 * the queue key), 'J' a user joined, 'L' a user left (no key, no value).
 * Writers take flock LOCK_EX, catch up on the log, append one write() and
 * release; readers take LOCK_SH. Each handle keeps a cache of the log up to
 * `offset` (keys, queues, user counts). Blocking get/wait/queue_pop poll the
 * file with a backoff of 50 us doubling to 4 ms. A log shorter than our
 * offset (the file was truncated) resets the cache.
 *
 * Users (torch's FileStore(path, world_size)): every handle logs 'J' when it
 * opens and 'L' when it is destroyed; with world_size > 0 the handle whose
 * 'L' leaves no user, once world_size 'L' are logged, unlinks the file under
 * its LOCK_EX. An open checks, under its LOCK_EX, that the file it locked is
 * still the one at the path, so it never joins a removed log. */
#include "store/store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FS_MAGIC "CRUNFS2\n"
#define FS_MAGIC_LEN 8
#define FS_REC_HDR 9

typedef struct {
  crun_store_t base;
  pthread_mutex_t mu; /* flock does not exclude threads sharing the fd */
  int fd;
  char *path;
  crun__kv_t kv;
  crun__kv_t queues;
  int64_t users, left; /* from the log: users now, 'L' records so far */
  off_t offset;
  int world_size;      /* > 0: the last user out removes the file */
  pid_t joined;        /* the process that logged this handle's 'J' (0: none) */
} file_store_t;

#define F(s) ((file_store_t *)(s))

/* Takes the thread mutex and the file lock (LOCK_SH or LOCK_EX). */
static int fs_lock(file_store_t *f, int mode) {
  pthread_mutex_lock(&f->mu);
  while (flock(f->fd, mode) < 0) {
    if (errno == EINTR) continue;
    pthread_mutex_unlock(&f->mu);
    return crun_error(CRUN_ESYS, "file store '%s': flock: %s", f->path, strerror(errno));
  }
  return 0;
}

static void fs_unlock(file_store_t *f) {
  flock(f->fd, LOCK_UN);
  pthread_mutex_unlock(&f->mu);
}

/* Applies one record to the cache. */
static int fs_apply(file_store_t *f, uint8_t type, const char *key, uint32_t klen,
                    const uint8_t *val, uint32_t vlen) {
  switch (type) {
  case 'S': return crun__kv_set(&f->kv, key, klen, val, vlen);
  case 'A': return crun__kv_append(&f->kv, key, klen, val, vlen);
  case 'D': crun__kv_delete(&f->kv, key, klen); return 0;
  case 'Q': return crun__kv_qpush(&f->queues, key, klen, val, vlen);
  case 'P': crun__kv_qdrop(&f->queues, key, klen); return 0;
  case 'J': f->users++; return 0;
  case 'L': f->users--, f->left++; return 0;
  }
  return crun_error(CRUN_EPROTO, "file store '%s': corrupt record type 0x%02x", f->path, type);
}

/* Parses complete records of buf[0..len) into the cache; returns bytes used. */
static int fs_parse(file_store_t *f, const uint8_t *buf, size_t len, size_t *used) {
  size_t p = 0;
  while (len - p >= FS_REC_HDR) {
    uint32_t klen, vlen;
    memcpy(&klen, buf + p + 1, 4);
    memcpy(&vlen, buf + p + 5, 4);
    size_t rec = FS_REC_HDR + (size_t)klen + vlen;
    if (len - p < rec) break;
    /* keys are stored NUL-free; kv wants them NUL-terminated only for lookups by length */
    CRUN_CHECK(fs_apply(f, buf[p], (const char *)buf + p + FS_REC_HDR, klen,
                        buf + p + FS_REC_HDR + klen, vlen));
    p += rec;
  }
  *used = p;
  return 0;
}

/* Brings the cache up to the end of the log (lock held). */
static int fs_refresh(file_store_t *f) {
  struct stat st;
  if (fstat(f->fd, &st) < 0)
    return crun_error(CRUN_ESYS, "file store '%s': fstat: %s", f->path, strerror(errno));
  if (st.st_size < f->offset) { /* truncated or rewritten: start over */
    crun__kv_free(&f->kv);
    crun__kv_free(&f->queues);
    CRUN_CHECK(crun__kv_init(&f->kv));
    CRUN_CHECK(crun__kv_init(&f->queues));
    f->users = f->left = 0;
    f->offset = FS_MAGIC_LEN;
  }
  if (st.st_size <= f->offset) return 0;
  size_t want = (size_t)(st.st_size - f->offset);
  uint8_t *buf = malloc(want);
  if (!buf) return crun_error(CRUN_ENOMEM, "file store '%s': out of memory", f->path);
  ssize_t got = pread(f->fd, buf, want, f->offset);
  int rc = got < 0 ? crun_error(CRUN_EIO, "file store '%s': read: %s", f->path, strerror(errno)) : 0;
  size_t used = 0;
  if (rc == 0) rc = fs_parse(f, buf, (size_t)got, &used);
  free(buf);
  f->offset += (off_t)used;
  return rc;
}

/* Appends records already encoded in buf and applies them (LOCK_EX held). */
static int fs_write(file_store_t *f, const uint8_t *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = pwrite(f->fd, buf + done, len - done, f->offset + (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return crun_error(CRUN_EIO, "file store '%s': write: %s", f->path, strerror(errno));
    done += (size_t)w;
  }
  size_t used;
  CRUN_CHECK(fs_parse(f, buf, len, &used));
  f->offset += (off_t)used;
  return 0;
}

/* Encodes one record into *buf at *pos (grown as needed). */
static int fs_encode(uint8_t **buf, size_t *pos, size_t *cap, uint8_t type, const char *key,
                     const void *val, size_t vlen) {
  size_t klen = strlen(key);
  if (klen > UINT32_MAX || vlen > UINT32_MAX)
    return crun_error(CRUN_ERANGE, "file store: key or value of key '%.64s' over 4 GiB", key);
  size_t need = *pos + FS_REC_HDR + klen + vlen;
  if (need > *cap) {
    size_t nc = need * 2;
    uint8_t *nb = realloc(*buf, nc);
    if (!nb) return crun_error(CRUN_ENOMEM, "file store: out of memory");
    *buf = nb;
    *cap = nc;
  }
  uint32_t k32 = (uint32_t)klen, v32 = (uint32_t)vlen;
  (*buf)[*pos] = type;
  memcpy(*buf + *pos + 1, &k32, 4);
  memcpy(*buf + *pos + 5, &v32, 4);
  memcpy(*buf + *pos + FS_REC_HDR, key, klen);
  if (vlen) memcpy(*buf + *pos + FS_REC_HDR + klen, val, vlen);
  *pos = need;
  return 0;
}

/* Appends the encoded records buf[0..len) under LOCK_EX when rc (the status
 * of encoding them) is 0; frees buf. Returns rc or the write's status. */
static int fs_commit(crun_store_t *s, uint8_t *buf, size_t len, int rc) {
  if (rc == 0 && (rc = fs_lock(F(s), LOCK_EX)) == 0) {
    rc = fs_refresh(F(s));
    if (rc == 0) rc = fs_write(F(s), buf, len);
    fs_unlock(F(s));
  }
  free(buf);
  return rc;
}

/* Writes one record under LOCK_EX. */
static int fs_put(crun_store_t *s, uint8_t type, const char *key, const void *val, size_t len) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  int rc = fs_encode(&buf, &pos, &cap, type, key, val, len);
  return fs_commit(s, buf, pos, rc);
}

static int f_set(crun_store_t *s, const char *key, const void *val, size_t len) {
  return fs_put(s, 'S', key, val, len);
}

static int f_append(crun_store_t *s, const char *key, const void *val, size_t len) {
  return fs_put(s, 'A', key, val, len);
}

/* Returns 1 when every key is in the cache. */
static int fs_all_present(file_store_t *f, const char *const *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!crun__kv_find(&f->kv, keys[i], strlen(keys[i]))) return 0;
  return 1;
}

/* Polls the log until every key exists, then copies values into outs (may be
 * NULL). */
static int fs_wait_get(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                       crun_buf_t *outs, const char *op) {
  long sleep_us = 50;
  for (;;) {
    CRUN_CHECK(fs_lock(F(s), LOCK_SH));
    int rc = fs_refresh(F(s));
    int ready = rc == 0 && fs_all_present(F(s), keys, n);
    for (size_t i = 0; ready && outs && rc == 0 && i < n; i++) {
      crun__kv_entry_t *e = crun__kv_find(&F(s)->kv, keys[i], strlen(keys[i]));
      rc = crun__buf_set(&outs[i], e->val, e->len);
    }
    fs_unlock(F(s));
    if (rc < 0 || ready) return rc;
    double left = deadline - crun_clock();
    if (left <= 0) {
      char buf[256];
      return crun_error(CRUN_ETIMEDOUT, "file store '%s' %s: keys %s not set within the deadline",
                        F(s)->path, op, crun__store_keys_str(keys, n, buf, sizeof buf));
    }
    long us = sleep_us < left * 1e6 ? sleep_us : (long)(left * 1e6) + 1;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    if (sleep_us < 4000) sleep_us *= 2;
  }
}

static int f_get(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  return fs_wait_get(s, &key, 1, deadline, out, "get");
}

static int f_wait(crun_store_t *s, const char *const *keys, size_t n, double deadline) {
  return fs_wait_get(s, keys, n, deadline, NULL, "wait");
}

static int f_multi_get(crun_store_t *s, const char *const *keys, size_t n, double deadline,
                       crun_buf_t *outs) {
  return fs_wait_get(s, keys, n, deadline, outs, "multi_get");
}

static int f_check(crun_store_t *s, const char *const *keys, size_t n, int *all) {
  CRUN_CHECK(fs_lock(F(s), LOCK_SH));
  int rc = fs_refresh(F(s));
  *all = rc == 0 && fs_all_present(F(s), keys, n);
  fs_unlock(F(s));
  return rc;
}

static int f_num_keys(crun_store_t *s, int64_t *out) {
  CRUN_CHECK(fs_lock(F(s), LOCK_SH));
  int rc = fs_refresh(F(s));
  *out = (int64_t)F(s)->kv.count;
  fs_unlock(F(s));
  return rc;
}

static int f_delete_key(crun_store_t *s, const char *key, int *existed) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  CRUN_CHECK(fs_lock(F(s), LOCK_EX));
  int rc = fs_refresh(F(s));
  *existed = rc == 0 && crun__kv_find(&F(s)->kv, key, strlen(key)) != NULL;
  if (*existed && (rc = fs_encode(&buf, &pos, &cap, 'D', key, NULL, 0)) == 0)
    rc = fs_write(F(s), buf, pos);
  fs_unlock(F(s));
  free(buf);
  return rc;
}

/* Runs a read-modify-write under LOCK_EX: computes the new value from the
 * cache with kv semantics on a scratch copy, then logs it as a 'S' record. */
static int f_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  CRUN_CHECK(fs_lock(F(s), LOCK_EX));
  int rc = fs_refresh(F(s));
  if (rc == 0) rc = crun__kv_add(&F(s)->kv, key, strlen(key), delta, out);
  if (rc == 0) {
    crun__kv_entry_t *e = crun__kv_find(&F(s)->kv, key, strlen(key));
    rc = fs_encode(&buf, &pos, &cap, 'S', key, e->val, e->len);
  }
  if (rc == 0) rc = fs_write(F(s), buf, pos);
  fs_unlock(F(s));
  free(buf);
  return rc;
}

static int f_compare_set(crun_store_t *s, const char *key, const void *exp, size_t elen,
                         const void *des, size_t dlen, crun_buf_t *out) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  CRUN_CHECK(fs_lock(F(s), LOCK_EX));
  int rc = fs_refresh(F(s));
  crun__kv_entry_t *e = rc == 0 ? crun__kv_find(&F(s)->kv, key, strlen(key)) : NULL;
  int swap = rc == 0 && (e ? (e->len == elen && (!elen || !memcmp(e->val, exp, elen))) : !elen);
  if (swap && (rc = fs_encode(&buf, &pos, &cap, 'S', key, des, dlen)) == 0)
    rc = fs_write(F(s), buf, pos);
  if (rc == 0) {
    e = crun__kv_find(&F(s)->kv, key, strlen(key));
    rc = e ? crun__buf_set(out, e->val, e->len) : crun__buf_set(out, exp, elen);
  }
  fs_unlock(F(s));
  free(buf);
  return rc;
}

static int f_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                       const void *const *vals, const size_t *lens) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = fs_encode(&buf, &pos, &cap, 'S', keys[i], vals[i], lens[i]);
  return fs_commit(s, buf, pos, rc);
}

static int f_queue_push(crun_store_t *s, const char *key, const void *val, size_t len) {
  return fs_put(s, 'Q', key, val, len);
}

/* Under LOCK_EX: copies the head of queue key into out and logs its pop.
 * Returns 0, 1 when the queue is empty, or a status. */
static int fs_take(crun_store_t *s, const char *key, crun_buf_t *out) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0, ilen;
  const void *item;
  CRUN_CHECK(fs_lock(F(s), LOCK_EX));
  int rc = fs_refresh(F(s));
  if (rc == 0 && !crun__kv_qpeek(&F(s)->queues, key, strlen(key), &item, &ilen)) rc = 1;
  if (rc == 0) rc = crun__buf_set(out, item, ilen);
  if (rc == 0 && (rc = fs_encode(&buf, &pos, &cap, 'P', key, NULL, 0)) == 0) rc = fs_write(F(s), buf, pos);
  if (rc < 0) crun_buf_free(out);
  fs_unlock(F(s));
  free(buf);
  return rc;
}

/* Returns the length of queue key under LOCK_SH (the cheap poll). */
static int fs_qlen(crun_store_t *s, const char *key, int64_t *out) {
  CRUN_CHECK(fs_lock(F(s), LOCK_SH));
  int rc = fs_refresh(F(s));
  *out = rc == 0 ? crun__kv_qlen(&F(s)->queues, key, strlen(key)) : 0;
  fs_unlock(F(s));
  return rc;
}

/* Polls (LOCK_SH) until queue key has an item, then takes it (LOCK_EX);
 * deadline < 0: one try. */
static int f_queue_pop(crun_store_t *s, const char *key, double deadline, crun_buf_t *out) {
  long sleep_us = 50;
  for (;;) {
    int64_t n = 1;
    if (deadline >= 0) CRUN_CHECK(fs_qlen(s, key, &n));
    int rc = n > 0 ? fs_take(s, key, out) : 1;
    if (rc <= 0) return rc;
    if (deadline < 0)
      return crun_error(CRUN_ENOTFOUND, "file store '%s' queue_pop: queue '%s' is empty", F(s)->path, key);
    double left = deadline - crun_clock();
    if (left <= 0)
      return crun_error(CRUN_ETIMEDOUT, "file store '%s' queue_pop: queue '%s' got no item within the deadline",
                        F(s)->path, key);
    long us = sleep_us < left * 1e6 ? sleep_us : (long)(left * 1e6) + 1;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    if (sleep_us < 4000) sleep_us *= 2;
  }
}

static int f_queue_len(crun_store_t *s, const char *key, int64_t *out) { return fs_qlen(s, key, out); }

static int f_list_keys(crun_store_t *s, crun_store_keys_t *out) {
  CRUN_CHECK(fs_lock(F(s), LOCK_SH));
  int rc = fs_refresh(F(s));
  if (rc == 0) rc = crun__kv_keys(&F(s)->kv, out);
  fs_unlock(F(s));
  return rc;
}

/* Logs this handle's 'L' and, when it leaves no user and world_size users
 * have left, removes the file (all under LOCK_EX). Only the process that
 * joined leaves: a forked child's copy of the handle does not. */
static void fs_leave(file_store_t *f) {
  uint8_t *buf = NULL;
  size_t pos = 0, cap = 0;
  if (f->joined != getpid() || fs_lock(f, LOCK_EX) < 0) return;
  int rc = fs_refresh(f);
  if (rc == 0 && (rc = fs_encode(&buf, &pos, &cap, 'L', "", NULL, 0)) == 0) rc = fs_write(f, buf, pos);
  if (rc == 0 && f->world_size > 0 && f->users <= 0 && f->left >= f->world_size) {
    if (unlink(f->path) < 0 && errno != ENOENT)
      CRUN_LOG(WARN, STORE, "file store '%s': the last user cannot remove it: %s", f->path, strerror(errno));
    else
      CRUN_LOG(INFO, STORE, "file store '%s': removed by its last user (%d left)", f->path, (int)f->left);
  }
  if (rc < 0) CRUN_LOG(WARN, STORE, "file store '%s': cannot log this user's exit: %s", f->path, crun_last_error());
  fs_unlock(f);
  free(buf);
}

static void f_destroy(crun_store_t *s) {
  if (F(s)->joined) fs_leave(F(s));
  close(F(s)->fd);
  crun__kv_free(&F(s)->kv);
  crun__kv_free(&F(s)->queues);
  pthread_mutex_destroy(&F(s)->mu);
  free(F(s)->path);
  free(s);
}

static const crun__store_ops_t file_ops = {
    .kind = "file", .set = f_set, .get = f_get, .add = f_add, .compare_set = f_compare_set,
    .wait = f_wait, .check = f_check, .delete_key = f_delete_key, .num_keys = f_num_keys,
    .append = f_append, .multi_get = f_multi_get, .multi_set = f_multi_set,
    .queue_push = f_queue_push, .queue_pop = f_queue_pop, .queue_len = f_queue_len,
    .list_keys = f_list_keys, .destroy = f_destroy};

/* Returns 1 when fd is still the file at path (not removed or replaced
 * since it was opened), 0 when not, or a status. */
static int fs_still_linked(file_store_t *f) {
  struct stat a, b;
  if (fstat(f->fd, &a) < 0)
    return crun_error(CRUN_ESYS, "file store '%s': fstat: %s", f->path, strerror(errno));
  if (a.st_nlink == 0 || stat(f->path, &b) < 0) return 0;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Under LOCK_EX: writes the magic into an empty file or checks it in an
 * existing one, loads the log and logs this handle's 'J'. Returns 1 when the
 * file was removed meanwhile (open it again). */
static int fs_join(file_store_t *f) {
  char magic[FS_MAGIC_LEN];
  int rc = fs_still_linked(f);
  if (rc <= 0) return rc < 0 ? rc : 1;
  rc = 0;
  ssize_t got = pread(f->fd, magic, FS_MAGIC_LEN, 0);
  if (got == 0) {
    if (pwrite(f->fd, FS_MAGIC, FS_MAGIC_LEN, 0) != FS_MAGIC_LEN)
      rc = crun_error(CRUN_EIO, "file store '%s': cannot write header: %s", f->path, strerror(errno));
  } else if (got != FS_MAGIC_LEN || memcmp(magic, FS_MAGIC, FS_MAGIC_LEN) != 0) {
    rc = crun_error(CRUN_EPROTO, "file store '%s': not a crun store file (bad header)", f->path);
  }
  f->offset = FS_MAGIC_LEN;
  if (rc == 0) rc = fs_refresh(f);
  uint8_t rec[FS_REC_HDR] = {'J'}; /* klen = vlen = 0 */
  if (rc == 0 && (rc = fs_write(f, rec, sizeof rec)) == 0) f->joined = getpid();
  return rc;
}

/* A store file is this user's (or root's), and only its owner may write it:
 * in a shared directory (/tmp, as torch's init_method file:///tmp/... has
 * it) another user could have made the file first, world-writable, and then
 * read the job's keys and forge its own. EACCES naming the owner. */
static int fs_check_owner(file_store_t *f) {
  struct stat st;
  if (fstat(f->fd, &st) < 0) return crun_error(CRUN_ESYS, "file store '%s': fstat: %s", f->path, strerror(errno));
  if (st.st_uid != geteuid() && st.st_uid != 0)
    return crun_error(CRUN_EACCES, "file store '%s' belongs to uid %ld, not to this user (uid %ld): another user "
                      "made it and could read and forge its keys; use a path of your own", f->path,
                      (long)st.st_uid, (long)geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return crun_error(CRUN_EACCES, "file store '%s' is writable by %s (mode %03o): they could forge its keys; "
                      "chmod go-w it or use another path", f->path, st.st_mode & S_IWOTH ? "every user" : "its group",
                      (unsigned)(st.st_mode & 0777));
  return 0;
}

/* Opens path and joins its log, again when it was removed under us (a last
 * user leaving as we open). The file is made 0600, never through a
 * symbolic link (one planted at the path would have the log written
 * wherever it points). */
static int fs_open(file_store_t *f) {
  for (int attempt = 0; attempt < 100; attempt++) {
    if (f->fd >= 0) close(f->fd);
    f->fd = open(f->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (f->fd < 0 && errno == ELOOP)
      return crun_error(CRUN_EINVAL, "file store '%s' is a symbolic link: refusing to write through it", f->path);
    if (f->fd < 0) return crun_error(CRUN_ESYS, "file store '%s': open: %s", f->path, strerror(errno));
    CRUN_CHECK(fs_check_owner(f));
    CRUN_CHECK(fs_lock(f, LOCK_EX));
    int rc = fs_join(f);
    fs_unlock(f);
    if (rc <= 0) return rc;
  }
  return crun_error(CRUN_EIO, "file store '%s': removed 100 times while being opened", f->path);
}

int crun_store_file_new(const char *path, crun_store_t **out) {
  return crun_store_file_open(path, NULL, out);
}

int crun_store_file_open(const char *path, const crun_store_file_opts_t *opts, crun_store_t **out) {
  if (!path || !*path || !out) return crun_error(CRUN_EINVAL, "file store: path and out are required");
  int ws = opts ? opts->world_size : 0;
  if (ws < 0) return crun_error(CRUN_EINVAL, "file store '%s': world_size %d < 0", path, ws);
  file_store_t *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path)) || crun__kv_init(&f->kv) < 0 || crun__kv_init(&f->queues) < 0) {
    if (f) crun__kv_free(&f->kv), free(f->path);
    free(f);
    return crun_error(CRUN_ENOMEM, "file store '%s': out of memory", path);
  }
  pthread_mutex_init(&f->mu, NULL);
  f->fd = -1;
  f->world_size = ws;
  crun__store_init(&f->base, &file_ops);
  int rc = fs_open(f);
  if (rc < 0) {
    if (f->fd < 0) f->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    f_destroy(&f->base);
    return rc;
  }
  *out = &f->base;
  return 0;
}

/* crun/store.h — key-value stores with torch.distributed's Store semantics.
 * Include <crun.h>.
 *
 * Four kinds behind one vtable: hash (in-process), file (processes on one host
 * share a file), prefix (wraps any store) and tcp (a client of a server on
 * libuv; the server can be embedded in any process). Every blocking call has
 * a deadline: the store's timeout (default 300 s) unless the call takes one. A
 * call past its deadline fails with CRUN_ETIMEDOUT and an error text naming
 * the keys. Values are binary-safe byte strings. Stores are reference counted
 * and thread-safe. */
#ifndef CRUN_STORE_H
#define CRUN_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CRUN_STORE_DEFAULT_TIMEOUT 300.0

typedef struct crun_store crun_store_t;

/* A byte string returned by a store; free with crun_buf_free(). */
typedef struct {
  void *data;
  size_t len;
} crun_buf_t;

void crun_buf_free(crun_buf_t *b);

/* Creates an in-process, thread-safe store. */
int crun_store_hash_new(crun_store_t **out);

/* Creates a store kept in the file at `path`, shared by every process on this
 * host that opens the same path (safe under concurrent writers). Same as
 * crun_store_file_open(path, NULL, out). */
int crun_store_file_new(const char *path, crun_store_t **out);

typedef struct {
  int world_size; /* >0: the file is removed by the last user to close it, once
                     world_size users have closed it in all; 0: never removed */
} crun_store_file_opts_t;

/* Creates a file store (as crun_store_file_new) with options (NULL: none).
 * Every open counts itself as a user of the file and its last release
 * uncounts it (torch's FileStore(path, world_size)); with world_size > 0 the
 * release that leaves no user, once world_size releases happened, removes
 * the file. A process that dies without releasing stays counted, so the file
 * is then left behind (as with torch): remove it yourself. An open that
 * races with the removal never uses the removed file (it opens a fresh one). */
int crun_store_file_open(const char *path, const crun_store_file_opts_t *opts, crun_store_t **out);

/* Creates a store that prepends "<prefix>/" to every key and forwards to
 * `inner` (which it retains). */
int crun_store_prefix_new(const char *prefix, crun_store_t *inner, crun_store_t **out);

typedef struct {
  const char *host;      /* server address to connect to / bind; "127.0.0.1" if NULL */
  int port;              /* 0 with is_master: pick a free port (see crun_store_tcp_port) */
  int is_master;         /* start an embedded server in this process */
  int world_size;        /* >0: the master's create waits until this many clients joined; 0: don't */
  double timeout;        /* seconds for every blocking call; <=0 means the default */
  double connect_timeout;/* seconds to keep retrying the connect; <=0 means `timeout` */
  const char *token;     /* the job's secret; NULL: CRUN_TOKEN from the environment; "": none */
  int async_set;         /* 0: the default, on unless CRUN_STORE_ASYNC_SET=0 in the
                            environment; 1: on; -1: off (see crun_store_tcp_new) */
} crun_store_tcp_opts_t;

/* Creates a TCP store client, starting an embedded server first when
 * opts->is_master. Blocks until connected (retrying until the deadline).
 *
 * async_set (on by default: torch's TCPStore set does the same): a set
 * returns once its request is sent; the server does not answer it. This
 * handle's later calls see it (one connection, served in order), and so does
 * any call of another client made after one of this handle's later calls
 * returned, or after crun_store_flush_sets (which every barrier of a process
 * group calls) returned in this process; before that, another client may
 * not see it yet (its get or wait simply waits). A set that failed (or was
 * lost with the connection) makes this handle's next call that waits for
 * the server (not another set that does not wait) fail with its status, and
 * that call is not run. Closing the store confirms its sets first (one
 * PING). async_set = -1 makes every set wait for the server's
 * acknowledgement, so that the set itself reports its failure. */
int crun_store_tcp_new(const crun_store_tcp_opts_t *opts, crun_store_t **out);

/* Waits until the server applied every set that this process's TCP store
 * clients sent without waiting (async_set), each within its handle's
 * timeout; returns at once when there are none. A failure is kept for that
 * handle's next call (which reports it and is not run), not returned here.
 * A handle that another thread is using at that moment is waited for only
 * until that call's sets are confirmed (a call that may block on a key
 * sends a PING ahead of its request and reads its reply first; a failure
 * that reply reports is kept for the handle's next call), not until the
 * call returns. The handles are waited for one after another, each
 * without holding up other threads' clients (creating, using or closing
 * another handle returns as usual); a handle released meanwhile is
 * destroyed (its connection closed) once this flush is done with it. In a
 * forked child the handles inherited from the parent are neither flushed
 * nor confirmed when destroyed there: their socket is the parent's. */
void crun_store_flush_sets(void);

/* Returns the port a TCP store is connected to (the picked one for port 0);
 * -1 for other kinds. */
int crun_store_tcp_port(crun_store_t *s);

/* Takes / drops a reference; the last release closes the store. */
void crun_store_retain(crun_store_t *s);
void crun_store_release(crun_store_t *s);

/* Sets / gets the deadline (seconds) used by blocking calls without their own. */
void crun_store_set_timeout(crun_store_t *s, double seconds);
double crun_store_get_timeout(crun_store_t *s);

/* Sets key to the value. */
int crun_store_set(crun_store_t *s, const char *key, const void *val, size_t len);

/* Blocks until key exists (or the deadline), then returns its value in *out. */
int crun_store_get(crun_store_t *s, const char *key, crun_buf_t *out);

/* Adds delta to the integer stored at key (created as 0) and returns the new
 * value in *out. Values are stored as decimal text, as torch does. */
int crun_store_add(crun_store_t *s, const char *key, int64_t delta, int64_t *out);

/* torch semantics: if key is missing and expected is empty, sets desired; if
 * key holds expected, sets desired; returns the value now stored (for a
 * missing key with non-empty expected: returns expected, stores nothing). */
int crun_store_compare_set(crun_store_t *s, const char *key,
                           const void *expected, size_t elen,
                           const void *desired, size_t dlen, crun_buf_t *out);

/* Blocks until every key exists; timeout <= 0 means the store's timeout. */
int crun_store_wait(crun_store_t *s, const char *const *keys, size_t n, double timeout);

/* Sets *all_exist to 1 when every key exists now, else 0. Never blocks. */
int crun_store_check(crun_store_t *s, const char *const *keys, size_t n, int *all_exist);

/* Deletes key; *existed (may be NULL) tells whether it was there. */
int crun_store_delete_key(crun_store_t *s, const char *key, int *existed);

/* Returns the number of keys in *out. */
int crun_store_num_keys(crun_store_t *s, int64_t *out);

/* Appends the bytes to key's value (creating it). */
int crun_store_append(crun_store_t *s, const char *key, const void *val, size_t len);

/* Blocks until every key exists, then fills outs[0..n-1]. */
int crun_store_multi_get(crun_store_t *s, const char *const *keys, size_t n, crun_buf_t *outs);

/* Sets every key to its value, atomically with respect to other clients. */
int crun_store_multi_set(crun_store_t *s, const char *const *keys, size_t n,
                         const void *const *vals, const size_t *lens);

/* ---- queues (torch's queue_push / queue_pop / queue_len)
 *
 * A queue is a FIFO of byte strings named by a key. Queues have their own
 * namespace: queue "k" and the plain key "k" are unrelated, and get, check,
 * wait, delete_key, num_keys and list_keys see plain keys only. A queue
 * exists while it holds items (queue_len of an unknown queue is 0). Each
 * item goes to exactly one popper. */

/* Appends a copy of the value to the tail of queue key. Does not block. */
int crun_store_queue_push(crun_store_t *s, const char *key, const void *val, size_t len);

/* Takes the head item of queue key into *out (free with crun_buf_free).
 * block != 0: waits for an item until the timeout (<= 0: the store's)
 * passes, then fails with CRUN_ETIMEDOUT. block == 0: fails at once with
 * CRUN_ENOTFOUND when the queue is empty. On a TCP store, blocked poppers of
 * one key are served in the order they arrived. */
int crun_store_queue_pop(crun_store_t *s, const char *key, int block, double timeout, crun_buf_t *out);

/* Returns the number of items in queue key in *out. Never blocks. */
int crun_store_queue_len(crun_store_t *s, const char *key, int64_t *out);

/* The keys of a store: free with crun_store_keys_free. */
typedef struct {
  size_t count;      /* number of keys */
  const char **keys; /* keys[0..count-1], sorted by strcmp, each NUL-terminated */
  char *buf;         /* the keys' bytes, NUL-separated (keys[] points into it) */
  size_t len;        /* bytes in buf */
} crun_store_keys_t;

/* Fills *out with every plain key (not the queues), sorted; a prefix store
 * lists only its own keys, with the prefix stripped. Never blocks. */
int crun_store_list_keys(crun_store_t *s, crun_store_keys_t *out);

/* Frees what crun_store_list_keys filled (and zeroes it). */
void crun_store_keys_free(crun_store_keys_t *keys);

/* A standalone TCP store server on libuv, running on its own thread. */
typedef struct crun_store_server crun_store_server_t;

/* Binds host:port (port 0 picks a free one) and starts serving. Fails with
 * CRUN_EADDRINUSE naming the address when the port is taken. */
int crun_store_server_start(const char *host, int port, crun_store_server_t **out);

/* As crun_store_server_start with the job's secret: every client must prove
 * it (challenge-response, runtime/core/auth.h) before its first request.
 * token NULL: CRUN_TOKEN from the environment; "": an open store. */
int crun_store_server_start_token(const char *host, int port, const char *token, crun_store_server_t **out);

/* Returns the port the server listens on. */
int crun_store_server_port(crun_store_server_t *srv);

/* Stops the server, closes every connection and frees it. */
void crun_store_server_stop(crun_store_server_t *srv);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_STORE_H */

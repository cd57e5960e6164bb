/* test_store_tcp.c — the TCP store: semantics, parked waits, port 0 and
 * EADDRINUSE, world_size joins, hostile frames, server loss, 1,000
 * concurrent clients and a multi-process race. */
#include "test_store_common.h"
#include "core/auth.h"
#include "store/store_impl.h"
#include "store/tcp_proto.h"
#include "core/auth.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <unistd.h>

/* Starts a secret-less server on 127.0.0.1 and a free port (*port). */
static crun_store_server_t *local_server(int *port) {
  crun_store_server_t *srv = NULL;
  EXPECT_OK(crun_store_server_start("127.0.0.1", 0, &srv));
  *port = crun_store_server_port(srv);
  return srv;
}

/* A TCP socket listening on 127.0.0.1 (a picked port, in *port): a fake
 * server's. */
static int loopback_listener(int *port) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof sa;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  EXPECT(bind(lfd, (struct sockaddr *)&sa, sl) == 0 && listen(lfd, 1) == 0);
  EXPECT(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
  *port = ntohs(sa.sin_port);
  return lfd;
}

/* local_server with name=value in the environment while it starts (the
 * server reads its settings then). */
static crun_store_server_t *local_server_env(const char *name, const char *value, int *port) {
  setenv(name, value, 1);
  crun_store_server_t *srv = local_server(port);
  unsetenv(name);
  return srv;
}

/* Opens a TCP client of the server on 127.0.0.1:port. */
static crun_store_t *client(int port, double timeout) {
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = timeout,
                             .connect_timeout = 5};
  crun_store_t *s = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  return s;
}

/* A raw TCP socket to 127.0.0.1:port, before any greeting is read. */
static int raw_socket(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
  return fd;
}

/* A raw TCP socket to an open (secret-less) server at 127.0.0.1:port that
 * has read the greeting and sent the (empty) answer, so frames come next. */
static int raw_connect(int port) {
  int fd = raw_socket(port);
  char greet[40], answer[64] = {0};
  size_t got = 0;
  while (got < sizeof greet) {
    ssize_t n = recv(fd, greet + got, sizeof greet - got, 0);
    EXPECT(n > 0);
    got += (size_t)n;
  }
  EXPECT(memcmp(greet, "crunopen", 8) == 0);
  EXPECT(send(fd, answer, sizeof answer, 0) == (ssize_t)sizeof answer);
  return fd;
}

/* Returns 1 when the server closes fd within 5 s (reads until EOF). */
static int closed_by_server(int fd) {
  char buf[256];
  struct pollfd p = {fd, POLLIN, 0};
  double end = crun_clock() + 5;
  while (crun_clock() < end) {
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return 1;
  }
  return 0;
}

/* Builds a request frame into buf; returns its size. */
static size_t frame_of(uint8_t *buf, int op, unsigned n, const void *const *a, const size_t *l) {
  size_t p = CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < n; i++) {
    crun__put_u32(buf + p, (uint32_t)l[i]);
    memcpy(buf + p + 4, a[i], l[i]);
    p += 4 + l[i];
  }
  crun__put_u32(buf, (uint32_t)(p - 4));
  buf[4] = CRUN_STORE_PROTO_VERSION, buf[5] = (uint8_t)op, buf[6] = (uint8_t)n, buf[7] = 0;
  return p;
}

/* Builds a GET frame for key (timeout_ms 60 s) into buf; returns its size. */
static size_t get_frame(uint8_t *buf, const char *key) {
  uint8_t ms[8];
  crun__put_i64(ms, 60000);
  return frame_of(buf, CRUN__SOP_GET, 2, (const void *[]){key, ms}, (size_t[]){strlen(key), 8});
}

TEST(tcp_semantics) {
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = 0, .is_master = 1, .timeout = 10};
  crun_store_t *s;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  EXPECT(crun_store_tcp_port(s) > 0);
  exercise(s);
  exercise_deadlines(s); /* also proves the store reconnects after a timeout */
  crun_store_t *c = client(crun_store_tcp_port(s), 10);
  expect_value(c, "cs", "second");
  crun_store_release(c);
  crun_store_release(s);
}

struct late { int port; const char *key; };
static void *late_set(void *arg) {
  struct late *l = arg;
  usleep(150000);
  crun_store_t *c = client(l->port, 5);
  crun_store_set(c, l->key, "later", 5);
  crun_store_release(c);
  return NULL;
}

TEST(tcp_get_is_parked_until_set) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 10);
  struct late l = {port, "late"};
  pthread_t th;
  pthread_create(&th, NULL, late_set, &l);
  double t0 = crun_clock();
  expect_value(s, "late", "later");
  double dt = crun_clock() - t0;
  EXPECT(dt > 0.1 && dt < 5);
  pthread_join(th, NULL);
  l.key = "w2";
  pthread_create(&th, NULL, late_set, &l);
  EXPECT_OK(crun_store_wait(s, (const char *[]){"late", "w2"}, 2, 5));
  pthread_join(th, NULL);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

TEST(tcp_port_in_use) {
  crun_store_server_t *a, *b = NULL;
  EXPECT_OK(crun_store_server_start("127.0.0.1", 0, &a));
  int port = crun_store_server_port(a);
  EXPECT_STATUS(crun_store_server_start("127.0.0.1", port, &b), CRUN_EADDRINUSE);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  EXPECT(strstr(crun_last_error(), want) != NULL);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .is_master = 1, .timeout = 1};
  crun_store_t *s = NULL;
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_EADDRINUSE);
  crun_store_server_stop(a);
}

/* A listen address that does not resolve is EINVAL naming it (the listener
 * handle used to be closed uninitialised: libuv aborted the process). */
TEST(tcp_listen_address_unresolvable) {
  crun_store_server_t *srv = NULL;
  EXPECT_STATUS(crun_store_server_start("no.such.host.invalid", 0, &srv), CRUN_EINVAL);
  EXPECT(strstr(crun_last_error(), "no.such.host.invalid") != NULL);
  crun_store_tcp_opts_t o = {.host = "no.such.host.invalid", .port = 0, .is_master = 1, .timeout = 1};
  crun_store_t *s = NULL;
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_EINVAL);
}

TEST(tcp_connect_refused) {
  crun_store_server_t *a;
  EXPECT_OK(crun_store_server_start("127.0.0.1", 0, &a));
  int port = crun_store_server_port(a);
  crun_store_server_stop(a); /* now nothing listens there */
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 5, .connect_timeout = 0.3};
  crun_store_t *s = NULL;
  double t0 = crun_clock();
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_ECONNREFUSED);
  EXPECT(crun_clock() - t0 < 3);
  o.port = 0;
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_EINVAL);
}

/* Picks a port that was free a moment ago. */
static int free_port(void) {
  int port;
  crun_store_server_stop(local_server(&port));
  return port;
}

TEST(tcp_world_size_join) {
  int port = free_port();
  pid_t kids[3];
  for (int i = 0; i < 3; i++) {
    if ((kids[i] = fork()) == 0) {
      alarm(60);
      usleep(100000 * (unsigned)i);
      crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .world_size = 4,
                                 .timeout = 10, .connect_timeout = 10};
      crun_store_t *s;
      if (crun_store_tcp_new(&o, &s) < 0) _exit(2);
      crun_buf_t b;
      if (crun_store_get(s, "go", &b) < 0) _exit(3);
      crun_store_release(s);
      _exit(0);
    }
  }
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .is_master = 1,
                             .world_size = 4, .timeout = 10};
  crun_store_t *s;
  EXPECT_OK(crun_store_tcp_new(&o, &s)); /* returns once all 4 joined */
  EXPECT_OK(crun_store_set(s, "go", "1", 1));
  for (int i = 0; i < 3; i++) {
    int st;
    waitpid(kids[i], &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  crun_store_release(s);
  /* a master whose world never fills times out */
  o.port = 0;
  o.timeout = 0.3;
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_ETIMEDOUT);
  EXPECT(strstr(crun_last_error(), "world_size=4") != NULL);
}

TEST(tcp_hostile_frames) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *good = client(port, 5);
  EXPECT_OK(crun_store_set(good, "k", "v", 1));
  /* garbage text: its first 4 bytes read as a huge length */
  int fd = raw_connect(port);
  const char *junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT(send(fd, junk, strlen(junk), 0) > 0);
  EXPECT(closed_by_server(fd));
  close(fd);
  /* a frame claiming 4 GiB */
  fd = raw_connect(port);
  uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, CRUN_STORE_PROTO_VERSION, CRUN__SOP_SET, 2, 0};
  EXPECT(send(fd, huge, sizeof huge, 0) == sizeof huge);
  EXPECT(closed_by_server(fd));
  close(fd);
  /* bad version, unknown op, arguments that overrun the frame, wrong arity */
  uint8_t bad[4][16] = {
      {12, 0, 0, 0, 99, CRUN__SOP_PING, 0, 0},
      {4, 0, 0, 0, CRUN_STORE_PROTO_VERSION, 200, 0, 0},
      {12, 0, 0, 0, CRUN_STORE_PROTO_VERSION, CRUN__SOP_GET, 1, 0, 0xff, 0, 0, 0, 'k', 0, 0, 0},
      {4, 0, 0, 0, CRUN_STORE_PROTO_VERSION, CRUN__SOP_GET, 0, 0}};
  size_t blen[4] = {16, 8, 16, 8};
  for (int i = 0; i < 4; i++) {
    fd = raw_connect(port);
    EXPECT(send(fd, bad[i], blen[i], 0) == (ssize_t)blen[i]);
    if (!closed_by_server(fd)) crun_test_fail(__FILE__, __LINE__, "bad frame #%d not closed", i);
    close(fd);
  }
  /* a frame cut short, then the peer vanishes: nothing to serve, no crash */
  fd = raw_connect(port);
  EXPECT(send(fd, huge + 4, 3, 0) == 3);
  close(fd);
  /* the server still serves the good client and new ones */
  expect_value(good, "k", "v");
  crun_store_t *c2 = client(port, 5);
  EXPECT_OK(crun_store_set(c2, "k2", "v2", 2));
  expect_value(good, "k2", "v2");
  crun_store_release(c2);
  crun_store_release(good);
  crun_store_server_stop(srv);
}

struct stopper { crun_store_server_t *srv; };
static void *stop_later(void *arg) {
  usleep(200000);
  crun_store_server_stop(((struct stopper *)arg)->srv);
  return NULL;
}

TEST(tcp_server_goes_away) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 60);
  struct stopper st = {srv};
  pthread_t th;
  pthread_create(&th, NULL, stop_later, &st);
  crun_buf_t b;
  double t0 = crun_clock();
  EXPECT_STATUS(crun_store_get(s, "never", &b), CRUN_ECONNRESET);
  EXPECT(crun_clock() - t0 < 5);
  EXPECT(strstr(crun_last_error(), "never") != NULL);
  pthread_join(th, NULL);
  t0 = crun_clock();
  EXPECT_STATUS(crun_store_set(s, "k", "v", 1), CRUN_ECONNREFUSED);
  EXPECT(crun_clock() - t0 < 5);
  crun_store_release(s);
}

TEST(tcp_thousand_clients) {
  enum { N = 1000 };
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 3 * N + 64) { /* raw + client + server-side sockets */
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  getrlimit(RLIMIT_NOFILE, &rl);
  EXPECT(rl.rlim_cur >= 3 * N + 64);
  int port;
  crun_store_server_t *srv = local_server(&port);
  /* N raw connections, each parking a GET on "go" at the same time */
  static int fds[N];
  uint8_t frame[64];
  size_t flen = get_frame(frame, "go");
  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(port);
    EXPECT(send(fds[i], frame, flen, 0) == (ssize_t)flen);
  }
  /* N store clients, all connected at once, each adding 1 */
  static crun_store_t *cs[N];
  int64_t v = 0;
  for (int i = 0; i < N; i++) {
    cs[i] = client(port, 20);
    EXPECT_OK(crun_store_add(cs[i], "count", 1, &v));
  }
  EXPECT_EQ_INT(v, N);
  EXPECT_OK(crun_store_set(cs[0], "go", "yes", 3));
  for (int i = 0; i < N; i++) {
    uint8_t r[64];
    size_t got = 0;
    while (got < 19) { /* 8-byte header + 4-byte length + "yes" + slack */
      struct pollfd p = {fds[i], POLLIN, 0};
      EXPECT(poll(&p, 1, 5000) == 1);
      ssize_t n = recv(fds[i], r + got, sizeof r - got, 0);
      EXPECT(n > 0);
      got += (size_t)n;
      if (got >= 15) break;
    }
    EXPECT(got == 15 && r[5] == 0 && memcmp(r + 12, "yes", 3) == 0);
    close(fds[i]);
  }
  for (int i = 0; i < N; i++) crun_store_release(cs[i]);
  crun_store_server_stop(srv);
}

static int race_port;
static void race_child(int idx) {
  crun_store_t *s;
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = race_port, .timeout = 20, .connect_timeout = 5};
  int64_t v;
  char key[32], me[8];
  if (crun_store_tcp_new(&o, &s) < 0) _exit(2);
  for (int i = 0; i < 500; i++)
    if (crun_store_add(s, "counter", 1, &v) < 0) _exit(3);
  int ml = snprintf(me, sizeof me, "%d", idx);
  for (int slot = 0; slot < 20; slot++) {
    crun_buf_t b;
    snprintf(key, sizeof key, "slot%d", slot);
    if (crun_store_compare_set(s, key, "", 0, me, (size_t)ml, &b) < 0) _exit(4);
    crun_buf_free(&b);
  }
  crun_store_release(s);
}

TEST(tcp_multiprocess_race) {
  /* fork before the server thread exists (a child forked while another
   * thread holds a lock, e.g. the allocator's, can deadlock); the children
   * keep retrying their connect until the server is up */
  race_port = free_port();
  pid_t kids[8];
  for (int i = 0; i < 8; i++)
    if ((kids[i] = fork()) == 0) alarm(60), race_child(i), _exit(0);
  crun_store_server_t *srv;
  EXPECT_OK(crun_store_server_start("127.0.0.1", race_port, &srv));
  for (int i = 0; i < 8; i++) {
    int st;
    waitpid(kids[i], &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  crun_store_t *s = client(race_port, 5);
  expect_value(s, "counter", "4000");
  int64_t n;
  EXPECT_OK(crun_store_num_keys(s, &n));
  EXPECT_EQ_INT(n, 21);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

TEST(tcp_big_value) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 20);
  size_t len = 24u << 20;
  char *v = malloc(len);
  for (size_t i = 0; i < len; i++) v[i] = (char)(i * 131u);
  EXPECT_OK(crun_store_set(s, "big", v, len));
  crun_buf_t b;
  EXPECT_OK(crun_store_get(s, "big", &b));
  EXPECT(b.len == len && memcmp(b.data, v, len) == 0);
  crun_buf_free(&b);
  free(v);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* Reads exactly len bytes from fd within 10 s. */
static int read_exact(int fd, uint8_t *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return -1;
    ssize_t n = recv(fd, buf + got, len - got, 0);
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

TEST(tcp_pipelined_clients) {
  signal(SIGPIPE, SIG_DFL); /* the harness ignores it; an embedding process may not */
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 20);
  size_t len = 1u << 20;
  uint8_t *v = malloc(len);
  for (size_t i = 0; i < len; i++) v[i] = (uint8_t)(i * 7u);
  EXPECT_OK(crun_store_set(s, "big", v, len));
  /* 200 pipelined GETs of 1 MiB: over the server's 64 MiB reply backlog, so
   * it pauses that connection and resumes as the client reads */
  enum { REQS = 200 };
  uint8_t one[64], *many = malloc(REQS * sizeof one), *r = malloc(len + 64);
  size_t flen = get_frame(one, "big");
  for (int i = 0; i < REQS; i++) memcpy(many + i * flen, one, flen);
  int fd = raw_connect(port);
  EXPECT(send(fd, many, REQS * flen, 0) == (ssize_t)(REQS * flen));
  for (int i = 0; i < REQS; i++) {
    EXPECT(read_exact(fd, r, 12 + len) == 0);
    EXPECT(crun__get_u32(r) == 8 + len && r[5] == 0 && memcmp(r + 12, v, len) == 0);
  }
  close(fd);
  /* clients that pipeline and vanish (FIN or RST) before their replies */
  for (int i = 0; i < 10; i++) {
    fd = raw_connect(port);
    EXPECT(send(fd, many, REQS * flen, 0) == (ssize_t)(REQS * flen));
    if (i % 2) {
      struct linger lg = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
  }
  free(many);
  free(r);
  free(v);
  EXPECT_OK(crun_store_set(s, "alive", "1", 1));
  expect_value(s, "alive", "1");
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* Counts the lines of /proc/net/unix naming the abstract socket @name. */
static int unix_sockets_named(const char *name) {
  FILE *f = fopen("/proc/net/unix", "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) {
    char *at = strchr(line, '@');
    if (at && strncmp(at + 1, name, strlen(name)) == 0 && (at[1 + strlen(name)] == '\n'))
      n++;
  }
  if (f) fclose(f);
  return n;
}

TEST(tcp_both_transports) {
  /* same-host clients of a loopback server come in over its unix socket */
  int port;
  crun_store_server_t *srv = local_server(&port);
  char name[64];
  snprintf(name, sizeof name, "crun-store:127.0.0.1:%d", port);
  EXPECT_EQ_INT(unix_sockets_named(name), 1); /* the listener */
  crun_store_t *s = client(port, 10);
  EXPECT_OK(crun_store_set(s, "k", "v", 1));
  EXPECT(unix_sockets_named(name) >= 2);      /* + the accepted connection */
  crun_store_release(s);
  crun_store_server_stop(srv);
  EXPECT_EQ_INT(unix_sockets_named(name), 0);
  /* CRUN_STORE_UNIX=0: plain TCP on both sides, same behaviour */
  setenv("CRUN_STORE_UNIX", "0", 1);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = 0, .is_master = 1, .timeout = 10};
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  snprintf(name, sizeof name, "crun-store:127.0.0.1:%d", crun_store_tcp_port(s));
  EXPECT_EQ_INT(unix_sockets_named(name), 0);
  exercise(s);
  exercise_deadlines(s);
  crun_store_release(s);
  unsetenv("CRUN_STORE_UNIX");
}

/* A store opened with a secret: clients that prove it are served; clients
 * with another secret or none, strangers' bytes and a server without the
 * secret are refused with EACCES, and nothing is read or written for them. */
static crun_store_t *token_client(int port, const char *token, int unix_socket, int *rc) {
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 3, .connect_timeout = 1, .token = token};
  crun_store_t *s = NULL;
  setenv("CRUN_STORE_UNIX", unix_socket ? "1" : "0", 1);
  *rc = crun_store_tcp_new(&o, &s);
  unsetenv("CRUN_STORE_UNIX");
  return s;
}

TEST(tcp_secret) {
  crun_store_server_t *srv;
  EXPECT_OK(crun_store_server_start_token("127.0.0.1", 0, "job-secret-1", &srv));
  int port = crun_store_server_port(srv), rc;
  for (int local = 0; local < 2; local++) {
    crun_store_t *s = token_client(port, "job-secret-1", local, &rc);
    EXPECT_OK(rc);
    EXPECT_OK(crun_store_set(s, "k", "v", 1));
    crun_store_release(s);
    EXPECT(token_client(port, "job-secret-2", local, &rc) == NULL);
    EXPECT_STATUS(rc, CRUN_EACCES);
    EXPECT_TEXT("refused this client's proof");
    EXPECT(token_client(port, "", local, &rc) == NULL);
    EXPECT_STATUS(rc, CRUN_EACCES);
    EXPECT_TEXT("requires the job's secret");
  }
  /* a stranger's bytes: a forged answer and frames behind it are never served */
  int fd = raw_socket(port);
  char greet[40];
  EXPECT(recv(fd, greet, sizeof greet, MSG_WAITALL) == 40 && memcmp(greet, "crunauth", 8) == 0);
  uint8_t forged[64 + 64] = {0}, frame[64];
  size_t flen = get_frame(frame, "k");
  memcpy(forged + 64, frame, flen);
  EXPECT(send(fd, forged, 64 + flen, 0) == (ssize_t)(64 + flen));
  EXPECT(closed_by_server(fd));
  close(fd);
  /* a client with the secret does not talk to a server without it */
  crun_store_server_t *open;
  EXPECT_OK(crun_store_server_start_token("127.0.0.1", 0, "", &open));
  EXPECT(token_client(crun_store_server_port(open), "job-secret-1", 0, &rc) == NULL);
  EXPECT_STATUS(rc, CRUN_EACCES);
  EXPECT_TEXT("does not know the job's secret");
  crun_store_server_stop(open);
  crun_store_t *s = token_client(port, "job-secret-1", 0, &rc);
  EXPECT_OK(rc);
  crun_buf_t b;
  EXPECT_OK(crun_store_get(s, "k", &b)); /* the server kept serving */
  EXPECT(b.len == 1 && memcmp(b.data, "v", 1) == 0);
  crun_buf_free(&b);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* A server that greets with the job's secret, reads the client's answer
 * and then sends no proof until the client hangs up (a store too busy to
 * finish the handshake in time). */
static void *stalling_server(void *arg) {
  int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
  if (fd < 0) return NULL;
  crun__auth_t a;
  unsigned char greet[CRUN__AUTH_GREET], nonce[32], answer[CRUN__AUTH_ANSWER], c;
  crun__auth_init(&a, "job-secret-1");
  crun__auth_greet(&a, greet, nonce);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (send(fd, greet, sizeof greet, MSG_NOSIGNAL) == (ssize_t)sizeof greet)
    if (recv(fd, answer, sizeof answer, MSG_WAITALL) == (ssize_t)sizeof answer)
      while (recv(fd, &c, 1, 0) > 0) {} /* until the client closes */
  close(fd);
  return NULL;
}

/* A proof that has not come by the connect deadline is ETIMEDOUT, not
 * EACCES: the client gave up on a busy server, which refused nothing (the
 * launcher's watcher, reconnecting within a 0.25 s slice, reported "lost the
 * store of node 0" for it under load; spec.multihost_spec under ASan). */
TEST(tcp_handshake_stall_is_etimedout) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  EXPECT(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
  EXPECT(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, stalling_server, &lfd) == 0);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = ntohs(sa.sin_port), .timeout = 5,
                             .connect_timeout = 0.5, .token = "job-secret-1"};
  crun_store_t *s = NULL;
  EXPECT_STATUS(crun_store_tcp_new(&o, &s), CRUN_ETIMEDOUT);
  EXPECT_TEXT("sent no proof of the job's secret in time");
  EXPECT(s == NULL);
  pthread_join(th, NULL);
  close(lfd);
}

/* Another user who binds the store's unix socket name first gets nothing:
 * the client sees the socket's owner (SO_PEERCRED) and goes over TCP. */
TEST(tcp_unix_socket_taken_by_another_user) {
  if (geteuid() != 0) {
    printf("SKIP: needs root to act as another user\n");
    return;
  }
  int port = free_port();
  int ready[2], told[2];
  EXPECT(pipe(ready) == 0 && pipe(told) == 0);
  pid_t kid = fork();
  if (kid == 0) { /* the squatter: binds the name, reports whether it ever got a byte */
    alarm(20);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    struct sockaddr_un un;
    socklen_t len = crun__store_local_addr("127.0.0.1", port, &un);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(lfd, (struct sockaddr *)&un, len) < 0 || listen(lfd, 8) < 0) _exit(4);
    if (write(ready[1], "r", 1) != 1) _exit(5);
    char got = 'n', b[64];
    for (;;) {
      struct pollfd p = {lfd, POLLIN, 0};
      if (poll(&p, 1, 3000) != 1) break;
      int c = accept(lfd, NULL, NULL);
      struct pollfd q = {c, POLLIN, 0};
      if (poll(&q, 1, 500) == 1 && recv(c, b, sizeof b, 0) > 0) got = 'y';
      close(c);
    }
    if (write(told[1], &got, 1) != 1) _exit(6);
    _exit(0);
  }
  char c;
  EXPECT(read(ready[0], &c, 1) == 1);
  crun_store_server_t *srv; /* its own unix socket cannot be bound: the name is taken */
  EXPECT_OK(crun_store_server_start_token("127.0.0.1", port, "", &srv));
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 3, .connect_timeout = 1, .token = ""};
  crun_store_t *s = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  EXPECT_OK(crun_store_set(s, "secret-key", "v", 1));
  int64_t n;
  EXPECT_OK(crun_store_num_keys(s, &n));
  crun_store_release(s);
  crun_store_server_stop(srv);
  EXPECT(read(told[0], &c, 1) == 1);
  waitpid(kid, NULL, 0);
  EXPECT(c == 'n');
}

/* A non-loopback IPv4 address of this host and its interface's name into
 * addr/ifname; 0 when there is none. */
static int host_ipv4(struct in_addr *addr, char *ifname, size_t cap) {
  struct ifaddrs *all, *i;
  int found = 0;
  if (getifaddrs(&all) < 0) return 0;
  for (i = all; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
    *addr = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
    snprintf(ifname, cap, "%s", i->ifa_name);
    found = 1;
  }
  freeifaddrs(all);
  return found;
}

/* Another user's process on this host that binds its socket to an interface
 * (SO_BINDTODEVICE, open to every user) and connects to one of the host's
 * own addresses is still found as the stranger it is: the kernel's exact
 * lookup by address and port alone does not see a socket bound to a device. */
TEST(tcp_stranger_bound_to_a_device) {
  struct in_addr ip;
  char ifname[IF_NAMESIZE];
  if (geteuid() != 0 || !host_ipv4(&ip, ifname, sizeof ifname)) {
    printf("SKIP: needs root to act as another user, and a non-loopback IPv4 address\n");
    return;
  }
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = ip};
  socklen_t sl = sizeof sa;
  EXPECT(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
  EXPECT(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
  for (int bound = 0; bound < 2; bound++) {
    pid_t kid = fork();
    if (kid == 0) { /* the stranger: connects, then waits to be closed */
      alarm(10);
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (bound && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname, (socklen_t)strlen(ifname)) != 0) _exit(4);
      if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) _exit(5);
      char b;
      _exit(recv(fd, &b, 1, 0) == 0 ? 0 : 6);
    }
    int c = accept(lfd, NULL, NULL);
    EXPECT(c >= 0);
    long uid = -2;
    int stranger = crun__peer_stranger(c, &uid);
    close(c);
    int st;
    waitpid(kid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!stranger) crun_test_fail(__FILE__, __LINE__, "a peer of uid 65534 %s was not taken for a stranger (uid %ld)",
                                  bound ? "bound to a device" : "", uid);
    EXPECT_EQ_INT(uid, 65534);
  }
  close(lfd);
}

/* Resident memory of this process in MiB. */
static long rss_mib(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
  }
  return rss * sysconf(_SC_PAGESIZE) / (1 << 20);
}

/* A client that pipelines ~90 MiB of tiny requests and never reads its
 * replies: the server's memory stays bounded (bytes, bookkeeping counted),
 * it stops reading that connection, and serves the others meanwhile. */
TEST(tcp_client_that_never_reads) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  long before = rss_mib();
  int fd = raw_connect(port);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  uint8_t one[8] = {4, 0, 0, 0, CRUN_STORE_PROTO_VERSION, CRUN__SOP_NUM_KEYS, 0, 0};
  enum { BATCH = 8192 };
  static uint8_t many[BATCH * 8];
  for (int i = 0; i < BATCH; i++) memcpy(many + 8 * i, one, 8);
  size_t sent = 0, off = 0;
  double end = crun_clock() + 3; /* bounded: the server stops reading long before */
  while (sent < ((size_t)90 << 20) && crun_clock() < end) {
    ssize_t n = send(fd, many + off, sizeof many - off, MSG_NOSIGNAL);
    if (n > 0) {
      sent += (size_t)n;
      off = (off + (size_t)n) % sizeof many;
    } else {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, 50);
    }
  }
  crun_store_t *other = client(port, 5); /* the server still serves others */
  int64_t n;
  EXPECT_OK(crun_store_num_keys(other, &n));
  long grown = rss_mib() - before;
  printf("sent %zu MiB of requests without reading; the process grew by %ld MiB\n", sent >> 20, grown);
  EXPECT(grown < 400);
  close(fd);
  crun_store_release(other);
  crun_store_server_stop(srv);
}

/* Many parked waits on distinct keys: each is answered when (and only when)
 * its own key is set; a multi-key wait parks on each missing key in turn. */
TEST(tcp_waiters_by_key) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  enum { W = 300 };
  static int fds[W];
  uint8_t frame[64];
  char key[32];
  for (int i = 0; i < W; i++) {
    snprintf(key, sizeof key, "w%d", i);
    size_t flen = get_frame(frame, key);
    fds[i] = raw_connect(port);
    EXPECT(send(fds[i], frame, flen, 0) == (ssize_t)flen);
  }
  crun_store_t *s = client(port, 10);
  const char *multi_keys[3] = {"m2", "m0", "m1"};
  pthread_t th;
  struct { crun_store_t *s; const char *const *k; int rc; } arg = {client(port, 10), multi_keys, 1};
  void *waiter(void *a);
  EXPECT(pthread_create(&th, NULL, waiter, &arg) == 0);
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof key, "m%d", i);
    EXPECT_OK(crun_store_set(s, key, "x", 1));
  }
  pthread_join(th, NULL);
  EXPECT_OK(arg.rc);
  crun_store_release(arg.s);
  for (int k = 0; k < W; k++) {
    int i = (k * 7 + 3) % W; /* W and 7 coprime: every key once, out of order */
    snprintf(key, sizeof key, "w%d", i);
    EXPECT_OK(crun_store_set(s, key, key, strlen(key)));
    uint8_t r[64];
    ssize_t n = recv(fds[i], r, sizeof r, 0);
    EXPECT(n >= 12 && r[5] == 0 && memcmp(r + 12, key, strlen(key)) == 0);
    if (k + 1 < W) { /* the next one in line is still parked */
      int j = ((k + 1) * 7 + 3) % W;
      struct pollfd p = {fds[j], POLLIN, 0};
      EXPECT(poll(&p, 1, 0) == 0);
    }
    close(fds[i]);
  }
  crun_store_release(s);
  crun_store_server_stop(srv);
}

void *waiter(void *a) {
  struct { crun_store_t *s; const char *const *k; int rc; } *w = a;
  w->rc = crun_store_wait(w->s, w->k, 3, 10);
  return NULL;
}

/* 1500 idle connections that never pass the handshake (a 1024-descriptor
 * soft limit would be gone): the job's own clients still connect. */
TEST(tcp_idle_connection_flood) {
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max < 4000) {
    printf("SKIP: the hard file limit (%ld) is too low for 1500 connections on both ends\n", (long)rl.rlim_max);
    return;
  }
  rl.rlim_cur = 1024; /* the usual default soft limit */
  setrlimit(RLIMIT_NOFILE, &rl);
  crun_store_server_t *srv;
  EXPECT_OK(crun_store_server_start("127.0.0.1", 0, &srv)); /* raises the soft limit */
  int port = crun_store_server_port(srv);
  enum { IDLE = 1500 };
  static int fds[IDLE];
  for (int i = 0; i < IDLE; i++) fds[i] = raw_socket(port);
  crun_store_t *s = client(port, 5);
  EXPECT_OK(crun_store_set(s, "alive", "1", 1));
  crun_store_release(s);
  for (int i = 0; i < IDLE; i++) close(fds[i]);
  crun_store_server_stop(srv);
}

/* ------------------------------------------------------------ queues */

/* A new client of the server on 127.0.0.1:port (ctx). */
static crun_store_t *tcp_handle(void *ctx) { return client((int)(intptr_t)ctx, 30); }

TEST(tcp_queues) {
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = 0, .is_master = 1, .timeout = 10};
  crun_store_t *s, *p;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  exercise_queues(s, 1);
  exercise_concurrent_pops(tcp_handle, (void *)(intptr_t)crun_store_tcp_port(s));
  EXPECT_OK(crun_store_prefix_new("pre", s, &p));
  exercise_queues(p, 0);
  crun_store_release(p);
  crun_store_release(s);
}

/* A QUEUE_POP frame for key with timeout_ms (< 0: don't wait). */
static size_t qpop_frame(uint8_t *buf, const char *key, int64_t ms) {
  uint8_t m[8];
  crun__put_i64(m, ms);
  return frame_of(buf, CRUN__SOP_QUEUE_POP, 2, (const void *[]){key, m}, (size_t[]){strlen(key), 8});
}

/* Sends a QUEUE_POP for key on fd, then makes a round trip on s: the server
 * has read the pop before it answers s (one loop, events in arrival order). */
static void park_popper(int fd, const char *key, int64_t ms, crun_store_t *s) {
  uint8_t f[128];
  size_t n = qpop_frame(f, key, ms);
  EXPECT(send(fd, f, n, 0) == (ssize_t)n);
  int64_t k;
  EXPECT_OK(crun_store_num_keys(s, &k));
}

/* Reads one reply frame from fd (10 s at most) into buf; returns its code
 * and points *arg / *alen at its first argument. */
static int read_reply(int fd, uint8_t *buf, size_t cap, const uint8_t **arg, uint32_t *alen) {
  EXPECT(read_exact(fd, buf, 4) == 0);
  uint32_t len = crun__get_u32(buf);
  EXPECT(len + 4 <= cap && read_exact(fd, buf + 4, len) == 0);
  *alen = 0, *arg = NULL;
  if (buf[6] || buf[7]) *alen = crun__get_u32(buf + 8), *arg = buf + 12;
  return buf[5];
}

/* Whether fd has bytes to read right now. */
static int readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

/* The queue opcodes on the wire: poppers parked in order are served in
 * order, one per push; a closed popper is dropped; the server times a pop
 * out itself and the connection goes on; non-blocking pops, LIST_KEYS,
 * pipelining and a malformed pop. */
TEST(tcp_queue_opcodes) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 10);
  uint8_t r[256], f[256];
  const uint8_t *arg;
  uint32_t alen;
  char item[32];
  enum { P = 20 };
  int fds[P];
  for (int i = 0; i < P; i++) {
    fds[i] = raw_connect(port);
    park_popper(fds[i], "fifo", 20000, s);
  }
  EXPECT_OK(crun_store_queue_push(s, "fifo", "item0", 5)); /* one push: the first popper only */
  EXPECT_EQ_INT(read_reply(fds[0], r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 5 && memcmp(arg, "item0", 5) == 0);
  int64_t n;
  EXPECT_OK(crun_store_queue_len(s, "fifo", &n));
  EXPECT_EQ_INT(n, 0);
  for (int i = 1; i < P; i++) EXPECT(!readable(fds[i]));
  for (int i = 1; i < P; i++) { /* then each popper gets the item pushed in its turn */
    snprintf(item, sizeof item, "item%d", i);
    EXPECT_OK(crun_store_queue_push(s, "fifo", item, strlen(item)));
  }
  for (int i = 1; i < P; i++) {
    snprintf(item, sizeof item, "item%d", i);
    EXPECT_EQ_INT(read_reply(fds[i], r, sizeof r, &arg, &alen), 0);
    if (alen != strlen(item) || memcmp(arg, item, alen) != 0)
      crun_test_fail(__FILE__, __LINE__, "popper %d got '%.*s', want '%s'", i, (int)alen, (const char *)arg, item);
  }
  for (int i = 0; i < P; i++) close(fds[i]);
  /* a popper that closes its connection is dropped: the next one gets the item */
  int x = raw_connect(port), y = raw_connect(port);
  park_popper(x, "gone", 20000, s);
  park_popper(y, "gone", 20000, s);
  close(x);
  EXPECT_OK(crun_store_num_keys(s, &n));
  EXPECT_OK(crun_store_queue_push(s, "gone", "for-y", 5));
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 5 && memcmp(arg, "for-y", 5) == 0);
  /* the server's deadline: ETIMEDOUT at 200 ms, then the pipelined PING */
  size_t fl = qpop_frame(f, "never", 200);
  fl += frame_of(f + fl, CRUN__SOP_PING, 0, NULL, NULL);
  double t0 = crun_clock();
  EXPECT(send(y, f, fl, 0) == (ssize_t)fl);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), -CRUN_ETIMEDOUT);
  double dt = crun_clock() - t0;
  EXPECT(dt >= 0.19 && dt < 2.0);
  EXPECT(alen > 0 && memmem(arg, alen, "'never'", 7) != NULL);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 10 && memcmp(arg, "crun-store", 10) == 0);
  /* not blocking: ENOTFOUND at once; a push and a pop pipelined */
  fl = qpop_frame(f, "none", -1);
  fl += frame_of(f + fl, CRUN__SOP_QUEUE_PUSH, 2, (const void *[]){"pp", "\0v"}, (size_t[]){2, 2});
  fl += qpop_frame(f + fl, "pp", -1);
  EXPECT(send(y, f, fl, 0) == (ssize_t)fl);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), -CRUN_ENOTFOUND);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 2 && memcmp(arg, "\0v", 2) == 0);
  /* LIST_KEYS: the count, then the plain keys NUL-terminated */
  EXPECT_OK(crun_store_set(s, "k1", "v", 1));
  EXPECT_OK(crun_store_set(s, "k22", "v", 1));
  crun_store_flush_sets(); /* s's sets do not wait (async_set): y sees them once flushed */
  fl = frame_of(f, CRUN__SOP_LIST_KEYS, 0, NULL, NULL);
  EXPECT(send(y, f, fl, 0) == (ssize_t)fl);
  EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
  EXPECT(r[6] == 2 && alen == 8 && crun__get_i64(arg) == 2);
  EXPECT(crun__get_u32(r + 20) == 7 && (memcmp(r + 24, "k1\0k22\0", 7) == 0 || memcmp(r + 24, "k22\0k1\0", 7) == 0));
  /* a pop whose timeout is not 8 bytes breaks the protocol */
  fl = frame_of(f, CRUN__SOP_QUEUE_POP, 2, (const void *[]){"q", "abcd"}, (size_t[]){1, 4});
  EXPECT(send(y, f, fl, 0) == (ssize_t)fl);
  EXPECT(closed_by_server(y));
  close(y);
  /* a server stopped with a popper still parked (its timer armed) */
  int z = raw_connect(port);
  park_popper(z, "forever", 60000, s);
  crun_store_release(s);
  crun_store_server_stop(srv);
  EXPECT(closed_by_server(z));
  close(z);
}

/* Opens a client of 127.0.0.1:port whose sets do not wait (async_set). */
static crun_store_t *async_client(int port) {
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .connect_timeout = 5,
                             .async_set = 1};
  crun_store_t *s = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  return s;
}

TEST(tcp_async_set) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *a = async_client(port), *b = client(port, 10);
  char k[32], v[32];
  for (int i = 0; i < 1000; i++) { /* many sets, none answered */
    snprintf(k, sizeof k, "k%d", i), snprintf(v, sizeof v, "v%d", i);
    EXPECT_OK(crun_store_set(a, k, v, strlen(v)));
  }
  crun_buf_t got = {0};
  EXPECT_OK(crun_store_get(a, "k999", &got)); /* its own later calls see them */
  EXPECT(got.len == 4 && memcmp(got.data, "v999", 4) == 0);
  crun_buf_free(&got);
  int64_t n = 0;
  EXPECT_OK(crun_store_num_keys(b, &n)); /* so does anyone once such a call returned */
  EXPECT(n == 1000);
  EXPECT_OK(crun_store_set(a, "last", "x", 1));
  crun_store_release(a); /* a close confirms them first */
  int all = 0;
  EXPECT_OK(crun_store_check(b, (const char *[]){"last"}, 1, &all));
  EXPECT(all == 1);
  crun_store_release(b);
  crun_store_server_stop(srv);
}

/* Accepts one client on lfd as a server with no secret: the greeting sent,
 * the client's answer read, so its frames come next. */
static int accept_greeted(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  crun__auth_t auth;
  unsigned char greet[CRUN__AUTH_GREET], nonce[32], in[CRUN__AUTH_ANSWER];
  crun__auth_init(&auth, "");
  crun__auth_greet(&auth, greet, nonce);
  EXPECT(send(fd, greet, sizeof greet, 0) == (ssize_t)sizeof greet);
  EXPECT(read_exact(fd, in, CRUN__AUTH_ANSWER) == 0);
  return fd;
}

/* A server that greets one client (no secret), reads its first request and
 * hangs up without answering. */
static void *hang_up_server(void *arg) {
  int fd = accept_greeted(*(int *)arg);
  uint8_t in[256];
  EXPECT(read_exact(fd, in, 8) == 0); /* the set's header */
  close(fd);
  return NULL;
}

/* A server that greets one client (no secret), reads a set that it does
 * not answer (SET_NOREPLY) and then one request, which it answers 300 ms
 * later with an OK of no arguments (CHECK: with 1). */
static void *slow_reply_server(void *arg) {
  int fd = accept_greeted(*(int *)arg);
  uint8_t in[256];
  int op = 0;
  for (int i = 0; i < 2; i++) {
    EXPECT(read_exact(fd, in, 8) == 0 && (i > 0 || in[5] == CRUN__SOP_SET_NOREPLY));
    op = in[5];
    uint32_t len = crun__get_u32(in);
    EXPECT(len >= 4 && len - 4 <= sizeof in && (len == 4 || read_exact(fd, in, len - 4) == 0));
  }
  usleep(300000);
  uint8_t one[8], r[64];
  crun__put_i64(one, 1);
  size_t rl = op == CRUN__SOP_CHECK ? frame_of(r, 0, 1, (const void *[]){one}, (size_t[]){8})
                                    : frame_of(r, 0, 0, NULL, NULL);
  EXPECT(send(fd, r, rl, 0) == (ssize_t)rl);
  EXPECT(read_exact(fd, in, 1) != 0); /* the client closes */
  close(fd);
  return NULL;
}

/* The default client's sets do not wait; crun_store_flush_sets waits for a
 * reply that comes after them, so every one is visible to the other
 * clients before it returns. */
TEST(tcp_flush_sets) {
  int lport, lfd = loopback_listener(&lport);
  pthread_t th;
  pthread_create(&th, NULL, slow_reply_server, &lfd);
  crun_store_tcp_opts_t so = {.host = "127.0.0.1", .port = lport, .timeout = 10,
                              .connect_timeout = 5, .token = ""};
  crun_store_t *slow = NULL;
  EXPECT_OK(crun_store_tcp_new(&so, &slow));
  double t0 = crun_clock();
  EXPECT_OK(crun_store_set(slow, "k", "v", 1)); /* returns at once */
  double t1 = crun_clock();
  crun_store_flush_sets(); /* returns with the reply to its PING */
  double t2 = crun_clock();
  EXPECT(t1 - t0 < 0.2 && t2 - t0 >= 0.29);
  crun_store_release(slow); /* nothing left to read */
  pthread_join(th, NULL);
  close(lfd);

  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .connect_timeout = 5};
  int y = raw_connect(port); /* another client, over TCP; first, so the server looks at it first */
  crun_store_t *a = NULL, *c = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &a));
  EXPECT_OK(crun_store_tcp_new(&o, &c));
  char k[32];
  uint8_t f[128], r[128];
  const uint8_t *arg;
  uint32_t alen;
  int seen = 0;
  size_t vl = 1 << 20;
  char *v = calloc(1, vl);
  for (int round = 0; round < 10; round++) {
    for (int i = 0; i < 2; i++) { /* two handles, each with a set in flight */
      snprintf(k, sizeof k, "r%d/%d", round, i);
      EXPECT_OK(crun_store_set(i % 2 ? c : a, k, v, vl));
    }
    crun_store_flush_sets();
    size_t fl = frame_of(f, CRUN__SOP_CHECK, 2, (const void *[]){k, "r0/0"}, (size_t[]){strlen(k), 4});
    EXPECT(send(y, f, fl, 0) == (ssize_t)fl);
    EXPECT_EQ_INT(read_reply(y, r, sizeof r, &arg, &alen), 0);
    seen += alen == 8 && crun__get_i64(arg) == 1;
  }
  EXPECT_EQ_INT(seen, 10);
  free(v);
  crun_store_flush_sets(); /* nothing in flight: returns at once */
  close(y);
  crun_store_release(a);
  crun_store_release(c);
  crun_store_server_stop(srv);
}

static void *check_k(void *arg) {
  int all = 0;
  EXPECT_OK(crun_store_check(arg, (const char *[]){"k"}, 1, &all));
  EXPECT(all == 1);
  return NULL;
}

/* A flush waits for the sets of a handle that another thread is using at
 * that moment (that thread's reply confirms them): skipping it let a
 * barrier end before the set was applied (the progress board's publisher
 * thread sets on the same handle as the group's store). */
TEST(tcp_flush_sets_busy_handle) {
  int lport, lfd = loopback_listener(&lport);
  pthread_t th, user;
  pthread_create(&th, NULL, slow_reply_server, &lfd);
  crun_store_tcp_opts_t so = {.host = "127.0.0.1", .port = lport, .timeout = 10,
                              .connect_timeout = 5, .token = "", .async_set = 1};
  crun_store_t *slow = NULL;
  EXPECT_OK(crun_store_tcp_new(&so, &slow));
  double t0 = crun_clock();
  EXPECT_OK(crun_store_set(slow, "k", "v", 1)); /* returns at once */
  pthread_create(&user, NULL, check_k, slow); /* holds the handle until the reply */
  usleep(50000);
  crun_store_flush_sets();
  double t1 = crun_clock();
  EXPECT(t1 - t0 >= 0.29); /* not before the set was confirmed */
  pthread_join(user, NULL);
  crun_store_release(slow);
  pthread_join(th, NULL);
  close(lfd);
}

/* A server that greets one client (no secret) and reads its frames without
 * answering any (a PING neither), until the client hangs up. */
static void *mute_server(void *arg) {
  int fd = accept_greeted(*(int *)arg);
  uint8_t in[256];
  while (read(fd, in, sizeof in) > 0) {
  }
  close(fd);
  return NULL;
}

static void *flush_sets(void *arg) {
  crun_store_flush_sets();
  *(double *)arg = crun_clock();
  return NULL;
}

/* A flush stuck on one handle (its server never answers the PING) holds no
 * other thread up: creating a client, setting on it and closing it, and
 * closing a handle the flush has yet to reach, each return at once (the
 * process's list of handles was locked for the whole flush: every one of
 * them waited out the stuck handle's timeout). The handle closed mid-flush
 * is closed after the flush and its set is applied. */
TEST(tcp_flush_sets_stuck_handle_blocks_no_one) {
  int port, lport, lfd = loopback_listener(&lport);
  crun_store_server_t *srv = local_server(&port);
  pthread_t mute, flusher;
  pthread_create(&mute, NULL, mute_server, &lfd);
  crun_store_tcp_opts_t bo = {.host = "127.0.0.1", .port = port, .timeout = 10, .connect_timeout = 5,
                              .async_set = 1};
  crun_store_tcp_opts_t ao = {.host = "127.0.0.1", .port = lport, .timeout = 2, .connect_timeout = 5,
                              .token = "", .async_set = 1};
  crun_store_t *a = NULL, *b = NULL, *c = NULL;
  EXPECT_OK(crun_store_tcp_new(&bo, &b));
  EXPECT_OK(crun_store_tcp_new(&ao, &a)); /* newer: flushed before b */
  EXPECT_OK(crun_store_set(b, "kb", "vb", 2));
  EXPECT_OK(crun_store_set(a, "ka", "va", 2));
  double t0 = crun_clock(), done = 0;
  pthread_create(&flusher, NULL, flush_sets, &done);
  usleep(100000); /* the flush waits on a */
  EXPECT_OK(crun_store_tcp_new(&bo, &c));
  EXPECT_OK(crun_store_set(c, "kc", "vc", 2));
  crun_store_release(c);
  crun_store_release(b);
  double t1 = crun_clock();
  EXPECT(t1 - t0 < 1.0); /* a's timeout is 2 s */
  pthread_join(flusher, NULL);
  EXPECT(done - t0 >= 1.9); /* a was waited for */
  crun_store_t *y = client(port, 10);
  int all = 0;
  EXPECT_OK(crun_store_check(y, (const char *[]){"kb", "kc"}, 2, &all));
  EXPECT(all == 1);
  crun_store_release(y);
  crun_store_release(a);
  pthread_join(mute, NULL);
  close(lfd);
  crun_store_server_stop(srv);
}

/* A forked child's flush leaves the parent's handles alone: its PING on
 * the socket the two share would put a reply there that the parent's next
 * call would take for its own. */
TEST(tcp_flush_sets_in_forked_child) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 2, .connect_timeout = 5,
                             .async_set = 1};
  crun_store_t *a = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &a));
  EXPECT_OK(crun_store_set(a, "k", "v", 1)); /* not confirmed yet */
  usleep(50000);
  pid_t pid = fork();
  if (pid == 0) {
    crun_store_flush_sets(); /* as a barrier in the child would */
    _exit(0);
  }
  int st = 0;
  EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  crun_buf_t got = {0};
  EXPECT_OK(crun_store_get(a, "k", &got)); /* its reply, not one the child asked for */
  EXPECT(got.len == 1 && memcmp(got.data, "v", 1) == 0);
  crun_buf_free(&got);
  crun_store_release(a);
  crun_store_server_stop(srv);
}

/* A process that exits or is killed without closing its store right after
 * sets it did not wait for: every set arrives. (When the server answered
 * them, a TCP socket closed with those answers unread was reset, and the
 * reset dropped the sets still in its send queue.) */
TEST(tcp_async_sets_survive_exit) {
  int port;
  crun_store_server_t *srv = local_server_env("CRUN_STORE_UNIX", "0", &port); /* TCP, as every client on another host */
  crun_store_t *c = client(port, 10);
  enum { N = 60 };
  for (int round = 0; round < 3; round++) {
    pid_t pid = fork();
    if (pid == 0) {
      crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .async_set = 1};
      crun_store_t *s = NULL;
      size_t vl = 1 << 16;
      char k[32], *v = calloc(1, vl);
      if (!v || crun_store_tcp_new(&o, &s) < 0) _exit(2);
      for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "x%d/%d", round, i);
        if (crun_store_set(s, k, v, vl) < 0) _exit(3);
      }
      if (round == 2) raise(SIGKILL); /* the store is not closed */
      _exit(0);
    }
    int st = 0;
    EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid);
    EXPECT(round == 2 ? WIFSIGNALED(st) : WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char kb[N][32];
    const char *keys[N];
    for (int i = 0; i < N; i++) snprintf(kb[i], sizeof kb[i], "x%d/%d", round, i), keys[i] = kb[i];
    EXPECT_OK(crun_store_wait(c, keys, N, 3.0)); /* every set arrives */
  }
  crun_store_release(c);
  crun_store_server_stop(srv);
}

/* A set that did not wait and failed on the server (here: a value over
 * CRUN_STORE_MAX_VALUE_BYTES) fails the handle's next request, which is not
 * run, once; the connection stays. A flush that finds it keeps it for that
 * request. An acknowledged set reports it itself. */
TEST(tcp_async_set_fails_on_server) {
  int port;
  crun_store_server_t *srv = local_server_env("CRUN_STORE_MAX_VALUE_BYTES", "100", &port);
  crun_store_t *a = client(port, 10), *b = client(port, 10);
  char big[200] = {0};
  crun_buf_t got = {0};
  int64_t n = 0;
  for (int flush = 0; flush < 2; flush++) {
    EXPECT_OK(crun_store_set(a, "small", "v", 1));
    EXPECT_OK(crun_store_set(a, "big", big, sizeof big)); /* sent: returns at once */
    EXPECT_OK(crun_store_set(a, "big2", big, 150));
    EXPECT_OK(crun_store_set(a, "after", "w", 1)); /* applied: only the failure is kept */
    if (flush) crun_store_flush_sets();
    EXPECT_STATUS(crun_store_add(a, "counter", 1, &n), CRUN_ERANGE);
    EXPECT(strstr(crun_last_error(), "an earlier set failed (set does not wait for the server; this call was not "
                                     "run): store: a value of 200 bytes for key 'big' is over this server's limit "
                                     "of 100 bytes (CRUN_STORE_MAX_VALUE_BYTES) (and 1 more after it)") != NULL);
    EXPECT_OK(crun_store_add(a, "counter", 1, &n)); /* told once; the add before was not run */
    EXPECT_EQ_INT((int)n, flush + 1);
    EXPECT_OK(crun_store_get(b, "after", &got));
    crun_buf_free(&got);
    int all = 1;
    EXPECT_OK(crun_store_check(b, (const char *[]){"big"}, 1, &all));
    EXPECT(all == 0);
  }
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .async_set = -1};
  crun_store_t *w = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &w));
  EXPECT_STATUS(crun_store_set(w, "big", big, sizeof big), CRUN_ERANGE); /* the set itself */
  EXPECT_OK(crun_store_set(w, "ok", "v", 1));
  crun_store_release(w);
  crun_store_release(a);
  crun_store_release(b);
  crun_store_server_stop(srv);
}

/* A lost set that a flush finds is reported by the handle's next call;
 * async_set = -1 makes the set itself wait and report it. */
static void lost_set(int async, int flush) {
  int lport, lfd = loopback_listener(&lport);
  pthread_t th;
  pthread_create(&th, NULL, hang_up_server, &lfd);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = lport, .timeout = 10,
                             .connect_timeout = 5, .token = "", .async_set = async};
  crun_store_t *a = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &a));
  if (async < 0) {
    EXPECT_STATUS(crun_store_set(a, "lost", "x", 1), CRUN_ECONNRESET); /* the set tells */
    pthread_join(th, NULL);
  } else {
    EXPECT_OK(crun_store_set(a, "lost", "x", 1)); /* sent: returns at once */
    pthread_join(th, NULL);
    if (flush) crun_store_flush_sets();
    crun_buf_t got = {0};
    EXPECT_STATUS(crun_store_get(a, "lost", &got), CRUN_ECONNRESET); /* the next call tells */
    EXPECT(strstr(crun_last_error(), "1 earlier set (async_set) never acknowledged") != NULL);
  }
  crun_store_release(a);
  close(lfd);
}

TEST(tcp_flush_sets_lost) {
  lost_set(0, 1);
  lost_set(-1, 0);
}

TEST(tcp_async_set_lost) {
  int lport, lfd = loopback_listener(&lport);
  pthread_t th;
  pthread_create(&th, NULL, hang_up_server, &lfd);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = lport, .timeout = 10,
                             .connect_timeout = 5, .token = "", .async_set = 1};
  crun_store_t *a = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &a));
  EXPECT_OK(crun_store_set(a, "lost", "x", 1)); /* sent: returns at once */
  pthread_join(th, NULL);
  crun_buf_t got = {0};
  EXPECT_STATUS(crun_store_get(a, "lost", &got), CRUN_ECONNRESET); /* the next call tells */
  EXPECT(strstr(crun_last_error(), "1 earlier set (async_set) never acknowledged") != NULL);
  crun_store_release(a);
  close(lfd);
}

/* CRUN_STORE_SPIN_US sets how long the client and the server poll; unset,
 * each has its own default (tcp_proto.h, "Spinning"). */
TEST(tcp_spin_setting) {
  const char *was = getenv("CRUN_STORE_SPIN_US");
  char *keep = was ? strdup(was) : NULL;
  unsetenv("CRUN_STORE_SPIN_US");
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_CLIENT) == CRUN_STORE_SPIN_US_CLIENT * 1e-6);
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_SERVER) == CRUN_STORE_SPIN_US_SERVER * 1e-6);
  setenv("CRUN_STORE_SPIN_US", "0", 1);
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_CLIENT) == 0);
  setenv("CRUN_STORE_SPIN_US", "70", 1);
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_SERVER) == 70 * 1e-6);
  setenv("CRUN_STORE_SPIN_US", "-3", 1);
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_CLIENT) == 0);
  setenv("CRUN_STORE_SPIN_US", "5000000", 1);
  EXPECT(crun__store_spin_seconds(CRUN_STORE_SPIN_US_CLIENT) == 1.0);
  if (keep) setenv("CRUN_STORE_SPIN_US", keep, 1);
  else unsetenv("CRUN_STORE_SPIN_US");
  free(keep);
}

/* The state letter of this process's thread named `name` (0: none). */
static char thread_state(const char *name) {
  char path[300], buf[512];
  DIR *d = opendir("/proc/self/task");
  char st = 0;
  for (struct dirent *e; d && !st && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *open = strchr(buf, '('), *close = strrchr(buf, ')');
    if (open && close && close > open && (size_t)(close - open - 1) == strlen(name) &&
        strncmp(open + 1, name, strlen(name)) == 0 && close[1] == ' ')
      st = close[2];
  }
  if (d) closedir(d);
  return st;
}

static void *busy_client(void *arg) {
  crun_store_t *s = client(*(int *)arg, 10);
  char key[32];
  crun_buf_t b = {0};
  for (int i = 0; i < 300; i++) {
    snprintf(key, sizeof key, "busy/%p/%d", (void *)&b, i);
    EXPECT_OK(crun_store_set(s, key, "v", 1));
    EXPECT_OK(crun_store_get(s, key, &b));
    crun_buf_free(&b);
  }
  crun_store_release(s);
  return NULL;
}

/* More busy clients than CPUs (the server stops polling after each request
 * and looks only CRUN_STORE_TAIL_POLLS more times), then none: the server
 * thread goes to sleep rather than polling on. */
TEST(tcp_idle_server_sleeps) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  enum { N = 16 };
  pthread_t th[N];
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN), n = ncpu + 2 < N ? ncpu + 2 : N;
  for (long i = 0; i < n; i++) pthread_create(&th[i], NULL, busy_client, &port);
  for (long i = 0; i < n; i++) pthread_join(th[i], NULL);
  EXPECT(thread_state("crun-store") != 0);
  double deadline = crun_clock() + 20;
  char st = 0;
  while ((st = thread_state("crun-store")) != 'S' && crun_clock() < deadline) usleep(1000);
  EXPECT(st == 'S');
  crun_store_server_stop(srv);
}

/* ------------------------------------------------------------ server-side deadlines */

/* A WAIT frame for key with timeout_ms into buf; returns its size. */
static size_t wait_frame(uint8_t *buf, const char *key, int64_t ms) {
  uint8_t m[8];
  crun__put_i64(m, ms);
  return frame_of(buf, CRUN__SOP_WAIT, 2, (const void *[]){key, m}, (size_t[]){strlen(key), 8});
}

/* Timed-out gets, waits and multi_gets are answered ETIMEDOUT by the
 * server at their deadline and keep their connection: the server accepts
 * no new one for them (the launcher's watcher waits in 0.25 s slices for
 * the whole job), and a later wait on that connection succeeds. */
TEST(tcp_timed_out_wait_keeps_connection) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 10), *setter = client(port, 10);
  EXPECT_OK(crun_store_set(setter, "here", "1", 1));
  unsigned long accepted = crun__store_server_accepted(srv);
  EXPECT(accepted == 2);
  crun_buf_t b, outs[2];
  const char *absent = "absent";
  for (int i = 0; i < 5; i++) {
    double t0 = crun_clock();
    EXPECT_STATUS(crun_store_wait(s, &absent, 1, 0.05), CRUN_ETIMEDOUT);
    double dt = crun_clock() - t0;
    if (dt < 0.045 || dt > 0.9) crun_test_fail(__FILE__, __LINE__, "wait #%d returned after %.3f s", i, dt);
    EXPECT_TEXT("wait 'absent'");
  }
  crun_store_set_timeout(s, 0.05);
  EXPECT_STATUS(crun_store_get(s, "absent", &b), CRUN_ETIMEDOUT);
  EXPECT_TEXT("get 'absent'");
  EXPECT_STATUS(crun_store_multi_get(s, (const char *[]){"here", "absent"}, 2, outs), CRUN_ETIMEDOUT);
  crun_store_set_timeout(s, 10);
  EXPECT_OK(crun_store_set(setter, "absent", "now", 3));
  EXPECT_OK(crun_store_wait(s, &absent, 1, 5));
  expect_value(s, "absent", "now");
  unsigned long now = crun__store_server_accepted(srv);
  if (now != accepted)
    crun_test_fail(__FILE__, __LINE__, "%lu connections accepted after the timeouts, %lu before", now, accepted);
  crun_store_release(setter);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* Over the unix socket (unix_socket) or loopback TCP only: gets on a
 * missing key that time out (as torch's TCPStore, a user's timeout is an
 * answer, not a broken connection) leave the handle's connection usable --
 * a set and a get on the same handle then run with no new connection (the
 * server's accept count) -- and a value set on that key after the timeout
 * is never taken for the reply of a later, different request (a server
 * still holding the timed-out get would answer it with that value). */
static void timed_out_get_then_more(int unix_socket) {
  int port;
  crun_store_server_t *srv = unix_socket ? local_server(&port) : local_server_env("CRUN_STORE_UNIX", "0", &port);
  if (!unix_socket) setenv("CRUN_STORE_UNIX", "0", 1); /* the clients too */
  crun_store_t *s = client(port, 0.1), *setter = client(port, 10);
  unsetenv("CRUN_STORE_UNIX");
  EXPECT_OK(crun_store_set(setter, "other", "fresh", 5));
  expect_value(setter, "other", "fresh"); /* applied: s sees it */
  char name[64];
  snprintf(name, sizeof name, "crun-store:127.0.0.1:%d", port);
  EXPECT(unix_socket ? unix_sockets_named(name) >= 3 : unix_sockets_named(name) == 0); /* the transport asked */
  unsigned long accepted = crun__store_server_accepted(srv);
  EXPECT(accepted == 2);
  crun_buf_t b = {0};
  for (int i = 0; i < 4; i++) {
    double t0 = crun_clock();
    EXPECT_STATUS(crun_store_get(s, "late", &b), CRUN_ETIMEDOUT);
    EXPECT_TEXT("get 'late'");
    double dt = crun_clock() - t0;
    if (dt < 0.095 || dt > 0.9) crun_test_fail(__FILE__, __LINE__, "get #%d returned after %.3f s", i, dt);
  }
  EXPECT_OK(crun_store_set(s, "mine", "v1", 2));
  expect_value(s, "mine", "v1");
  /* right after a timeout: a server that kept the get parked answers it now */
  EXPECT_STATUS(crun_store_get(s, "late", &b), CRUN_ETIMEDOUT);
  EXPECT_OK(crun_store_set(setter, "late", "stale", 5));
  expect_value(setter, "late", "stale");
  expect_value(s, "other", "fresh");
  expect_value(s, "mine", "v1");
  expect_value(s, "late", "stale"); /* its own request now */
  unsigned long now = crun__store_server_accepted(srv);
  if (now != accepted)
    crun_test_fail(__FILE__, __LINE__, "%s: %lu connections accepted after the timeouts, %lu before",
                   unix_socket ? "unix socket" : "TCP", now, accepted);
  crun_store_release(setter);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

TEST(tcp_timed_out_get_keeps_connection_unix) { timed_out_get_then_more(1); }
TEST(tcp_timed_out_get_keeps_connection_tcp) { timed_out_get_then_more(0); }

/* The sanitizers reserve terabytes of address space: no RLIMIT_AS there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NO_AS_LIMIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NO_AS_LIMIT 1
#endif
#endif

/* In a child (its address space limited so that a 64 MiB reply cannot be
 * held): a get of a 64 MiB value fails with ENOMEM; with the limit lifted,
 * a get of another key returns that key's value, not the rest of the
 * reply the failed get left in the socket. Exit code: 0 ok, else the step. */
static int enomem_get_child(int port) {
  crun_store_t *s = NULL;
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .connect_timeout = 5};
  if (crun_store_tcp_new(&o, &s) != 0) return 2;
  crun_buf_t b = {0};
  if (crun_store_get(s, "small", &b) != 0) return 3; /* connected, buffers made */
  crun_buf_free(&b);
  struct rlimit rl, low;
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%ld", &pages) != 1) return 4;
  fclose(f);
  getrlimit(RLIMIT_AS, &rl);
  low = rl;
  low.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (16u << 20);
  if (setrlimit(RLIMIT_AS, &low) != 0) return 5;
  int rc = crun_store_get(s, "big", &b);
  setrlimit(RLIMIT_AS, &rl);
  if (rc != CRUN_ENOMEM) return 6;
  if (crun_store_get(s, "small", &b) != 0) return 7;
  int same = b.len == 5 && memcmp(b.data, "small", 5) == 0;
  crun_buf_free(&b);
  crun_store_release(s);
  return same ? 0 : 8;
}

/* A reply the client had no memory for is not left on its connection: the
 * next request gets its own reply, not the rest of that one (a get of a
 * large value under memory pressure, then a get of another key, returned
 * the large value). Over the unix socket and loopback TCP. */
TEST(tcp_reply_without_memory_is_not_taken_later) {
#ifdef NO_AS_LIMIT
  printf("SKIP: a sanitizer build (RLIMIT_AS)\n");
#else
  for (int unix_socket = 1; unix_socket >= 0; unix_socket--) {
    int port;
    crun_store_server_t *srv = unix_socket ? local_server(&port) : local_server_env("CRUN_STORE_UNIX", "0", &port);
    crun_store_t *setter = client(port, 10);
    size_t n = (size_t)64 << 20;
    char *big = malloc(n);
    EXPECT(big != NULL);
    memset(big, 'b', n);
    EXPECT_OK(crun_store_set(setter, "big", big, n));
    free(big);
    EXPECT_OK(crun_store_set(setter, "small", "small", 5));
    expect_value(setter, "small", "small");
    if (!unix_socket) setenv("CRUN_STORE_UNIX", "0", 1);
    pid_t kid = fork();
    if (kid == 0) {
      alarm(30);
      _exit(enomem_get_child(port));
    }
    unsetenv("CRUN_STORE_UNIX");
    int st = 0;
    EXPECT(waitpid(kid, &st, 0) == kid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      crun_test_fail(__FILE__, __LINE__, "%s: the client child failed at step %d (8: a stale reply)",
                     unix_socket ? "unix socket" : "TCP", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    crun_store_release(setter);
    crun_store_server_stop(srv);
  }
#endif
}

struct at_deadline { int port; double at; const char *key; };
static void *set_at(void *arg) {
  struct at_deadline *d = arg;
  crun_store_t *c = client(d->port, 5);
  double left = d->at - crun_clock();
  if (left > 0) usleep((useconds_t)(left * 1e6));
  EXPECT_OK(crun_store_set(c, d->key, "v", 1));
  crun_store_release(c);
  return NULL;
}

/* A key set right at a parked wait's deadline: the wait gets exactly one
 * answer (OK or ETIMEDOUT, whichever the server saw first), so the request
 * behind it on the connection gets its own reply, and nothing is left over. */
TEST(tcp_set_at_the_deadline) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 10);
  uint8_t f[128], r[256];
  const uint8_t *arg;
  uint32_t alen;
  int fd = raw_connect(port), ok = 0, late = 0;
  for (int i = 0; i < 24; i++) {
    char key[32];
    snprintf(key, sizeof key, "edge%d", i);
    size_t fl = wait_frame(f, key, 50);
    fl += frame_of(f + fl, CRUN__SOP_PING, 0, NULL, NULL);
    /* the set lands from 6 ms before to 5 ms after the deadline */
    struct at_deadline d = {port, crun_clock() + 0.050 + (i % 12 - 6) * 1e-3, key};
    pthread_t th;
    EXPECT(send(fd, f, fl, 0) == (ssize_t)fl);
    pthread_create(&th, NULL, set_at, &d);
    int code = read_reply(fd, r, sizeof r, &arg, &alen);
    if (code != 0 && code != -CRUN_ETIMEDOUT) crun_test_fail(__FILE__, __LINE__, "wait #%d: code %d", i, code);
    code == 0 ? ok++ : late++;
    EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0);
    EXPECT(alen == 10 && memcmp(arg, "crun-store", 10) == 0);
    pthread_join(th, NULL);
    EXPECT_OK(crun_store_check(s, (const char *[]){key}, 1, &(int){0})); /* the set was served */
    struct pollfd p = {fd, POLLIN, 0};
    EXPECT(poll(&p, 1, 20) == 0); /* no second answer to the wait */
  }
  printf("set at the deadline: %d waits answered OK, %d ETIMEDOUT\n", ok, late);
  close(fd);
  /* the same through the client: the next call gets its own reply */
  for (int i = 0; i < 12; i++) {
    char key[32], val[32];
    snprintf(key, sizeof key, "cedge%d", i), snprintf(val, sizeof val, "mark%d", i);
    EXPECT_OK(crun_store_set(s, "mark", val, strlen(val)));
    struct at_deadline d = {port, crun_clock() + 0.050 + (i - 6) * 1e-3, key};
    pthread_t th;
    pthread_create(&th, NULL, set_at, &d);
    const char *k = key;
    int rc = crun_store_wait(s, &k, 1, 0.05);
    if (rc != 0 && rc != CRUN_ETIMEDOUT) crun_test_fail(__FILE__, __LINE__, "wait #%d: %s", i, crun_last_error());
    expect_value(s, "mark", val);
    pthread_join(th, NULL);
  }
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* timeout_ms from the wire: a negative one closes the connection (a pop's
 * means "don't wait"); INT64_MAX is capped, parks and is answered by a set;
 * 0 looks once; a connection closed while parked frees its timer (ASan);
 * a request of another protocol version is told why in its own version. */
TEST(tcp_wait_timeouts_on_the_wire) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *s = client(port, 10);
  uint8_t f[128], r[256];
  const uint8_t *arg;
  uint32_t alen;
  int fd = raw_connect(port);
  size_t fl = wait_frame(f, "k", -1);
  EXPECT(send(fd, f, fl, 0) == (ssize_t)fl);
  EXPECT(closed_by_server(fd));
  close(fd);
  fd = raw_connect(port);
  fl = wait_frame(f, "big", INT64_MAX);
  fl += wait_frame(f + fl, "none", 0);
  EXPECT(send(fd, f, fl, 0) == (ssize_t)fl);
  EXPECT_OK(crun_store_set(s, "other", "1", 1)); /* a round trip: the wait is parked now */
  EXPECT(!readable(fd));
  EXPECT_OK(crun_store_set(s, "big", "1", 1));
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0);
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), -CRUN_ETIMEDOUT);
  EXPECT(alen > 0 && memmem(arg, alen, "'none'", 6) != NULL);
  fl = wait_frame(f, "never", 60000); /* parked with its timer armed, then closed */
  EXPECT(send(fd, f, fl, 0) == (ssize_t)fl);
  EXPECT_OK(crun_store_set(s, "other", "2", 1));
  close(fd);
  fd = raw_connect(port);
  fl = wait_frame(f, "k", 10);
  f[4] = 1; /* a client of protocol version 1 */
  EXPECT(send(fd, f, fl, 0) == (ssize_t)fl);
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), -CRUN_EPROTO);
  EXPECT(r[4] == 1 && alen > 0 && memmem(arg, alen, "version 1 not supported", 23) != NULL);
  EXPECT(closed_by_server(fd));
  close(fd);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* A SET_NOREPLY frame of key k and a value of vlen bytes (from v) into buf. */
static size_t noreply_frame(uint8_t *buf, const char *k, const void *v, size_t vlen) {
  return frame_of(buf, CRUN__SOP_SET_NOREPLY, 2, (const void *[]){k, v}, (size_t[]){strlen(k), vlen});
}

typedef struct {
  int fd;
  const uint8_t *frames;
  size_t len;      /* bytes of frames, sent over and over */
  size_t limit;    /* stop after this many bytes */
  double end;      /* or at this time */
  size_t sent;
} flood_t;

/* Sends f->frames over and over without reading, until f->limit or f->end. */
static void *flood(void *arg) {
  flood_t *f = arg;
  size_t off = 0;
  while (f->sent < f->limit && crun_clock() < f->end) {
    ssize_t n = send(f->fd, f->frames + off, f->len - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    f->sent += (size_t)n;
    off = (off + (size_t)n) % f->len;
  }
  return NULL;
}

/* Floods the server at port with unanswered sets (SET_NOREPLY) of one key,
 * values of vlen bytes, up to limit bytes or secs seconds, never reading,
 * while another client probes; checks the server's memory stays flat, the
 * probes are answered promptly, the flood's next request is answered after
 * all of them, and the last value is the one stored. */
static void noreply_flood(int port, size_t vlen, size_t limit, double secs) {
  crun_store_t *other = client(port, 10);
  enum { COPIES = 16 };
  uint8_t *v = malloc(vlen), *one = malloc(vlen + 64), *frames = malloc(COPIES * (vlen + 64));
  for (size_t i = 0; i < vlen; i++) v[i] = (uint8_t)(i * 131u + (i >> 9) - 7);
  size_t fl = noreply_frame(one, "flooded", v, vlen);
  for (int i = 0; i < COPIES; i++) memcpy(frames + (size_t)i * fl, one, fl);
  int64_t n;
  EXPECT_OK(crun_store_num_keys(other, &n)); /* warm */
  long before = rss_mib();
  int fd = raw_connect(port);
  flood_t f = {fd, frames, COPIES * fl, limit, crun_clock() + secs, 0};
  pthread_t th;
  pthread_create(&th, NULL, flood, &f);
  double worst = 0;
  int probes = 0;
  while (crun_clock() < f.end && f.sent < f.limit) {
    double t0 = crun_clock();
    EXPECT_OK(crun_store_num_keys(other, &n));
    double took = crun_clock() - t0;
    if (took > worst) worst = took;
    probes++;
    usleep(20000);
  }
  pthread_join(th, NULL);
  long grown = rss_mib() - before;
  uint8_t ping[16], r[256];
  const uint8_t *arg;
  uint32_t alen;
  size_t pl = frame_of(ping, CRUN__SOP_PING, 0, NULL, NULL);
  EXPECT(send(fd, ping, pl, 0) == (ssize_t)pl);
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0);
  EXPECT(!readable(fd));
  printf("flooded %zu MiB of unanswered %zu-byte sets; the server grew by %ld MiB; %d probes, worst %.3f s\n",
         f.sent >> 20, vlen, grown, probes, worst);
  EXPECT(f.sent >= limit / 2 || vlen < 1024); /* it read them: no stall */
  EXPECT(grown < 64);
  EXPECT(worst < 1.0);
  crun_buf_t got = {0};
  EXPECT_OK(crun_store_get(other, "flooded", &got));
  EXPECT(got.len == vlen && memcmp(got.data, v, vlen) == 0);
  crun_buf_free(&got);
  close(fd);
  free(v), free(one), free(frames);
  crun_store_release(other);
}

/* A client that floods unanswered sets of one key and never reads (2 GiB
 * of 64 KiB values, then 2 s of 9-byte ones): the server stays bounded in
 * memory and keeps serving the others. */
TEST(tcp_noreply_flood_is_bounded) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  noreply_flood(port, 65536 - 64, (size_t)2 << 30, 20);
  noreply_flood(port, 9, (size_t)2 << 30, 2);
  crun_store_server_stop(srv);
}

/* A raw client pipelines a GET that parks, a SET_NOREPLY of that key and
 * another GET: the set is applied only after the parked GET is answered
 * (ETIMEDOUT at its deadline), and the second GET sees it; nothing else is
 * written. */
TEST(tcp_noreply_behind_a_parked_get) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *other = client(port, 10);
  uint8_t buf[512], r[512], ms[8];
  const uint8_t *arg;
  uint32_t alen;
  crun__put_i64(ms, 300);
  size_t l = frame_of(buf, CRUN__SOP_GET, 2, (const void *[]){"pk", ms}, (size_t[]){2, 8});
  l += noreply_frame(buf + l, "pk", "v-3", 3);
  l += get_frame(buf + l, "pk");
  int fd = raw_connect(port);
  EXPECT(send(fd, buf, l, 0) == (ssize_t)l);
  usleep(100000);
  int all = 1;
  EXPECT_OK(crun_store_check(other, (const char *[]){"pk"}, 1, &all));
  EXPECT(all == 0); /* not applied ahead of the parked GET */
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), -CRUN_ETIMEDOUT);
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 3 && memcmp(arg, "v-3", 3) == 0);
  usleep(50000);
  EXPECT(!readable(fd));
  close(fd);
  crun_store_release(other);
  crun_store_server_stop(srv);
}

/* Failing SET_NOREPLYs, then a GET that would park and a PING: the GET is
 * answered at once with the first failure and the count of the others (not
 * run), the PING normally; the kept failure is cleared by that one reply. */
TEST(tcp_noreply_failure_answers_one_request) {
  int port;
  crun_store_server_t *srv = local_server_env("CRUN_STORE_MAX_VALUE_BYTES", "100", &port);
  uint8_t big[200], buf[2048], r[2048];
  for (int i = 0; i < 200; i++) big[i] = (uint8_t)(i * 7 - 3);
  const uint8_t *arg;
  uint32_t alen;
  size_t l = noreply_frame(buf, "b1", big, 200);
  l += noreply_frame(buf + l, "b2", big, 101);
  l += noreply_frame(buf + l, "b3", big, 150);
  l += noreply_frame(buf + l, "fine", big, 100);
  l += get_frame(buf + l, "never");
  l += frame_of(buf + l, CRUN__SOP_PING, 0, NULL, NULL);
  l += noreply_frame(buf + l, "b4", big, 120);
  l += frame_of(buf + l, CRUN__SOP_NUM_KEYS, 0, NULL, NULL);
  l += frame_of(buf + l, CRUN__SOP_NUM_KEYS, 0, NULL, NULL);
  int fd = raw_connect(port);
  EXPECT(send(fd, buf, l, 0) == (ssize_t)l);
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), -CRUN_ERANGE);
  EXPECT(alen > 0 && memmem(arg, alen, "key 'b1'", 8) && memmem(arg, alen, "(and 2 more after it)", 21));
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0); /* PING */
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), -CRUN_ERANGE);
  EXPECT(alen > 0 && memmem(arg, alen, "key 'b4'", 8) && !memmem(arg, alen, "more after", 10));
  EXPECT_EQ_INT(read_reply(fd, r, sizeof r, &arg, &alen), 0);
  EXPECT(alen == 8 && crun__get_i64(arg) == 1); /* "fine" only */
  usleep(50000);
  EXPECT(!readable(fd));
  close(fd);
  crun_store_server_stop(srv);
}

/* Every op that stores a value honours CRUN_STORE_MAX_VALUE_BYTES, and one
 * refused stores nothing: set, append (the resulting length), compare_set,
 * multi_set (all or nothing), queue_push. */
TEST(tcp_max_value_every_op) {
  int port;
  crun_store_server_t *srv = local_server_env("CRUN_STORE_MAX_VALUE_BYTES", "100", &port);
  crun_store_tcp_opts_t o = {.host = "127.0.0.1", .port = port, .timeout = 10, .async_set = -1};
  crun_store_t *s = NULL;
  EXPECT_OK(crun_store_tcp_new(&o, &s));
  uint8_t v[101];
  for (int i = 0; i < 101; i++) v[i] = (uint8_t)(i * 13 - 5);
  int64_t n = -1;
  int all = 1;
  crun_buf_t got = {0};
  EXPECT_STATUS(crun_store_set(s, "s", v, 101), CRUN_ERANGE);
  EXPECT_OK(crun_store_set(s, "s", v, 100));
  EXPECT_OK(crun_store_append(s, "a", v, 60));
  EXPECT_STATUS(crun_store_append(s, "a", v, 41), CRUN_ERANGE);
  EXPECT_OK(crun_store_append(s, "a", v, 40));
  EXPECT_OK(crun_store_get(s, "a", &got));
  EXPECT(got.len == 100);
  crun_buf_free(&got);
  EXPECT_STATUS(crun_store_compare_set(s, "c", "", 0, v, 101, &got), CRUN_ERANGE);
  EXPECT_OK(crun_store_check(s, (const char *[]){"c"}, 1, &all));
  EXPECT(all == 0);
  EXPECT_STATUS(crun_store_multi_set(s, (const char *[]){"m1", "m2"}, 2, (const void *[]){v, v},
                                     (size_t[]){5, 101}), CRUN_ERANGE);
  EXPECT_OK(crun_store_check(s, (const char *[]){"m1"}, 1, &all));
  EXPECT(all == 0);
  EXPECT_STATUS(crun_store_queue_push(s, "q", v, 101), CRUN_ERANGE);
  EXPECT_OK(crun_store_queue_len(s, "q", &n));
  EXPECT(n == 0);
  crun_store_release(s);
  crun_store_server_stop(srv);
}

/* A set failure that a flush found is kept for a call that reads a reply,
 * not taken by a set that does not wait: the progress board's publisher
 * thread sets on the group's handle (through a prefix store), and a set of
 * its took the user's failure away (it only logs it). */
TEST(tcp_flush_failure_not_taken_by_a_set) {
  int port;
  crun_store_server_t *srv = local_server_env("CRUN_STORE_MAX_VALUE_BYTES", "100", &port);
  crun_store_t *a = client(port, 10), *b = client(port, 10), *board = NULL;
  EXPECT_OK(crun_store_prefix_new("board", a, &board));
  uint8_t big[200];
  for (int i = 0; i < 200; i++) big[i] = (uint8_t)(i * 11 - 9);
  int64_t n = 0;
  EXPECT_OK(crun_store_set(a, "big", big, sizeof big)); /* fails on the server */
  crun_store_flush_sets();                              /* finds it: kept for a's next call */
  EXPECT_OK(crun_store_set(board, "progress/0", "allreduce #3", 12)); /* sent all the same */
  EXPECT_STATUS(crun_store_add(a, "counter", 1, &n), CRUN_ERANGE); /* the user is told */
  EXPECT_TEXT("key 'big'");
  EXPECT(strncmp(crun_last_error(), "ERANGE: an earlier set failed", 29) == 0); /* named once */
  EXPECT_OK(crun_store_add(a, "counter", 1, &n));
  EXPECT_EQ_INT((int)n, 1);
  crun_store_flush_sets();
  int all = 0;
  EXPECT_OK(crun_store_check(b, (const char *[]){"board/progress/0"}, 1, &all));
  EXPECT(all == 1);
  /* a get (which may park) confirms the sets ahead of it: their failure
   * goes to the next call, the get itself runs */
  crun_buf_t got = {0};
  EXPECT_OK(crun_store_set(a, "big", big, sizeof big));
  EXPECT_OK(crun_store_set(a, "x", "x1", 2));
  EXPECT_OK(crun_store_get(a, "x", &got));
  EXPECT(got.len == 2 && memcmp(got.data, "x1", 2) == 0);
  crun_buf_free(&got);
  EXPECT_STATUS(crun_store_add(a, "counter", 1, &n), CRUN_ERANGE);
  EXPECT_TEXT("key 'big'");
  EXPECT_OK(crun_store_add(a, "counter", 1, &n));
  EXPECT_EQ_INT((int)n, 2);
  crun_store_release(board);
  crun_store_release(a);
  crun_store_release(b);
  crun_store_server_stop(srv);
}

static void *get_go(void *arg) {
  crun_buf_t got = {0};
  EXPECT_OK(crun_store_get(arg, "go", &got));
  EXPECT(got.len == 2 && memcmp(got.data, "-1", 2) == 0);
  crun_buf_free(&got);
  return NULL;
}

/* A flush does not wait for a get that another thread has parked on the
 * same handle (its key may be set only after the barrier): the sets sent
 * before that get are confirmed before it parks. */
TEST(tcp_flush_sets_beside_a_parked_get) {
  int port;
  crun_store_server_t *srv = local_server(&port);
  crun_store_t *a = client(port, 3), *b = client(port, 10);
  EXPECT_OK(crun_store_set(a, "k", "v7", 2)); /* not confirmed yet */
  pthread_t th;
  pthread_create(&th, NULL, get_go, a); /* parks on "go", holding a */
  usleep(100000);
  double t0 = crun_clock();
  crun_store_flush_sets();
  double took = crun_clock() - t0;
  int all = 0;
  EXPECT_OK(crun_store_check(b, (const char *[]){"k"}, 1, &all));
  EXPECT(all == 1);
  EXPECT_OK(crun_store_set(b, "go", "-1", 2)); /* "after the barrier" */
  pthread_join(th, NULL);
  printf("the flush took %.3f s\n", took);
  EXPECT(took < 1.0);
  crun_store_release(a);
  crun_store_release(b);
  crun_store_server_stop(srv);
}

static void *cont_later(void *arg) {
  usleep(8000000);
  kill(*(pid_t *)arg, SIGCONT);
  return NULL;
}

/* Sets into a server that stopped reading (SIGSTOP) fail with ETIMEDOUT
 * within the handle's timeout once the socket buffers are full, instead of
 * blocking in send forever (sets are not answered: nothing else bounds
 * them). */
TEST(tcp_sets_into_a_stopped_server_time_out) {
  int pfd[2];
  EXPECT(pipe(pfd) == 0);
  pid_t kid = fork();
  if (kid == 0) {
    int port;
    crun_store_server_t *srv = NULL;
    if (crun_store_server_start("127.0.0.1", 0, &srv) < 0) _exit(1);
    port = crun_store_server_port(srv);
    if (write(pfd[1], &port, sizeof port) != sizeof port) _exit(1);
    for (;;) pause();
  }
  int port = 0;
  EXPECT(read(pfd[0], &port, sizeof port) == sizeof port);
  crun_store_t *a = client(port, 2);
  size_t vlen = 256 << 10;
  uint8_t *v = malloc(vlen);
  for (size_t i = 0; i < vlen; i++) v[i] = (uint8_t)(i * 29u + (i >> 11) - 1);
  EXPECT_OK(crun_store_set(a, "k", v, vlen));
  EXPECT(kill(kid, SIGSTOP) == 0);
  pthread_t th;
  pthread_create(&th, NULL, cont_later, &kid);
  double t0 = crun_clock();
  int rc = 0, i;
  for (i = 0; i < 256 && rc == 0; i++) rc = crun_store_set(a, "k", v, vlen);
  double took = crun_clock() - t0;
  printf("set #%d failed after %.2f s: %s\n", i, took, rc ? crun_last_error() : "(none)");
  EXPECT_EQ_INT(rc, CRUN_ETIMEDOUT);
  EXPECT(took < 4);
  kill(kid, SIGKILL);
  waitpid(kid, NULL, 0);
  pthread_join(th, NULL);
  crun_store_release(a);
  free(v);
  close(pfd[0]), close(pfd[1]);
}

#define CRUN_TESTS(X) X(tcp_semantics) X(tcp_get_is_parked_until_set) X(tcp_port_in_use) \
  X(tcp_listen_address_unresolvable) X(tcp_connect_refused) X(tcp_world_size_join) X(tcp_hostile_frames) X(tcp_server_goes_away) \
  X(tcp_thousand_clients) X(tcp_multiprocess_race) X(tcp_big_value) X(tcp_pipelined_clients) X(tcp_both_transports) \
  X(tcp_secret) X(tcp_handshake_stall_is_etimedout) X(tcp_unix_socket_taken_by_another_user) X(tcp_stranger_bound_to_a_device) \
  X(tcp_client_that_never_reads) \
  X(tcp_waiters_by_key) X(tcp_idle_connection_flood) X(tcp_queues) X(tcp_queue_opcodes) X(tcp_async_set) X(tcp_async_set_lost) X(tcp_flush_sets) X(tcp_flush_sets_busy_handle) X(tcp_flush_sets_stuck_handle_blocks_no_one) X(tcp_flush_sets_in_forked_child) X(tcp_async_sets_survive_exit) X(tcp_flush_sets_lost) X(tcp_async_set_fails_on_server) \
  X(tcp_spin_setting) X(tcp_idle_server_sleeps) X(tcp_timed_out_wait_keeps_connection) X(tcp_timed_out_get_keeps_connection_unix) \
  X(tcp_timed_out_get_keeps_connection_tcp) X(tcp_reply_without_memory_is_not_taken_later) \
  X(tcp_set_at_the_deadline) \
  X(tcp_wait_timeouts_on_the_wire) X(tcp_noreply_flood_is_bounded) X(tcp_noreply_behind_a_parked_get) \
  X(tcp_noreply_failure_answers_one_request) X(tcp_max_value_every_op) \
  X(tcp_flush_failure_not_taken_by_a_set) X(tcp_flush_sets_beside_a_parked_get) \
  X(tcp_sets_into_a_stopped_server_time_out)
CRUN_TEST_MAIN()

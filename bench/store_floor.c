/* bench/store_floor.c — the floor under any acknowledged request/reply store
 * on this machine: one epoll server thread that answers each 32-byte
 * request with its echo (no parsing, no table), and C client processes that
 * each send a request and wait for its reply, NOPS times, started together.
 * Prints round trips per second, the figure to put beside a store's
 * throughput (jobs/store_bench.lua: one round trip per acknowledged op).
 *
 *   cc -O2 -o store_floor bench/store_floor.c -lpthread
 *   ./store_floor [--unix] [--poll] CLIENTS NOPS
 *
 * --unix: a unix socket instead of loopback TCP. --poll: the clients poll for
 * the reply (recv MSG_DONTWAIT, then sched_yield), as crun's store client does
 * while its round trips are short; else they block in recv. A job, not a test. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MSG = 32 };
static int g_listen;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* Echoes whatever each connection sends, one read and one write per request. */
static void *serve(void *arg) {
  (void)arg;
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = g_listen}, evs[64];
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, g_listen, &ev) < 0) die("epoll");
  char buf[4096];
  for (;;) {
    int n = epoll_wait(ep, evs, 64, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == g_listen) {
        int c = accept(g_listen, NULL, NULL), one = 1;
        if (c < 0) continue;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on unix */
        struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        continue;
      }
      ssize_t r = read(fd, buf, sizeof buf);
      if (r <= 0 || write(fd, buf, (size_t)r) != r) close(fd);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int use_unix = 0, poll_reply = 0, a = 1;
  for (; a < argc && argv[a][0] == '-'; a++) {
    if (!strcmp(argv[a], "--unix")) use_unix = 1;
    else if (!strcmp(argv[a], "--poll")) poll_reply = 1;
    else break;
  }
  if (argc - a != 2) {
    fprintf(stderr, "usage: store_floor [--unix] [--poll] CLIENTS NOPS\n");
    return 2;
  }
  int clients = atoi(argv[a]), nops = atoi(argv[a + 1]);
  if (clients < 1 || clients > 256 || nops < 1) {
    fprintf(stderr, "store_floor: CLIENTS 1-256 and NOPS >= 1\n");
    return 2;
  }
  struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct sockaddr_un un = {.sun_family = AF_UNIX};
  struct sockaddr *sa = use_unix ? (struct sockaddr *)&un : (struct sockaddr *)&in;
  socklen_t len = use_unix ? sizeof un : sizeof in;
  if (use_unix) snprintf(un.sun_path, sizeof un.sun_path, "/tmp/store_floor.%d", (int)getpid());
  g_listen = socket(use_unix ? AF_UNIX : AF_INET, SOCK_STREAM, 0);
  if (g_listen < 0 || bind(g_listen, sa, len) < 0 || listen(g_listen, 256) < 0) die("listen");
  if (!use_unix && getsockname(g_listen, sa, &len) < 0) die("getsockname");
  pthread_t th;
  if (pthread_create(&th, NULL, serve, NULL) != 0) die("pthread_create");
  int go[2];
  if (pipe(go) < 0) die("pipe");
  for (int c = 0; c < clients; c++) {
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid) continue;
    int s = socket(use_unix ? AF_UNIX : AF_INET, SOCK_STREAM, 0), one = 1;
    if (s < 0 || connect(s, sa, len) < 0) die("connect");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char req[MSG] = {1}, rep[MSG], x;
    if (read(go[0], &x, 1) != 1) _exit(1);
    for (int i = 0; i < nops; i++) {
      if (write(s, req, MSG) != MSG) _exit(1);
      for (ssize_t got = 0; got < MSG;) {
        ssize_t r = recv(s, rep + got, (size_t)(MSG - got), poll_reply ? MSG_DONTWAIT : 0);
        if (r > 0) got += r;
        else if (r == 0) _exit(1);
        else if (poll_reply) sched_yield();
      }
    }
    _exit(0);
  }
  usleep(200000); /* every client connected */
  double t0 = now();
  for (int c = 0; c < clients; c++)
    if (write(go[1], "x", 1) != 1) die("write");
  int bad = 0;
  for (int c = 0; c < clients; c++) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
  }
  double t1 = now();
  if (use_unix) unlink(un.sun_path);
  if (bad) {
    fprintf(stderr, "store_floor: a client failed\n");
    return 1;
  }
  printf("store_floor,%s,%s,%d,%d,%.0f\n", use_unix ? "unix" : "tcp", poll_reply ? "poll" : "block", clients, nops,
         (double)clients * nops / (t1 - t0));
  return 0;
}

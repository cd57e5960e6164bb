/* tcp_proto.h — the TCP store wire protocol, shared by client and server.
 *
 * Every message, both ways, is one frame (integers little-endian):
 *   u32 len      bytes that follow this field; at most CRUN_STORE_MAX_FRAME
 *   u8  version  CRUN_STORE_PROTO_VERSION
 *   u8  code     request: the op (crun__sop); reply: 0 ok, else -crun_status
 *   u16 nargs    number of arguments that follow
 *   nargs x { u32 alen; alen bytes }
 * The arguments exactly fill the frame. A reply with a non-zero code carries
 * one argument, the error text. Integers travel as 8-byte arguments.
 *
 * A client has one request in flight per connection; sets that do not wait
 * (SET_NOREPLY, "Sets that do not wait" below) have no reply. The server answers
 * GET, WAIT, MULTI_GET, JOIN_WAIT and QUEUE_POP only once their keys (the
 * join count, a queue item) exist: the request is parked on the server and
 * the client does not poll. Each carries its deadline as its last argument,
 * an i64 timeout_ms: the time the client has left, rounded up. The server
 * starts a timer when the request first parks and, if it is still parked
 * then, answers ETIMEDOUT itself; an answer stops the timer. The client
 * waits a little past its deadline for that answer (tcp_client.c: 1 s, a
 * pop 2 s), so a timed-out wait keeps its connection and an item is never
 * handed to a connection that is being closed. Only a server silent past
 * that grace makes the client close its connection (the server then drops
 * the parked request) and reconnect on its next call. The server caps
 * timeout_ms at CRUN_STORE_PARK_MAX_MS (a client with more time left sends
 * the request again); a negative timeout_ms closes the connection as a
 * malformed frame, except for QUEUE_POP, where it means "don't wait": an
 * empty queue answers ENOTFOUND at once. A QUEUE_PUSH wakes one parked
 * popper of its key, the one parked first.
 *
 * Version 2 (this one) added timeout_ms to GET, WAIT, MULTI_GET and
 * JOIN_WAIT; version 1 parked them without a deadline. The arguments of a
 * v1 request would mean something else to a v2 server (a v1 WAIT's last key
 * read as a timeout), so the version byte changed: a server answers a
 * request of another version with EPROTO ("store protocol version 1 not
 * supported (server speaks 2)"), in a frame of the client's version so that
 * the client can read it, and closes the connection; a v2 client that gets
 * a reply of another version says that the server speaks it. Client and
 * server of one job come from the same build.
 *
 * Sets that do not wait (async_set, the default; torch's TCPStore set does
 * the same): the client sends SET_NOREPLY and returns; the server answers
 * nothing. It serves a connection's frames in order, so the reply to the
 * client's next request (a PING when the client only wants to know: a
 * flush) says every earlier set was applied. A SET_NOREPLY that fails is
 * kept on the connection: the next request gets that failure as its reply
 * ("an earlier set failed ...; this call was not run") and is not run.
 * Ahead of a request that may park (GET, WAIT, MULTI_GET, JOIN_WAIT,
 * QUEUE_POP) the client sends a PING in the same burst and reads its reply
 * first, so the sets are confirmed before the request parks (a flush in
 * another thread does not wait for it); a failure that PING reports is kept
 * for the client's next call.
 * With no reply to read, a client that exits or is killed right after its
 * sets leaves nothing unread in its socket, so closing it never resets the
 * connection (which would drop the sets still in flight).
 *
 * Transport: TCP, and for clients on the server's host an abstract unix
 * socket (crun__store_local_addr) that a server bound to a loopback or
 * wildcard address also listens on; the frames are the same on both.
 * CRUN_STORE_UNIX=0 turns the unix socket off on either side. */
#ifndef CRUN_STORE_TCP_PROTO_H
#define CRUN_STORE_TCP_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#define CRUN_STORE_PROTO_VERSION 2
#define CRUN_STORE_MAX_FRAME (1u << 30) /* 1 GiB: a larger claim closes the connection */
#define CRUN_STORE_FRAME_HDR 8          /* len + version + code + nargs */
#define CRUN_STORE_MAX_ARGS 65535
/* The longest timeout_ms a parked request gets from the server (1 hour):
 * a larger one (up to INT64_MAX) is cut to this, so no client parks a
 * request beyond it and no timer arithmetic overflows. */
#define CRUN_STORE_PARK_MAX_MS 3600000

/* Request ops and their arguments -> reply arguments. */
typedef enum {
  CRUN__SOP_SET = 1,       /* key, value -> () */
  CRUN__SOP_GET = 2,       /* key, i64 timeout_ms -> value (parks) */
  CRUN__SOP_ADD = 3,       /* key, i64 delta -> i64 new value */
  CRUN__SOP_CAS = 4,       /* key, expected, desired -> value now stored */
  CRUN__SOP_WAIT = 5,      /* keys..., i64 timeout_ms -> () (parks) */
  CRUN__SOP_CHECK = 6,     /* keys... -> i64 all_exist */
  CRUN__SOP_DELETE = 7,    /* key -> i64 existed */
  CRUN__SOP_NUM_KEYS = 8,  /* () -> i64 count */
  CRUN__SOP_APPEND = 9,    /* key, value -> () */
  CRUN__SOP_MULTI_GET = 10,/* keys..., i64 timeout_ms -> values... (parks) */
  CRUN__SOP_MULTI_SET = 11,/* key1, value1, key2, value2... -> () */
  CRUN__SOP_PING = 12,     /* () -> "crun-store" */
  CRUN__SOP_JOIN = 13,     /* () -> i64 clients joined so far (counts this one) */
  CRUN__SOP_JOIN_WAIT = 14,/* i64 n, i64 timeout_ms -> i64 joined, once >= n (parks) */
  CRUN__SOP_QUEUE_PUSH = 15,/* key, value -> () */
  CRUN__SOP_QUEUE_POP = 16, /* key, i64 timeout_ms (< 0: don't wait) -> value (parks) */
  CRUN__SOP_QUEUE_LEN = 17, /* key -> i64 items */
  CRUN__SOP_LIST_KEYS = 18, /* () -> i64 count, the keys NUL-terminated one after another */
  CRUN__SOP_SET_NOREPLY = 19, /* key, value -> no reply ("Sets that do not wait" above) */
  CRUN__SOP_MAX = 19
} crun__sop;

static inline void crun__put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static inline uint32_t crun__get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void crun__put_i64(uint8_t *p, int64_t v) {
  crun__put_u32(p, (uint32_t)(uint64_t)v);
  crun__put_u32(p + 4, (uint32_t)((uint64_t)v >> 32));
}

static inline int64_t crun__get_i64(const uint8_t *p) {
  return (int64_t)((uint64_t)crun__get_u32(p) | (uint64_t)crun__get_u32(p + 4) << 32);
}

/* One parsed argument: a view into the frame. */
typedef struct {
  const uint8_t *p;
  uint32_t len;
} crun__sarg_t;

/* Splits the body of a frame (after the 8-byte header) into nargs arguments;
 * returns 0, or -1 when they do not exactly fill the body. */
static inline int crun__sproto_parse(const uint8_t *body, size_t blen, unsigned nargs,
                                     crun__sarg_t *args) {
  size_t p = 0;
  for (unsigned i = 0; i < nargs; i++) {
    if (blen - p < 4) return -1;
    uint32_t l = crun__get_u32(body + p);
    p += 4;
    if (blen - p < l) return -1;
    args[i].p = body + p;
    args[i].len = l;
    p += l;
  }
  return p == blen ? 0 : -1;
}

/* ---- the pure parsing steps (tcp_proto.c): bytes in, parsed frame or a
 * reason out; the server, the client and tests/fuzz all call these. */

/* Where the frame at the head of a buffer stands. */
enum { CRUN__SFRAME_BAD = -1, CRUN__SFRAME_SHORT = 0, CRUN__SFRAME_WHOLE = 1 };

/* Looks at the frame at buf (have bytes buffered): SHORT until its length
 * field is in, BAD when that length is outside [4, CRUN_STORE_MAX_FRAME],
 * SHORT until all 4 + length bytes are in, then WHOLE. Sets *flen once the
 * length field is in. */
int crun__sproto_frame(const uint8_t *buf, size_t have, uint32_t *flen);

/* What is wrong with a request header, as soon as its bytes are in. */
enum { CRUN__SREQ_OK = 0, CRUN__SREQ_BAD_LEN = 1, CRUN__SREQ_BAD_VERSION = 2, CRUN__SREQ_BAD_OP = 3 };

/* Checks the request header at f (have >= 4 bytes buffered): the length
 * first, version and op once all 8 header bytes are in. Returns
 * CRUN__SREQ_OK, or another CRUN__SREQ_* with the reason in why. */
int crun__sproto_check_request(const uint8_t *f, size_t have, char *why, size_t whylen);

/* One parsed request: args are views into the frame; args points at stack
 * for up to 16 arguments (do not copy the struct), else at the heap. */
typedef struct {
  int op;
  unsigned nargs;
  crun__sarg_t *args;
  crun__sarg_t stack[16];
} crun__sreq_t;

/* Parses the whole request frame f (4 + flen bytes, header checked by
 * crun__sproto_check_request): splits its arguments and checks them against
 * the op's arity. Returns 0, or -1 with the reason in why (r needs
 * crun__sproto_request_free either way). */
int crun__sproto_parse_request(const uint8_t *f, uint32_t flen, crun__sreq_t *r, char *why, size_t whylen);

/* Frees what crun__sproto_parse_request allocated for r. */
void crun__sproto_request_free(crun__sreq_t *r);

/* Parses the whole reply frame f (4 + flen bytes, length checked): its
 * code into *code and its arguments (views into f) into *args, which grows
 * to *cap entries as needed; *nargs gets their number. Returns 0, -1 when
 * the reply is malformed (version, arguments that do not fill it), or
 * CRUN_ENOMEM. */
int crun__sproto_parse_reply(const uint8_t *f, uint32_t flen, unsigned *code, crun__sarg_t **args,
                             unsigned *cap, unsigned *nargs);

/* Records the error that a reply with a non-zero code carries (its first
 * argument is the server's text; its status name is not repeated) and
 * returns the status (CRUN_EPROTO for a code that names none); `where`
 * names the store, e.g. "store 10.0.0.1:29500". */
int crun__sproto_reply_error(unsigned code, const crun__sarg_t *args, unsigned nargs, const char *where);

/* The abstract unix socket a server bound to ip:port also listens on, for
 * clients on the same host ("\0crun-store:<ip>:<port>"). Fills un and
 * returns the address length to pass to bind/connect. */
static inline socklen_t crun__store_local_addr(const char *ip, int port, struct sockaddr_un *un) {
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  int n = snprintf(un->sun_path + 1, sizeof un->sun_path - 1, "crun-store:%s:%d", ip, port);
  if (n < 0 || n >= (int)sizeof un->sun_path - 1) n = (int)sizeof un->sun_path - 2;
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Spinning: how long a client polls for its reply, and the server for the
 * next request after serving one, before blocking (CRUN_STORE_SPIN_US,
 * microseconds, sets both; 0: never). Both poll with sched_yield between
 * tries. A thread that blocks lets its vCPU halt, and on a VM that halts
 * at once (haltpoll.guest_halt_poll_ns=0) waking it costs a halt exit and
 * an IPI through the host: ~15 us per wake-up on a 2-core AMD EPYC VM, two
 * per round trip (runtime/store/README.md). The client polls by default
 * for CRUN_STORE_SPIN_US_CLIENT, while its recent round trips were shorter
 * than that: many clients on few cores wait ~10 us per client ahead of
 * them, and a reply that finds its client polling wakes nobody (a wake-up
 * on another vCPU costs the server's write ~8 us there). The server polls
 * by default for CRUN_STORE_SPIN_US_SERVER, only while fewer clients are
 * busy than the machine has CPUs: with every CPU busy, polling only
 * yields to the clients it serves. Then, after serving unix-socket
 * clients, it looks CRUN_STORE_TAIL_POLLS more times (sched_yield between)
 * before blocking, so a client that runs on its CPU meanwhile finds it
 * awake. */
#define CRUN_STORE_SPIN_US_CLIENT 200
#define CRUN_STORE_SPIN_US_SERVER 50
#define CRUN_STORE_TAIL_POLLS 3
/* Returns CRUN_STORE_SPIN_US in seconds (clamped to 0..1 s), or
 * default_us when it is not set. */
double crun__store_spin_seconds(long default_us);

#endif

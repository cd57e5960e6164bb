/* test_wire.c — the pure wire parsers the fuzz targets drive
 * (store/tcp_proto.c, transport/tcp_wire.c), one case per contract and per
 * bug the fuzzers found, so they are checked without clang too: frame
 * lengths, request arity, reply errors (an unknown code is EPROTO), the
 * mesh hello, the abort text's sink bound, an unknown op's name. */
#include "harness.h"

#include <stdint.h>

#include "store/tcp_proto.h"
#include "transport/tcp_priv.h"

/* Writes a frame with version 1, code, and nargs arguments into f; returns its size. */
static size_t put_frame(uint8_t *f, int code, unsigned nargs, const char *const *args) {
  size_t p = CRUN_STORE_FRAME_HDR;
  for (unsigned i = 0; i < nargs; i++) {
    crun__put_u32(f + p, (uint32_t)strlen(args[i]));
    memcpy(f + p + 4, args[i], strlen(args[i]));
    p += 4 + strlen(args[i]);
  }
  crun__put_u32(f, (uint32_t)(p - 4));
  f[4] = CRUN_STORE_PROTO_VERSION, f[5] = (uint8_t)code, f[6] = (uint8_t)nargs, f[7] = 0;
  return p;
}

TEST(frame_lengths) {
  uint8_t f[64];
  uint32_t flen = 0;
  const char *kv[2] = {"key-3", "-41.5"};
  size_t n = put_frame(f, CRUN__SOP_SET, 2, kv);
  EXPECT_EQ_INT(crun__sproto_frame(f, 3, &flen), CRUN__SFRAME_SHORT);
  EXPECT_EQ_INT(crun__sproto_frame(f, n - 1, &flen), CRUN__SFRAME_SHORT);
  EXPECT_EQ_INT(crun__sproto_frame(f, n, &flen), CRUN__SFRAME_WHOLE);
  EXPECT_EQ_INT(flen, n - 4);
  crun__put_u32(f, 3); /* below the 4 bytes of version, code, nargs */
  EXPECT_EQ_INT(crun__sproto_frame(f, n, &flen), CRUN__SFRAME_BAD);
  crun__put_u32(f, CRUN_STORE_MAX_FRAME + 1);
  EXPECT_EQ_INT(crun__sproto_frame(f, n, &flen), CRUN__SFRAME_BAD);
}

TEST(request_header_and_arity) {
  uint8_t f[64];
  char why[160];
  const char *one[1] = {"k"}, *kv[2] = {"k", "v"};
  size_t n = put_frame(f, CRUN__SOP_SET, 2, kv);
  EXPECT_EQ_INT(crun__sproto_check_request(f, n, why, sizeof why), CRUN__SREQ_OK);
  crun__sreq_t r;
  EXPECT_EQ_INT(crun__sproto_parse_request(f, (uint32_t)(n - 4), &r, why, sizeof why), 0);
  EXPECT_EQ_INT(r.nargs, 2);
  EXPECT(r.args[1].len == 1 && r.args[1].p[0] == 'v');
  crun__sproto_request_free(&r);
  n = put_frame(f, CRUN__SOP_SET, 1, one);
  EXPECT_EQ_INT(crun__sproto_parse_request(f, (uint32_t)(n - 4), &r, why, sizeof why), -1);
  EXPECT(strstr(why, "needs 2 arguments") != NULL);
  crun__sproto_request_free(&r);
  f[5] = CRUN__SOP_MAX + 1;
  EXPECT_EQ_INT(crun__sproto_check_request(f, n, why, sizeof why), CRUN__SREQ_BAD_OP);
  f[4] = CRUN_STORE_PROTO_VERSION + 1;
  EXPECT_EQ_INT(crun__sproto_check_request(f, n, why, sizeof why), CRUN__SREQ_BAD_VERSION);
}

TEST(reply_errors) {
  uint8_t f[128];
  const char *msg[1] = {"ETIMEDOUT: wait 'k' timed out"};
  size_t n = put_frame(f, -CRUN_ETIMEDOUT, 1, msg);
  crun__sarg_t *args = NULL;
  unsigned cap = 0, nargs = 0, code = 0;
  EXPECT_EQ_INT(crun__sproto_parse_reply(f, (uint32_t)(n - 4), &code, &args, &cap, &nargs), 0);
  EXPECT_STATUS(crun__sproto_reply_error(code, args, nargs, "store h:1"), CRUN_ETIMEDOUT);
  EXPECT(strcmp(crun_last_error(), "ETIMEDOUT: wait 'k' timed out (store h:1)") == 0);
  /* tests/fuzz/corpus/store_reply/regress-unknown-code: code 50 names no status */
  EXPECT_STATUS(crun__sproto_reply_error(50, args, nargs, "store h:1"), CRUN_EPROTO);
  EXPECT_TEXT("reply code 50 names no status");
  f[7] = 2; /* two arguments claimed, one present */
  EXPECT_EQ_INT(crun__sproto_parse_reply(f, (uint32_t)(n - 4), &code, &args, &cap, &nargs), -1);
  free(args);
}

TEST(mesh_hello) {
  int fds[4] = {-1, -1, 7, -1}; /* rank 1 of 4; rank 2 already connected */
  crun__hello_t h = {CRUN__TCP_HELLO, 0xabcd, 3, 4};
  EXPECT_OK(crun__tcp_hello_check(&h, 0xabcd, 1, 4, fds));
  h.rank = 2;
  EXPECT_STATUS(crun__tcp_hello_check(&h, 0xabcd, 1, 4, fds), CRUN_EPROTO);
  h.rank = 0;
  EXPECT_STATUS(crun__tcp_hello_check(&h, 0xabcd, 1, 4, fds), CRUN_EPROTO);
  h.rank = 3, h.group = 0xabce;
  EXPECT_STATUS(crun__tcp_hello_check(&h, 0xabcd, 1, 4, fds), CRUN_EPROTO);
  EXPECT_TEXT("unexpected hello (rank 3 of 4, group 0000abce)");
}

/* tests/fuzz/corpus/mesh_frame/regress-abort-text-over-sink: the rest of a
 * long abort text goes to the sink at most sinkcap bytes at a time. */
TEST(abort_text_bounds) {
  char text[CRUN__ABORT_TEXT_MAX + 1], sink[4096];
  size_t want = 0;
  uint64_t nbytes = 10007;
  EXPECT(crun__tcp_abort_dst(text, sink, sizeof sink, nbytes, 0, &want) == text);
  EXPECT_EQ_INT(want, CRUN__ABORT_TEXT_MAX);
  EXPECT(crun__tcp_abort_dst(text, sink, sizeof sink, nbytes, 4096, &want) == sink);
  EXPECT_EQ_INT(want, sizeof sink);
  EXPECT(crun__tcp_abort_dst(text, sink, sizeof sink, nbytes, 8192, &want) == sink);
  EXPECT_EQ_INT(want, 10007 - 8192);
  crun__tcp_abort_dst(text, sink, sizeof sink, nbytes, nbytes, &want);
  EXPECT_EQ_INT(want, 0);
  crun__hdr_t h = {.magic = CRUN__TCP_MAGIC, .kind = CRUN__KIND_ABORT, .status = 3};
  int st = 0;
  EXPECT(strcmp(crun__tcp_abort_body(&h, "ETIMEDOUT: late", &st), "late") == 0);
  EXPECT_EQ_INT(st, CRUN_ETIMEDOUT);
  h.status = 77;
  EXPECT(strcmp(crun__tcp_abort_body(&h, "EIO: x", &st), "x") == 0);
  EXPECT_EQ_INT(st, CRUN_EIO);
  h.status = 0x80000000u; /* regress-abort-status-int-min: no -INT_MIN */
  crun__tcp_abort_body(&h, "x", &st);
  EXPECT_EQ_INT(st, CRUN_EIO);
}

/* An abort frame longer than CRUN__ABORT_FRAME_MAX is garbled: a reader
 * drained any length before, so a peer streaming bytes behind an abort
 * header of 2^40 bytes kept it reading past every deadline. */
TEST(abort_frame_length_bound) {
  crun__hdr_t h = {.magic = CRUN__TCP_MAGIC, .group = 0xabcd, .kind = CRUN__KIND_ABORT, .nbytes = 10007};
  char text[160];
  EXPECT_EQ_INT(crun__tcp_hdr_garbled(&h, 0xabcd, NULL, 0, 1, text, sizeof text), 0);
  h.nbytes = CRUN__ABORT_FRAME_MAX;
  EXPECT_EQ_INT(crun__tcp_hdr_garbled(&h, 0xabcd, NULL, 0, 1, text, sizeof text), 0);
  h.nbytes = 1ull << 40;
  EXPECT_EQ_INT(crun__tcp_hdr_garbled(&h, 0xabcd, NULL, 0, 1, text, sizeof text), 1);
  EXPECT(strstr(text, "rank 0: garbled frame from rank 1 (an abort frame of 1099511627776 bytes") != NULL);
  h.kind = CRUN__COLL_SEND; /* a data frame's length is checked against its receive */
  EXPECT_EQ_INT(crun__tcp_hdr_garbled(&h, 0xabcd, NULL, 0, 1, text, sizeof text), 0);
}

/* On a sub-group (new_group{1, 2}: group ranks 0-1 are global ranks 1-2) a
 * garbled frame's text and an operation's description name a rank by its
 * global rank, then its group rank, as the group's other texts do; they
 * named the group rank alone ("rank 0: garbled frame from rank 1"). */
TEST(subgroup_texts_name_global_ranks) {
  int global[2] = {1, 2};
  crun_pg_t pg = {.size = 2, .global = global};
  crun__hdr_t h = {.magic = CRUN__TCP_MAGIC, .group = 0xdead};
  char text[160];
  EXPECT_EQ_INT(crun__tcp_hdr_garbled(&h, 0xabcd, &pg, 0, 1, text, sizeof text), 1);
  EXPECT(strncmp(text, "rank 1 (group rank 0): garbled frame from rank 2 (group rank 1) (magic ", 71) == 0);
  crun__coll_t c = {.kind = CRUN__COLL_SEND, .root = 1, .tag = 3};
  crun__pg_coll_desc(&pg, &c, text, sizeof text);
  EXPECT(strcmp(text, "send to rank 2 (group rank 1) (tag 3)") == 0);
  c.kind = CRUN__COLL_RECV, c.root = 0;
  crun__pg_coll_desc(&pg, &c, text, sizeof text);
  EXPECT(strcmp(text, "recv from rank 1 (group rank 0) (tag 3)") == 0);
  crun__coll_desc(&c, text, sizeof text); /* without the group: its rank */
  EXPECT(strcmp(text, "recv from rank 0 (tag 3)") == 0);
}

/* tests/fuzz/corpus/checkpoint/regress-empty-tensor-huge-dims: an empty
 * tensor's other sizes are bounded too (their strides overflowed int64). */
TEST(empty_tensor_huge_dims) {
  int64_t shape[3] = {0, INT64_C(1) << 45, INT64_C(1) << 45};
  crun_tensor_t *t = NULL;
  EXPECT_STATUS(crun_tensor_from_data(CRUN_FLOAT32, 3, shape, "", 0, &t), CRUN_EINVAL);
  EXPECT_TEXT("shape too large");
  shape[1] = 3, shape[2] = 5;
  EXPECT_OK(crun_tensor_from_data(CRUN_FLOAT32, 3, shape, "", 0, &t));
  crun_tensor_release(t);
}

/* tests/fuzz/corpus/mesh_frame/regress-unknown-op-name */
TEST(call_shape_unknown_op) {
  char b[96];
  crun__tcp_call_shape(b, sizeof b, CRUN_FLOAT64, 5, 9, 2, 1, 1);
  EXPECT(strcmp(b, "float64[5] op 9 root 2") == 0);
  crun__tcp_call_shape(b, sizeof b, CRUN_FLOAT32, 7, CRUN_OP_SUM, 0, 1, 0);
  EXPECT(strcmp(b, "float32[7] sum") == 0);
}

#define CRUN_TESTS(X) X(frame_lengths) X(request_header_and_arity) X(reply_errors) X(mesh_hello) \
  X(abort_text_bounds) X(abort_frame_length_bound) X(call_shape_unknown_op) X(empty_tensor_huge_dims) \
  X(subgroup_texts_name_global_ranks)
CRUN_TEST_MAIN()

-- make_corpus.lua — writes the seed corpora of tests/fuzz/corpus/<target>/
-- (a few valid messages of each kind, and a few near misses). Run from the
-- repository root with the build tree's crun on the path:
--   . build/env.sh && lua5.4 tests/fuzz/make_corpus.lua
local out = arg[1] or "tests/fuzz/corpus"

local function write(target, name, bytes)
  os.execute("mkdir -p " .. out .. "/" .. target)
  local f = assert(io.open(out .. "/" .. target .. "/" .. name, "wb"))
  f:write(bytes)
  f:close()
end

-- ---------------------------------------------------------------- store frames
local function frame(code, args)
  local body = {}
  for i, a in ipairs(args) do body[i] = string.pack("<s4", a) end
  body = table.concat(body)
  return string.pack("<I4BBI2", 4 + #body, 2, code, #args) .. body -- CRUN_STORE_PROTO_VERSION 2
end
local i64 = function(v) return string.pack("<i8", v) end
local ms = i64(250) -- the timeout_ms that GET, WAIT, MULTI_GET and JOIN_WAIT end with

-- requests (op codes of tcp_proto.h), several per input as a client pipelines them
write("store_request", "set_get", frame(1, {"alpha", "-17.25e3"}) .. frame(2, {"alpha", ms}))
write("store_request", "add_twice", frame(3, {"ctr", i64(-7)}) .. frame(3, {"ctr", i64(123456789013)}))
write("store_request", "cas", frame(1, {"k", "v1"}) .. frame(4, {"k", "v1", "w2"}) .. frame(4, {"k", "zz", "v3"}))
write("store_request", "wait_check", frame(5, {"a", "b", ms}) .. frame(6, {"a", "b", "c"}))
write("store_request", "delete_numkeys", frame(1, {"x", ""}) .. frame(7, {"x"}) .. frame(8, {}))
write("store_request", "append", frame(9, {"log", "one;"}) .. frame(9, {"log", "two;"}) .. frame(10, {"log", "nope", ms}))
write("store_request", "multi_set", frame(11, {"p", "3", "q", "-4", "r", "5.5"}) .. frame(10, {"p", "q", "r", ms}))
write("store_request", "ping_join", frame(12, {}) .. frame(13, {}) .. frame(14, {i64(3), ms}) .. frame(5, {"k", i64(-1)}))
write("store_request", "bad_version", string.pack("<I4BBI2", 4, 1, 1, 0)) -- version 1
write("store_request", "bad_args", string.pack("<I4BBI2", 12, 2, 1, 2) .. string.pack("<I4", 99) .. "abcd")

-- replies: ok with values, integers, errors
write("store_reply", "ok_empty", frame(0, {}))
write("store_reply", "ok_value", frame(0, {"value-91"}) .. frame(0, {i64(-3)}))
write("store_reply", "multi", frame(0, {"a", "", "ccc", "dddd"}))
write("store_reply", "err_timeout", frame(3, {"ETIMEDOUT: wait 'k' timed out"}))
write("store_reply", "err_proto", frame(9, {"EPROTO: store protocol version 1 not supported (server speaks 2)"}))
write("store_reply", "err_noarg", frame(13, {}))

-- ---------------------------------------------------------------- auth + hello
-- flags: 1 own secret, 2 greeting tag forced, 4 "crunauth" (else "crunopen"), 8 real exchange
local function hello(magic, group, rank, size) return string.pack("<I4I4i4i4", magic, group, rank, size) end
local HELO, GROUP = 0x4f4c4548, 0x1234abcd
local function auth(flags, token, greet, answer, proof, h, size, rank, conn, force)
  return string.char(flags) .. (token .. string.rep("\0", 16)):sub(1, 16)
    .. (greet .. string.rep("\0", 40)):sub(1, 40) .. (answer .. string.rep("\1", 64)):sub(1, 64)
    .. (proof .. string.rep("\2", 32)):sub(1, 32) .. h .. string.char(size - 1, rank)
    .. string.pack("<I8", conn) .. string.char(force)
end
write("auth_hello", "open", auth(0, "", "crunopen", "", "", hello(HELO, GROUP, 2, 4), 4, 1, 0, 0))
write("auth_hello", "secret", auth(9, "s3cr3t-token-42", "crunauth" .. string.rep("\7", 32), "", "",
  hello(HELO, GROUP, 3, 4), 4, 0, 2, 0))
write("auth_hello", "mismatch", auth(1, "t", "crunopen", "", "", hello(HELO, GROUP, 1, 4), 4, 1, 0, 0))
write("auth_hello", "proof_match", auth(8, "", "junkjunk", "", string.rep("\x5a", 32),
  hello(HELO, GROUP + 1, 5, 8), 8, 2, 3, 1))

-- ---------------------------------------------------------------- mesh frames
local MAGIC = 0x314e5243
local function hdr(kind, dtype, op, algo, root, tag, status, seq, count, nbytes, magic, group)
  return string.pack("<I4I4BBBBi4i4I4I4I8I8I8", magic or MAGIC, group or GROUP, kind, dtype, op, algo,
    root, tag, status, 0, seq, count, nbytes)
end
write("mesh_frame", "allreduce", hdr(1, 0, 0, 3, 0, 0, 0, 42, 512, 2048))
write("mesh_frame", "send", hdr(12, 1, 9, 1, 2, 7, 0, 3, 5, 40) .. hdr(2, 3, 1, 2, 1, 0, 0, 4, 16, 64))
write("mesh_frame", "abort", hdr(255, 0, 0, 0, 0, 0, 3, 0, 0, 27) .. "ETIMEDOUT: all_reduce #42 on rank 3")
write("mesh_frame", "abort_long", hdr(255, 0, 0, 0, 0, 0, 16, 0, 0, 5000) .. string.rep("EPEERDIED: x ", 20))
write("mesh_frame", "garbled", hdr(1, 0, 0, 0, 0, 0, 0, 1, 1, 4, 0x11111111, 0x22222222))

-- ---------------------------------------------------------------- checkpoints
local ok, ser = pcall(require, "crun.serialize")
if ok then
  local T = require("crun.tensor")
  write("checkpoint", "scalars", ser.dumps({1, -2.5, "three", true, false, {nested = {x = -7}}}))
  write("checkpoint", "tensor_f32", ser.dumps({w = T.new({{1.5, -2}, {3.25, -4.125}})}))
  write("checkpoint", "tensor_kinds", ser.dumps({a = T.new({-1, 2, -3}, "int64"), b = T.new({7, 9}, "uint8"),
    c = T.zeros({0, 3}), d = T.new({{-1, 3}}, "int16")}))
  write("checkpoint", "state", ser.dumps({epoch = 3, step = 1201, lr = 0.003, model = {["fc1.weight"] =
    T.new({{0.1, -0.2, 0.31}}, "float64")}, name = "run-7"}))
  write("checkpoint", "nil", ser.dumps(nil))
else
  io.stderr:write("make_corpus: crun.serialize not found (source build/env.sh): checkpoint seeds skipped\n")
end

-- ---------------------------------------------------------------- repl framing
-- first byte: world = 1 + (b & 63), rank = (b >> 6) % world
write("repl_framing", "chunk", string.char(3) .. "*\nprint(1 + 2)")
write("repl_framing", "chunk_on", string.char(0x47) .. "0,2-3\nx = x or 0\nx = x + 1")
write("repl_framing", "ranks", string.char(7) .. "0-3,5,7")
write("repl_framing", "result", string.char(1) .. "err\nboom\nstack traceback:\n  [C]: in ?")
write("repl_framing", "incomplete", string.char(2) .. "for i = 1, 3 do")
write("repl_framing", "meta", string.char(63) .. ":on 1-2 print(rank)")
print("make_corpus: seeds written under " .. out)

--- dist_p2p.lua — a job for dist_p2p_spec, run on N ranks:
--   dist_p2p.lua <case> [rounds]
-- cases: ring (isend+recv and irecv+send exchanges, 8 B to 4 MiB),
-- order (many messages in flight to one peer, two tags), mixed (p2p between
-- all_reduce and uneven all_to_all, then a 128 KiB ring), a2a_ring (uneven
-- all_to_all then a 128 KiB isend+recv ring), tag (a recv whose tag no send
-- used times out naming the frame that waits with another tag; ends the
-- group, so it skips the closing barrier), flood (rank 1 sends 48 MiB that
-- no receive takes yet ahead of the one rank 0 waits for; rank 0 prints its
-- peak RSS growth), overrun (an all_reduce behind 8 MiB of sends no receive
-- took, over a 4 MiB CRUN_TCP_UNEXPECTED_MAX, fails naming them), paused
-- (a recv behind such sends times out saying the reading is paused),
-- held_coll (an all_reduce whose own frame waits behind a full 4 MiB buffer
-- of sends still completes, and so do the sends). Every rank prints
-- "rank <r> ok <case>" when all its checks passed; a failed check errors.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local case, rounds = arg[1] or "ring", tonumber(arg[2] or "1")

dist.init_process_group{backend = "cpu", timeout = 30}
local rank, size = dist.get_rank(), dist.get_world_size()
local right, left = (rank + 1) % size, (rank - 1 + size) % size

local function check(t, v, what)
  if not t:equal(T.full_like(t, v)) then
    error(string.format("rank %d: %s: expected every element %s, got %s at [1] and %s at [%d]",
                        rank, what, v, t[1], t[t:numel()], t:numel()), 0)
  end
end

-- one exchange with the neighbours; recv_first posts the receive first
local function exchange(n, k, recv_first)
  local out, got = T.full({n}, rank * 1000 + k, "int32"), T.zeros({n}, "int32")
  if recv_first then
    local w = dist.irecv(got, left)
    dist.send(out, right)
    w:wait()
  else
    local w = dist.isend(out, right)
    dist.recv(got, left)
    w:wait()
  end
  check(got, left * 1000 + k, string.format("%d-element %s exchange %d", n, recv_first and "irecv+send" or "isend+recv", k))
end

local cases = {}

function cases.ring()
  local k = 0
  for _ = 1, rounds do
    for _, bytes in ipairs{8, 512 * 1024, 4 * 1024 * 1024} do
      for _, first in ipairs{false, true} do
        k = k + 1
        exchange(bytes // 4, k, first)
      end
    end
  end
end

function cases.order()
  if rank > 1 then return end
  local works, bufs, K = {}, {}, 10
  local function n_of(i) return (i // 2) % 2 == 1 and 65536 or 4 end
  for i = 0, 2 * K - 1 do
    local opts = {tag = 1 + i % 2}
    if rank == 0 then
      works[i] = dist.isend(T.full({n_of(i)}, i, "int32"), 1, opts)
    end
  end
  if rank == 1 then
    for _, start in ipairs{1, 0} do           -- tag 2 first, then tag 1
      for i = start, 2 * K - 1, 2 do
        bufs[i] = T.zeros({n_of(i)}, "int32")
        works[i] = dist.irecv(bufs[i], 0, {tag = 1 + i % 2})
      end
    end
  end
  for i = 0, 2 * K - 1 do
    works[i]:wait()
    if rank == 1 then check(bufs[i], i, "message " .. i .. " of tag " .. (1 + i % 2)) end
  end
end

function cases.mixed()
  for k = 1, rounds do
    local w = dist.isend(T.full({262144}, rank * 1000 + k, "int32"), right)
    local s = T.full({1}, rank + k, "int64")
    dist.all_reduce(s, "sum")
    check(s, size * (size - 1) // 2 + size * k, "all_reduce between p2p")
    -- uneven all_to_all: rank r sends (r + j + 1) * 100 + k elements to rank j
    local ins, outs = {}, {}
    for j = 0, size - 1 do
      ins[j + 1] = T.full({(rank + j + 1) * 100 + k}, rank * 10 + j, "float32")
      outs[j + 1] = T.zeros({(j + rank + 1) * 100 + k}, "float32")
    end
    dist.all_to_all(outs, ins)
    for j = 0, size - 1 do check(outs[j + 1], j * 10 + rank, "all_to_all block from rank " .. j) end
    local got = T.zeros({262144}, "int32")
    dist.recv(got, left)
    w:wait()
    check(got, left * 1000 + k, "1 MiB message received after the collectives")
    exchange(32768, k, k % 2 == 0)                       -- the 128 KiB ring of the report
  end
end

-- the lost-frame report: uneven all_to_all (sizes change every round), then
-- a 128 KiB isend+recv ring, many times
function cases.a2a_ring()
  for k = 1, rounds do
    local ins, outs = {}, {}
    for j = 0, size - 1 do
      ins[j + 1] = T.full({((rank * 7 + j * 3 + k) % 11) * 997 + 1}, rank * 100 + j + k, "float32")
      outs[j + 1] = T.zeros({((j * 7 + rank * 3 + k) % 11) * 997 + 1}, "float32")
    end
    dist.all_to_all(outs, ins)
    for j = 0, size - 1 do check(outs[j + 1], j * 100 + rank + k, "all_to_all block from rank " .. j) end
    exchange(32768, k, false)
  end
end

function cases.tag()
  local store = dist.get_store()
  if rank == 0 then
    dist.send(T.ones({4}), 1, {tag = 1})
  elseif rank == 1 then
    local ok, err = pcall(dist.recv, T.zeros({4}), 0, {tag = 2, timeout = 1})
    local want = "^ETIMEDOUT: recv from rank 0 %(tag 2%) on rank 1: no data from rank 0 after 1.0 s %(rank 0 sent "
                 .. "float32%[4%] with tag 1, which no recv took: do the tags differ%?%)"
    if ok or not tostring(err):find(want) then error("rank 1: tag mismatch reported as " .. tostring(err), 0) end
    store:set("p2p_tag_done", "1")
  end
  store:wait({"p2p_tag_done"}, 30) -- the sender stays until the receiver has judged
  return true
end

-- the kB a /proc/self/status field holds
local function status_kb(field)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

function cases.flood()
  local N, n, store = 48, 262144, dist.get_store()   -- 48 messages of 1 MiB
  if rank == 1 then
    local works = {}
    for i = 1, N do works[i] = dist.isend(T.full({n}, i * 7 - 3, "int32"), 0, {tag = 1}) end
    works[N + 1] = dist.isend(T.full({3}, -5, "int32"), 0, {tag = 2})
    store:set("flood_posted", "1")
    for _, w in ipairs(works) do w:wait() end
  elseif rank == 0 then
    local buf, last = T.zeros({n}, "int32"), T.zeros({3}, "int32")
    local rss0 = status_kb("VmRSS")
    local w = dist.irecv(last, 1, {tag = 2})          -- behind all 48 MiB of tag 1
    store:wait({"flood_posted"}, 30)
    os.execute("sleep 0.5")                           -- the background reader runs meanwhile
    for i = 1, N do
      dist.recv(buf, 1, {tag = 1})
      check(buf, i * 7 - 3, "message " .. i .. " of tag 1")
    end
    w:wait()
    check(last, -5, "the tag 2 message")
    print(string.format("rank 0 peak rss growth %d kB", status_kb("VmHWM") - rss0))
  end
end

function cases.overrun()
  local n = 262144
  local works = {}
  if rank == 1 then
    for i = 1, 8 do works[i] = dist.isend(T.full({n}, i - 4, "int32"), 0, {tag = 3}) end
  end
  local ok, err = pcall(dist.all_reduce, T.ones({5}), "sum")
  if rank == 0 then
    local want = "^ENOMEM: all_reduce #1 on rank 0: rank 1 sent a frame %(tag 3, 1048576 bytes%) no recv took"
    if ok or not tostring(err):find(want) or not tostring(err):find("limit of 4194304 %(CRUN_TCP_UNEXPECTED_MAX%)") then
      error("rank 0: overrun reported as " .. tostring(err), 0)
    end
  elseif not ok and not tostring(err):find("^E%u+: ") then  -- rank 1 may have finished its part first
    error("rank " .. rank .. ": all_reduce failed without a status: " .. tostring(err), 0)
  end
  for _, w in ipairs(works) do
    local wok, werr = pcall(w.wait, w)                 -- rank 0 failed the group: sends fail or were taken
    if not wok and not tostring(werr):find("^E%u+: ") then error("rank 1: isend failed with " .. tostring(werr), 0) end
  end
  return true
end

function cases.paused()
  local store = dist.get_store()
  if rank == 1 then
    local works = {}
    for i = 1, 8 do works[i] = dist.isend(T.full({262144}, 5 - i, "int32"), 0, {tag = 1}) end
    works[9] = dist.isend(T.full({2}, 9, "int32"), 0, {tag = 2})
    store:set("paused_posted", "1")
  elseif rank == 0 then
    store:wait({"paused_posted"}, 30)
    local ok, err = pcall(dist.recv, T.zeros({2}, "int32"), 1, {tag = 2, timeout = 1})
    local want = "^ETIMEDOUT: recv from rank 1 %(tag 2%) on rank 0: no data from rank 1 after 1.0 s %(reading from "
                 .. "rank 1 is paused: its next frame, tag 1 of 1048576 bytes, does not fit beside the 3 frames no "
                 .. "recv took yet %(3145920 bytes; limit CRUN_TCP_UNEXPECTED_MAX=4194304%)"
    if ok or not tostring(err):find(want) then error("rank 0: paused reader reported as " .. tostring(err), 0) end
    store:set("paused_done", "1")
  end
  store:wait({"paused_done"}, 30) -- the sender stays until the receiver has judged
  return true
end

function cases.held_coll()
  local n, store = 262144, dist.get_store()
  local want = 3.5 - 1.25
  if rank == 1 then
    local works = {}
    for i = 1, 3 do works[i] = dist.isend(T.full({n}, i - 2, "int32"), 0, {tag = 1}) end
    works[4] = dist.isend(T.full({230000}, 11, "int32"), 0, {tag = 1}) -- 4065984 of 4194304 bytes used
    store:set("held_posted", "1")
    local big = T.full({300000}, 3.5, "float32")
    dist.all_reduce(big, "sum")
    check(big, want, "all_reduce behind the held sends")
    dist.send(T.full({2}, -7, "int32"), 0, {tag = 2})
    for _, w in ipairs(works) do w:wait() end
  elseif rank == 0 then
    local last = T.zeros({2}, "int32")
    local w = dist.irecv(last, 1, {tag = 2})        -- the background reader fills the buffer
    store:wait({"held_posted"}, 30)
    os.execute("sleep 0.5")
    local big = T.full({300000}, -1.25, "float32")
    dist.all_reduce(big, "sum")
    check(big, want, "all_reduce behind the held sends")
    local buf, b4 = T.zeros({n}, "int32"), T.zeros({230000}, "int32")
    for i = 1, 3 do
      dist.recv(buf, 1, {tag = 1})
      check(buf, i - 2, "message " .. i .. " of tag 1")
    end
    dist.recv(b4, 1, {tag = 1})
    check(b4, 11, "message 4 of tag 1")
    w:wait()
    check(last, -7, "the tag 2 message")
  end
end

assert(cases[case], "unknown case " .. case)
if not cases[case]() then dist.barrier() end
print(string.format("rank %d ok %s", rank, case))
dist.destroy_process_group()

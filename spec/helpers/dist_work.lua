--- dist_work.lua — a job for dist_work_spec, run on N ranks (N >= 2):
--   dist_work.lua <case>
-- cases: barrier (async barriers on the default group and a sub-group),
-- result (Work:result/exception/get_future), pinned (tensors an async op
-- uses stay alive and cannot be closed while it runs), ranks (rank, root
-- and tag arguments beyond int are EINVAL, never narrowed), failed (a
-- failing async op reports its error through exception()), waits (wait with
-- math.huge waits, with NaN is EINVAL). Every rank prints
-- "rank <r> ok <case>" when all its checks passed; a failed check errors.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local case = arg[1]
dist.init_process_group{backend = "cpu", timeout = 30}
local rank, size = dist.get_rank(), dist.get_world_size()

local function check(cond, fmt, ...)
  if not cond then error(string.format("rank %d: " .. fmt, rank, ...), 0) end
end

local function sleep(s) os.execute("sleep " .. s) end

-- expected sum over ranks of v(r, i) for a signed, non-periodic v
local function v(r, i) return ((r + 3) * 7919 * i) % 2003 - 1001 end

local cases = {}

function cases.barrier()
  for _ = 1, 3 do
    local w = dist.barrier({async_op = true})
    check(w ~= nil, "async barrier returned no work")
    check(w:wait() == true, "async barrier wait")
  end
  local g = dist.new_group({0, 1})
  if rank <= 1 then
    local w = dist.barrier({group = g, async_op = true})
    check(w:wait() == true, "async barrier on a sub-group")
    check(#w:result() == 0, "a barrier's result() is an empty list")
  end
  dist.barrier()
end

function cases.result()
  local n = 70001
  local t = T.zeros({n}, "int64")
  for i = 1, n do t[i] = v(rank, i) end
  local w = dist.all_reduce(t, "sum", {async_op = true})
  local fut = w:get_future()
  local chained = fut:then_(function(f) return f:value()[1][n] end)
  local res = fut:wait()
  check(#res == 1 and res[1] == t, "result list is {t}")
  check(w:exception() == nil, "no exception after success")
  check(fut:done(), "future done after wait")
  local want = 0
  for r = 0, size - 1 do want = want + v(r, n) end
  check(chained:wait() == want, "then_ callback value %s, expected %d", tostring(chained:wait()), want)
  for _, i in ipairs{1, 4096, 4097, 65536} do
    local s = 0
    for r = 0, size - 1 do s = s + v(r, i) end
    check(t[i] == s, "element %d: %d, expected %d", i, t[i], s)
  end
  -- an all_gather's result() is its output list
  local outs = {}
  for r = 1, size do outs[r] = T.zeros({5}, "int32") end
  local x = T.full({5}, rank * 10 - 7, "int32")
  local wg = dist.all_gather(outs, x, {async_op = true})
  wg:wait()
  local rl = wg:result()
  check(#rl == size, "all_gather result has %d tensors", #rl)
  for r = 1, size do check(rl[r] == outs[r] and rl[r][3] == (r - 1) * 10 - 7, "all_gather result %d", r) end
  -- the one-tensor forms' result() and future value are {output}, as torch's
  -- (not the per-rank blocks they are done on)
  local big = T.zeros({size * 3}, "int64")
  local wb = dist.all_gather_into_tensor(big, T.full({3}, rank * 7 - 11, "int64"), {async_op = true})
  local fb = wb:get_future():then_(function(f) return f:value()[1]:numel() end)
  wb:wait()
  check(#wb:result() == 1 and rawequal(wb:result()[1], big), "all_gather_into_tensor result is {out}, got %d tensors",
        #wb:result())
  check(fb:wait() == size * 3, "all_gather_into_tensor future value[1] has %s elements", tostring(fb:wait()))
  local a2o, a2i = T.zeros({size * 2}, "int64"), T.zeros({size * 2}, "int64")
  for i = 1, size * 2 do a2i[i] = rank * 101 - i end
  local wa = dist.all_to_all_single(a2o, a2i, {async_op = true})
  local va = wa:get_future():wait()
  check(#va == 1 and rawequal(va[1], a2o), "all_to_all_single future value is {output}, got %d tensors", #va)
  for j = 0, size - 1 do
    for k = 1, 2 do
      check(a2o[2 * j + k] == j * 101 - (2 * rank + k), "all_to_all_single element %d: %d", 2 * j + k, a2o[2 * j + k])
    end
  end
end

function cases.pinned()
  local n = 1 << 17
  local t = T.full({n}, rank + 1, "float32")
  if rank == 1 then sleep(1) end  -- rank 0's op is really in flight
  local w = dist.all_reduce(t, "sum", {async_op = true})
  if rank == 0 then
    local ok, err = pcall(t.close, t)
    check(not ok and tostring(err):match("^ESTATE: tensor close: the tensor is in use by 1 pending async operation"),
          "close in flight should raise ESTATE, got %s", tostring(err))
  end
  w:wait()
  check(t[n] == size * (size + 1) / 2, "all_reduce after a refused close: %s", tostring(t[n]))
  t:close()  -- allowed once the work completed
  -- drop every output tensor of an async all_gather and collect garbage:
  -- the work keeps them alive, new tensors never receive the results
  local outs = {}
  for r = 1, size do outs[r] = T.zeros({n}, "int32") end
  local x = T.full({n}, 1000 + rank, "int32")
  if rank == 1 then sleep(1) end
  local wg = dist.all_gather(outs, x, {async_op = true})
  for r = 1, size do outs[r] = nil end
  collectgarbage(); collectgarbage()
  local fresh = {}
  for r = 1, size * 2 do fresh[r] = T.full({n}, -5, "int32") end
  wg:wait()
  for r = 1, #fresh do check(fresh[r]:equal(T.full({n}, -5, "int32")), "fresh tensor %d received data", r) end
  local rl = wg:result()
  for r = 1, size do check(rl[r][n] == 1000 + r - 1, "kept output %d holds %s", r, tostring(rl[r][n])) end
end

function cases.ranks()
  local t = T.zeros({4})
  -- a rooted call's bad src/dst, and an unknown option, is refused for its
  -- group (every rank fails it, and the group stops): each runs on a group
  -- of its own (a global rank that is none of the group's; dist_errors_spec
  -- has the range texts)
  local all = {}
  for r = 0, size - 1 do all[#all + 1] = r end
  local function own(f) return function() f({group = dist.new_group(all)}) end end
  local on = "^EINVAL: %s on rank " .. rank .. ": "
  local bad = {
    {own(function(o) dist.broadcast(t, 1 << 32, o) end),
     on:format("broadcast") .. "src 4294967296 is not in the group"},
    {own(function(o) dist.reduce(t, -1, "sum", o) end), on:format("reduce") .. "dst %-1 is not in the group"},
    {function() dist.send(t, (1 << 32) + 1) end, "^EINVAL: send: dst 4294967297 is out of range"},
    {own(function(o) dist.gather(t, nil, 1 << 33, o) end), on:format("gather") .. "dst 8589934592 is not in the group"},
    {function() dist.send(t, 1, {tag = 1 << 40}) end, "^EINVAL: send on rank %d+: tag 1099511627776 is out of range"},
    {own(function(o) dist.all_reduce(t, "sum", {group = o.group, tga = 1}) end), "^EINVAL: all_reduce: unknown option 'tga'"},
    {function() dist.new_group({0, 1 << 32}) end, "^EINVAL: new_group: rank 4294967296 is out of range"},
  }
  for i, b in ipairs(bad) do
    local ok, err = pcall(b[1])
    check(not ok and tostring(err):match(b[2]), "case %d: expected %s, got %s", i, b[2], tostring(err))
  end
  dist.barrier()
end

function cases.failed()
  local t = T.ones({8})
  if rank == 0 then
    local w = dist.all_reduce(t, "sum", {async_op = true, timeout = 0.5})
    local ok, err = pcall(w.wait, w)
    check(not ok, "the lone all_reduce should fail")
    local e = w:exception()
    check(type(e) == "string" and e:match("^E%u+: ") and e == err, "exception() %s vs wait's %s", tostring(e), tostring(err))
  else
    sleep(1.5)
  end
end

function cases.waits()
  -- math.huge (or any timeout past 1e9 s) waits without a limit; NaN is EINVAL
  for _, limit in ipairs{math.huge, 1e300} do
    local t = T.ones({4})
    if rank == 1 then sleep(0.5) end
    local w = dist.all_reduce(t, "sum", {async_op = true})
    local ok, err = pcall(w.wait, w, limit)
    check(ok and t[1] == size, "wait(%s): %s, t[1] = %s", tostring(limit), tostring(err), tostring(t[1]))
    local ok2, err2 = pcall(w.wait, w, 0 / 0)
    check(not ok2 and tostring(err2):match("^EINVAL: wait: the timeout is NaN"), "wait(nan): %s", tostring(err2))
  end
end

cases[case]()
print(string.format("rank %d ok %s", rank, case))

-- dist_cases.lua — the collective matrix, run as one crun-lua job per world
-- size: every collective x op x dtype x counts {0, 1, 7, 100003}, in-place and
-- out-of-place forms, async ordering, sub-groups, object collectives and
-- send/recv matching. Each rank checks its own results against a reference
-- computed here and writes one line per case to <outdir>/rank<r>.txt:
-- "ok <case>" or "FAIL <case>: <why>", then "done <ncases>".
-- Usage: dist_cases.lua OUTDIR [subset]
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local outdir = assert(arg[1], "usage: dist_cases.lua OUTDIR")
dist.init_process_group{timeout = 60}
local rank, size = dist.get_rank(), dist.get_world_size()
local out = assert(io.open(outdir .. "/rank" .. rank .. ".txt", "w"))
local ncases = 0

local function case(name, fn)
  ncases = ncases + 1
  local ok, err = pcall(fn)
  out:write(ok and ("ok " .. name) or ("FAIL " .. name .. ": " .. tostring(err)), "\n")
end

local DTYPES = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"}
local INT = {int32 = true, int64 = true, uint8 = true}
local OPS = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor"}
local COUNTS = {0, 1, 7, 100003}
local PERIOD = 24   -- inputs repeat every 24 elements, so references are small

-- Input element i (0-based) of rank r; small integers, exact in every dtype.
local function value(r, i, op, salt)
  if op == "product" then return (r + i + salt) % 3 + 1 end
  return (r * 3 + i * 5 + salt) % 8
end

-- Input tables are cached (the same values serve every dtype); tensors are
-- made from them in C.
local input_cache = {}
local function input(r, n, dtype, op, salt)
  local key = table.concat({r, n, op == "product" and "p" or "s", salt}, ":")
  local v = input_cache[key]
  if not v then
    v = {}
    for i = 1, n do v[i] = value(r, i - 1, op, salt) end
    input_cache[key] = v
  end
  return T.new(n > 0 and v or {}, dtype):view(n)
end

local function combine(op, a, b)
  if op == "sum" or op == "avg" then return a + b
  elseif op == "product" then return a * b
  elseif op == "min" then return math.min(a, b)
  elseif op == "max" then return math.max(a, b)
  elseif op == "band" then return a & b
  elseif op == "bor" then return a | b
  else return a ~ b end
end

-- Reference of the reduction over all ranks for one period of elements.
local function reference(op, dtype, salt)
  local ref = {}
  for i = 0, PERIOD - 1 do
    local acc = value(0, i, op, salt)
    for r = 1, size - 1 do acc = combine(op, acc, value(r, i, op, salt)) end
    if op == "avg" then acc = INT[dtype] and acc // size or acc / size end
    ref[i + 1] = acc
  end
  return ref
end

local function close(a, b, dtype)
  if INT[dtype] then return a == b end
  local tol = (dtype == "float16" or dtype == "bfloat16") and 1e-2 or 1e-6
  return math.abs(a - b) <= tol * math.max(1, math.abs(b))
end

-- Raises unless t[i] equals ref(i) (0-based element index) everywhere. The
-- comparison runs in C (equal / allclose against a cached expected tensor);
-- the element loop only runs to describe a failure.
local expected_cache = {}
local function expect(t, n, ref, dtype, what, key)
  if t:numel() ~= n then error(what .. ": numel " .. t:numel() .. " ~= " .. n) end
  local want = key and expected_cache[key .. dtype]
  if not want then
    local v = {}
    for i = 1, n do v[i] = ref(i - 1) end
    want = T.new(n > 0 and v or {}, INT[dtype] and dtype or "float64"):view(n)
    if key then expected_cache[key .. dtype] = want end
  end
  local got = INT[dtype] and t or t:to("float64")
  local tol = (dtype == "float16" or dtype == "bfloat16") and 1e-2 or 1e-6
  if n == 0 or (INT[dtype] and got:equal(want)) or (not INT[dtype] and got:allclose(want, tol, tol)) then return end
  local tt = t:totable()
  for i = 1, n do
    if not close(tt[i], ref(i - 1), dtype) then
      error(string.format("%s: element %d is %s, expected %s", what, i, tostring(tt[i]), tostring(ref(i - 1))))
    end
  end
  error(what .. ": tensors differ")
end

local function periodic(ref) return function(i) return ref[i % PERIOD + 1] end end
local function from_rank(r, op, salt) return function(i) return value(r, i, op, salt) end end
local function in_key(r, op, salt, n) return table.concat({"in", r, op, salt, n}, ":") end

local function reductions(dtype, op, n)
  local tag = string.format("%s/%s/%d", dtype, op, n)
  local ref = periodic(reference(op, dtype, 0))
  case("all_reduce/" .. tag, function()
    local t = input(rank, n, dtype, op, 0)
    dist.all_reduce(t, op)
    expect(t, n, ref, dtype, "all_reduce", "red:" .. op .. ":" .. n)
  end)
  case("reduce/" .. tag, function()
    local t, dst = input(rank, n, dtype, op, 0), size - 1
    dist.reduce(t, dst, dist.ReduceOp[op:upper()])
    expect(t, n, rank == dst and ref or from_rank(rank, op, 0), dtype, "reduce",
           rank == dst and ("red:" .. op .. ":" .. n) or ("in:" .. rank .. ":" .. op .. ":0:" .. n))
  end)
  case("reduce_scatter/" .. tag, function()
    local ins = {}
    for b = 0, size - 1 do ins[b + 1] = input(rank, n, dtype, op, b) end
    local o = T.zeros({n}, dtype)
    dist.reduce_scatter(o, ins, op)
    expect(o, n, periodic(reference(op, dtype, rank)), dtype, "reduce_scatter", "rs:" .. op .. ":" .. n)
  end)
  case("reduce_scatter_tensor/" .. tag, function()
    local big = T.zeros({size * n}, dtype)
    for b = 0, size - 1 do big:narrow(1, b * n + 1, n):copy(input(rank, n, dtype, op, b)) end
    local o = T.zeros({n}, dtype)
    dist.reduce_scatter_tensor(o, big, op)
    expect(o, n, periodic(reference(op, dtype, rank)), dtype, "reduce_scatter_tensor", "rs:" .. op .. ":" .. n)
  end)
end

local function moves(dtype, n)
  local tag = string.format("%s/%d", dtype, n)
  local src = size > 1 and 1 or 0
  case("broadcast/" .. tag, function()
    local t = input(rank, n, dtype, "sum", 0)
    dist.broadcast(t, src)
    expect(t, n, from_rank(src, "sum", 0), dtype, "broadcast", in_key(src, "sum", 0, n))
  end)
  case("all_gather/" .. tag, function()
    local list = {}
    for j = 1, size do list[j] = T.zeros({n}, dtype) end
    dist.all_gather(list, input(rank, n, dtype, "sum", 0))
    for j = 1, size do expect(list[j], n, from_rank(j - 1, "sum", 0), dtype, "all_gather " .. j, in_key(j - 1, "sum", 0, n)) end
  end)
  case("all_gather_into_tensor/" .. tag, function()
    local out = T.zeros({size * n}, dtype)
    dist.all_gather_into_tensor(out, input(rank, n, dtype, "sum", 0))
    for j = 1, size do
      expect(out:narrow(1, (j - 1) * n + 1, n), n, from_rank(j - 1, "sum", 0), dtype,
             "all_gather_into_tensor " .. j, in_key(j - 1, "sum", 0, n))
    end
  end)
  case("all_gather_inplace/" .. tag, function()
    local list = {}
    for j = 1, size do list[j] = T.zeros({n}, dtype) end
    list[rank + 1] = input(rank, n, dtype, "sum", 0)
    dist.all_gather(list, list[rank + 1])
    for j = 1, size do expect(list[j], n, from_rank(j - 1, "sum", 0), dtype, "all_gather " .. j, in_key(j - 1, "sum", 0, n)) end
  end)
  case("gather/" .. tag, function()
    local list = nil
    if rank == src then
      list = {}
      for j = 1, size do list[j] = T.zeros({n}, dtype) end
    end
    dist.gather(input(rank, n, dtype, "sum", 0), list, src)
    for j = 1, list and size or 0 do expect(list[j], n, from_rank(j - 1, "sum", 0), dtype, "gather " .. j, in_key(j - 1, "sum", 0, n)) end
  end)
  case("scatter/" .. tag, function()
    local list = nil
    if rank == src then
      list = {}
      for j = 1, size do list[j] = input(j - 1, n, dtype, "sum", 7) end
    end
    local t = T.zeros({n}, dtype)
    dist.scatter(t, list, src)
    expect(t, n, from_rank(rank, "sum", 7), dtype, "scatter", in_key(rank, "sum", 7, n))
  end)
  case("all_to_all/" .. tag, function()
    local ins, outs = {}, {}
    for j = 1, size do
      ins[j] = input(rank * 8 + j - 1, n, dtype, "sum", 3)
      outs[j] = T.zeros({n}, dtype)
    end
    dist.all_to_all(outs, ins)
    for j = 1, size do
      expect(outs[j], n, from_rank((j - 1) * 8 + rank, "sum", 3), dtype, "all_to_all " .. j, in_key((j - 1) * 8 + rank, "sum", 3, n))
    end
  end)
end

-- Whether (dtype, op, n) runs: everything in the full matrix; with arg[2] ==
-- "subset" (the tcp and hierarchical modes) every dtype once (sum, 7), every
-- op once (int32 and float32 where defined, 100003) and every count once
-- (float32 sum).
local SUBSET = arg[2] == "subset"
local function wanted(dtype, op, n)
  if not SUBSET then return true end
  if op == "sum" and n == 7 then return true end
  if n == 100003 and (dtype == "int32" or dtype == "float32") then return true end
  return dtype == "float32" and op == "sum"
end

for _, dtype in ipairs(DTYPES) do
  for _, n in ipairs(COUNTS) do
    for _, op in ipairs(OPS) do
      if (INT[dtype] or (op ~= "band" and op ~= "bor" and op ~= "bxor")) and wanted(dtype, op, n) then
        reductions(dtype, op, n)
      end
    end
    if wanted(dtype, "sum", n) then moves(dtype, n) end
  end
end

case("bitwise_on_float_is_an_error", function()
  local ok, err = pcall(dist.all_reduce, T.ones({3}), "bxor")
  assert(not ok and tostring(err):find("bxor", 1, true), "expected a bxor error, got " .. tostring(err))
end)

case("async_ordering", function()
  local ts, ws = {}, {}
  for k = 1, 5 do
    ts[k] = T.full({50000}, rank + k)
    ws[k] = dist.all_reduce(ts[k], "sum", {async_op = true})
  end
  local x = T.full({1}, rank)
  dist.all_reduce(x, "max")   -- blocking, queued behind the async ones
  assert(x[1] == size - 1, "blocking all_reduce behind async ones gave " .. x[1])
  for k = 5, 1, -1 do
    assert(ws[k]:wait(30) == true)
    assert(ws[k]:is_completed())
    local want = size * (size - 1) / 2 + size * k
    assert(ts[k][1] == want and ts[k][50000] == want, "async all_reduce " .. k .. " gave " .. ts[k][1])
  end
end)

case("objects", function()
  local v = dist.broadcast_object({rank = rank, list = {1, "two", true}, nested = {x = 1.5}}, size - 1)
  assert(v.rank == size - 1 and v.list[2] == "two" and v.list[3] == true and v.nested.x == 1.5)
  local all = dist.all_gather_object(rank == 0 and {"zero"} or ("r" .. rank))
  assert(#all == size and all[1][1] == "zero")
  for j = 2, size do assert(all[j] == "r" .. (j - 1)) end
end)

case("send_recv_tags_and_any_source", function()
  if size < 2 then return end
  if rank == 0 then
    dist.send(T.full({3}, 11), 1, {tag = 1})
    dist.send(T.full({3}, 22), 1, {tag = 2})
    local seen = {}
    for _ = 1, size - 1 do
      local b = T.zeros({2}, "int64")
      local from = dist.recv(b)
      assert(b[1] == from * 100, "any-source recv from " .. from .. " got " .. b[1])
      seen[from] = true
    end
    for j = 1, size - 1 do assert(seen[j], "no message from rank " .. j) end
  else
    if rank == 1 then
      local b = T.zeros({3})
      assert(dist.recv(b, 0, {tag = 2}) == 0 and b[1] == 22)
      local w = dist.irecv(b, 0, {tag = 1})
      w:wait()
      assert(w:source() == 0 and b[3] == 11)
    end
    dist.isend(T.full({2}, rank * 100, "int64"), 0):wait()
  end
end)

case("sub_groups", function()
  local evens, odds = {}, {}
  for r = 0, size - 1 do
    if r % 2 == 0 then evens[#evens + 1] = r else table.insert(odds, 1, r) end
  end
  local ge = dist.new_group(evens)
  local go = size > 1 and dist.new_group(odds) or dist.GroupMember.NON_GROUP_MEMBER
  local mine = rank % 2 == 0 and ge or go
  local other = rank % 2 == 0 and go or ge
  assert(other == dist.GroupMember.NON_GROUP_MEMBER)
  local members = rank % 2 == 0 and evens or odds
  local t = T.full({5}, rank)
  dist.all_reduce(t, "sum", {group = mine})
  local want = 0
  for _, r in ipairs(members) do want = want + r end
  assert(t[1] == want, "group all_reduce gave " .. t[1] .. ", expected " .. want)
  local b = T.full({2}, rank)
  dist.broadcast(b, members[#members], {group = mine})   -- src is a global rank
  assert(b[2] == members[#members])
  assert(dist.get_world_size(mine) == #members)
  -- ranks outside a group call nothing: this is a no-op for them
  dist.all_reduce(T.ones({1}), "sum", {group = other})
  dist.barrier()
end)

dist.barrier()
out:write("done ", ncases, "\n")
out:close()
dist.destroy_process_group()

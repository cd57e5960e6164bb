-- dist_cases.lua — the collective matrix, run as one crun-lua job per world
-- size: every collective x op x dtype x counts {0, 1, 7, 40009}, every root
-- of broadcast/gather/scatter (reduce's root walks over the ranks), in-place
-- and out-of-place forms (all_to_all_single(t, t) too), async ordering, sub-groups, object collectives and
-- send/recv matching. Inputs are hashes of (rank, index): signed, spanning each
-- integer dtype's range, never periodic. Each rank checks its own results against a reference
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

local DTYPES = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8",
                "int8", "int16", "bool"}
local INT = {int32 = true, int64 = true, uint8 = true, int8 = true, int16 = true, bool = true}
local BITS = {int8 = 8, int16 = 16, int32 = 32, int64 = 64}
local OPS = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor"}
local SUBSET = arg[2] == "subset"
-- the large count crosses pages and the shm small threshold; the subset (tcp,
-- hierarchical: float32/int32 only) uses 100003, past the 256 KiB where TCP
-- all_reduce takes the ring, across several 40000-byte ring slices; at more
-- than 4 ranks (mpirun -np 8, oversubscribed) the full matrix uses 20011 so
-- that the references computed here stay within the job's time limit
local BIG = SUBSET and 100003 or size > 4 and 20011 or 40009
local COUNTS = {0, 1, 7, BIG}
-- float16/bfloat16 sums accumulate in float32 and are rounded once by the
-- shared-memory engine and by every TCP algorithm: asserted exactly. The
-- hierarchical engine (fake hosts, CRUN_HOST_ID) rounds once per level, so it
-- gets a tolerance of one ulp a rank.
local HALF_EXACT = not os.getenv("CRUN_HOST_ID")

-- A 64-bit hash of (r, i, salt): inputs are signed, large and non-periodic.
local function mix(r, i, salt)
  local x = r * -7046029254386353131 + i * -4658895280553007687 + salt * 7046029254386353131
            + 0x632BE59BD9B4E019
  x = (x ~ (x >> 31)) * -7723592293110705685
  x = (x ~ (x >> 29)) * -4658895280553007687
  return x ~ (x >> 32)
end

-- Sign-extends the low `bits` bits of x (two's complement wrap-around).
local function wrap(x, bits)
  if bits == 64 then return x end
  local m = (1 << bits) - 1
  x = x & m
  if x >= (1 << (bits - 1)) then x = x - (1 << bits) end
  return x
end

-- Input element i (0-based) of rank r for (dtype, op): every integer dtype
-- uses its whole range (sums and products wrap, as in C and torch); floats
-- are multiples of 1/8 whose sums stay exact in float32 (and in float16 /
-- bfloat16 until the one final rounding), products of small halves.
local function value(r, i, dtype, op, salt)
  local h = mix(r, i, salt)
  if dtype == "bool" then return h & 1 == 1 end
  if dtype == "uint8" then return h & 0xff end
  if BITS[dtype] then return wrap(h, BITS[dtype]) end
  if op == "product" then return ((h & 0xff) % 9 - 4) / 2 end
  if dtype == "float16" then return (wrap(h, 12) % 4095 - 2047) / 8 end
  if dtype == "bfloat16" then return (wrap(h, 9) % 511 - 255) / 8 end
  if dtype == "float32" then return wrap(h, 17) / 8 end
  return wrap(h, 31) / 8
end

-- x rounded to `bits` significant bits, ties to even (float16: 11, bfloat16: 8).
local function round_sig(x, bits)
  if x == 0 or x ~= x then return x end
  local a = math.abs(x)
  local e = math.floor(math.log(a, 2))
  while 2.0 ^ e > a do e = e - 1 end
  while 2.0 ^ (e + 1) <= a do e = e + 1 end
  local ulp = 2.0 ^ (e - bits + 1)
  local q = a / ulp
  local f = math.floor(q)
  local rem = q - f
  if rem > 0.5 or (rem == 0.5 and f % 2 == 1) then f = f + 1 end
  return (x < 0 and -1 or 1) * f * ulp
end
local SIG = {float16 = 11, bfloat16 = 8}

local function tdiv(a, b) -- integer division truncating toward zero
  local q = a // b
  if q < 0 and q * b ~= a then q = q + 1 end
  return q
end

local function combine(dtype, op, a, b)
  if dtype == "bool" then
    if op == "sum" or op == "max" or op == "bor" then return a or b
    elseif op == "bxor" then return a ~= b end
    return a and b
  end
  local v
  if op == "sum" or op == "avg" then v = a + b
  elseif op == "product" then v = a * b
  elseif op == "min" then v = math.min(a, b)
  elseif op == "max" then v = math.max(a, b)
  elseif op == "band" then v = a & b
  elseif op == "bor" then v = a | b
  else v = a ~ b end
  if dtype == "uint8" then return v & 0xff end
  if BITS[dtype] then return wrap(v, BITS[dtype]) end
  return v
end

-- Lua tables of inputs and references are cached per key; tensors are made
-- from them in C.
local cache = {}
local function cached(key, make)
  local v = cache[key]
  if not v then v = make(); cache[key] = v end
  return v
end

local function input_vals(r, n, dtype, op, salt)
  local cls = op == "product" and "p" or "s"
  return cached(table.concat({"in", r, n, dtype, cls, salt}, ":"), function()
    local v = {}
    for i = 1, n do v[i] = value(r, i - 1, dtype, op, salt) end
    return v
  end)
end

local function input(r, n, dtype, op, salt)
  return T.new(n > 0 and input_vals(r, n, dtype, op, salt) or {}, dtype):view(n)
end

-- Reference of the reduction over all ranks, element by element.
local function reference(op, dtype, n, salt)
  return cached(table.concat({"ref", op, dtype, n, salt}, ":"), function()
    local cols = {}
    for r = 0, size - 1 do cols[r] = input_vals(r, n, dtype, op, salt) end
    local ref = {}
    for i = 1, n do
      local acc = cols[0][i]
      for r = 1, size - 1 do acc = combine(dtype, op, acc, cols[r][i]) end
      if op == "avg" then acc = INT[dtype] and tdiv(acc, size) or acc / size end
      if SIG[dtype] then acc = round_sig(acc, SIG[dtype]) end
      ref[i] = acc
    end
    return ref
  end)
end

-- Tolerance for a float result: avg divides (rounding), half types round
-- once a step where the engine reduces pairwise.
local function tolerance(dtype, op)
  if INT[dtype] then return nil end
  local steps = (SIG[dtype] and not HALF_EXACT) and size or (op == "avg" and 2 or 0)
  if steps == 0 then return nil end
  local eps = SIG[dtype] and 2.0 ^ (1 - SIG[dtype]) or (dtype == "float32" and 2.0 ^ -23 or 2.0 ^ -52)
  return steps * eps
end

-- Raises unless t holds exactly vals (or within tol, relative, for floats).
local expected_cache = {}
local function expect(t, vals, dtype, what, key, tol)
  local n = #vals
  if t:numel() ~= n then error(what .. ": numel " .. t:numel() .. " ~= " .. n) end
  if n == 0 then return end
  local want = expected_cache[key .. dtype]
  if not want then
    want = T.new(vals, tol and "float64" or dtype):view(n)
    expected_cache[key .. dtype] = want
  end
  if tol then
    if t:to("float64"):allclose(want, tol, tol) then return end
  elseif t:equal(want) then
    return
  end
  local tt = t:totable()
  for i = 1, n do
    local g, w = tt[i], vals[i]
    local bad = tol and not (math.abs(g - w) <= tol * math.max(1, math.abs(w))) or (not tol and g ~= w)
    if bad then
      error(string.format("%s: element %d (0-based %d) is %s, expected %s", what, i, i - 1, tostring(g), tostring(w)))
    end
  end
  error(what .. ": tensors differ")
end

local function in_key(r, n, dtype, salt) return table.concat({"in", r, n, salt}, ":") end

local function reductions(dtype, op, n, dst)
  local tag = string.format("%s/%s/%d", dtype, op, n)
  local tol = tolerance(dtype, op)
  local rkey = table.concat({"red", op, n}, ":")
  case("all_reduce/" .. tag, function()
    local t = input(rank, n, dtype, op, 0)
    dist.all_reduce(t, op)
    expect(t, reference(op, dtype, n, 0), dtype, "all_reduce", rkey, tol)
  end)
  case("reduce/" .. tag .. "/root" .. dst, function()
    local t = input(rank, n, dtype, op, 0)
    dist.reduce(t, dst, dist.ReduceOp[op:upper()])
    if rank == dst then
      expect(t, reference(op, dtype, n, 0), dtype, "reduce", rkey, tol)
    else -- the input of a non-root rank is left as it was
      expect(t, input_vals(rank, n, dtype, op, 0), dtype, "reduce input", "in:" .. op .. ":" .. rank .. ":" .. n)
    end
  end)
  case("reduce_scatter/" .. tag, function()
    local ins = {}
    for b = 0, size - 1 do ins[b + 1] = input(rank, n, dtype, op, b) end
    local o = T.zeros({n}, dtype)
    dist.reduce_scatter(o, ins, op)
    expect(o, reference(op, dtype, n, rank), dtype, "reduce_scatter", "rs:" .. op .. ":" .. n, tol)
  end)
  case("reduce_scatter_tensor/" .. tag, function()
    local big = T.zeros({size * n}, dtype)
    for b = 0, size - 1 do big:narrow(1, b * n + 1, n):copy(input(rank, n, dtype, op, b)) end
    local o = T.zeros({n}, dtype)
    dist.reduce_scatter_tensor(o, big, op)
    expect(o, reference(op, dtype, n, rank), dtype, "reduce_scatter_tensor", "rs:" .. op .. ":" .. n, tol)
  end)
end

local function moves(dtype, n)
  local tag = string.format("%s/%d", dtype, n)
  local function vals(r, salt) return input_vals(r, n, dtype, "sum", salt) end
  for src = 0, size - 1 do
    case("broadcast/" .. tag .. "/root" .. src, function()
      local t = input(rank, n, dtype, "sum", 0)
      dist.broadcast(t, src)
      expect(t, vals(src, 0), dtype, "broadcast", in_key(src, n, dtype, 0))
    end)
  end
  case("all_gather/" .. tag, function()
    local list = {}
    for j = 1, size do list[j] = T.zeros({n}, dtype) end
    dist.all_gather(list, input(rank, n, dtype, "sum", 0))
    for j = 1, size do expect(list[j], vals(j - 1, 0), dtype, "all_gather " .. j, in_key(j - 1, n, dtype, 0)) end
  end)
  case("all_gather_into_tensor/" .. tag, function()
    local out = T.zeros({size * n}, dtype)
    dist.all_gather_into_tensor(out, input(rank, n, dtype, "sum", 0))
    for j = 1, size do
      expect(out:narrow(1, (j - 1) * n + 1, n), vals(j - 1, 0), dtype, "all_gather_into_tensor " .. j,
             in_key(j - 1, n, dtype, 0))
    end
  end)
  case("all_gather_inplace/" .. tag, function()
    local list = {}
    for j = 1, size do list[j] = T.zeros({n}, dtype) end
    list[rank + 1] = input(rank, n, dtype, "sum", 0)
    dist.all_gather(list, list[rank + 1])
    for j = 1, size do expect(list[j], vals(j - 1, 0), dtype, "all_gather " .. j, in_key(j - 1, n, dtype, 0)) end
  end)
  for src = 0, size - 1 do
    case("gather/" .. tag .. "/root" .. src, function()
      local list = nil
      if rank == src then
        list = {}
        for j = 1, size do list[j] = T.zeros({n}, dtype) end
      end
      dist.gather(input(rank, n, dtype, "sum", 0), list, src)
      for j = 1, list and size or 0 do expect(list[j], vals(j - 1, 0), dtype, "gather " .. j, in_key(j - 1, n, dtype, 0)) end
    end)
  end
  for src = 0, size - 1 do
    case("scatter/" .. tag .. "/root" .. src, function()
      local list = nil
      if rank == src then
        list = {}
        for j = 1, size do list[j] = input(j - 1, n, dtype, "sum", 7) end
      end
      local t = T.zeros({n}, dtype)
      dist.scatter(t, list, src)
      expect(t, vals(rank, 7), dtype, "scatter", in_key(rank, n, dtype, 7))
    end)
  end
  case("all_to_all/" .. tag, function()
    local ins, outs = {}, {}
    for j = 1, size do
      ins[j] = input(rank * 8 + j - 1, n, dtype, "sum", 3)
      outs[j] = T.zeros({n}, dtype)
    end
    dist.all_to_all(outs, ins)
    for j = 1, size do
      local r = (j - 1) * 8 + rank
      expect(outs[j], vals(r, 3), dtype, "all_to_all " .. j, in_key(r, n, dtype, 3))
    end
  end)
  case("all_to_all_single_inplace/" .. tag, function() -- output is input
    local t = T.zeros({size * n}, dtype)
    for j = 1, size do t:narrow(1, (j - 1) * n + 1, n):copy(input(rank * 8 + j - 1, n, dtype, "sum", 3)) end
    dist.all_to_all_single(t, t)
    for j = 1, size do
      local r = (j - 1) * 8 + rank
      expect(t:narrow(1, (j - 1) * n + 1, n), vals(r, 3), dtype, "all_to_all_single in place " .. j,
             in_key(r, n, dtype, 3))
    end
  end)
end

-- Whether (dtype, op, n) runs: everything in the full matrix; with arg[2] ==
-- "subset" (the tcp and hierarchical modes) every dtype once (sum, 7), every
-- op once (int32 and float32 where defined, the large count) and every count once
-- (float32 sum). spec/helpers/dist_matrix.lua counts the same cases on its own.
local function wanted(dtype, op, n)
  if not SUBSET then return true end
  if op == "sum" and n == 7 then return true end
  if n == BIG and (dtype == "int32" or dtype == "float32") then return true end
  return dtype == "float32" and op == "sum"
end

local function defined(dtype, op)
  if dtype == "bool" then return op ~= "avg" end
  return INT[dtype] or (op ~= "band" and op ~= "bor" and op ~= "bxor")
end

local k = 0
for _, dtype in ipairs(DTYPES) do
  for _, n in ipairs(COUNTS) do
    for _, op in ipairs(OPS) do
      if defined(dtype, op) and wanted(dtype, op, n) then
        k = k + 1
        reductions(dtype, op, n, k % size) -- the reduce root walks over every rank
      end
    end
    if wanted(dtype, "sum", n) then moves(dtype, n) end
  end
  cache = {} -- inputs and references of one dtype are not needed again
  expected_cache = {}
end

-- premul_sum (dist.make_premul_sum): each input times F, then summed; the
-- inputs that are not outputs (reduce off the root, reduce_scatter) stay as
-- they were. F * x is rounded to the dtype once per input (float16/bfloat16),
-- then the sum once.
local F = -0.375
local function premul_reference(dtype, n, salt)
  return cached(table.concat({"pm", dtype, n, salt}, ":"), function()
    local cols = {}
    for r = 0, size - 1 do cols[r] = input_vals(r, n, dtype, "sum", salt) end
    local ref = {}
    for i = 1, n do
      local acc = 0
      for r = 0, size - 1 do
        local v = F * cols[r][i]
        acc = acc + (SIG[dtype] and round_sig(v, SIG[dtype]) or v)
      end
      ref[i] = SIG[dtype] and round_sig(acc, SIG[dtype]) or acc
    end
    return ref
  end)
end

local pm_k = 0
for _, dtype in ipairs({"float32", "float64", "float16", "bfloat16"}) do
  for _, n in ipairs({7, BIG}) do
    if not SUBSET or dtype == "float32" then
      local tag, op = dtype .. "/" .. n, dist.make_premul_sum(F)
      local tol = SIG[dtype] and not HALF_EXACT and tolerance(dtype, "sum") or nil
      pm_k = pm_k + 1
      local dst = pm_k % size
      case("premul_sum all_reduce/" .. tag, function()
        local t = input(rank, n, dtype, "sum", 0)
        dist.all_reduce(t, op)
        expect(t, premul_reference(dtype, n, 0), dtype, "premul all_reduce", "pm:" .. n, tol)
      end)
      case("premul_sum reduce/" .. tag .. "/root" .. dst, function()
        local t = input(rank, n, dtype, "sum", 0)
        dist.reduce(t, dst, op)
        if rank == dst then
          expect(t, premul_reference(dtype, n, 0), dtype, "premul reduce", "pm:" .. n, tol)
        else
          expect(t, input_vals(rank, n, dtype, "sum", 0), dtype, "premul reduce input", "pmin:" .. rank .. ":" .. n)
        end
      end)
      case("premul_sum reduce_scatter/" .. tag, function()
        local ins = {}
        for b = 0, size - 1 do ins[b + 1] = input(rank, n, dtype, "sum", b) end
        local o = T.zeros({n}, dtype)
        dist.reduce_scatter(o, ins, op)
        expect(o, premul_reference(dtype, n, rank), dtype, "premul reduce_scatter", "pmrs:" .. n, tol)
        for b = 0, size - 1 do
          expect(ins[b + 1], input_vals(rank, n, dtype, "sum", b), dtype, "premul reduce_scatter input " .. b,
                 "pmrsin:" .. b .. ":" .. n)
        end
      end)
    end
  end
  cache, expected_cache = {}, {}
end

-- Runs fn(g) on every rank with g a group of that rank alone: a collective
-- that a rank refuses stops its group (bindings/pg.c, coll.c), and stops
-- nothing on a group of one, so the cases after it keep the default group.
local function alone(fn)
  for r = 0, size - 1 do
    local g = dist.new_group({r})
    if rank == r then fn(g) end
  end
end

case("premul_sum_on_int_is_an_error", function()
  alone(function(g)
    local ok, err = pcall(dist.all_reduce, T.new({1, 2}, "int32"), dist.make_premul_sum(2), {group = g})
    assert(not ok and tostring(err):match("^EINVAL") and tostring(err):find("floating", 1, true),
           "expected an EINVAL premul_sum-on-int32 error, got " .. tostring(err))
    local ok2, err2 = pcall(dist.all_reduce, T.new({1.5}), dist.ReduceOp.PREMUL_SUM, {group = g})
    assert(not ok2 and tostring(err2):find("make_premul_sum", 1, true), tostring(err2))
  end)
end)

case("avg_on_bool_is_an_error", function()
  alone(function(g)
    local ok, err = pcall(dist.all_reduce, T.new({true, false}, "bool"), "avg", {group = g})
    assert(not ok and tostring(err):match("^EINVAL") and tostring(err):find("bool", 1, true),
           "expected an EINVAL avg-on-bool error, got " .. tostring(err))
  end)
end)

case("bitwise_on_float_is_an_error", function()
  alone(function(g)
    local ok, err = pcall(dist.all_reduce, T.ones({3}), "bxor", {group = g})
    assert(not ok and tostring(err):find("bxor", 1, true), "expected a bxor error, got " .. tostring(err))
  end)
end)

case("async_ordering", function()
  local ts, ws = {}, {}
  for k = 1, 5 do
    ts[k] = T.full({50000}, rank + k, "float32")
    ws[k] = dist.all_reduce(ts[k], "sum", {async_op = true})
  end
  local x = T.full({1}, rank, "float32")
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
    dist.send(T.full({3}, 11, "float32"), 1, {tag = 1})
    dist.send(T.full({3}, 22, "float32"), 1, {tag = 2})
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
  local t = T.full({5}, rank, "float32")
  dist.all_reduce(t, "sum", {group = mine})
  local want = 0
  for _, r in ipairs(members) do want = want + r end
  assert(t[1] == want, "group all_reduce gave " .. t[1] .. ", expected " .. want)
  local b = T.full({2}, rank, "float32")
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

-- nccl_cases.lua — the nccl backend's cases on CUDA tensors, run as one
-- crun-lua job (spec/nccl_spec.lua): through the NCCL and CUDA runtime test
-- doubles in the double build, on GPUs in the real one. Each rank writes one
-- line per case to <outdir>/rank<r>.txt ("ok <case>" or "FAIL <case>: <why>")
-- then "done <ncases>".
-- Usage: nccl_cases.lua OUTDIR MODE, MODE one of
--   matrix    every op x dtype x count (0, 1, 7, 4099) of all_reduce, reduce
--             and reduce_scatter; broadcast/gather/scatter from every root,
--             all_gather, all_to_all (uneven), send/recv; the ENOTSUP, EINVAL
--             and async-work cases; a sub-group on 4 ranks
--   mismatch  rank 1 passes a different count: EMISMATCH everywhere, then ESTATE
--   hang      the last rank never calls all_reduce #2 (it sleeps past the 1 s
--             deadline): ETIMEDOUT naming it, then ESTATE
--   refuse    rank 1's all_to_all_single split sizes are wrong: every rank
--             fails that call (#2) with EINVAL naming rank 1 and its fault,
--             then ESTATE; refuse_auto: the same on a group of backend "auto"
--   refuse_gather  the root's gather list is short: every rank fails gather #2
--             naming the root and its fault, then ESTATE
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local outdir, mode = assert(arg[1], "usage: nccl_cases.lua OUTDIR MODE"), arg[2] or "matrix"
dist.init_process_group{backend = mode == "refuse_auto" and "auto" or "nccl", timeout = 30}
local rank, size = dist.get_rank(), dist.get_world_size()
local out = assert(io.open(outdir .. "/rank" .. rank .. ".txt", "w"))
local ncases = 0

local function case(name, fn)
  ncases = ncases + 1
  local ok, err = pcall(fn)
  out:write(ok and ("ok " .. name) or ("FAIL " .. name .. ": " .. tostring(err)), "\n")
  out:flush()
end

-- Raises unless fn raises an error containing every text of `want`.
-- Fails unless fn raises an error holding every string given; a list of
-- strings is satisfied by any one of them.
local function fails_with(fn, ...)
  local ok, err = pcall(fn)
  if ok then error("expected an error, got none", 2) end
  for _, w in ipairs({...}) do
    local any = false
    for _, s in ipairs(type(w) == "table" and w or {w}) do any = any or tostring(err):find(s, 1, true) ~= nil end
    if not any then
      error("error lacks '" .. (type(w) == "table" and table.concat(w, "' or '") or w) .. "': " .. tostring(err), 2)
    end
  end
end

local DTYPES = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8", "int16", "bool"}
local OPS = {"sum", "product", "min", "max", "avg"}
local COUNTS = {0, 1, 7, 4099}

-- Input element i (0-based) of rank r: signed, non-periodic, exact in every
-- dtype, a product over 4 ranks fits int8.
local function value(dtype, r, i)
  local v = (i * 7 + r * 13 + i // 5) % 5 - 2
  if dtype == "uint8" then return v + 2 end
  if dtype == "bool" then return v > 0 end
  return v
end

local function num(x) if type(x) == "boolean" then return x and 1 or 0 end return x end

local function host(dtype, r, n)
  local v = {}
  for i = 1, n do v[i] = value(dtype, r, i - 1) end
  return T.new(v, dtype):view(n)
end

local function dev(dtype, r, n) return host(dtype, r, n):cuda() end

-- The reduction of every rank's element i, computed here.
local function reduced(dtype, op, i)
  local acc = num(value(dtype, 0, i))
  for r = 1, size - 1 do
    local x = num(value(dtype, r, i))
    if op == "sum" or op == "avg" then acc = acc + x
    elseif op == "product" then acc = acc * x
    elseif op == "min" then acc = math.min(acc, x)
    else acc = math.max(acc, x) end
  end
  if dtype == "bool" and op == "sum" then acc = acc > 0 and 1 or 0 end
  if op == "avg" then
    if dtype:match("int") then
      local q = acc // size
      if q < 0 and q * size ~= acc then q = q + 1 end
      acc = q
    else acc = acc / size end
  end
  return acc
end

-- Relative tolerance of one rounding (avg divides; half types round it).
local TOL = {float16 = 2.0 ^ -10, bfloat16 = 2.0 ^ -7, float32 = 2.0 ^ -23}

local function expect(t, n, want, what)
  if t:numel() ~= n then error(what .. ": numel " .. t:numel() .. " ~= " .. n) end
  if n == 0 then return end
  local tol = TOL[t:dtype()] or 1e-12
  local got = t:cpu():to("float64"):totable()
  for i = 1, n do
    local g, w = num(got[i]), want(i - 1)
    if math.abs(g - w) > tol * math.max(1, math.abs(w)) then
      error(string.format("%s: element %d is %s, expected %s", what, i - 1, tostring(g), tostring(w)))
    end
  end
end

if mode == "mismatch" then
  local t = T.zeros({rank == 1 and 3 or 4}, "float32"):cuda()
  case("mismatch", function()
    fails_with(function() dist.all_reduce(t) end, "EMISMATCH", "all_reduce #1 on rank " .. rank .. " expected float32[" ..
               (rank == 1 and 3 or 4) .. "]")
  end)
  case("estate after mismatch", function()
    fails_with(function() dist.all_reduce(t) end, "ESTATE", "unusable after an earlier failure")
  end)
elseif mode == "hang" then
  local t = T.ones({5}, "float32"):cuda()
  dist.all_reduce(t)
  if rank == size - 1 then
    os.execute("sleep 3") -- never calls all_reduce #2 in time
  else
    case("timeout names the missing rank", function()
      -- the progress board a rank publishes is at most 200 ms old: on a loaded
      -- machine a peer that did reach #2 may still be shown at #1 with rank 2
      local last = size - 1
      fails_with(function() dist.all_reduce(t, "sum", {timeout = 1}) end, "ETIMEDOUT", "all_reduce #2 on rank " .. rank,
                 "no data from rank " .. last, {"rank " .. last .. " is at all_reduce #1",
                                                 "ranks " .. (last - 1) .. "-" .. last .. " are at all_reduce #1",
                                                 "ranks 0-" .. last .. " are at all_reduce #1",
                                                 "ranks 0," .. last .. " are at all_reduce #1"})
    end)
    case("estate after the abort", function()
      fails_with(function() dist.broadcast(t, 0) end, "ESTATE")
    end)
  end
elseif mode == "refuse" or mode == "refuse_auto" then
  local t = dev("float32", rank, 3)
  dist.all_reduce(t) -- #1 (on "auto": connects the device backend)
  local input, output = dev("float32", rank, 2 * size), T.zeros({2 * size}, "float32"):cuda()
  local splits = {}
  for i = 1, size do splits[i] = 2 end
  if rank == 1 then splits[1] = 3 end
  case("every rank fails all_to_all_single naming rank 1", function()
    local why = "all_to_all_single on rank 1: input split sizes add up to " .. (2 * size + 1) ..
                ", dim 1 of the input tensor is " .. (2 * size)
    local peer = rank == 1 and {} or {"all_to_all #2 on rank " .. rank, "rank 1 refused its part of all_to_all #2"}
    local t0 = os.time()
    fails_with(function() dist.all_to_all_single(output, input, nil, splits, {timeout = 20}) end, "EINVAL: ", why,
               table.unpack(peer))
    if os.time() - t0 > 10 then error("the refusal took " .. (os.time() - t0) .. " s to reach rank " .. rank) end
  end)
  case("estate after the refusal", function()
    fails_with(function() dist.broadcast(t, 0) end, "ESTATE")
  end)
elseif mode == "refuse_gather" then
  local t = dev("float32", rank, 3)
  dist.all_reduce(t) -- #1
  -- a sender (rank > 0) may find its gather done (NCCL took its send
  -- without the root): then its next call fails instead
  case("every rank fails gather, or a sender its next call, naming the root", function()
    local why = "bad argument #2 to 'gather' (list of " .. size .. " tensors expected, got 1)"
    local t0 = os.time()
    local ok, err = pcall(dist.gather, t, rank == 0 and {T.zeros({3}, "float32"):cuda()} or nil, 0, {timeout = 20})
    if ok and rank > 0 then ok, err = pcall(dist.broadcast, t, 0, {timeout = 20}) end
    if ok then error("expected an error, got none") end
    err = tostring(err)
    for _, w in ipairs({"EINVAL: ", why, rank > 0 and "rank 0, the root, refused its part of gather #2" or why}) do
      if not err:find(w, 1, true) then error("error lacks '" .. w .. "': " .. err) end
    end
    if os.time() - t0 > 10 then error("the refusal took " .. (os.time() - t0) .. " s to reach rank " .. rank) end
  end)
  case("estate after the refusal", function()
    fails_with(function() dist.broadcast(t, 0) end, "ESTATE")
  end)
else
  for _, dtype in ipairs(DTYPES) do
    for _, op in ipairs(OPS) do
      if not (dtype == "bool" and op == "avg") then
        for _, n in ipairs(COUNTS) do
          local tag = string.format("%s %s n=%d", dtype, op, n)
          local want = function(i) return reduced(dtype, op, i) end
          if dtype == "int16" then
            case("all_reduce " .. tag .. " ENOTSUP", function()
              fails_with(function() dist.all_reduce(dev(dtype, rank, n), op) end, "ENOTSUP", op .. " on int16")
            end)
          else
            case("all_reduce " .. tag, function()
              local t = dev(dtype, rank, n)
              dist.all_reduce(t, op)
              expect(t, n, want, "all_reduce " .. tag)
            end)
            local root = n % size
            case("reduce " .. tag, function()
              local t = dev(dtype, rank, n)
              dist.reduce(t, root, op)
              if rank == root then expect(t, n, want, "reduce " .. tag)
              else expect(t, n, function(i) return num(value(dtype, rank, i)) end, "reduce input kept") end
            end)
            case("reduce_scatter " .. tag, function()
              local list = {}
              for j = 1, size do list[j] = dev(dtype, rank, n) end
              local o = T.zeros({n}, dtype):cuda()
              dist.reduce_scatter(o, list, op)
              expect(o, n, want, "reduce_scatter " .. tag)
            end)
          end
        end
      end
    end
    for _, n in ipairs(COUNTS) do
      local tag = string.format("%s n=%d", dtype, n)
      for root = 0, size - 1 do
        local from_root = function(i) return num(value(dtype, root, i)) end
        case("broadcast root " .. root .. " " .. tag, function()
          local t = dev(dtype, rank, n)
          dist.broadcast(t, root)
          expect(t, n, from_root, "broadcast")
        end)
        case("gather root " .. root .. " " .. tag, function()
          local list
          if rank == root then
            list = {}
            for j = 1, size do list[j] = T.zeros({n}, dtype):cuda() end
          end
          dist.gather(dev(dtype, rank, n), list, root)
          for j = 1, rank == root and size or 0 do
            expect(list[j], n, function(i) return num(value(dtype, j - 1, i)) end, "gather block " .. j)
          end
        end)
        case("scatter root " .. root .. " " .. tag, function()
          local list
          if rank == root then
            list = {}
            for j = 1, size do list[j] = dev(dtype, j + 10, n) end
          end
          local t = T.zeros({n}, dtype):cuda()
          dist.scatter(t, list, root)
          expect(t, n, function(i) return num(value(dtype, rank + 11, i)) end, "scatter")
        end)
      end
      case("all_gather " .. tag, function()
        local list = {}
        for j = 1, size do list[j] = T.zeros({n}, dtype):cuda() end
        dist.all_gather(list, dev(dtype, rank, n))
        for j = 1, size do expect(list[j], n, function(i) return num(value(dtype, j - 1, i)) end, "all_gather " .. j) end
      end)
      case("all_to_all " .. tag, function()
        local outs, ins = {}, {}
        for p = 0, size - 1 do -- rank r sends (r + 2p) % 5 elements to p (none when n == 0)
          local k_in, k_out = n > 0 and (rank + 2 * p) % 5 or 0, n > 0 and (p + 2 * rank) % 5 or 0
          ins[p + 1] = dev(dtype, rank * 10 + p, k_in)
          outs[p + 1] = T.zeros({k_out}, dtype):cuda()
        end
        dist.all_to_all(outs, ins)
        for p = 0, size - 1 do
          expect(outs[p + 1], outs[p + 1]:numel(), function(i) return num(value(dtype, p * 10 + rank, i)) end,
                 "all_to_all from " .. p)
        end
      end)
      if size > 1 then
        case("send/recv ring " .. tag, function()
          local w = dist.isend(dev(dtype, rank, n), (rank + 1) % size)
          local t = T.zeros({n}, dtype):cuda()
          dist.recv(t, (rank + size - 1) % size)
          w:wait()
          expect(t, n, function(i) return num(value(dtype, (rank + size - 1) % size, i)) end, "recv")
        end)
      end
    end
  end
  case("premul_sum", function()
    local t = dev("float32", rank, 9)
    dist.all_reduce(t, dist.make_premul_sum(0.5))
    expect(t, 9, function(i) return 0.5 * reduced("float32", "sum", i) end, "premul_sum")
    -- past 16 KiB, in place and out of place: NCCL's one-rank kernel (before
    -- 2.29.7) leaves the tail of such a count unscaled
    for _, dn in ipairs({{"float64", 4099}, {"float32", 4097}}) do
      local dtype, n = dn[1], dn[2]
      local a = dev(dtype, rank, n)
      dist.all_reduce(a, dist.make_premul_sum(0.5))
      expect(a, n, function(i) return 0.5 * reduced(dtype, "sum", i) end, "premul_sum all_reduce " .. dtype)
      local list = {}
      for j = 1, size do list[j] = dev(dtype, rank, n) end
      local o = T.zeros({n}, dtype):cuda()
      dist.reduce_scatter(o, list, dist.make_premul_sum(0.25))
      expect(o, n, function(i) return 0.25 * reduced(dtype, "sum", i) end, "premul_sum reduce_scatter " .. dtype)
    end
  end)
  case("bitwise ops are ENOTSUP naming op and dtype", function()
    fails_with(function() dist.all_reduce(dev("int32", rank, 3), "bxor") end, "ENOTSUP", "bxor on int32",
               "not supported by backend nccl")
  end)
  case("a CPU tensor is EINVAL", function()
    fails_with(function() dist.all_reduce(host("float32", rank, 3)) end, "EINVAL",
               "a CPU tensor was given to a group with backend nccl")
  end)
  case("async work: wait, synchronize, is_completed", function()
    local t = dev("int64", rank, 4099)
    local w = dist.all_reduce(t, "max", {async_op = true})
    w:wait()
    w:synchronize()
    assert(w:is_completed(), "not completed after synchronize")
    expect(t, 4099, function(i) return reduced("int64", "max", i) end, "async all_reduce")
  end)
  if size == 4 then
    case("sub-group by ncclCommSplit", function()
      local g = dist.new_group({3, 1})
      if rank % 2 == 1 then
        local t = T.new({rank * 100 + 7}, "int64"):cuda()
        dist.all_reduce(t, "sum", {group = g})
        expect(t, 1, function() return 414 end, "sub-group all_reduce")
      end
    end)
  end
  case("object collectives staged through the device", function()
    local objs = {rank == 0 and {a = 1, s = "x"} or false}
    dist.broadcast_object_list(objs, 0)
    assert(objs[1].a == 1 and objs[1].s == "x", "broadcast_object_list")
    local got = {}
    dist.all_gather_object(got, {r = rank, pad = string.rep("y", rank * 3)})
    for r = 0, size - 1 do assert(got[r + 1].r == r and #got[r + 1].pad == 3 * r, "all_gather_object " .. r) end
  end)
  case("barrier", function() dist.barrier() end)
end
out:write("done ", ncases, "\n")
out:close()
if mode == "matrix" then dist.barrier() end
dist.destroy_process_group()

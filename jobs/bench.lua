--- jobs/bench.lua — an nccl-tests style table for one collective.
--
--   crun-lua -n 4 jobs/bench.lua all_reduce [--min-bytes 8] [--max-bytes 64M]
--            [--iters N] [--warmup N] [--budget S] [--dtype float32] [--op sum] [--csv]
--            [--sizes 8,1K,64K] [--no-barrier] [--device cuda] [--timeline FILE] [--trace-cost [ROUNDS]]
--
-- --timeline FILE: a Chrome/Perfetto trace of the run (crun.trace), merged by
-- rank 0 at the end. --trace-cost: every size is measured ROUNDS times (5)
-- in each recording mode, interleaved in this one run (none: no timeline and
-- no flight recorder; flight: the default; timeline: flight recorder and
-- timeline), and the table shows each mode's median.
--
-- --device cuda: CUDA tensors on a backend "nccl" group (each rank on its
-- LOCAL_RANK's GPU), every iteration ending with crun.cuda.synchronize(), as
-- nccl-tests times it (out of place there, in place here). The nccl backend's
-- signature check adds store round trips to every call: CRUN_NCCL_CHECK=0
-- measures NCCL alone.
-- Collectives: all_reduce, all_gather, broadcast, reduce_scatter, all_to_all,
-- and the one-tensor forms all_gather_into_tensor, reduce_scatter_tensor and
-- all_to_all_single (equal blocks, no split sizes).
-- size is the whole buffer in bytes as nccl-tests counts it (all_gather: the
-- gathered output; reduce_scatter: the input of all blocks; all_to_all: the
-- send buffer). Each iteration starts after a barrier (--no-barrier: back to
-- back, as the Gloo and MPI anchors time it); its time is the max over ranks,
-- and the table shows the median over iterations. algbw = size /
-- time; busbw = algbw x (2(n-1)/n for all_reduce, (n-1)/n for all_gather,
-- reduce_scatter and all_to_all, 1 for broadcast). Warm-up runs and
-- iterations follow the anchors' plan by size (50 and 1,000 up to 1 KiB ... 2
-- and 10 above 16 MiB), the iterations capped to take about --budget s (4);
-- --warmup and --iters override it.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local function usage(msg)
  io.stderr:write((msg and (msg .. "\n") or ""), "usage: crun-lua -n N jobs/bench.lua COLLECTIVE ",
    "[--min-bytes B] [--max-bytes B] [--sizes B,B,...] [--iters N] [--warmup N] [--budget S] [--dtype D] [--op OP] ",
    "[--csv] [--no-barrier] [--device cpu|cuda] [--timeline FILE] [--trace-cost [ROUNDS]]\n")
  os.exit(2)
end

local function parse_bytes(s)
  local n, unit = tostring(s):match("^(%d+)([KkMmGg]?)[Bb]?$")
  if not n then usage("bad size '" .. tostring(s) .. "'") end
  local mult = ({k = 1024, m = 1024 ^ 2, g = 1024 ^ 3})[unit:lower()] or 1
  return math.tointeger(tonumber(n) * mult)
end

local function parse_args(a)
  local o = {coll = "all_reduce", min = 8, max = 64 * 1024 * 1024, dtype = "float32", op = "sum", budget = 4}
  local i = 1
  while a[i] do
    local k, v = a[i], a[i + 1]
    if k == "--min-bytes" then o.min, i = parse_bytes(v), i + 1
    elseif k == "--max-bytes" then o.max, i = parse_bytes(v), i + 1
    elseif k == "--iters" then o.iters, i = math.tointeger(tonumber(v)), i + 1
    elseif k == "--warmup" then o.warmup, i = math.tointeger(tonumber(v)), i + 1
    elseif k == "--budget" then o.budget, i = tonumber(v) or usage("--budget needs seconds"), i + 1
    elseif k == "--dtype" then o.dtype, i = v, i + 1
    elseif k == "--op" then o.op, i = v, i + 1
    elseif k == "--csv" then o.csv = true
    elseif k == "--no-barrier" then o.no_barrier = true
    elseif k == "--device" then
      o.device, i = v, i + 1
      if v ~= "cpu" and v ~= "cuda" then usage("--device is cpu or cuda") end
    elseif k == "--timeline" then o.timeline, i = v or usage("--timeline needs a file"), i + 1
    elseif k == "--trace-cost" then
      o.trace_cost = 5
      if v and v:match("^%d+$") then o.trace_cost, i = math.tointeger(tonumber(v)), i + 1 end
    elseif k == "--sizes" then
      o.sizes, i = {}, i + 1
      for part in tostring(v):gmatch("[^,]+") do o.sizes[#o.sizes + 1] = parse_bytes(part) end
    elseif k:sub(1, 2) ~= "--" then o.coll = k
    else usage("unknown option " .. k) end
    i = i + 1
  end
  return o
end

local BUS = {
  all_reduce = function(n) return 2 * (n - 1) / n end,
  all_gather = function(n) return (n - 1) / n end,
  reduce_scatter = function(n) return (n - 1) / n end,
  all_to_all = function(n) return (n - 1) / n end,
  broadcast = function() return 1 end,
  all_gather_into_tensor = function(n) return (n - 1) / n end,
  reduce_scatter_tensor = function(n) return (n - 1) / n end,
  all_to_all_single = function(n) return (n - 1) / n end,
}

-- Returns a function running one op of `bytes` total, the element count and
-- the function's two arguments: all_reduce and broadcast time the user's
-- call itself, dist.all_reduce(t, op), with no closure around it (and with
-- no op for sum, the default: dist.all_reduce(t), as users write it).
local function setup(o, n, bytes, esize)
  local per = math.max(1, bytes // esize // ((o.coll == "all_reduce" or o.coll == "broadcast") and 1 or n))
  local ones = function() return o.cuda and T.ones({per}, o.dtype):cuda() or T.ones({per}, o.dtype) end
  if o.coll == "all_reduce" then
    return dist.all_reduce, per, ones(), o.op ~= "sum" and o.op or nil
  elseif o.coll == "broadcast" then
    return dist.broadcast, per, ones(), 0
  end
  local list, list2 = {}, {}
  for j = 1, n do list[j], list2[j] = ones(), ones() end
  local t = ones()
  if o.coll == "all_gather" then return function() dist.all_gather(list, t) end, per * n end
  if o.coll == "reduce_scatter" then return function() dist.reduce_scatter(t, list, o.op) end, per * n end
  if o.coll == "all_to_all" then return function() dist.all_to_all(list2, list) end, per * n end
  local big = T.ones({per * n}, o.dtype)
  if o.cuda then big = big:cuda() end
  if o.coll == "all_gather_into_tensor" then return function() dist.all_gather_into_tensor(big, t) end, per * n end
  if o.coll == "reduce_scatter_tensor" then return function() dist.reduce_scatter_tensor(t, big, o.op) end, per * n end
  if o.coll == "all_to_all_single" then
    local big2 = T.ones({per * n}, o.dtype)
    if o.cuda then big2 = big2:cuda() end
    return function() dist.all_to_all_single(big2, big) end, per * n
  end
  usage("unknown collective " .. o.coll)
end

-- The anchors' plan (anchors/mpi/mpi_allreduce.c, gloo_bench.py): warm-up
-- runs and timed iterations by size; the iterations are then capped so that
-- they take about --budget seconds (at least 3).
local function plan(bytes)
  if bytes <= 1024 then return 50, 1000 end
  if bytes <= 64 * 1024 then return 20, 300 end
  if bytes <= 1024 * 1024 then return 10, 200 end
  if bytes <= 16 * 1024 * 1024 then return 3, 30 end
  return 2, 10
end

-- Times `iters` runs of fn(a, b) (each followed by sync(), when given) after
-- `warmup` runs; a nil iters is capped by `budget` s at the warm-up's pace
-- (the slowest rank's, so that every rank runs as many). Returns the median
-- of the per-iteration max over ranks.
local function measure(fn, iters, warmup, no_barrier, sync, a, b, cap, budget)
  local w0 = crun.clock()
  for _ = 1, warmup do fn(a, b); if sync then sync() end end
  if not iters then
    local pace = T.new({(crun.clock() - w0) / math.max(warmup, 1)}, "float64")
    if sync then pace = pace:cuda() end -- an nccl group takes CUDA tensors only
    dist.all_reduce(pace, "max")
    local t = pace:cpu():totable()[1]
    iters = math.max(3, math.min(cap, t > 0 and math.floor(budget / t) or cap))
  end
  -- a plain Lua table while timing (no binding call per iteration: with
  -- more ranks than cores every rank's bookkeeping delays the others)
  local raw, clock = {}, crun.clock
  if no_barrier then dist.barrier() end
  for i = 1, iters do
    if not no_barrier then dist.barrier() end
    local t0 = clock()
    fn(a, b)
    if sync then sync() end
    raw[i] = clock() - t0
  end
  local times = T.new(raw, "float64")
  if sync then times = times:cuda() end
  dist.all_reduce(times, "max")
  local v = times:cpu():totable()
  table.sort(v)
  return v[(iters + 1) // 2]
end

-- --trace-cost: the median time of fn in each recording mode, the modes
-- interleaved round by round (the machine's load drifts: A/B/C, C/A/B, ...).
local MODES = {{"none", 0}, {"flight", 1}, {"timeline", 3}}
local function measure_modes(fn, iters, o, a, b)
  local got = {}
  for r = 1, o.trace_cost do
    for j = 0, #MODES - 1 do
      local m = MODES[(j + r) % #MODES + 1]
      crun.trace.mode(m[2])
      got[m[1]] = got[m[1]] or {}
      table.insert(got[m[1]], measure(fn, iters, o.warmup or 3, o.no_barrier, nil, a, b))
    end
  end
  crun.trace.mode(1)
  local med = {}
  for name, v in pairs(got) do
    table.sort(v)
    med[name] = v[(#v + 1) // 2]
  end
  return med
end

local function trace_cost(o, n, sizes, esize, out)
  out("# recording cost: median over %d interleaved rounds of the per-size median (us); "
      .. "flight = the default flight recorder, timeline = flight recorder + timeline\n", o.trace_cost)
  out("# %12s %12s %12s %12s %10s %10s\n", "size(B)", "none(us)", "flight(us)", "timeline(us)", "flight%", "timeline%")
  for _, bytes in ipairs(sizes) do
    local fn, count, a, b = setup(o, n, bytes, esize)
    local real = count * esize
    local iters = o.iters or math.max(5, math.min(200, (256 * 1024 * 1024) // math.max(real, 1) // 4))
    local m = measure_modes(fn, iters, o, a, b)
    out("  %12d %12.2f %12.2f %12.2f %+9.1f%% %+9.1f%%\n", real, m.none * 1e6, m.flight * 1e6, m.timeline * 1e6,
        (m.flight / m.none - 1) * 100, (m.timeline / m.none - 1) * 100)
    io.stdout:flush()
  end
end

local function main()
  local o = parse_args(arg)
  if not BUS[o.coll] then usage("unknown collective " .. o.coll) end
  local sync
  if o.device == "cuda" then
    if not crun.cuda.is_available() then
      io.stderr:write("bench: --device cuda needs a CUDA device (crun.cuda.is_available() is false)\n")
      os.exit(1)
    end
    o.cuda = true
    sync = function() crun.cuda.synchronize() end
  end
  -- --trace-cost's own timeline is dropped (trace.stop below), never written:
  -- only the empty file os.tmpname made is left to remove
  local scratch
  if o.timeline then crun.trace.start(o.timeline)
  elseif o.trace_cost and not crun.trace.enabled() then
    scratch = os.tmpname()
    crun.trace.start(scratch)
  end
  dist.init_process_group{backend = o.cuda and "nccl" or nil}
  local n, rank = dist.get_world_size(), dist.get_rank()
  local esize = T.zeros({1}, o.dtype):bytes():len()
  local function out(...) if rank == 0 then io.write(string.format(...)) end end
  if o.csv then
    out("collective,ranks,bytes,count,dtype,op,time_us,algbw_gbs,busbw_gbs\n")
  else
    out("# crun bench: %s on %d ranks, backend %s, %s%s, %s\n", o.coll, n, dist.group.WORLD:backend(), o.dtype,
        o.cuda and " on cuda" or "",
        (o.coll == "all_reduce" or o.coll:find("^reduce_scatter")) and o.op or "-")
    out("# %12s %12s %9s %7s %12s %12s %12s\n", "size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
  end
  local sizes = o.sizes
  if not sizes then
    sizes = {}
    local b = o.min
    while b <= o.max do sizes[#sizes + 1] = b; b = b * 2 end
  end
  if o.trace_cost then
    trace_cost(o, n, sizes, esize, out)
    if not o.timeline then crun.trace.stop() end
    if scratch then os.remove(scratch) end
    dist.destroy_process_group()
    return
  end
  for _, bytes in ipairs(sizes) do
    local fn, count, a, b = setup(o, n, bytes, esize)
    local real = count * esize
    local warm, cap = plan(real)
    local t = measure(fn, o.iters, o.warmup or warm, o.no_barrier, sync, a, b, cap, o.budget)
    local algbw = real / t / 1e9
    local opname = (o.coll == "all_reduce" or o.coll:find("^reduce_scatter")) and o.op or "-"
    if o.csv then
      out("%s,%d,%d,%d,%s,%s,%.2f,%.4f,%.4f\n", o.coll, n, real, count, o.dtype, opname, t * 1e6, algbw, algbw * BUS[o.coll](n))
    else
      out("  %12d %12d %9s %7s %12.2f %12.4f %12.4f\n", real, count, o.dtype, opname, t * 1e6, algbw, algbw * BUS[o.coll](n))
    end
    io.stdout:flush()
  end
  if o.timeline then
    local summary = crun.trace.finish(o.timeline)
    if summary then out("%s\n", summary) end
  end
  dist.destroy_process_group()
end

main()

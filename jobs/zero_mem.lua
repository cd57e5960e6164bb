--- jobs/zero_mem.lua — per-rank model-state bytes and step time of DDP,
-- ZeroRedundancyOptimizer, FSDP SHARD_GRAD_OP and FSDP FULL_SHARD, all with
-- Adam, on one model (not a test).
--
--   for n in 1 2 4; do crun-lua -n $n jobs/zero_mem.lua [--width 1152] [--layers 8]
--                      [--batch 32] [--steps 5] [--warmup 1]; done
--
-- The model is `layers` Linear(width, width) with ReLU between (8 x 1152:
-- 10.6 M float32 parameters). Both runs use DDP with gradient_as_bucket_view
-- (the gradients are the reducer's buckets: no second copy). Bytes are
-- counted from the tensors each rank holds: parameters, gradients and the
-- optimizer state (the largest over ranks is shown; for ZeRO that is the
-- rank with the biggest shard). step ms is forward + backward + optimizer
-- step, the median over `steps` timed steps of the slowest rank; opt ms is
-- the optimizer step alone (for ZeRO it includes the parameter broadcasts).
-- FSDP wraps every Linear as a unit (auto_wrap); its params/grads columns
-- are the shards a rank keeps between steps, and "peak +MB" the most bytes
-- of full-size buffers it held at once during a step (the gathered units'
-- parameters, a prefetched gather, the gradients being computed and being
-- reduced, the reduce_scatter output); they go back to the allocator when
-- backward ends.
local crun = require "crun"
local nn, dist, T = crun.nn, crun.dist, crun.tensor

local function parse_args(a)
  local o = {width = 1152, layers = 8, batch = 32, steps = 5, warmup = 1}
  local i = 1
  while a[i] do
    local k = a[i]:match("^%-%-(%a+)$")
    local v = math.tointeger(tonumber(a[i + 1] or ""))
    if not k or o[k] == nil or not v or v < 1 then
      io.stderr:write("usage: crun-lua -n N jobs/zero_mem.lua [--width W] [--layers L] [--batch B] "
        .. "[--steps S] [--warmup S]\n")
      os.exit(2)
    end
    o[k], i = v, i + 2
  end
  return o
end

local function build(o)
  nn.manual_seed(7)
  local m = nn.Sequential()
  for l = 1, o.layers do
    m:add(nn.Linear(o.width, o.width))
    if l < o.layers then m:add(nn.ReLU()) end
  end
  return m
end

local function bytes_of(list)
  local n = 0
  for _, t in ipairs(list) do n = n + t:numel() * 4 end
  return n
end

-- Bytes of every tensor in an optimizer's state table.
local function state_bytes(state)
  local n = 0
  for _, s in pairs(state) do
    for _, v in pairs(s) do if type(v) == "userdata" then n = n + v:numel() * (v:dtype() == "float64" and 8 or 4) end end
  end
  return n
end

local function median(v)
  table.sort(v)
  local n = #v
  return n % 2 == 1 and v[(n + 1) // 2] or (v[n // 2] + v[n // 2 + 1]) / 2
end

-- One configuration: returns {params=, grads=, state=, step_ms=, opt_ms=} for this rank.
local function measure(o, mode, rank)
  local net = build(o)
  local zero = mode == "ZeRO"
  local model, opt
  if mode == "DDP" or zero then
    model = crun.DDP(net, {gradient_as_bucket_view = true})
    opt = zero and crun.optim.ZeroRedundancyOptimizer(model, crun.optim.Adam, {lr = 1e-4})
      or crun.optim.Adam(model, {lr = 1e-4})
  else
    model = crun.FSDP(net, {sharding_strategy = mode == "FSDP-SGO" and "SHARD_GRAD_OP" or "FULL_SHARD",
      auto_wrap = {min_params = o.width * o.width}})
    opt = crun.optim.Adam(model, {lr = 1e-4})
  end
  local X = T.randn({o.batch, o.width}, {seed = 100 + rank})
  local Y = T.randn({o.batch, o.width}, {seed = 200 + rank})
  local crit = nn.MSECriterion()
  local steps, opts = {}, {}
  for s = 1, o.warmup + o.steps do
    dist.barrier()
    local t0 = crun.core.clock()
    opt:zero_grad()
    local out = model:forward(X)
    crit:forward(out, Y)
    model:backward(X, crit:backward(out, Y))
    local t1 = crun.core.clock()
    opt:step()
    local t2 = crun.core.clock()
    if s > o.warmup then steps[#steps + 1], opts[#opts + 1] = (t2 - t0) * 1e3, (t2 - t1) * 1e3 end
  end
  local params, grads = model:parameters()
  local r = {params = bytes_of(params), grads = bytes_of(grads),
    state = state_bytes(zero and opt.optim.state or opt.state), steps = steps, opts = opts,
    numel = bytes_of(params) // 4, peak = model.stats.peak_full_bytes or 0}
  if model.close then model:close() end
  return r
end

local o = parse_args(arg)
dist.init_process_group{backend = "auto"}
local rank, world = dist.get_rank(), dist.get_world_size()
local MB = 1024 * 1024
for _, mode in ipairs{"DDP", "ZeRO", "FSDP-SGO", "FSDP-FULL"} do
  local all = dist.all_gather_object(measure(o, mode, rank))
  collectgarbage()
  if rank == 0 then
    local row = {params = 0, grads = 0, state = 0, peak = 0}
    local step, optms = {}, {}
    for i = 1, o.steps do
      step[i], optms[i] = 0, 0
      for _, r in ipairs(all) do
        step[i] = math.max(step[i], r.steps[i])
        optms[i] = math.max(optms[i], r.opts[i])
      end
    end
    for _, r in ipairs(all) do
      for _, k in ipairs{"params", "grads", "state", "peak"} do row[k] = math.max(row[k], r[k]) end
    end
    if mode == "DDP" then
      print(string.format("# %d parameters (%.1f M), float32, Adam, batch %d per rank, median of %d steps",
        all[1].numel, all[1].numel / 1e6, o.batch, o.steps))
      print(string.format("%-5s %-9s %10s %10s %10s %10s %9s %9s %9s", "ranks", "mode", "params MB", "grads MB",
        "optim MB", "total MB", "peak +MB", "step ms", "opt ms"))
    end
    print(string.format("%-5d %-9s %10.1f %10.1f %10.1f %10.1f %9.1f %9.1f %9.1f", world, mode,
      row.params / MB, row.grads / MB, row.state / MB, (row.params + row.grads + row.state) / MB, row.peak / MB,
      median(step), median(optms)))
  end
end
dist.destroy_process_group()

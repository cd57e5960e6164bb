--- jobs/train.lua — trains an MLP classifier with DDP on the project's
-- synthetic spirals data set (crun.data.make_spirals: 4 spiral arms mapped
-- into 16 dimensions; a linear model stays at chance, an MLP gets ~98%).
--
--   crun-lua -n 4 jobs/train.lua                 # what `make demo` runs
--   crun-lua -n 4 --max-restarts 2 jobs/train.lua --ckpt-dir /tmp/run1
--   crun-lua -n 2 jobs/train.lua --bench          # throughput and overlap
--
-- Each epoch: a shuffled DistributedSampler pass with DDP (Adam), a progress
-- bar with loss and throughput on rank 0, an exactly-once distributed
-- evaluation on the held-out set, and an atomic checkpoint. A restarted job
-- (crun-lua --max-restarts) resumes after the last checkpointed epoch.
local crun = require "crun"
local dist, nn, optim, data, T = crun.dist, crun.nn, crun.optim, crun.data, crun.tensor

local DEFAULTS = {
  epochs = 10, ["batch-size"] = 32, lr = 0.01, hidden = 64, layers = 2, samples = 10000,
  ["test-fraction"] = 0.2, dims = 16, classes = 4, seed = 0, ["ckpt-dir"] = nil,
  ["bench-steps"] = 40, ["lr-decay"] = 0.7, ["bucket-cap-mb"] = 25, ["crash-at-epoch"] = nil,
  ["powersgd-rank"] = 1, ["powersgd-start"] = 10, device = "cpu",
  logdir = false, -- --logdir DIR: training curves (crun.metrics) on rank 0
}
local FLAGS = {bench = true, ["no-resume"] = true, quiet = true, ["no-ckpt"] = true, help = true,
  ["flush-denormal"] = true}

local function usage()
  print([[usage: crun-lua -n N jobs/train.lua [options]
  --epochs N (10)  --batch-size B per rank (32)  --lr LR (0.01, Adam)  --lr-decay F per epoch (0.7)
  --hidden H (64)  --layers L hidden layers (2; 0 = linear model)  --samples N data set size (10000)
  --ckpt-dir DIR (checkpoints; default /tmp/crun-train-<user>)  --no-ckpt
  --no-resume  start fresh (a restart by --max-restarts still resumes)
  --bench [--bench-steps N] [--bucket-cap-mb MB]  throughput / overlap measurement
  --crash-at-epoch E   exit rank 1 after epoch E on the first run (to show resume)
  --logdir DIR  rank 0 writes training curves there (crun.metrics: a TensorBoard event file
                and scalars.csv): train/loss and train/step_time per step,
                train/samples_per_s, test/loss and test/accuracy per epoch
  --comm-hook allreduce|fp16|bf16|powersgd  DDP communication hook (crun.comm_hooks)
      [--powersgd-rank R (1)] [--powersgd-start ITER (10)]
  --timeline FILE  a Chrome/Perfetto trace of the run (forward, backward, buckets, collectives per
                   rank; crun.trace), merged by rank 0 at the end with a per-rank summary
  --device cpu|cuda (cpu)  where the model, its gradients (DDP buckets) and the batches live;
                    cuda: this rank's GPU (LOCAL_RANK picks it), all_reduce over NCCL
  --flush-denormal  denormal floats become zero in this job's math (crun.set_flush_denormal;
                    off by default as in torch: IEEE results, but kernels slow down many
                    times when weights or activations drift into the denormal range)]])
end

local function parse_args(argv)
  local o = {}
  for k, v in pairs(DEFAULTS) do o[k] = v end
  local i = 1
  while i <= #argv do
    local k = argv[i]:match("^%-%-(.+)$")
    if not k then error("train.lua: unexpected argument '" .. argv[i] .. "' (see --help)", 0) end
    if FLAGS[k] then
      o[k] = true
    elseif DEFAULTS[k] ~= nil or k == "ckpt-dir" or k == "crash-at-epoch" or k == "comm-hook" or k == "timeline" then
      local v = argv[i + 1] or error("train.lua: --" .. k .. " needs a value", 0)
      o[k] = tonumber(v) or v
      i = i + 1
    else
      error("train.lua: unknown option --" .. k .. " (see --help)", 0)
    end
    i = i + 1
  end
  for _, k in ipairs{"epochs", "batch-size", "hidden", "layers", "samples", "dims", "classes", "seed", "bench-steps",
      "powersgd-rank", "powersgd-start"} do
    local v = math.tointeger(o[k])
    if not v or v < (k == "layers" and 0 or (k == "seed" and math.mininteger or 1)) then
      error(string.format("train.lua: --%s must be a %s integer, got %s", k,
        k == "layers" and "non-negative" or "positive", tostring(o[k])), 0)
    end
    o[k] = v
  end
  return o
end

local config_of

-- --comm-hook: registers one of torch's built-in DDP hooks on `model`.
local function register_hook(o, model)
  local h = crun.comm_hooks
  local name = o["comm-hook"]
  if name == "allreduce" then model:register_comm_hook(nil, h.allreduce_hook)
  elseif name == "fp16" then model:register_comm_hook(nil, h.fp16_compress_hook)
  elseif name == "bf16" then model:register_comm_hook(nil, h.bf16_compress_hook)
  elseif name == "powersgd" then
    model:register_comm_hook(h.PowerSGDState(nil, {matrix_approximation_rank = o["powersgd-rank"],
      start_powerSGD_iter = o["powersgd-start"]}), h.powerSGD_hook)
  else error("train.lua: --comm-hook must be allreduce, fp16, bf16 or powersgd, got " .. tostring(name), 0) end
end

-- The data set as tensors: train and test splits.
local function load_data(o)
  local X, Y = data.make_spirals{n = o.samples, classes = o.classes, dims = o.dims, seed = 1234}
  local ntest = math.floor(o.samples * o["test-fraction"])
  local ntrain = o.samples - ntest
  local function split(a, b)
    local xs, ys = {}, {}
    for i = a, b do xs[#xs + 1], ys[#ys + 1] = X[i], Y[i] end
    return T.new(xs, "float32"), T.new(ys, "int64")
  end
  local Xtr, Ytr = split(1, ntrain)
  local Xte, Yte = split(ntrain + 1, o.samples)
  return Xtr, Ytr, Xte, Yte
end

-- An MLP with `layers` hidden ReLU layers; layers = 0 gives a linear model.
local function build_model(o)
  nn.manual_seed(o.seed)
  return nn.mlp(o.dims, o.hidden, o.layers, o.classes)
end

-- Exactly-once distributed evaluation: each test sample on one rank only.
-- Moves a batch tensor to the job's device (a no-op on the CPU).
local DEVICE = "cpu"
local function dev(t) return DEVICE == "cpu" and t or t:cuda() end

-- A copy of a state tree (tables of tensors) on the host, for crun.save.
local function host_tree(v)
  if type(v) == "table" then
    local c = {}
    for k, x in pairs(v) do c[k] = host_tree(x) end
    return c
  end
  if type(v) == "userdata" and v.cpu then return v:cpu() end
  return v
end

local function evaluate(net, Xte, Yte)
  net:evaluate()
  local crit = nn.CrossEntropyCriterion{reduction = "sum"}
  local m = data.evaluate{size = Xte:size(1), batch_size = 500, metrics = {"correct", "loss_sum"},
    fn = function(idx)
      local out = net:forward(dev(data.gather_rows(Xte, idx)))
      local loss = crit:forward(out, dev(data.gather_rows(Yte, idx)))
      return {correct = crit.correct, loss_sum = loss}
    end}
  net:train()
  if m.count ~= Xte:size(1) then
    error(string.format("evaluation saw %d samples, the test set has %d", m.count, Xte:size(1)), 0)
  end
  return m.correct / m.count, m.loss_sum / m.count
end

local function bar(done, total, width)
  local n = math.floor(width * done / math.max(total, 1) + 0.5)
  return string.rep("#", n) .. string.rep("-", width - n)
end

-- One epoch of training; returns mean loss and samples/s (global).
local function train_epoch(ctx, epoch)
  local o, rank, world = ctx.o, ctx.rank, ctx.world
  ctx.sampler:set_epoch(epoch)
  ctx.opt.opts.lr = o.lr * o["lr-decay"] ^ (epoch - 1)
  local nb = #ctx.loader
  local t0, loss_sum, seen = crun.clock(), 0, 0
  local next_report = 1
  for b, xb, yb in ctx.loader:iter() do
    local t_step = crun.clock()
    xb, yb = dev(xb), dev(yb)
    local out = ctx.model:forward(xb)
    local loss = ctx.crit:forward(out, yb)
    ctx.opt:zero_grad()
    ctx.model:backward(xb, ctx.crit:backward(out, yb))
    ctx.opt:step()
    loss_sum, seen = loss_sum + loss * xb:size(1), seen + xb:size(1)
    if ctx.writer then
      local step = (epoch - 1) * nb + b
      ctx.writer:add_scalar("train/loss", loss, step)
      ctx.writer:add_scalar("train/step_time", crun.clock() - t_step, step)
    end
    if rank == 0 and not o.quiet and (b * 4 >= next_report * nb or b == nb) then
      next_report = next_report + 1
      local rate = seen * world / math.max(crun.clock() - t0, 1e-9)
      print(string.format("epoch %d/%d [%s] %3d/%d loss %.4f  %.0f samples/s", epoch, o.epochs,
        bar(b, nb, 24), b, nb, loss_sum / seen, rate))
    end
  end
  return loss_sum / math.max(seen, 1), seen * world / (crun.clock() - t0)
end

local function ckpt_path(o)
  local dir = o["ckpt-dir"] or ("/tmp/crun-train-" .. (os.getenv("USER") or "user"))
  if not o["no-ckpt"] then os.execute("mkdir -p '" .. dir .. "'") end -- --no-ckpt: nothing on disk
  return dir .. "/train.crun"
end

-- What evaluate.lua needs to rebuild the model and the test split.
function config_of(o)
  local c = {hidden = o.hidden, layers = o.layers, dims = o.dims, classes = o.classes,
    samples = o.samples, test_fraction = o["test-fraction"], data_seed = 1234}
  c.key = string.format("%d/%d/%d/%d/%d/%g", c.hidden, c.layers, c.dims, c.classes, c.samples, c.test_fraction)
  return c
end

-- Loads the checkpoint (if any) into net and opt; returns the next epoch.
local function resume(o, net, opt, path)
  local restarted = (tonumber(os.getenv("CRUN_RESTART_COUNT") or "0") or 0) > 0
  if (o["no-resume"] and not restarted) or o["no-ckpt"] or not crun.serialize.exists(path) then return 1 end
  local ck = crun.load(path)
  if type(ck.config) ~= "table" or ck.config.key ~= config_of(o).key then return 1 end
  if ck.epoch >= o.epochs then return 1 end -- that run finished: start a new one
  net:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  return ck.epoch + 1, ck
end

local function save(o, ctx, epoch, acc, path)
  if o["no-ckpt"] then return end
  if ctx.rank == 0 then
    crun.save(path, {epoch = epoch, model = host_tree(ctx.net:state_dict()), optim = host_tree(ctx.opt:state_dict()),
      accuracy = acc, config = config_of(o)})
  end
  dist.barrier()
end

local function train(o)
  local rank, world = dist.get_rank(), dist.get_world_size()
  local t_start = crun.clock()
  local Xtr, Ytr, Xte, Yte = load_data(o)
  local net = build_model(o):to(DEVICE)
  local opt = optim.Adam(net, {lr = o.lr})
  local path = ckpt_path(o)
  local first, ck = resume(o, net, opt, path)
  local model = crun.DDP(net, {bucket_cap_mb = o["bucket-cap-mb"]})
  if o["comm-hook"] then register_hook(o, model) end
  local sampler = data.DistributedSampler{size = Xtr:size(1), shuffle = true, seed = o.seed}
  local ctx = {o = o, rank = rank, world = world, net = net, model = model, opt = opt, sampler = sampler,
    crit = nn.CrossEntropyCriterion(),
    loader = data.DataLoader{dataset = {Xtr, Ytr}, batch_size = o["batch-size"], sampler = sampler}}
  if rank == 0 then
    print(string.format("spirals: %d train / %d test samples, %d dims, %d classes; MLP %d params on %s; %d ranks x batch %d%s",
      Xtr:size(1), Xte:size(1), o.dims, o.classes, net:num_parameters(), DEVICE, world, o["batch-size"],
      ck and string.format("; resumed after epoch %d from %s", ck.epoch, path) or ""))
  end
  -- --logdir: training curves on rank 0 (a TensorBoard event file and a CSV)
  local writer <close> = rank == 0 and o.logdir and crun.metrics.SummaryWriter(tostring(o.logdir)) or nil
  ctx.writer = writer
  local acc, tloss = ck and ck.accuracy or 0, 0
  for epoch = first, o.epochs do
    local loss, rate = train_epoch(ctx, epoch)
    acc, tloss = evaluate(net, Xte, Yte)
    if writer then
      local step = epoch * #ctx.loader
      writer:add_scalar("train/samples_per_s", rate, step)
      writer:add_scalar("test/loss", tloss, step)
      writer:add_scalar("test/accuracy", acc, step)
      writer:flush()
    end
    if rank == 0 then
      print(string.format("epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.0f samples/s",
        epoch, o.epochs, loss, tloss, 100 * acc, rate))
    end
    save(o, ctx, epoch, acc, path)
    if o["crash-at-epoch"] == epoch and rank == 1 and (os.getenv("CRUN_RESTART_COUNT") or "0") == "0" then
      print("simulating a crash after epoch " .. epoch)
      os.exit(3)
    end
  end
  if rank == 0 then
    print(string.format("final test accuracy %.2f%% (%d test samples, each evaluated once over %d ranks) in %.1f s",
      100 * acc, Xte:size(1), world, crun.clock() - t_start))
  end
  return acc
end

-- Mean step time of `steps` training steps with `model`, averaged over
-- ranks (ranks that finish first must not count the CPU time their waiting
-- in the final collective takes from the others).
local function time_steps(ctx, model, steps)
  local xb = ctx.Xtr:narrow(1, 1, ctx.o["batch-size"]):contiguous()
  local yb = ctx.Ytr:narrow(1, 1, ctx.o["batch-size"]):contiguous()
  local crit = nn.CrossEntropyCriterion()
  dist.barrier()
  local t0 = crun.clock()
  for _ = 1, steps do
    local out = model:forward(xb)
    crit:forward(out, yb)
    ctx.opt:zero_grad()
    model:backward(xb, crit:backward(out, yb))
    ctx.opt:step()
  end
  local t = T.full({1}, (crun.clock() - t0) / steps, "float64")
  dist.all_reduce(t, "sum")
  return t[1] / dist.get_world_size()
end

local function minimum(l)
  local m = math.huge
  for _, v in ipairs(l) do m = math.min(m, v) end
  return m
end

-- --bench: step time without communication, with DDP all-reduce after
-- backward (no overlap), and with DDP overlapping backward; the three are
-- measured in 7 alternating rounds and the fastest round of each counts, so
-- that load from other processes on a shared machine disturbs them least.
local function bench(o)
  local rank, world = dist.get_rank(), dist.get_world_size()
  local Xtr, Ytr = load_data(o)
  local net = build_model(o)
  local ctx = {o = o, Xtr = Xtr, Ytr = Ytr, opt = optim.SGD(net, {lr = 1e-3})}
  local steps = o["bench-steps"]
  local seq = crun.DDP(net, {bucket_cap_mb = o["bucket-cap-mb"], overlap = false})
  local ddp = crun.DDP(net, {bucket_cap_mb = o["bucket-cap-mb"]})
  local modes, times = {net, seq, ddp}, {{}, {}, {}}
  for _, m in ipairs(modes) do time_steps(ctx, m, math.max(1, steps // 4)) end -- warm up
  for _ = 1, 7 do
    for k, m in ipairs(modes) do times[k][#times[k] + 1] = time_steps(ctx, m, steps) end
  end
  local t_local, t_seq, t_ddp = minimum(times[1]), minimum(times[2]), minimum(times[3])
  if rank == 0 then
    local comm = t_seq - t_local
    local hidden = comm > 0 and math.max(0, math.min(1, (t_seq - t_ddp) / comm)) or 0
    print(string.format("bench: %d ranks, %d params (%.1f MB), %d buckets (cap %g MB), batch %d/rank, best of 7 rounds of %d steps",
      world, net:num_parameters(), net:num_parameters() * 4 / 2 ^ 20, #ddp.buckets, o["bucket-cap-mb"],
      o["batch-size"], steps))
    print(string.format("  step time: no comm %.3f ms | DDP, all-reduce after backward %.3f ms | DDP overlapped %.3f ms",
      1e3 * t_local, 1e3 * t_seq, 1e3 * t_ddp))
    if world == 1 then
      print(string.format("  DDP: %.0f samples/s; one rank: DDP communicates nothing, overlap n/a",
        o["batch-size"] / t_ddp))
    else
      print(string.format("  DDP overlapped: %.0f samples/s; all-reduce %.3f ms/step, %.0f%% of it hidden behind backward",
        world * o["batch-size"] / t_ddp, 1e3 * comm, 100 * hidden))
    end
  end
end

local o = parse_args(arg or {})
if o.help then usage() return end
if o.device ~= "cpu" and o.device ~= "cuda" then error("train.lua: --device must be cpu or cuda, got " .. tostring(o.device), 0) end
if o.device == "cuda" then
  if not crun.cuda.is_available() then
    error("ENOTSUP: train.lua --device cuda: " .. tostring(crun.cuda.unavailable_reason()), 0)
  end
  if o.bench then error("train.lua: --bench runs on the CPU only", 0) end
  DEVICE = "cuda"
end
if o["flush-denormal"] then crun.set_flush_denormal(true) end
crun.core.blas_threads() -- cores / ranks on this host: no oversubscription
if o.timeline then crun.trace.start(tostring(o.timeline)) end -- before init: the clocks get aligned there
dist.init_process_group{backend = "auto"}
if o.bench then bench(o) else train(o) end
if o.timeline then
  local summary = crun.trace.finish(tostring(o.timeline))
  if summary then print(summary) end
end
dist.destroy_process_group()

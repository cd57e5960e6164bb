--- jobs/digits.lua — a small CNN on the UCI handwritten digits (1,797 8x8
-- images, sklearn's digits.csv.gz from Debian's python3-sklearn; fetch it
-- once with scripts/fetch_digits.sh), trained with DDP or FSDP.
--
--   scripts/fetch_digits.sh                      # once: the data file
--   crun-lua -n 4 jobs/digits.lua                # DDP
--   crun-lua -n 4 jobs/digits.lua --fsdp         # FSDP (FULL_SHARD)
--
-- Model: Conv2d(1,16,3,pad 1)-BatchNorm2d-ReLU-Conv2d(16,32,3,pad 1)-
-- BatchNorm2d-ReLU-MaxPool2d(2)-Flatten-Linear(512,64)-ReLU-Linear(64,10),
-- Adam. A fixed seeded train/test split (crun.data.train_test_split); the
-- global batch is split over the ranks, so 1 and 4 ranks see the same
-- number of samples per step. At the end: test accuracy (every test image
-- evaluated once over the ranks), a per-class table and a confusion matrix.
local crun = require "crun"
local dist, nn, optim, data, T = crun.dist, crun.nn, crun.optim, crun.data, crun.tensor

local DEFAULTS = {epochs = 20, ["batch-size"] = 64, lr = 0.003, ["lr-decay"] = 0.85, seed = 0, ["split-seed"] = 2024,
  ["test-fraction"] = 0.25, strategy = "FULL_SHARD", data = nil}
local FLAGS = {fsdp = true, ["sync-bn"] = true, quiet = true, help = true}

local function usage()
  print([[usage: crun-lua -n N jobs/digits.lua [options]
  --epochs N (20)  --batch-size B global, split over the ranks (64)  --lr LR (0.003, Adam)
  --lr-decay F per epoch (0.85)  --seed S model init (0)  --split-seed S train/test split (2024)
  --test-fraction F (0.25)  --data PATH (default: crun.data.digits_path(), see scripts/fetch_digits.sh)
  --fsdp [--strategy FULL_SHARD|SHARD_GRAD_OP|NO_SHARD]  FSDP instead of DDP
  --sync-bn  SyncBatchNorm (batch statistics over every rank) instead of BatchNorm
  --quiet  only the final lines]])
end

local function parse_args(argv)
  local o = {}
  for k, v in pairs(DEFAULTS) do o[k] = v end
  local i = 1
  while i <= #argv do
    local k = argv[i]:match("^%-%-(.+)$")
    if not k then error("digits.lua: unexpected argument '" .. argv[i] .. "' (see --help)", 0) end
    if FLAGS[k] then o[k] = true
    elseif DEFAULTS[k] ~= nil or k == "data" then
      local v = argv[i + 1] or error("digits.lua: --" .. k .. " needs a value", 0)
      o[k] = tonumber(v) or v
      i = i + 1
    else error("digits.lua: unknown option --" .. k .. " (see --help)", 0) end
    i = i + 1
  end
  for _, k in ipairs{"epochs", "batch-size", "seed", "split-seed"} do
    if not math.tointeger(o[k]) or (k ~= "seed" and k ~= "split-seed" and o[k] < 1) then
      error(string.format("digits.lua: --%s must be a positive integer, got %s", k, tostring(o[k])), 0)
    end
  end
  return o
end

local function build_model(o)
  nn.manual_seed(o.seed)
  local net = nn.Sequential(
    nn.Conv2d(1, 16, 3, {padding = 1}), nn.BatchNorm2d(16), nn.ReLU(),
    nn.Conv2d(16, 32, 3, {padding = 1}), nn.BatchNorm2d(32), nn.ReLU(),
    nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
  if o["sync-bn"] then net = nn.SyncBatchNorm.convert(net) end
  return net
end

-- Exactly-once evaluation; returns accuracy, mean loss and the 10x10
-- confusion counts (conf[true][predicted], summed over ranks).
local function evaluate(net, Xte, Yte)
  net:evaluate()
  local crit = nn.CrossEntropyCriterion{reduction = "sum"}
  local conf = T.zeros({10, 10}, "float64")
  local m = data.evaluate{size = Xte:size(1), batch_size = 256, metrics = {"correct", "loss_sum"},
    fn = function(idx)
      local y = data.gather_rows(Yte, idx)
      local out = net:forward(data.gather_rows(Xte, idx))
      local loss = crit:forward(out, y)
      for i = 1, #idx do
        local best, row = 1, out[i]
        for j = 2, 10 do if row[j] > row[best] then best = j end end
        conf[y[i]][best] = conf[y[i]][best] + 1
      end
      return {correct = crit.correct, loss_sum = loss}
    end}
  dist.all_reduce(conf, "sum")
  net:train()
  if m.count ~= Xte:size(1) then
    error(string.format("evaluation saw %d samples, the test set has %d", m.count, Xte:size(1)), 0)
  end
  return m.correct / m.count, m.loss_sum / m.count, conf
end

local function report(conf)
  print("class  support  correct  precision  recall")
  for c = 1, 10 do
    local tp, support, predicted = conf[c][c], 0, 0
    for k = 1, 10 do support, predicted = support + conf[c][k], predicted + conf[k][c] end
    print(string.format("  %d    %5d    %5d    %6.2f%%  %6.2f%%", c - 1, support, tp,
      predicted > 0 and 100 * tp / predicted or 0, support > 0 and 100 * tp / support or 0))
  end
  print("confusion matrix (rows: true digit, columns: predicted digit)")
  local head = {"     "}
  for c = 0, 9 do head[#head + 1] = string.format("%4d", c) end
  print(table.concat(head))
  for r = 1, 10 do
    local line = {string.format("  %d: ", r - 1)}
    for c = 1, 10 do line[#line + 1] = string.format("%4d", math.tointeger(conf[r][c]) or conf[r][c]) end
    print(table.concat(line))
  end
end

local function main(o)
  local rank, world = dist.get_rank(), dist.get_world_size()
  local t_start = crun.clock()
  local X, Y, info = data.load_digits{path = o.data, image = true}
  local train_idx, test_idx = data.train_test_split(info.n, o["test-fraction"], o["split-seed"])
  local Xtr, Ytr = data.gather_rows(X, train_idx), data.gather_rows(Y, train_idx)
  local Xte, Yte = data.gather_rows(X, test_idx), data.gather_rows(Y, test_idx)
  if o["batch-size"] % world ~= 0 then
    error(string.format("digits.lua: the global batch %d does not split over %d ranks", o["batch-size"], world), 0)
  end
  local net = build_model(o)
  local nparams = net:num_parameters()
  local model, mode
  if o.fsdp then
    model = crun.FSDP(net, {sharding_strategy = o.strategy, auto_wrap = {min_params = 4000}})
    mode = "FSDP " .. o.strategy
  else
    model, mode = crun.DDP(net), "DDP"
  end
  local opt = optim.Adam(model, {lr = o.lr})
  local sampler = data.DistributedSampler{size = Xtr:size(1), shuffle = true, seed = o.seed}
  local loader = data.DataLoader{dataset = {Xtr, Ytr}, batch_size = o["batch-size"] // world, sampler = sampler}
  local crit = nn.CrossEntropyCriterion()
  if rank == 0 then
    print(string.format("digits: %d images from %s, %d train / %d test (split seed %d); CNN %d params; %s on %d ranks, global batch %d",
      info.n, info.path, Xtr:size(1), Xte:size(1), o["split-seed"], nparams, mode, world, o["batch-size"]))
  end
  local acc, tloss, conf
  for epoch = 1, o.epochs do
    sampler:set_epoch(epoch)
    opt.opts.lr = o.lr * o["lr-decay"] ^ (epoch - 1)
    local loss_sum, seen = 0, 0
    for _, xb, yb in loader:iter() do
      local out = model:forward(xb)
      local loss = crit:forward(out, yb)
      opt:zero_grad()
      model:backward(xb, crit:backward(out, yb))
      opt:step()
      loss_sum, seen = loss_sum + loss * xb:size(1), seen + xb:size(1)
    end
    -- every rank evaluates with rank 0's BatchNorm statistics (DDP broadcasts them before
    -- each training forward, then each rank's last batch moved its own; FSDP never does)
    for _, b in ipairs(net:buffers()) do dist.broadcast(b, 0) end
    acc, tloss, conf = evaluate(net, Xte, Yte)
    if rank == 0 and not o.quiet then
      print(string.format("epoch %2d/%d: train loss %.4f, test loss %.4f, test accuracy %.2f%%", epoch, o.epochs,
        loss_sum / math.max(seen, 1), tloss, 100 * acc))
    end
  end
  if rank == 0 then
    report(conf)
    print(string.format("final test accuracy %.2f%% (%d test images, %s, %d ranks) in %.1f s", 100 * acc,
      Xte:size(1), mode, world, crun.clock() - t_start))
  end
  return acc
end

local o = parse_args(arg or {})
if o.help then usage() return end
crun.core.blas_threads()
dist.init_process_group{backend = "auto"}
main(o)
if o.fsdp then dist.barrier() end
dist.destroy_process_group()

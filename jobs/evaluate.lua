--- jobs/evaluate.lua — evaluates a checkpoint of jobs/train.lua on N ranks.
--
--   crun-lua -n 4 jobs/evaluate.lua [--ckpt /tmp/crun-train-$USER/train.crun] [--batch-size 500]
--
-- Rebuilds the model from the configuration stored in the checkpoint,
-- regenerates the same held-out split of the spirals data set, and evaluates
-- it exactly once over all ranks (crun.data.evaluate: no padded duplicates),
-- combining the counts with all_reduce. Prints accuracy, mean loss and the
-- per-class accuracy on rank 0.
local crun = require "crun"
local dist, nn, data, T = crun.dist, crun.nn, crun.data, crun.tensor

local function parse_args(argv)
  local o = {ckpt = "/tmp/crun-train-" .. (os.getenv("USER") or "user") .. "/train.crun", ["batch-size"] = 500}
  local i = 1
  while i <= #argv do
    local k = argv[i]:match("^%-%-(.+)$")
    if k == "help" then o.help = true
    elseif k == "ckpt" or k == "batch-size" then
      o[k] = argv[i + 1] or error("evaluate.lua: --" .. k .. " needs a value", 0)
      i = i + 1
    else error("evaluate.lua: unknown argument '" .. argv[i] .. "' (see --help)", 0) end
    i = i + 1
  end
  o["batch-size"] = math.tointeger(tonumber(o["batch-size"])) or error("evaluate.lua: --batch-size must be an integer", 0)
  return o
end

-- The held-out split of the data set the checkpoint was trained on.
local function test_split(c)
  local X, Y = data.make_spirals{n = c.samples, classes = c.classes, dims = c.dims, seed = c.data_seed}
  local ntest = math.floor(c.samples * c.test_fraction)
  local xs, ys = {}, {}
  for i = c.samples - ntest + 1, c.samples do xs[#xs + 1], ys[#ys + 1] = X[i], Y[i] end
  return T.new(xs, "float32"), T.new(ys, "int64")
end

-- The architecture of jobs/train.lua (both use nn.mlp).
local function build_model(c)
  return nn.mlp(c.dims, c.hidden, c.layers, c.classes)
end

local o = parse_args(arg or {})
if o.help then
  print("usage: crun-lua -n N jobs/evaluate.lua [--ckpt PATH] [--batch-size B]")
  return
end
dist.init_process_group{backend = "auto"}
local rank, world = dist.get_rank(), dist.get_world_size()
local ck = crun.load(o.ckpt)
local c = ck.config
if type(c) ~= "table" or not c.hidden then
  error(string.format("evaluate.lua on rank %d: %s is not a jobs/train.lua checkpoint", rank, o.ckpt), 0)
end
local net = build_model(c)
net:load_state_dict(ck.model)
net:evaluate()
local Xte, Yte = test_split(c)
local metrics = {"correct", "loss_sum"}
for k = 1, c.classes do metrics[#metrics + 1] = "n" .. k; metrics[#metrics + 1] = "ok" .. k end
local crit = nn.CrossEntropyCriterion{reduction = "sum"}
local t0 = crun.clock()
local m = data.evaluate{size = Xte:size(1), batch_size = o["batch-size"], metrics = metrics, fn = function(idx)
  local out = net:forward(data.gather_rows(Xte, idx))
  local loss = crit:forward(out, data.gather_rows(Yte, idx))
  local r = {correct = crit.correct, loss_sum = loss}
  for k = 1, c.classes do r["n" .. k], r["ok" .. k] = 0, 0 end
  for j, i in ipairs(idx) do
    local y, best = Yte[i], 1
    for k = 2, c.classes do if out[j][k] > out[j][best] then best = k end end
    r["n" .. y] = r["n" .. y] + 1
    if best == y then r["ok" .. y] = r["ok" .. y] + 1 end
  end
  return r
end}
if rank == 0 then
  print(string.format("checkpoint %s (epoch %d): %d test samples evaluated once over %d ranks in %.2f s",
    o.ckpt, ck.epoch or 0, math.tointeger(m.count), world, crun.clock() - t0))
  print(string.format("accuracy %.2f%%  mean loss %.4f", 100 * m.correct / m.count, m.loss_sum / m.count))
  for k = 1, c.classes do
    print(string.format("  class %d: %.2f%% of %d", k, 100 * m["ok" .. k] / math.max(m["n" .. k], 1),
      math.tointeger(m["n" .. k])))
  end
end
dist.destroy_process_group()

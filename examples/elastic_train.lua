--- examples/elastic_train.lua — DDP training that survives a change of world size.
--
--   export CRUN_TOKEN=...   # the same on every node
--   crun-lua --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 \
--            -n 1 examples/elastic_train.lua --ckpt /shared/job7.crun        # on each node
--
-- Trains an MLP on the spirals data set with DDP (Adam), checkpointing every
-- --ckpt-every steps and at the end of each epoch. A checkpoint holds the
-- model, the optimizer state, the sampler's state (epoch, seed and the
-- global samples of the epoch consumed: DistributedSampler:state_dict) and
-- which samples went into the model in each epoch, with the world size that
-- took them. When a node joins or is lost, crun-lua stops every worker and
-- starts them again in a world of the new size (a new rendezvous round);
-- they load the checkpoint, and the sampler hands the rest of the
-- interrupted epoch out across the new world (load_state_dict), so no sample
-- of that epoch is repeated or skipped. Steps taken after the last
-- checkpoint are lost with the old world and taken again. The last
-- checkpoint is marked finished: a new crun-lua job that finds it (run again
-- with the same run id, so the same default --ckpt) trains afresh and says
-- so; only a restart or a new round of the job that wrote it resumes it.
--
-- Options: --epochs 3 --samples 240 --batch 4 (per rank) --ckpt-every 2
-- --lr 0.02 --seed 7 --step-delay S (sleep after each step, to watch it)
-- --ckpt PATH (default /tmp/crun-elastic-<run id>.crun) --record FILE (rank 0
-- writes "epoch index world" for every sample consumed, at the end).
local crun = require "crun"
local nn, optim, T, dist, data = crun.nn, crun.optim, crun.tensor, crun.dist, crun.data

local o = {epochs = 3, samples = 240, batch = 4, ["ckpt-every"] = 2, lr = 0.02, seed = 7, ["step-delay"] = 0,
           ckpt = "/tmp/crun-elastic-" .. (os.getenv("TORCHELASTIC_RUN_ID") or "none") .. ".crun"}
-- what each numeric option takes: a whole number >= its minimum, or a real number > 0 / >= 0
local whole = {epochs = 1, samples = 1, batch = 1, ["ckpt-every"] = 1, seed = -math.maxinteger}
local function bad(opt, v, want) error(string.format("EINVAL: elastic_train.lua: --%s: expected %s, got '%s'", opt, want, v), 0) end
local i = 1
while arg[i] do
  local k = arg[i]:match("^%-%-(.+)$")
  if not k or o[k] == nil and k ~= "record" then error("EINVAL: elastic_train.lua: unknown argument " .. arg[i], 0) end
  local v = arg[i + 1] or error("EINVAL: elastic_train.lua: " .. arg[i] .. " needs a value", 0)
  if type(o[k]) == "number" then
    local x = tonumber(v)
    if whole[k] then
      x = math.tointeger(x)
      if not x or x < whole[k] then bad(k, v, whole[k] == 1 and "a whole number >= 1" or "a whole number") end
    elseif not x or x ~= x or x == math.huge or x < 0 or (k == "lr" and x == 0) then
      bad(k, v, k == "lr" and "a number > 0" or "a number >= 0")
    end
    v = x
  end
  o[k] = v
  i = i + 2
end

dist.init_process_group{backend = "auto"}
local rank, world = dist.get_rank(), dist.get_world_size()
local X, Y = data.make_spirals{n = o.samples, classes = 3, dims = 2, seed = 1234}
local Xt, Yt = T.new(X, "float32"), T.new(Y, "int64")

nn.manual_seed(o.seed)
local net = nn.mlp(2, 32, 1, 3)
local opt = optim.Adam(net, {lr = o.lr})
local sampler = data.DistributedSampler{size = o.samples, shuffle = true, seed = o.seed}
local seen = {} -- seen[epoch] = {{index, world}, ...}, in the order the samples were consumed
local first = 1
-- the first attempt of this crun-lua job: no restart yet, and round 0 of a c10d
-- job (its CRUN_STORE_PREFIX ends in the round number)
local launched = os.getenv("TORCHELASTIC_RESTART_COUNT") == "0" and
                 not (os.getenv("CRUN_STORE_PREFIX") or ""):match("/[1-9]%d*$")
local ck = crun.serialize.exists(o.ckpt) and crun.load(o.ckpt) or nil
if ck and ck.finished and launched then
  if rank == 0 then
    print(string.format("%s holds a finished run (%d epochs): training afresh (another --ckpt keeps it)", o.ckpt,
                        ck.sampler.epoch))
  end
  ck = nil
end
if ck then
  net:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  sampler:load_state_dict(ck.sampler)
  seen = ck.seen
  first = ck.sampler.epoch + (ck.sampler.consumed >= o.samples and 1 or 0)
  if rank == 0 then
    print(string.format("resumed at epoch %d after %d of its %d samples, world size %d (restart count %s)", first,
                        first == ck.sampler.epoch and ck.sampler.consumed or 0, o.samples, world,
                        os.getenv("TORCHELASTIC_RESTART_COUNT")))
  end
end
local model = crun.DDP(net)
local crit = nn.CrossEntropyCriterion()

-- Saves model, optimizer, sampler state and the samples every rank took
-- since the last checkpoint (gathered: the ranks took `pending` in step).
local function checkpoint(epoch, taken, pending)
  local all = dist.all_gather_object(pending)
  if rank == 0 then
    seen[epoch] = seen[epoch] or {}
    for _, list in ipairs(all) do
      for _, idx in ipairs(list) do table.insert(seen[epoch], {idx, world}) end
    end
    local st = sampler:state_dict(taken)
    crun.save(o.ckpt, {model = net:state_dict(), optim = opt:state_dict(), sampler = st, seen = seen,
                       finished = epoch == o.epochs and st.consumed >= o.samples})
    print(string.format("checkpoint epoch %d consumed %d/%d world %d", epoch, st.consumed, o.samples, world))
    io.stdout:flush()
  end
  dist.barrier()
end

local loss = 0
for epoch = first, o.epochs do
  sampler:set_epoch(epoch) -- the resumed epoch keeps its consumed part
  local idx = sampler:indices()
  local nb = (#idx + o.batch - 1) // o.batch
  local taken, pending = 0, {}
  for b = 1, nb do
    local sel = {}
    for k = (b - 1) * o.batch + 1, math.min(b * o.batch, #idx) do sel[#sel + 1] = idx[k] end
    local xb, yb = data.gather_rows(Xt, sel), data.gather_rows(Yt, sel)
    local out = model:forward(xb)
    loss = crit:forward(out, yb)
    opt:zero_grad()
    model:backward(xb, crit:backward(out, yb))
    opt:step()
    taken = taken + #sel
    for _, v in ipairs(sel) do pending[#pending + 1] = v end
    if b % o["ckpt-every"] == 0 or b == nb then
      checkpoint(epoch, taken, pending)
      pending = {}
    end
    if o["step-delay"] > 0 then os.execute(string.format("sleep %.3f", o["step-delay"])) end
  end
end

if rank == 0 then
  local out = net:forward(Xt)
  local full = nn.CrossEntropyCriterion()
  local l = full:forward(out, Yt)
  print(string.format("done: %d epochs, world size %d, loss %.4f, accuracy %.1f%%", o.epochs, world, l,
                      100 * full.correct / o.samples))
  if o.record then
    local f = assert(io.open(o.record, "w"))
    for e = 1, o.epochs do
      for _, s in ipairs(seen[e] or {}) do f:write(string.format("%d %d %d\n", e, s[1], s[2])) end
    end
    f:close()
  end
end
dist.destroy_process_group()

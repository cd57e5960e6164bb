-- Multi-rank job of comm_hook_spec.lua:
--   crun-lua -n W spec/helpers/comm_hook_job.lua OUTDIR
-- Every rank runs each case and saves what it saw (errors measured against
-- values computed here with plain Lua arithmetic, messages) to
-- OUTDIR/r<rank>.crun; the spec asserts on every rank's record.
package.path = (os.getenv("CRUN_SOURCE_DIR") or ".") .. "/spec/?.lua;" .. package.path
local crun = require "crun"
local nn = require "crun.nn"
local util = require "helpers.train_util"
local hooks = crun.comm_hooks
local T = crun.tensor

local out = assert(arg[1], "usage: comm_hook_job.lua OUTDIR")
crun.dist.init_process_group{backend = "auto"}
local rank, world = crun.dist.get_rank(), crun.dist.get_world_size()
local rec = {rank = rank, world = world}

-- 60 + 6 + 36 + 6 + 12 + 2 = 122 parameters in three buckets (small caps).
local function model(dtype, seed)
  nn.set_default_dtype(dtype)
  nn.manual_seed(seed)
  local m = nn.Sequential(nn.Linear(10, 6), nn.Tanh(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
  nn.set_default_dtype("float32")
  return m
end

local function ddp_of(dtype, o)
  local net = model(dtype, 3)
  return net, crun.DDP(net, {first_bucket_mb = 100 / 2 ^ 20, bucket_cap_mb = 300 / 2 ^ 20,
    gradient_as_bucket_view = o and o.view})
end

-- One forward/backward on this rank's batch of step s (signed inputs).
local function fwd_bwd(ddp, dtype, s)
  local X = T.randn({5, 10}, {seed = 7919 * s + 104729 * rank + 11, dtype = dtype})
  local y = T.new({(s + rank) % 2 + 1, (s + 2 * rank) % 2 + 1, 1, 2, (s * rank) % 2 + 1}, "int64")
  local crit = nn.CrossEntropyCriterion()
  local o = ddp:forward(X)
  crit:forward(o, y)
  ddp:backward(X, crit:backward(o, y))
end

local function grads_of(net)
  local _, g = net:parameters()
  local l = {}
  for i, t in ipairs(g) do l[i] = util.list(t) end
  return l
end

-- Largest |a - b| and largest |a| over lists of lists.
local function abs_err(a, b)
  local e, m = 0, 0
  for i = 1, #a do
    for j = 1, #a[i] do
      e = math.max(e, math.abs(a[i][j] - b[i][j]))
      m = math.max(m, math.abs(a[i][j]))
    end
  end
  return e, m
end

-- allreduce_hook: k SGD steps equal plain DDP's (float64).
do
  local n1, d1 = ddp_of("float64")
  local n2, d2 = ddp_of("float64")
  d2:register_comm_hook(nil, hooks.allreduce_hook)
  local o1, o2 = crun.optim.SGD(d1, {lr = 0.1}), crun.optim.SGD(d2, {lr = 0.1})
  local gerr = 0
  for s = 1, 3 do
    o1:zero_grad(); o2:zero_grad()
    fwd_bwd(d1, "float64", s); fwd_bwd(d2, "float64", s)
    gerr = math.max(gerr, (abs_err(grads_of(n1), grads_of(n2))))
    o1:step(); o2:step()
  end
  local perr = 0
  for i, p in ipairs(n1:parameters()) do perr = math.max(perr, util.max_rel_err(p, n2:parameters()[i])) end
  rec.allreduce = {grad_err = gerr, param_err = perr, buckets = #d2.buckets}
end

-- fp16 / bf16 compression: one backward against plain DDP's gradients.
for _, c in ipairs{{"fp16", hooks.fp16_compress_hook}, {"bf16", hooks.bf16_compress_hook},
                   {"fp16_view", hooks.fp16_compress_hook, true}} do
  local n1, d1 = ddp_of("float32")
  local n2, d2 = ddp_of("float32", {view = c[3]})
  d2:register_comm_hook(nil, c[2])
  fwd_bwd(d1, "float32", 1); fwd_bwd(d2, "float32", 1)
  local e, m = abs_err(grads_of(n1), grads_of(n2))
  rec[c[1]] = {err = e, max = m}
end

-- A stand-in GradBucket over `buf` whose gradients are `views`.
local function bucket_of(buf, views, index, last)
  return {buffer = function() return buf end, index = function() return index end,
    is_last = function() return last end, gradients = function() return views end}
end

-- PowerSGD on low-rank gradients: each rank's 12x10 matrix is
-- sum_j u_j (v_j + rank w_j)^T (rank R), so the average has rank R and
-- PowerSGD of rank R reproduces it; the 7-element vector is averaged as is.
local N, M, V = 12, 10, 7
local function u(j, i) return math.sin(1.3 * i + 0.7 * j) + 0.1 * j end
local function v(j, k) return math.cos(0.9 * k - 0.4 * j) - 0.05 * k end
local function w(j, k) return ((k * 7 + j * 3) % 11) / 11 - 0.45 end
local function mat_val(R, r, i, k)
  local s = 0
  for j = 1, R do s = s + u(j, i) * (v(j, k) + r * w(j, k)) end
  return s
end
local function vec_val(r, i) return (i - 4) * 0.37 + r * 1.25 - 0.01 * i * i end
-- average over the ranks, by hand
local function avg_of(f)
  local s = 0
  for r = 0, world - 1 do s = s + f(r) end
  return s / world
end

local function lowrank_case(R, iters)
  local st = hooks.PowerSGDState(nil, {matrix_approximation_rank = R, start_powerSGD_iter = 0})
  local res = {err = 0, feedback_err = 0}
  for it = 1, iters do
    local buf = T.zeros({N * M + V}, "float64")
    local mat, vec = buf:narrow(1, 1, N * M):view(N, M), buf:narrow(1, N * M + 1, V)
    for i = 1, N do for k = 1, M do mat[i][k] = mat_val(R, rank, i - 1, k - 1) end end
    for i = 1, V do vec[i] = vec_val(rank, i) end
    local fed = st.errors[0] and util.list(st.errors[0]) or nil
    local got = hooks.powerSGD_hook(st, bucket_of(buf, {mat, vec}, 0, true)):wait()
    assert(rawequal(got, buf), "the hook's value is its bucket")
    local flat = util.list(buf)
    for i = 1, N do
      for k = 1, M do
        local want = avg_of(function(r) return mat_val(R, r, i - 1, k - 1) end)
        res.err = math.max(res.err, math.abs(flat[(i - 1) * M + k] - want))
      end
    end
    for i = 1, V do
      res.err = math.max(res.err, math.abs(flat[N * M + i] - avg_of(function(r) return vec_val(r, i) end)))
    end
    -- error feedback: what this rank gave (its values plus last iteration's
    -- error) minus what came back
    local e = util.list(st.errors[0])
    for idx = 1, N * M + V do
      local mine
      if idx <= N * M then mine = mat_val(R, rank, (idx - 1) // M, (idx - 1) % M)
      else mine = vec_val(rank, idx - N * M) end
      local given = mine + (fed and fed[idx] or 0)
      res.feedback_err = math.max(res.feedback_err, math.abs(e[idx] - (given - flat[idx])))
    end
  end
  res.iter = st.iter
  return res
end
rec.powersgd_rank1 = lowrank_case(1, 2)
rec.powersgd_rank2 = lowrank_case(2, 2)

-- A full-rank matrix with rank 1 is NOT reproduced (the test can fail).
do
  local st = hooks.PowerSGDState(nil, {matrix_approximation_rank = 1, start_powerSGD_iter = 0})
  local buf = T.zeros({N * M}, "float64")
  for i = 1, N * M do buf[i] = math.sin(i * 1.7 + rank) * ((i % 5) - 2) end
  local want = {}
  for i = 1, N * M do want[i] = avg_of(function(r) return math.sin(i * 1.7 + r) * ((i % 5) - 2) end) end
  hooks.powerSGD_hook(st, bucket_of(buf, {buf:view(N, M)}, 0, true)):wait()
  rec.powersgd_fullrank_err = util.max_rel_err(util.list(buf), want)
end

-- powerSGD_hook before start_powerSGD_iter is the plain average: two steps
-- of training equal plain DDP's; the state counts one iteration per backward.
do
  local n1, d1 = ddp_of("float64")
  local n2, d2 = ddp_of("float64")
  local st = hooks.PowerSGDState(nil, {start_powerSGD_iter = 2})
  d2:register_comm_hook(st, hooks.powerSGD_hook)
  local o1, o2 = crun.optim.SGD(d1, {lr = 0.1}), crun.optim.SGD(d2, {lr = 0.1})
  local errs = {}
  for s = 1, 3 do
    o1:zero_grad(); o2:zero_grad()
    fwd_bwd(d1, "float64", s); fwd_bwd(d2, "float64", s)
    errs[s] = (abs_err(grads_of(n1), grads_of(n2)))
    o1:step(); o2:step()
  end
  rec.powersgd_start = {errs = errs, iter = st.iter}
end

-- PeriodicModelAverager(period 2, warmup 1): averages at steps 1 and 3.
do
  local p = T.zeros({5}, "float64")
  local av = hooks.PeriodicModelAverager{period = 2, warmup_steps = 1}
  local averaged = {}
  for s = 0, 4 do
    for i = 1, 5 do p[i] = p[i] + (rank + 1) ^ 2 * i * (s + 1) - 0.5 * s end
    local before = util.list(p)
    av:average_parameters({p})
    -- averaged iff every element equals the mean of the ranks' values
    local sum = T.zeros({5}, "float64"):copy(p)
    crun.dist.all_reduce(sum, "sum")
    local same = true
    for i = 1, 5 do if math.abs(p[i] - sum[i] / world) > 1e-9 then same = false end end
    local changed = false
    for i = 1, 5 do if p[i] ~= before[i] then changed = true end end
    averaged[s + 1] = same and (changed or world == 1)
  end
  rec.averager = averaged
end

-- post_localSGD_hook: world average at iteration 0, subgroup average after.
do
  local lists = ({[1] = {{0}}, [2] = {{0}, {1}}, [3] = {{0, 1}, {2}}, [4] = {{0, 1}, {2, 3}}})[world]
  local sub = crun.dist.new_subgroups_by_enumeration(lists)
  local mates
  for _, l in ipairs(lists) do for _, r in ipairs(l) do if r == rank then mates = l end end end
  local st = hooks.PostLocalSGDState(nil, sub, 1)
  local errs = {}
  for it = 0, 1 do
    local buf = T.zeros({9}, "float64")
    local function val(r, i) return (r + 1) * 0.75 * i - it * 2 + (i % 3) end
    for i = 1, 9 do buf[i] = val(rank, i) end
    hooks.post_localSGD_hook(st, bucket_of(buf, {buf}, 0, true)):wait()
    local e = 0
    for i = 1, 9 do
      local s = 0
      local over = it ~= 0 and mates or nil
      if over then for _, r in ipairs(over) do s = s + val(r, i) end; s = s / #over
      else s = avg_of(function(r) return val(r, i) end) end
      e = math.max(e, math.abs(buf[i] - s))
    end
    errs[it + 1] = e
  end
  rec.post_local = errs
end

-- Misuse.
do
  local _, d = ddp_of("float32")
  local ok, e = pcall(d.register_comm_hook, d, nil, 42)
  rec.bad_hook = ok and "accepted" or tostring(e)
  d:register_comm_hook(nil, function() return 7 end)
  ok, e = pcall(d.register_comm_hook, d, nil, hooks.allreduce_hook)
  rec.twice = ok and "accepted" or tostring(e)
  ok, e = pcall(fwd_bwd, d, "float32", 1)
  rec.not_future = ok and "accepted" or tostring(e)
  local _, d2 = ddp_of("float32")
  d2:register_comm_hook(nil, function(_, b)
    return require("crun.future").completed(T.zeros({b:buffer():numel() + 1}))
  end)
  ok, e = pcall(fwd_bwd, d2, "float32", 1)
  rec.wrong_size = ok and "accepted" or tostring(e)
  local _, d3 = ddp_of("float32")
  fwd_bwd(d3, "float32", 1)
  ok, e = pcall(d3.register_comm_hook, d3, nil, hooks.allreduce_hook)
  rec.after_backward = ok and "accepted" or tostring(e)
end

crun.save(string.format("%s/r%d.crun", out, rank), rec)
crun.dist.destroy_process_group()

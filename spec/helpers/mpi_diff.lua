-- mpi_diff.lua OUTDIR [TRIALS] — the differential job: seeded random inputs
-- through every collective, dtype and op, and a p2p ring, on whatever backend
-- the job got (mpi under `mpirun -np N crun-lua`, cpu under `crun-lua -n N`).
-- Each rank saves every case's result tensors (crun.serialize) to
-- OUTDIR/<backend>/rank<r>.bin; spec/mpi_diff_spec.lua runs the job on both
-- backends and compares: integers and data movement identical, float
-- reductions within rounding. Inputs depend only on (trial, dtype, op, rank).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local S = require "crun.serialize"

local outdir = assert(arg[1], "usage: mpi_diff.lua OUTDIR [TRIALS]")
local trials = tonumber(arg[2] or "3")
dist.init_process_group{timeout = 60}
local rank, size = dist.get_rank(), dist.get_world_size()
local results, order = {}, {}

-- Runs one case; stores its result tensors (or the error text) by name.
local function case(name, fn)
  local ok, res = pcall(fn)
  results[name] = ok and res or ("error: " .. tostring(res))
  order[#order + 1] = name
end

local DTYPES = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"}
local INT = {int32 = true, int64 = true, uint8 = true}
local OPS = {"sum", "product", "min", "max", "avg", "band", "bor", "bxor"}
-- Random input of n elements for (seed, rank): small values for products.
local function input(n, dtype, op, seed, r)
  local s = seed * 131 + r
  if n == 0 then return T.zeros({0}, dtype) end
  if INT[dtype] then
    local lo, hi = -1000, 1000
    if dtype == "uint8" then lo, hi = 0, 256 end
    if op == "product" then lo, hi = -3, 4 end
    if op == "product" and dtype == "uint8" then lo, hi = 0, 16 end  -- wraps modulo 256
    return T.randint(lo, hi, {n}, {seed = s}):to(dtype)
  end
  if op == "product" then return T.rand({n}, {seed = s}):to("float64"):mul(0.5):add(0.75):to(dtype) end
  return T.randn({n}, {seed = s}):to(dtype)
end

local function list_of(n, count, dtype)
  local l = {}
  for i = 1, n do l[i] = T.zeros({count}, dtype) end
  return l
end

local function reductions(seed, n, dtype, op)
  local root = seed % size
  case(string.format("all_reduce %s %s n=%d", dtype, op, n), function()
    local t = input(n, dtype, op, seed, rank)
    dist.all_reduce(t, op)
    return {t}
  end)
  case(string.format("reduce %s %s n=%d root=%d", dtype, op, n, root), function()
    local t = input(n, dtype, op, seed, rank)
    dist.reduce(t, root, op)
    return {t}
  end)
  case(string.format("reduce_scatter %s %s n=%d", dtype, op, n), function()
    local ins, t = {}, T.zeros({n}, dtype)
    for j = 1, size do ins[j] = input(n, dtype, op, seed + j, rank) end
    dist.reduce_scatter(t, ins, op)
    return {t}
  end)
end

local function movement(seed, n, dtype)
  local root = (seed + 1) % size
  case(string.format("broadcast %s n=%d root=%d", dtype, n, root), function()
    local t = input(n, dtype, "sum", seed, rank)
    dist.broadcast(t, root)
    return {t}
  end)
  case(string.format("all_gather %s n=%d", dtype, n), function()
    local l = list_of(size, n, dtype)
    dist.all_gather(l, input(n, dtype, "sum", seed, rank))
    return l
  end)
  case(string.format("gather/scatter %s n=%d root=%d", dtype, n, root), function()
    local l = rank == root and list_of(size, n, dtype) or nil
    dist.gather(input(n, dtype, "sum", seed, rank), l, root)
    local t = T.zeros({n}, dtype)
    dist.scatter(t, l, root)
    return {t, table.unpack(l or {})}
  end)
  case(string.format("all_to_all uneven %s n=%d", dtype, n), function()
    local ins, outs = {}, {}
    for j = 0, size - 1 do
      ins[j + 1] = input((n + rank * 3 + j) % 11, dtype, "sum", seed + j, rank)
      outs[j + 1] = T.zeros({(n + j * 3 + rank) % 11}, dtype)
    end
    dist.all_to_all(outs, ins)
    return outs
  end)
  if size > 1 then
    -- even ranks send first, odd ones receive first: a cpu send larger than
    -- the socket buffers waits for its receiver, so an isend+recv pair on one
    -- group could deadlock there (the mpi backend buffers sends)
    case(string.format("send/recv ring %s n=%d", dtype, n), function()
      local t, x, o = T.zeros({n}, dtype), input(n, dtype, "sum", seed, rank), {tag = seed % 7}
      local src, from = (rank - 1) % size, nil
      if rank % 2 == 1 then from = dist.recv(t, src, o) end
      dist.send(x, (rank + 1) % size, o)
      if rank % 2 == 0 then from = dist.recv(t, src, o) end
      return {t, T.new({from}, "int64")}
    end)
  end
end

local COUNTS = {0, 1, 7, 1000, 65537}
for trial = 1, trials do
  for di, dtype in ipairs(DTYPES) do
    local n = COUNTS[(trial + di) % #COUNTS + 1]
    local seed = trial * 1000 + di * 10
    for oi, op in ipairs(OPS) do
      if INT[dtype] or oi <= 5 then reductions(seed + oi, n, dtype, op) end
    end
    movement(seed, n, dtype)
  end
end
local backend = dist.group.WORLD:backend()
dist.barrier()
os.execute("mkdir -p '" .. outdir .. "/" .. backend .. "'")
S.save(outdir .. "/" .. backend .. "/rank" .. rank .. ".bin", {order = order, results = results})
dist.destroy_process_group()

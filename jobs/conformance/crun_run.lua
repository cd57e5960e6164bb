-- Runs a conformance program (jobs/conformance/gen.py) on crun and writes what
-- every rank saw, in the record format of torch_run.py, for compare.py.
--   crun-lua -n W jobs/conformance/crun_run.lua PROGRAM OUTDIR
--   mpirun -np W crun-lua jobs/conformance/crun_run.lua PROGRAM OUTDIR
-- Under the mpi backend the store operations are left out (no shared store
-- under mpirun; compare.py is told with --no-store).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local path, outdir = arg[1], arg[2]
assert(path and outdir, "usage: crun_run.lua PROGRAM OUTDIR")
local P = 4294967291

local prog = {groups = {}, ops = {}}
for line in io.lines(path) do
  local w = {}
  for tok in line:gmatch("%S+") do w[#w + 1] = tok end
  if w[1] == "seed" or w[1] == "world" then
    prog[w[1]] = math.tointeger(tonumber(w[2]))
  elseif w[1] == "group" then
    local rs = {}
    for x in w[3]:gmatch("[^,]+") do rs[#rs + 1] = math.tointeger(tonumber(x)) end
    prog.groups[math.tointeger(tonumber(w[2]))] = rs
  elseif w[1] == "op" then
    local f = {}
    for i = 4, #w do
      local k, v = w[i]:match("^([^=]+)=(.*)$")
      f[k] = v
    end
    prog.ops[#prog.ops + 1] = {idx = math.tointeger(tonumber(w[2])), name = w[3], f = f}
  end
end

dist.init_process_group{backend = "auto"}
local rank, W = dist.get_rank(), dist.get_world_size()
assert(W == prog.world, "world size " .. W .. " but the program is for " .. prog.world)
local backend = dist.get_backend()

local FLOAT = {float16 = true, bfloat16 = true, float32 = true, float64 = true}
local SIGNED_SMALL = {[0] = 1, 2, 1, 1}
local FLOAT_FACTORS = {[0] = 1.0, 2.0, 0.5, 1.5}   -- product inputs (torch_run.py values())
local INT_FACTORS = {[0] = 1, 2, 3, 1}

-- The input value of element i (0-based) for dtype dt; see torch_run.py values().
local function value(dt, red, seed, op, r, i)
  local x = (7919 * i * i + 2654435761 * i + 40503 * (r + 1) * (i + 3)
             + 97 * (op + 1) * (op + 7) + 1000003 * seed + 12345) % P
  if red == "product" then
    local sign = ((x // 7) % 2 == 1) and -1 or 1
    if FLOAT[dt] then return sign * FLOAT_FACTORS[x % 4] end
    if dt == "int32" or dt == "int64" then return sign * INT_FACTORS[x % 4] end
    if dt == "int16" or dt == "int8" then return sign * SIGNED_SMALL[x % 4] end
    if dt == "uint8" then return SIGNED_SMALL[x % 4] end
    return (x % 5 ~= 0) and 1 or 0
  end
  if dt == "int64" then return (x - 2147483645) * 1048573 end
  if dt == "int32" then return x % 16777216 - 8388608 end
  if dt == "int16" then return x % 8001 - 4000 end
  if dt == "int8" then return x % 31 - 15 end
  if dt == "uint8" then return x % 32 end
  if dt == "bool" then return (x % 3 == 0) and 1 or 0 end
  if dt == "float64" then return (x - 2147483645) / 1024 end
  if dt == "float32" then return (x % 4194304 - 2097152) / 64 end
  if dt == "float16" then return (x % 4001 - 2000) / 8 end
  if dt == "bfloat16" then return (x % 255 - 127) / 4 end
  error("unknown dtype " .. tostring(dt))
end

-- A 1-D tensor of n inputs starting at element off (computed in int64 or
-- float64, exact, then converted to dt).
local function make(dt, red, op, r, n, off)
  off = off or 0
  local fmt = FLOAT[dt] and "<d" or "<i8"
  local parts = {}
  for i = 0, n - 1 do parts[#parts + 1] = string.pack(fmt, value(dt, red, prog.seed, op, r, off + i)) end
  local t = T.from_bytes(FLOAT[dt] and "float64" or "int64", {n}, table.concat(parts))
  return t:to(dt)
end

local function obj(r, k) return {r * 1000003 - 7 * k, string.format("s%d_%d", r, k), -(1 << 40) + r * k * 12345, k} end

local function js(v)
  if type(v) == "table" then
    local p = {}
    for i = 1, #v do p[i] = js(v[i]) end
    return "[" .. table.concat(p, ",") .. "]"
  elseif type(v) == "string" then
    return '"' .. v .. '"'
  elseif math.type(v) == "integer" then
    return string.format("%d", v)
  elseif v == nil or v == false then
    return "null"
  end
  error("js: unexpected " .. type(v))
end

local out = assert(io.open(string.format("%s/rank%d.bin", outdir, rank), "wb"))
local function rec(idx, label, dt, data)
  out:write(string.format("%d %s %s %d\n", idx, label, dt, #data), data, "\n")
end

local groups = {[0] = dist.group.WORLD}
prog.groups[0] = {}
for r = 0, W - 1 do prog.groups[0][r + 1] = r end
for gi = 1, #prog.groups do groups[gi] = dist.new_group(prog.groups[gi]) end

local function wait(w) if w then w:wait() end end
local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function cat(list, dt)
  if #list == 0 then return T.zeros({0}, dt) end
  return T.cat(list, 1)
end

local store = dist.get_store()
for _, o in ipairs(prog.ops) do
  local idx, name, f = o.idx, o.name, o.f
  if os.getenv("CONF_TRACE") then io.stderr:write(string.format("rank %d op %d %s\n", rank, idx, name)) end
  local gi = math.tointeger(tonumber(f.g or "0"))
  local members = prog.groups[gi]
  local me
  for i, r in ipairs(members) do if r == rank then me = i - 1 end end
  if me ~= nil then
    local grp = groups[gi]
    local ng = #members
    local dt, red = f.dt, f.red
    local n = math.tointeger(tonumber(f.n or "0"))
    local opts = {group = grp, async_op = f.async == "1"}
    local root = f.root and math.tointeger(tonumber(f.root))
    if name == "all_reduce" then
      local t = make(dt, red, idx, rank, n)
      wait(dist.all_reduce(t, red, opts)); rec(idx, "out", dt, t:bytes())
    elseif name == "broadcast" then
      local t = make(dt, nil, idx, rank, n)
      wait(dist.broadcast(t, root, opts)); rec(idx, "out", dt, t:bytes())
    elseif name == "reduce" then
      local t = make(dt, red, idx, rank, n)
      wait(dist.reduce(t, root, red, opts))
      if rank == root then rec(idx, "out", dt, t:bytes()) end
    elseif name == "all_gather" then
      local t = make(dt, nil, idx, rank, n)
      local outs = {}
      for j = 1, ng do outs[j] = T.zeros({n}, dt) end
      wait(dist.all_gather(outs, t, opts)); rec(idx, "out", dt, cat(outs, dt):bytes())
    elseif name == "all_gather_into_tensor" then
      local t = make(dt, nil, idx, rank, n)
      local o2 = T.zeros({n * ng}, dt)
      wait(dist.all_gather_into_tensor(o2, t, opts)); rec(idx, "out", dt, o2:bytes())
    elseif name == "gather" then
      local t = make(dt, nil, idx, rank, n)
      local outs
      if rank == root then
        outs = {}
        for j = 1, ng do outs[j] = T.zeros({n}, dt) end
      end
      wait(dist.gather(t, outs, root, opts))
      if rank == root then rec(idx, "out", dt, cat(outs, dt):bytes()) end
    elseif name == "scatter" then
      local full = make(dt, nil, idx, rank, n * ng)
      local ins
      if rank == root then
        ins = {}
        for j = 1, ng do ins[j] = full:narrow(1, (j - 1) * n + 1, n) end
      end
      local t = T.zeros({n}, dt)
      wait(dist.scatter(t, ins, root, opts)); rec(idx, "out", dt, t:bytes())
    elseif name == "reduce_scatter" then
      local full = make(dt, red, idx, rank, n * ng)
      local ins = {}
      for j = 1, ng do ins[j] = full:narrow(1, (j - 1) * n + 1, n) end
      local t = T.zeros({n}, dt)
      wait(dist.reduce_scatter(t, ins, red, opts)); rec(idx, "out", dt, t:bytes())
    elseif name == "reduce_scatter_tensor" then
      local full = make(dt, red, idx, rank, n * ng)
      local t = T.zeros({n}, dt)
      wait(dist.reduce_scatter_tensor(t, full, red, opts)); rec(idx, "out", dt, t:bytes())
    elseif name == "all_to_all" then
      local full = make(dt, nil, idx, rank, n * ng)
      local ins, outs = {}, {}
      for j = 1, ng do ins[j] = full:narrow(1, (j - 1) * n + 1, n); outs[j] = T.zeros({n}, dt) end
      wait(dist.all_to_all(outs, ins, opts)); rec(idx, "out", dt, cat(outs, dt):bytes())
    elseif name == "all_to_all_single" then
      local rows = {}
      for row in f.splits:gmatch("[^;]+") do
        local r = {}
        for v in row:gmatch("[^,]+") do r[#r + 1] = math.tointeger(tonumber(v)) end
        rows[#rows + 1] = r
      end
      local ins, outs, nin, nout = rows[me + 1], {}, 0, 0
      for j = 1, ng do outs[j] = rows[j][me + 1]; nout = nout + outs[j]; nin = nin + ins[j] end
      local full = make(dt, nil, idx, rank, nin)
      local o2 = T.zeros({nout}, dt)
      wait(dist.all_to_all_single(o2, full, outs, ins, opts)); rec(idx, "out", dt, o2:bytes())
    elseif name == "sendrecv" then
      local t = make(dt, nil, idx, rank, n)
      local o2 = T.zeros({n}, dt)
      local nxt, prv = members[(me + 1) % ng + 1], members[(me - 1) % ng + 1]
      local ws = {dist.isend(t, nxt, {group = grp}), dist.irecv(o2, prv, {group = grp})}
      for _, w in ipairs(ws) do w:wait() end
      rec(idx, "out", dt, o2:bytes())
    elseif name == "barrier" then
      dist.barrier{group = grp}
    elseif name == "broadcast_object_list" then
      local lst = {false, false, false}
      if rank == root then for j = 0, 2 do lst[j + 1] = obj(rank, idx + j) end end
      dist.broadcast_object_list(lst, root, {group = grp}); rec(idx, "obj", "json", js(lst))
    elseif name == "all_gather_object" then
      local lst = {}
      dist.all_gather_object(lst, obj(rank, idx), {group = grp}); rec(idx, "obj", "json", js(lst))
    elseif name == "gather_object" then
      local lst = rank == root and {} or nil
      dist.gather_object(obj(rank, idx), lst, root, {group = grp})
      if rank == root then rec(idx, "obj", "json", js(lst)) end
    elseif name == "scatter_object_list" then
      local o2, ins = {false}, nil
      if rank == root then
        ins = {}
        for j = 0, ng - 1 do ins[j + 1] = obj(root, idx * 10 + j) end
      end
      dist.scatter_object_list(o2, ins, root, {group = grp}); rec(idx, "obj", "json", js(o2))
    elseif name == "store" then
      if backend ~= "mpi" then
        local K = string.format("conf/%d/", idx)
        store:add(K .. "c", rank + 1)
        store:set(K .. "s/" .. rank, string.format("\0\255%d-%d", rank, idx))
        dist.barrier()
        local res = {tostring(store:add(K .. "c", 0)), hex(store:get(K .. "s/" .. ((rank + 1) % W))),
          hex(store:compare_set(K .. "x/" .. rank, "", "v" .. rank)),
          hex(store:compare_set(K .. "x/" .. rank, "wrong", "zz")),
          hex(store:compare_set(K .. "x/" .. rank, "v" .. rank, "w" .. rank))}
        dist.barrier()
        res[#res + 1] = store:delete_key(K .. "s/" .. rank) and "1" or "0"
        res[#res + 1] = store:delete_key(K .. "nope") and "1" or "0"
        rec(idx, "store", "text", table.concat(res, "|"))
      end
    else
      error("unknown op " .. name)
    end
  end
end
dist.barrier()
out:close()
dist.destroy_process_group()

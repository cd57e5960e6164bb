-- multihost_job.lua — run by one crun-lua per namespace host (multihost_spec).
--   check: every rank says where it runs ("rank R of N on hH (local L)"), then
--          all_reduce (sum int64 / float64, max float32, avg float64),
--          all_gather and broadcast from a rank on the last host, every
--          element compared with values computed here from the formula;
--          prints "rank R ok <cases>" or raises.
--   loop:  all_reduce in a loop (group timeout arg[2] s) until it fails;
--          rank 0 prints "looping" after 20 rounds; each rank prints
--          "rank R failed after S s: <error>" when a peer vanished.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local mode, timeout = arg[1] or "check", tonumber(arg[2] or "30")
dist.init_process_group{timeout = timeout}
local r, n = dist.get_rank(), dist.get_world_size()

local function hostname()
  local f = assert(io.open("/proc/sys/kernel/hostname"))
  local h = f:read("l")
  f:close()
  return h
end

-- Element i (0-based) of rank q: signed, and not periodic in any power of two.
local function v(q, i) return (i * 7919 + q * 104729 + (i * i) % 997) % 2003 - 1001 end

local function filled(count, dtype, q)
  local t = T.zeros({count}, dtype)
  for i = 0, count - 1 do t[i + 1] = v(q, i) end
  return t
end

local function expect(t, want, what)
  for i = 0, t:numel() - 1 do
    local got, w = t[i + 1], want(i)
    if got ~= w then
      error(string.format("rank %d: %s: element %d is %s, want %s", r, what, i, tostring(got), tostring(w)))
    end
  end
end

local function check()
  print(string.format("rank %d of %d on %s (local %s, backend %s)", r, n, hostname(),
                      os.getenv("LOCAL_RANK") or os.getenv("OMPI_COMM_WORLD_LOCAL_RANK"), dist.group.WORLD:backend()))
  local cases = 0
  -- counts cross the shm chunk (512 KiB), the hierarchical split (64 KiB) and TCP's pieces
  for _, job in ipairs({{"sum", "int64", 70001}, {"sum", "float64", 262147}, {"max", "float32", 1},
                        {"max", "float32", 150011}, {"avg", "float64", 65539}}) do
    local op, dtype, count = job[1], job[2], job[3]
    local t = filled(count, dtype, r)
    dist.all_reduce(t, op)
    expect(t, function(i)
      local s, m = 0, -math.huge
      for q = 0, n - 1 do s = s + v(q, i); m = math.max(m, v(q, i)) end
      if op == "max" then return m elseif op == "avg" then return s / n end
      return s
    end, string.format("all_reduce %s %s x %d", op, dtype, count))
    cases = cases + 1
  end
  local count = 40009
  local outs = {}
  for q = 1, n do outs[q] = T.zeros({count}, "float64") end
  dist.all_gather(outs, filled(count, "float64", r))
  for q = 0, n - 1 do
    expect(outs[q + 1], function(i) return v(q, i) end, "all_gather from rank " .. q)
  end
  cases = cases + 1
  local root = n - 1
  local b = r == root and filled(200003, "int32", root) or T.zeros({200003}, "int32")
  dist.broadcast(b, root)
  expect(b, function(i) return v(root, i) end, "broadcast from rank " .. root)
  cases = cases + 1
  dist.barrier()
  print(string.format("rank %d ok %d", r, cases))
end

local function loop()
  local t = T.ones({1000}, "float64")
  local rounds, t0 = 0, crun.clock()
  while true do
    t0 = crun.clock()
    local ok, err = pcall(dist.all_reduce, t)
    if not ok then
      print(string.format("rank %d failed after %.2f s: %s", r, crun.clock() - t0, tostring(err)))
      io.stdout:flush()
      os.exit(3)
    end
    t:fill(1)
    rounds = rounds + 1
    if rounds == 20 and r == 0 then print("looping"); io.stdout:flush() end
  end
end

if mode == "check" then check() else loop() end
dist.destroy_process_group()

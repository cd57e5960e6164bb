--- jobs/doctor.lua — checks that a crun job can run here, and says what it found.
--
--   crun-lua -n 4 jobs/doctor.lua            (any backend: --backend cpu|mpi)
--   mpirun -np 4 crun-lua jobs/doctor.lua
--
-- Every rank reports its host, pid, backend and environment; then the job times a
-- store round trip, checks all_reduce results at 8 B and 1 MiB and a barrier, and
-- rank 0 prints one table. Exits non-zero (naming the rank and the check) when any
-- check fails on any rank.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local function read_first_line(path)
  local f = io.open(path)
  if not f then return "?" end
  local line = f:read("l") or "?"
  f:close()
  return line
end

-- Runs fn and returns its median time in microseconds over `n` calls.
local function median_us(n, fn)
  local times = {}
  for i = 1, n do
    local t0 = crun.clock()
    fn()
    times[i] = (crun.clock() - t0) * 1e6
  end
  table.sort(times)
  return times[(n + 1) // 2]
end

-- Fills t with rank+1 and checks that the sum over ranks came back everywhere.
local function check_all_reduce(numel, world)
  local t = T.full({numel}, dist.get_rank() + 1, "float32")
  dist.all_reduce(t, "sum")
  local want = world * (world + 1) / 2
  for _, i in ipairs({1, numel}) do
    if t[i] ~= want then
      return string.format("all_reduce of %d floats gave %s at [%d], expected %s", numel, t[i], i, want)
    end
  end
  return nil
end

dist.init_process_group{backend = os.getenv("CRUN_BACKEND") or "auto", timeout = 60}
local rank, world = dist.get_rank(), dist.get_world_size()
local problems = {}

local store = dist.get_store and dist.get_store()
local store_us = -1
if store then
  store_us = median_us(200, function()
    store:set("doctor/" .. rank, "x")
    store:get("doctor/" .. rank)
  end)
end
for _, numel in ipairs({2, 262144}) do
  local err = check_all_reduce(numel, world)
  if err then problems[#problems + 1] = err end
end
local small = T.zeros({2})
local ar_us = median_us(200, function() dist.all_reduce(small, "sum") end)
local barrier_us = median_us(50, function() dist.barrier() end)

local me = {
  rank = rank,
  host = read_first_line("/proc/sys/kernel/hostname"),
  pid = crun.core.getpid and crun.core.getpid() or -1,
  backend = dist.group.WORLD:backend(),
  omp = os.getenv("OMP_NUM_THREADS") or "unset",
  store_us = store_us, ar_us = ar_us, barrier_us = barrier_us,
  problems = problems,
}
local all = dist.all_gather_object(me)

if rank == 0 then
  print(string.format("crun %s, %d ranks, MPI %s, NCCL %s", crun.version, world,
    crun.core.have_mpi and "built" or "not built", crun.core.have_nccl and "built" or "not built"))
  print(string.format("%4s  %-16s %8s %-8s %4s %12s %14s %12s", "rank", "host", "pid", "backend",
    "omp", "store (us)", "8B allred (us)", "barrier (us)"))
  for _, r in ipairs(all) do
    print(string.format("%4d  %-16s %8d %-8s %4s %12.1f %14.1f %12.1f", r.rank, r.host, r.pid,
      r.backend, r.omp, r.store_us, r.ar_us, r.barrier_us))
  end
end
local failed = 0
for _, r in ipairs(all) do
  for _, p in ipairs(r.problems) do
    failed = failed + 1
    if rank == 0 then print(string.format("PROBLEM on rank %d: %s", r.rank, p)) end
  end
end
if rank == 0 then print(failed == 0 and "all checks passed" or (failed .. " problem(s) found")) end
dist.destroy_process_group()
os.exit(failed == 0 and 0 or 1)

--- Fault injection (issue 16): N times, start a job on 2-4 ranks that runs a
-- random sequence of collectives (same sequence on every rank, random sizes
-- crossing the shm one-shot and chunk limits, shm or tcp transport), then
-- kill a random rank (SIGKILL) or the launcher (SIGTERM or SIGKILL) at a
-- random moment while the collectives run, and check:
--   * every surviving rank ended on its own (before CRUN_STOP_DELAY ran out)
--     with EPEERDIED or ETIMEDOUT naming the killed rank;
--   * the launcher printed its summary naming the killed rank and exited with
--     137 (a rank killed) or 143 (launcher SIGTERMed);
--   * nothing is left behind: no worker process, no /dev/shm/crun-shm-<pid>-*
--     of a worker, no cgroup of the launcher (the workers' heap is an
--     anonymous shared mapping: it goes with the last process).
--
-- usage: lua5.4 jobs/fault_inject.lua [--runs N] [--seed S] [--crun PATH]
--        [--max-ranks K] [--timeout S]
-- Prints one line per run and a summary; exits 0 when every run passed.
-- `make fault-inject` runs 100; spec/fault_inject_spec.lua a few.
local opts = {runs = 100, seed = os.time(), crun = "build/crun-lua", max_ranks = 4, timeout = 5}
do
  local i = 1
  while i <= #arg do
    local k, v = arg[i]:match("^%-%-([%w-]+)=?(.*)$")
    if not k then error("EINVAL: fault_inject: unexpected argument '" .. arg[i] .. "'") end
    if v == "" then i = i + 1; v = arg[i] end
    k = k:gsub("-", "_")
    if opts[k] == nil or v == nil then error("EINVAL: fault_inject: unknown option or missing value --" .. k) end
    opts[k] = type(opts[k]) == "number" and assert(tonumber(v), "--" .. k .. " needs a number") or v
    i = i + 1
  end
end

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local function slurp(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end
local function sh(cmd) return os.execute(cmd) end
local function now()
  local p = io.popen("date +%s.%N")
  local t = tonumber(p:read("l"))
  p:close()
  return t
end
-- Calls f every 20 ms until it is truthy (returned) or `s` seconds pass (nil).
local function wait_for(f, s)
  local deadline = now() + s
  repeat
    local v = f()
    if v then return v end
    sh("sleep 0.02")
  until now() > deadline
  return nil
end
-- Whether process pid is alive (not gone, not a zombie).
local function alive(pid)
  local st = slurp("/proc/" .. pid .. "/stat")
  if not st then return false end
  local state = st:match("%) (%a)")
  return state ~= "Z" and state ~= "X"
end

local JOB = [[
-- the job of jobs/fault_inject.lua: collectives until a peer dies
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local dir, seed = arg[1], tonumber(arg[2])
local rank = tonumber(os.getenv("RANK"))
dist.init_process_group{backend = "auto", timeout = tonumber(os.getenv("FI_TIMEOUT"))}
local n = dist.get_world_size()
local f = assert(io.open(dir .. "/pid." .. rank .. ".tmp", "w"))
f:write(tostring(require("crun.core").getpid()))
f:close()
os.rename(dir .. "/pid." .. rank .. ".tmp", dir .. "/pid." .. rank)
local COLLS = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"}
local rng = seed -- the same sequence on every rank
local function rand(m) rng = (rng * 1103515245 + 12345) % 2147483648; return rng % m end
local function vec(len, k) -- signed, non-periodic
  local t = T.zeros({len})
  for i = 1, math.min(len, 64) do t[i] = ((i * 37 + k * 11) % 101) - 50 end
  return t
end
local ok, err = pcall(function()
  for it = 1, math.huge do
    local c = COLLS[rand(#COLLS) + 1]
    local len = ({3, 1000, 70001, 300007})[rand(4) + 1]
    if c == "all_reduce" then dist.all_reduce(vec(len, rank))
    elseif c == "broadcast" then dist.broadcast(vec(len, rank), rand(n))
    elseif c == "reduce" then dist.reduce(vec(len, rank), rand(n))
    elseif c == "all_gather" then
      local list = {}
      for r = 1, n do list[r] = T.zeros({len}) end
      dist.all_gather(list, vec(len, rank))
    elseif c == "reduce_scatter" then
      local list = {}
      for r = 1, n do list[r] = vec(len, rank + r) end
      dist.reduce_scatter(T.zeros({len}), list)
    elseif c == "all_to_all" then
      local ins, outs = {}, {}
      for r = 1, n do ins[r] = vec(len, rank * n + r); outs[r] = T.zeros({len}) end
      dist.all_to_all(outs, ins)
    else dist.barrier() end
  end
end)
io.stderr:write("FI rank=" .. rank .. " err=" .. (tostring(err):match("^[^\n]*")) .. "\n")
-- stay until every survivor has its own error (bounded): a survivor that
-- exits at once would be a second dead peer for those still waiting
local f = io.open(dir .. "/done." .. rank, "w")
if f then f:close() end
local deadline = os.time() + 2 * tonumber(os.getenv("FI_TIMEOUT")) + 2
repeat
  local k = 0
  for r = 0, n - 1 do
    local g = io.open(dir .. "/done." .. r)
    if g then g:close(); k = k + 1 end
  end
  if k >= n - 1 then break end
  os.execute("sleep 0.02")
until os.time() > deadline
os.exit(1)
]]

local ROOT = (function()
  local p = io.popen("mktemp -d /tmp/crun-fault-inject.XXXXXX")
  local d = p:read("l")
  p:close()
  return d
end)()
write(ROOT .. "/job.lua", JOB)
local stats = {blamed_survivor = 0}

-- The cgroup v2 directory a launcher of pid `pid` would use (nil if none).
local function cgroup_of(pid)
  local mnt
  for line in io.lines("/proc/self/mountinfo") do
    local point, fstype = line:match("^%S+ %S+ %S+ %S+ (%S+) .* %- (%S+) ")
    if fstype == "cgroup2" then mnt = point break end
  end
  if not mnt then return nil end
  for line in io.lines("/proc/self/cgroup") do
    local own = line:match("^0::(.*)$")
    if own then return mnt .. (own == "/" and "" or own) .. "/crun-" .. pid end
  end
end

local function shm_left(pids)
  local left = {}
  local p = io.popen("ls -A /dev/shm 2>/dev/null")
  for name in p:lines() do
    local pid = tonumber(name:match("^crun%-shm%-(%d+)%-"))
    for _, w in ipairs(pids) do
      if pid == w then left[#left + 1] = name end
    end
  end
  p:close()
  return left
end

-- One run; returns ok, a description, and the seconds from the kill to the
-- launcher's exit.
local function run_one(i, rnd)
  local dir = string.format("%s/run%03d", ROOT, i)
  sh("mkdir -p " .. q(dir))
  local n = rnd(opts.max_ranks - 1) + 2
  local transport = rnd(3) == 0 and "tcp" or "auto"
  local victim = rnd(5) == 0 and "launcher" or rnd(n)
  local lsig = rnd(2) == 0 and "TERM" or "KILL"
  local delay_ms = rnd(300)
  local seed = rnd(1 << 30)
  local what = string.format("n=%d transport=%s victim=%s%s delay=%dms seed=%d", n, transport,
    victim == "launcher" and "launcher/SIG" or "rank ", victim == "launcher" and lsig or victim,
    delay_ms, seed)
  local env = string.format("CRUN_TRANSPORT=%s FI_TIMEOUT=%d CRUN_STOP_DELAY=%d", transport,
    opts.timeout, 2 * opts.timeout + 10)
  sh(string.format("{ %s %s -n %d --master-port 0 --grace-period 2 %s %s %d >%s/out 2>%s/err & "
    .. "echo $! >%s/lpid; wait $!; echo $? >%s/rc.tmp; mv %s/rc.tmp %s/rc; } 2>/dev/null &",
    env, q(opts.crun), n, q(ROOT .. "/job.lua"), q(dir), seed, dir, dir, dir, dir, dir, dir))
  -- the shell creates lpid before it writes the pid: wait for the whole line
  -- (an empty read used to count as "did not start" and left the job running)
  local lpid = tonumber(wait_for(function() return (slurp(dir .. "/lpid") or ""):match("^(%d+)\n") end, 10) or "")
  local function fail(why)
    if lpid then sh("kill -KILL " .. lpid .. " 2>/dev/null") end
    return false, what .. ": " .. why .. "\n    stderr: " .. (slurp(dir .. "/err") or ""):gsub("\n", "\n    "), 0
  end
  if not lpid then return fail("the launcher did not start") end
  local pids = {}
  local all = wait_for(function()
    for r = 0, n - 1 do
      pids[r + 1] = tonumber(slurp(dir .. "/pid." .. r) or "")
      if not pids[r + 1] then return nil end
    end
    return true
  end, 30)
  if not all then return fail("not every rank initialized (pid files missing)") end
  sh(string.format("sleep %.3f", delay_ms / 1000))
  local t0 = now()
  if victim == "launcher" then sh("kill -" .. lsig .. " " .. lpid)
  else sh("kill -KILL " .. pids[victim + 1]) end
  local rc = wait_for(function() return slurp(dir .. "/rc") end, 3 * opts.timeout + 30)
  local secs = now() - t0
  if not rc then return fail("the launcher did not exit") end
  rc = tonumber(rc)
  local err = slurp(dir .. "/err") or ""
  local function check(cond, why) if not cond then error(why, 0) end end
  local ok, why = pcall(function()
    if victim == "launcher" and lsig == "KILL" then
      check(rc == 137, "launcher rc " .. rc .. ", expected 137")
    elseif victim == "launcher" then
      check(rc == 143, "launcher rc " .. rc .. ", expected 143")
      check(err:find("received SIGTERM; stopping " .. n .. " workers", 1, true), "no 'received SIGTERM' line")
      check(err:find("stopped by SIGTERM; exit code 143", 1, true), "no summary line")
    else
      -- the summary names the killed rank first, or (when a survivor's exit was
      -- reaped in an earlier batch) on an "also:" line; the exit code is the
      -- first failure's
      local killed = string.format("rank %d (pid %d) was killed by signal SIGKILL", victim, pids[victim + 1])
      local main = err:find("attempt 0 failed: " .. killed, 1, true)
      check(main or err:find("  also: " .. killed, 1, true), "the summary does not name the killed rank")
      check(rc == (main and 137 or 1), "launcher rc " .. rc .. ", expected " .. (main and 137 or 1))
      check(err:find(string.format("exit code %d (from rank ", rc), 1, true), "no exit code line")
      if not main then stats.blamed_survivor = stats.blamed_survivor + 1 end
      check(not err:find("CRUN_STOP_DELAY over", 1, true), "survivors did not end on their own in time")
      for r = 0, n - 1 do
        if r ~= victim then
          local e = err:match("FI rank=" .. r .. " err=([^\n]*)")
          check(e, "rank " .. r .. " reported no error")
          check(e:match("^EPEERDIED") or e:match("^ETIMEDOUT"), "rank " .. r .. " ended with: " .. e)
          check(e:find("rank " .. victim .. "[^%d]") or e:find("rank " .. victim .. "$") or
                e:find("ranks? [%d,%- ]*" .. victim), "rank " .. r .. "'s error does not name rank " ..
                victim .. ": " .. e)
        end
      end
    end
    -- nothing left behind (the watchdog of a SIGKILLed launcher needs a moment)
    local gone = wait_for(function()
      for _, p in ipairs(pids) do if alive(p) then return nil end end
      return true
    end, 10)
    check(gone, "worker processes left")
    local cg = cgroup_of(lpid)
    check(wait_for(function() return #shm_left(pids) == 0 end, 10),
      "/dev/shm left: " .. table.concat(shm_left(pids), " "))
    check(not cg or wait_for(function() return not slurp(cg .. "/cgroup.procs") end, 10),
      "cgroup left: " .. tostring(cg))
  end)
  if not ok then return fail(why) end
  sh("rm -rf " .. q(dir))
  return true, what, secs
end

math.randomseed(opts.seed)
local function rnd(m) return math.random(0, m - 1) end
print(string.format("fault injection: %d runs, seed %d, %s, collective timeout %d s", opts.runs,
  opts.seed, opts.crun, opts.timeout))
local passed, times, failures = 0, {}, {}
local started = now()
for i = 1, opts.runs do
  local ok, what, secs = run_one(i, rnd)
  if ok then
    passed = passed + 1
    times[#times + 1] = secs
    print(string.format("run %3d ok   %s (ended %.2f s after the kill)", i, what, secs))
  else
    failures[#failures + 1] = i
    print(string.format("run %3d FAIL %s", i, what))
  end
  io.stdout:flush()
end
table.sort(times)
local function pct(p) return #times > 0 and times[math.max(1, math.ceil(#times * p))] or 0 end
print(string.format("fault injection: %d of %d runs passed in %.0f s; kill -> launcher exit: "
  .. "median %.2f s, p90 %.2f s, max %.2f s%s", passed, opts.runs, now() - started, pct(0.5),
  pct(0.9), pct(1.0), #failures > 0 and ("; failed runs: " .. table.concat(failures, ",")) or ""))
print(string.format("fault injection: %d run(s) where a survivor's exit was reported first and the "
  .. "killed rank on an 'also:' line", stats.blamed_survivor))
if passed == opts.runs then sh("rm -rf " .. q(ROOT)) else print("kept the failed runs' output in " .. ROOT) end
os.exit(passed == opts.runs and 0 or 1)

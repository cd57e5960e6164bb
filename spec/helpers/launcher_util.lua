--- Helpers for the launcher specs: run crun-lua, capture what it printed,
-- start it in the background, wait for files, look for leftover processes.
local M = {}

M.CRUN_LUA = assert(os.getenv("CRUN_LUA"), "CRUN_LUA must point at the built crun-lua")
M.SOURCE = os.getenv("CRUN_SOURCE_DIR") or "."
M.FIX = M.SOURCE .. "/spec/fixtures/launcher/"

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end
M.slurp = slurp

--- Quotes one word for sh.
function M.q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- A fresh temporary directory (removed by M.rmrf).
function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/crun-launcher-spec.XXXXXX")
  local d = p:read("l")
  p:close()
  return d
end

function M.rmrf(dir)
  if dir and dir:match("^/tmp/crun%-launcher%-spec") then os.execute("rm -rf " .. M.q(dir)) end
end

--- Runs crun-lua with the argument string `args` (already quoted where
-- needed) and an optional env prefix ("A=1 B=2"). Returns
-- {code=, out=, err=, seconds=}. `timeout` (s) bounds the run (default 60).
function M.run(args, env, timeout)
  local dir = M.tmpdir()
  local cmd = string.format("cd %s && %s timeout -s KILL %d %s %s >%s/out 2>%s/err",
    M.q(M.SOURCE), env or "", timeout or 60, M.q(M.CRUN_LUA), args, dir, dir)
  local t0 = os.time()
  local clock0 = os.clock()
  local _, _, code = os.execute(cmd)
  local r = {code = code, out = slurp(dir .. "/out") or "", err = slurp(dir .. "/err") or "",
             seconds = os.time() - t0, cpu = os.clock() - clock0}
  M.rmrf(dir)
  return r
end

--- Starts crun-lua in the background; returns a handle with .pid, and
-- :wait(timeout) -> {code=, out=, err=} once it has exited.
function M.start(args, env)
  local dir = M.tmpdir()
  local script = string.format(
    "cd %s && { %s %s %s >%s/out 2>%s/err & echo $! >%s/pid.tmp; mv %s/pid.tmp %s/pid; wait $!; echo $? >%s/rc.tmp; mv %s/rc.tmp %s/rc; } 2>/dev/null &",
    M.q(M.SOURCE), env or "", M.q(M.CRUN_LUA), args, dir, dir, dir, dir, dir, dir, dir, dir)
  os.execute(script)
  local h = {dir = dir}
  assert(M.wait_for(function() return slurp(dir .. "/pid") end, 10), "crun-lua did not start")
  h.pid = tonumber(slurp(dir .. "/pid"))
  function h:wait(timeout)
    local ok = M.wait_for(function() return slurp(dir .. "/rc") end, timeout or 30)
    if not ok then
      os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
      error("crun-lua (pid " .. self.pid .. ") did not exit in time")
    end
    local r = {code = tonumber(slurp(dir .. "/rc")), out = slurp(dir .. "/out"), err = slurp(dir .. "/err")}
    M.rmrf(dir)
    return r
  end
  return h
end

--- Sleeps a little (fractions of a second) without a busy loop.
function M.sleep(s)
  os.execute("sleep " .. s)
end

--- Calls f every 50 ms until it returns a truthy value or `timeout` s pass.
function M.wait_for(f, timeout)
  local deadline = os.time() + timeout + 1
  repeat
    local v = f()
    if v then return v end
    M.sleep(0.05)
  until os.time() > deadline
  return nil
end

--- Lines of `s` as a list.
function M.lines(s)
  local t = {}
  for l in s:gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

--- pids of live processes whose command line contains `marker`.
function M.pids_with(marker)
  -- "[c]runspec..." matches the marker but not this pgrep's own shell
  local p = io.popen("pgrep -f -- " .. M.q("[" .. marker:sub(1, 1) .. "]" .. marker:sub(2)))
  local t = {}
  for l in p:lines() do t[#t + 1] = tonumber(l) end
  p:close()
  return t
end

--- pids of live (not zombie) processes in process group `pgid`.
function M.pids_in_group(pgid)
  local p = io.popen("ps -eo pid=,pgid=,stat=")
  local t = {}
  for l in p:lines() do
    local pid, g, stat = l:match("(%d+)%s+(%d+)%s+(%S+)")
    if tonumber(g) == pgid and not stat:match("^Z") then t[#t + 1] = tonumber(pid) end
  end
  p:close()
  return t
end

--- A TCP port that was free a moment ago (a store server on port 0, stopped).
function M.free_port()
  local srv = require("crun").store.server{host = "127.0.0.1", port = 0}
  local port = srv:port()
  srv:stop()
  return port
end

--- A marker unlikely to appear in any other command line.
function M.unique_marker(tag)
  return string.format("crunspec_%s_%d_%d", tag, os.time(), math.random(1, 1e9))
end

return M

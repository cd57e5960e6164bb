--- Helpers for the launcher specs: run crun-lua, capture what it printed,
-- start it in the background, wait for files, look for leftover processes.
local M = {}

local C = require("helpers.common")

M.CRUN_LUA = assert(C.CRUN_LUA, "CRUN_LUA must point at the built crun-lua")
M.SOURCE = C.SOURCE
M.count = C.count
M.FIX = M.SOURCE .. "/spec/fixtures/launcher/"
M.slurp, M.q, M.rmrf, M.sleep, M.wait_for, M.write = C.slurp, C.q, C.rmrf, C.sleep, C.wait_for, C.write

--- A fresh temporary directory (removed by M.rmrf).
function M.tmpdir() return C.tmpdir("launcher") end

--- Runs crun-lua with the argument string `args` (already quoted where
-- needed) and an optional env prefix ("A=1 B=2"). Returns
-- {code=, out=, err=, seconds=}. `timeout` (s) bounds the run (default 60).
function M.run(args, env, timeout)
  return C.run(args, {env = env, timeout = timeout})
end

--- Starts crun-lua in the background; returns a handle with .pid, and
-- :wait(timeout) -> {code=, out=, err=} once it has exited.
function M.start(args, env)
  local dir = M.tmpdir()
  local h = {dir = dir, pid = C.spawn(dir, args, env)}
  function h:wait(timeout)
    local rc = C.wait_rc(dir, timeout or 30)
    if not rc then
      os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
      error("crun-lua (pid " .. self.pid .. ") did not exit in time")
    end
    local r = {code = rc, out = C.slurp(dir .. "/out"), err = C.slurp(dir .. "/err")}
    M.rmrf(dir)
    return r
  end
  return h
end

--- Waits for every handle of M.start (`timeout` s each); once one fails to
-- exit in time (and is killed), the rest get a second each and are killed
-- too, so that no node outlives the case; then raises the first error.
-- Returns the results in the handles' order.
function M.wait_all(hs, timeout)
  local rs, err = {}, nil
  for i, h in ipairs(hs) do
    local ok, r = pcall(h.wait, h, err and 1 or timeout)
    if ok then rs[i] = r else err = err or r end
  end
  if err then error(err, 2) end
  return rs
end

--- Parses the "ENV K=V ..." lines of spec/fixtures/launcher/env.lua (with or
-- without the "[rank] " prefix) into {[rank] = {K = V}}; with `all`, a list of
-- every line's table instead (restarts print a rank more than once).
function M.env_by_rank(out, all)
  local t = {}
  for line in out:gmatch("[^\n]+") do
    local body = line:match("^%[%d+%] ENV (.*)$") or line:match("^ENV (.*)$")
    if body then
      local e = {}
      for k, v in body:gmatch("(%S+)=(%S+)") do e[k] = v end
      if all then t[#t + 1] = e else t[tonumber(e.RANK)] = e end
    end
  end
  return t
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

--- A TCP port that was free a moment ago: tried with a store server and
-- stopped. It is drawn below Linux's ephemeral range (32768 and up), so no
-- outgoing connection of a test running beside this one can take it meanwhile.
function M.free_port()
  local store = require("crun").store
  for _ = 1, 50 do
    local port = 20000 + math.random(0, 12000)
    local ok, srv = pcall(store.server, {host = "127.0.0.1", port = port})
    if ok then
      srv:stop()
      return port
    end
  end
  error("no free port found in 20000-32000")
end

--- A marker unlikely to appear in any other command line.
function M.unique_marker(tag)
  return string.format("crunspec_%s_%d_%d", tag, os.time(), math.random(1, 1e9))
end

return M

--- netns.lua — multi-host specs on one machine: hosts built by
-- scripts/netns.sh (a network namespace, address 10.77.0.<i+1> and hostname
-- h<i> per host, on a bridge of their own), one crun-lua per host.
--   local hosts = netns.up(3)          -- hosts 0..2; hosts:down() in a finally
--   hosts:start(i, args, {env=, limit=}) -- crun-lua <args> as host i, in the background
--   hosts:wait(i, timeout) -> exit code or nil; hosts:out(i) -> its stdout+stderr
--   hosts:sh(i, cmd, limit) -> exit code, output of an sh command run as host i
--   hosts:kill(i)  SIGKILLs host i's crun-lua; hosts:link(i, "down"|"up")
local c = require "helpers.common"

local M = {}
local SCRIPT = c.SOURCE .. "/scripts/netns.sh"

--- nil when hosts can be built here, else why not (for pending()).
function M.unavailable()
  local p = io.popen(c.q(SCRIPT) .. " check 2>&1")
  local why = p:read("a")
  local ok = p:close()
  if ok then return nil end
  return "network namespaces unavailable: " .. (why:gsub("%s+$", ""))
end

--- The address of host i.
function M.addr(i) return "10.77.0." .. (i + 1) end

local Hosts = {}
Hosts.__index = Hosts

-- This process's pid (the runs it builds are swept once it is gone).
local function my_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("n")
  f:close()
  return pid
end

--- Builds n hosts under a fresh tag; raises when that fails.
function M.up(n)
  local tag = string.format("s%05x", math.random(0, 0xfffff))
  local h = setmetatable({tag = tag, n = n, dir = c.tmpdir("netns")}, Hosts)
  local ok = os.execute(string.format("%s up %s %d %d >%s/up.log 2>&1", c.q(SCRIPT), tag, n, my_pid(), h.dir))
  if not ok then
    local log = c.slurp(h.dir .. "/up.log") or ""
    h:down()
    error("netns.sh up " .. tag .. " " .. n .. " failed: " .. log)
  end
  return h
end

--- Starts `crun-lua <args>` (quoted for sh) as host i from the source dir,
-- killed after opts.limit seconds (default 60); its pid in dir/pid.<i>, its
-- output in dir/out.<i>, its exit code in dir/rc.<i> once it ended.
-- opts.net_only: enter the host's network namespace only (the hostname,
-- mounts and everything else stay this machine's).
function Hosts:start(i, args, opts)
  opts = opts or {}
  local d = self.dir
  local inner = string.format("echo $$ >%s/pid.%d; exec env %s %s %s", d, i, opts.env or "",
                              c.q(c.CRUN_LUA), args)
  local cmd = string.format(
    "cd %s && { timeout -s KILL %d %s %s %s %d sh -c %s >%s/out.%d 2>&1; echo $? >%s/rc.%d.tmp;"
    .. " mv %s/rc.%d.tmp %s/rc.%d; } </dev/null >/dev/null 2>&1 &",
    c.q(c.SOURCE), opts.limit or 60, c.q(SCRIPT), opts.net_only and "netonly" or "exec", self.tag, i, c.q(inner), d, i, d, i, d, i, d, i)
  assert(os.execute(cmd))
  assert(c.wait_for(function() return c.slurp(d .. "/pid." .. i) end, 10),
         "crun-lua did not start on host " .. i)
end

--- Runs the sh command line `cmd` as host i from the source dir in the
-- foreground, killed after `limit` seconds; returns its exit code and
-- output (stdout and stderr).
function Hosts:sh(i, cmd, limit)
  local full = string.format("cd %s && timeout -s KILL %d %s exec %s %d sh -c %s 2>&1", c.q(c.SOURCE),
                             limit, c.q(SCRIPT), self.tag, i, c.q(cmd))
  local p = io.popen(full)
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

--- The exit code of host i's crun-lua, waiting up to `timeout` seconds.
function Hosts:wait(i, timeout)
  return tonumber(c.wait_for(function() return c.slurp(self.dir .. "/rc." .. i) end, timeout))
end

--- What host i's crun-lua wrote so far (stdout and stderr).
function Hosts:out(i) return c.slurp(self.dir .. "/out." .. i) or "" end

--- SIGKILLs host i's crun-lua (its workers die with it).
function Hosts:kill(i)
  local pid = tonumber(c.slurp(self.dir .. "/pid." .. i))
  assert(pid, "no pid for host " .. i)
  os.execute("kill -KILL " .. pid)
end

--- Pulls host i's cable ("down") or plugs it back in ("up").
function Hosts:link(i, state)
  assert(os.execute(string.format("%s link %s %d %s", c.q(SCRIPT), self.tag, i, state)))
end

--- Kills what still runs in the hosts and removes them; safe to call twice.
function Hosts:down()
  if self.gone then return end
  self.gone = true
  os.execute(string.format("%s down %s >/dev/null 2>&1", c.q(SCRIPT), self.tag))
  c.rmrf(self.dir)
end

return M

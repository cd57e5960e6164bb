--- jobs/store_scale.lua — the store at scale: N clients (default 10,000; many
-- connections from a few processes) join one rendezvous on one TCP store.
--
--   lua5.4 jobs/store_scale.lua [--clients 10000] [--procs 8] [--timeout 120]
--   CRUN_STORE_UNIX=0 lua5.4 jobs/store_scale.lua      # loopback TCP, not the unix socket
--   (plain lua5.4 finds crun once build/env.sh is sourced, or crun is installed)
--
-- The server lives in this process. Each of --procs child processes opens
-- one control connection and waits for "go"; then it opens its share of the
-- clients one after another, and each new client (connect, authenticate)
-- does add("joined", 1) and stays connected; the client whose add returns N
-- sets "all". Reported: the time from "go" to "all" (every client joined),
-- this process's resident memory before and its peak after (the server's
-- cost, the Lua state being the same), and the joins per second. A child
-- raises its own open-file limit (`ulimit -n`) to hold its share.
local crun = require "crun"

local LUA = crun.lua_command()

local function connect(port, timeout)
  return crun.store.tcp{host = "127.0.0.1", port = port, timeout = timeout, connect_timeout = timeout}
end

-- kB value of `field` in /proc/self/status.
local function status_kb(field)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

--- Child: `count` clients joining; stays until "release".
local function child(port, count, total, timeout, procs)
  local ctl = connect(port, timeout)
  if ctl:add("ready", 1) == procs then ctl:set("ready_all", "1") end
  ctl:wait({"go"}, timeout)
  local clients = {}
  for i = 1, count do
    local c = connect(port, timeout)
    clients[i] = c
    if c:add("joined", 1) == total then c:set("all", "1") end
  end
  ctl:wait({"release"}, timeout)
  for _, c in ipairs(clients) do c:close() end
  ctl:close()
end

local function parse_args()
  local o = {clients = 10000, procs = 8, timeout = 120}
  local i = 1
  while i <= #arg do
    local a, v = arg[i], arg[i + 1]
    local k = a:match("^%-%-(%a+)$")
    if not k or o[k] == nil or not math.tointeger(tonumber(v)) then
      error("usage: lua5.4 jobs/store_scale.lua [--clients N] [--procs P] [--timeout S]", 0)
    end
    o[k] = math.tointeger(tonumber(v))
    i = i + 2
  end
  return o
end

local function main()
  if arg[1] == "--child" then
    return child(math.tointeger(tonumber(arg[2])), math.tointeger(tonumber(arg[3])),
      math.tointeger(tonumber(arg[4])), tonumber(arg[5]), math.tointeger(tonumber(arg[6])))
  end
  local o = parse_args()
  local server = crun.store.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = o.timeout}
  local port = server:port()
  local procs = {}
  local per = o.clients // o.procs
  for p = 1, o.procs do
    local n = per + (p <= o.clients % o.procs and 1 or 0)
    procs[p] = io.popen(string.format("ulimit -n %d 2>/dev/null; %s %s --child %d %d %d %g %d 2>&1", n + 64, LUA,
      arg[0], port, n, o.clients, o.timeout, o.procs), "r")
  end
  server:wait({"ready_all"}, o.timeout)
  local rss0 = status_kb("VmRSS")
  local t0 = crun.clock()
  server:set("go", "1")
  server:wait({"all"}, o.timeout)
  local dt = crun.clock() - t0
  local hwm, rss1 = status_kb("VmHWM"), status_kb("VmRSS")
  local joined = server:add("joined", 0)
  server:set("release", "1")
  local failed = 0
  for p, h in ipairs(procs) do
    local out = h:read("a")
    if not h:close() then
      failed = failed + 1
      io.stderr:write(string.format("child %d failed:\n%s\n", p, out))
    end
  end
  print(string.format("store_scale: %d clients from %d processes joined in %.3f s (%.0f joins/s) over %s; "
    .. "server process RSS %.1f MiB before, %.1f MiB with every client connected (peak %.1f MiB): %.1f KiB per client",
    joined, o.procs, dt, joined / dt, os.getenv("CRUN_STORE_UNIX") == "0" and "loopback TCP" or "the unix socket",
    rss0 / 1024, rss1 / 1024, hwm / 1024, (rss1 - rss0) / joined))
  server:close()
  if failed > 0 or joined ~= o.clients then os.exit(1) end
end

main()

-- store_bench.lua — TCP store latency and throughput, measured the way the
-- torch TCPStore anchor (anchors/store/store_bench.py) measures them:
--
--   latency:    1 client process, N ops each of set / get / add, every op
--               timed; median, p10, p99 (us) after 200 warm-up ops
--   throughput: C client processes released together (a store barrier);
--               setget: each does K set then K get on its own keys;
--               add:    each does K add("shared_ctr", 1) (final value checked)
--               aggregate ops/s = total ops / (last finish - first start)
-- The server (is_master) lives in this process, which only waits; clients are
-- separate lua5.4 processes connecting to 127.0.0.1, so every op crosses a
-- socket: crun's same-host clients use the server's unix socket
-- (CRUN_STORE_UNIX=0 in the environment forces loopback TCP, as torch uses).
-- torch 1.13's set sends without waiting for a reply, and so does crun's by
-- default; CRUN_STORE_ASYNC_SET=0 in the environment makes each crun set wait
-- for its acknowledgement (a round trip; the title then says so). Values: 16 B.
--
--   lua5.4 jobs/store_bench.lua [--lat-ops 10000] [--clients 8] [--tput-ops 5000]
--                               [--torch-csv FILE] [--out FILE]
--   (plain lua5.4 finds crun once build/env.sh is sourced, or crun is installed)
-- With --torch-csv (the --out file of the anchor) the table shows torch's
-- figures side by side; --lat-ops 0 runs the throughput tests only.
local crun = require "crun"

local VAL = string.rep("v", 16)
local LUA = crun.lua_command()

local function pct(v, p)
  local s = {}
  for i = 1, #v do s[i] = v[i] end
  table.sort(s)
  return s[math.min(#s, math.floor(p * #s) + 1)]
end

local function median(v)
  local s = {}
  for i = 1, #v do s[i] = v[i] end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

local function connect(port)
  return crun.store.tcp{host = "127.0.0.1", port = port, timeout = 120, connect_timeout = 30}
end

--- Child: the latency client. Stores "med p10 p99" per op under lat/<op>.
local function lat_client(port, nops)
  local st = connect(port)
  local clock = crun.clock
  for _, name in ipairs({"set", "get", "add"}) do
    for i = 0, 199 do -- warm-up
      if name == "set" then st:set("w" .. i, VAL)
      elseif name == "get" then st:get("w" .. i)
      else st:add("wctr", 1) end
    end
    local ts = {}
    for i = 0, nops - 1 do
      local k = "lat/" .. i
      local a
      if name == "set" then a = clock(); st:set(k, VAL)
      elseif name == "get" then a = clock(); st:get(k)
      else a = clock(); st:add("latctr", 1) end
      ts[#ts + 1] = clock() - a
    end
    st:set("res/lat/" .. name, string.format("%.9f %.9f %.9f", median(ts), pct(ts, 0.10), pct(ts, 0.99)))
  end
  st:close()
end

--- Child: one throughput client. Stores "t0 t1 ops" under res/<mode>/<cid>.
local function tput_client(port, cid, nops, mode, nclients)
  local st = connect(port)
  st:set("warm/" .. cid, VAL)
  st:get("warm/" .. cid)
  crun.store.barrier(st, "start/" .. mode, nclients, cid, 120)
  local t0 = crun.clock()
  local ops
  if mode == "setget" then
    local prefix = "c" .. cid .. "/k"
    for i = 0, nops - 1 do st:set(prefix .. i, VAL) end
    for i = 0, nops - 1 do st:get(prefix .. i) end
    ops = 2 * nops
  else
    for _ = 1, nops do st:add("shared_ctr", 1) end
    ops = nops
  end
  local t1 = crun.clock()
  st:set("res/" .. mode .. "/" .. cid, string.format("%.9f %.9f %d", t0, t1, ops))
  st:close()
end

--- Runs child processes of this script and checks that each exits 0.
local function run_children(list)
  local procs = {}
  for i, args in ipairs(list) do
    procs[i] = io.popen(string.format("%s %s --child %s 2>&1", LUA, arg[0], args), "r")
  end
  for i, p in ipairs(procs) do
    local out = p:read("a")
    local ok, how, code = p:close()
    if not ok then error(string.format("client %d failed (%s %s):\n%s", i, how, code, out)) end
  end
end

local function parse_args()
  local o = {lat_ops = 10000, clients = 8, tput_ops = 5000}
  local i = 1
  while i <= #arg do
    local a, v = arg[i], arg[i + 1]
    if a == "--lat-ops" then o.lat_ops = math.tointeger(tonumber(v))
    elseif a == "--clients" then o.clients = math.tointeger(tonumber(v))
    elseif a == "--tput-ops" then o.tput_ops = math.tointeger(tonumber(v))
    elseif a == "--torch-csv" then o.torch_csv = v
    elseif a == "--out" then o.out = v
    else error("unknown option " .. tostring(a) .. " (see the header of jobs/store_bench.lua)") end
    if v == nil then error("option " .. a .. " needs a value") end
    i = i + 2
  end
  return o
end

--- Reads the anchor's CSV into {test = {median, p10, p99, agg}}.
local function read_torch(path)
  local t = {}
  if not path then return t end
  local f = assert(io.open(path), "cannot open " .. path)
  for line in f:lines() do
    local test, _, _, med, p10, p99, agg = line:match("^([%w_]+),(%d+),(%d+),([^,]*),([^,]*),([^,]*),([^,]*)$")
    if test then t[test] = {tonumber(med), tonumber(p10), tonumber(p99), tonumber(agg)} end
  end
  f:close()
  return t
end

local function main()
  local o = parse_args()
  local server = crun.store.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 300}
  local port = server:port()
  local rows = {}
  if o.lat_ops > 0 then run_children({string.format("lat %d %d", port, o.lat_ops)}) end
  for _, name in ipairs(o.lat_ops > 0 and {"set", "get", "add"} or {}) do
    local med, p10, p99 = server:get("res/lat/" .. name):match("(%S+) (%S+) (%S+)")
    med, p10, p99 = tonumber(med) * 1e6, tonumber(p10) * 1e6, tonumber(p99) * 1e6
    rows[#rows + 1] = {"latency_" .. name, 1, o.lat_ops, med, p10, p99, 1e6 / med}
  end
  for _, mode in ipairs({"setget", "add"}) do
    local list = {}
    for c = 0, o.clients - 1 do
      list[#list + 1] = string.format("tput %d %d %d %s %d", port, c, o.tput_ops, mode, o.clients)
    end
    run_children(list)
    local t0, t1, ops, per = math.huge, -math.huge, 0, {}
    for c = 0, o.clients - 1 do
      local a, b, n = server:get("res/" .. mode .. "/" .. c):match("(%S+) (%S+) (%S+)")
      a, b, n = tonumber(a), tonumber(b), tonumber(n)
      t0, t1, ops = math.min(t0, a), math.max(t1, b), ops + n
      per[#per + 1] = (b - a) / n * 1e6
    end
    if mode == "add" then
      local final = server:add("shared_ctr", 0)
      assert(final == o.clients * o.tput_ops, "shared_ctr = " .. final)
    end
    rows[#rows + 1] = {"throughput_" .. mode, o.clients, ops // o.clients, median(per), nil, nil,
                       ops / (t1 - t0)}
  end
  server:close()

  local torch = read_torch(o.torch_csv)
  local function f(v, fmt) return v and string.format(fmt, v) or "-" end
  print(string.format("crun TCP store (%s%s) vs torch TCPStore (127.0.0.1, value 16 B; us = microseconds)",
                      os.getenv("CRUN_STORE_UNIX") == "0" and "loopback TCP" or "unix socket",
                      os.getenv("CRUN_STORE_ASYNC_SET") == "0" and ", acknowledged sets: each set waits" or ""))
  print(string.format("%-18s %7s %8s | %9s %9s | %9s %9s | %11s %11s %7s", "test", "clients",
                      "ops/cli", "crun med", "torch med", "crun p99", "torch p99", "crun ops/s",
                      "torch ops/s", "speedup"))
  local csv = {"test,clients,ops_per_client,median_us,p10_us,p99_us,agg_ops_per_s"}
  for _, r in ipairs(rows) do
    local t = torch[r[1]] or {}
    print(string.format("%-18s %7d %8d | %9s %9s | %9s %9s | %11s %11s %7s", r[1], r[2], r[3],
                        f(r[4], "%.2f"), f(t[1], "%.2f"), f(r[6], "%.2f"), f(t[3], "%.2f"),
                        f(r[7], "%.0f"), f(t[4], "%.0f"), t[4] and f(r[7] / t[4], "%.1fx") or "-"))
    csv[#csv + 1] = string.format("%s,%d,%d,%s,%s,%s,%.0f", r[1], r[2], r[3], f(r[4], "%.2f"),
                                  r[5] and f(r[5], "%.2f") or "", r[6] and f(r[6], "%.2f") or "", r[7])
  end
  if o.out then
    local fo = assert(io.open(o.out, "w"))
    fo:write(table.concat(csv, "\n"), "\n")
    fo:close()
  end
end

if arg[1] == "--child" then
  local kind = arg[2]
  if kind == "lat" then
    lat_client(tonumber(arg[3]), tonumber(arg[4]))
  else
    tput_client(tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5]), arg[6], tonumber(arg[7]))
  end
  os.exit(0)
end
main()

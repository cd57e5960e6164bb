-- store_lat.lua — get latency with the server in another process, for
-- bench/store_pinned.sh (which pins the two processes to chosen CPUs).
--
--   crun-lua -n 1 --master-port 0 --no-prefix bench/store_lat.lua server PORT
--   crun-lua -n 1 --master-port 0 --no-prefix bench/store_lat.lua client PORT [N]
-- The server holds key "k" (16 B) until the client sets "done"; the client
-- does 500 warm-up gets and N timed ones and prints median, p10 and p90.
local crun = require "crun"
local mode, port, n = arg[1], tonumber(arg[2]), tonumber(arg[3] or 5000)
if mode == "server" then
  local s = crun.store.tcp{host = "127.0.0.1", port = port, is_master = true, timeout = 120}
  s:set("k", string.rep("v", 16))
  s:wait({"done"}, 120)
  os.exit(0)
end
local st = crun.store.tcp{host = "127.0.0.1", port = port, timeout = 60, connect_timeout = 30}
local clock = crun.clock
for _ = 1, 500 do st:get("k") end
local ts = {}
for i = 1, n do
  local a = clock()
  st:get("k")
  ts[i] = clock() - a
end
table.sort(ts)
print(string.format("get median %.2f us p10 %.2f p90 %.2f", ts[n // 2] * 1e6, ts[n // 10] * 1e6,
                    ts[n * 9 // 10] * 1e6))
st:set("done", "1")

-- store_demo.lua — four processes meet through one TCP store.
--
--   lua5.4 examples/store_demo.lua        (with build/env.sh sourced)
--
-- Rank 0 hosts the store on a free port (port 0) and starts ranks 1..3 as
-- child lua5.4 processes running this same file. Every rank counts itself in
-- with add(), publishes its pid and a greeting with set(), meets the others at
-- a barrier, and then reads everyone's greeting. Rank 0 prints the summary.
local crun = require "crun"

local WORLD = 4

--- What every rank does once connected.
local function work(store, rank)
  local arrived = store:add("arrived", 1)
  store:set("hello/" .. rank, string.format("rank %d says hi (arrived #%d)", rank, arrived))
  store:add("sum_of_ranks", rank)
  store:append("order", rank .. " ")
  crun.store.barrier(store, "greeted", WORLD, rank, 30)
  local keys = {}
  for r = 0, WORLD - 1 do keys[#keys + 1] = "hello/" .. r end
  return store:multi_get(keys)
end

if arg[1] == "worker" then -- ranks 1..3
  local port, rank = tonumber(arg[2]), tonumber(arg[3])
  local store = crun.store.tcp{host = "127.0.0.1", port = port, timeout = 30}
  local greetings = work(store, rank)
  store:set("saw/" .. rank, tostring(#greetings))
  store:close()
  os.exit(0)
end

-- rank 0: host the store, start the others, do the same work, summarize.
local t0 = crun.clock()
local store <close> = crun.store.tcp{host = "127.0.0.1", port = 0, is_master = true, timeout = 30}
local lua = crun.lua_command()
local children = {}
for rank = 1, WORLD - 1 do
  local cmd = string.format("%s %s worker %d %d 2>&1", lua, arg[0], store:port(), rank)
  children[rank] = io.popen(cmd, "r")
end
local greetings = work(store, 0)
local failed = 0
for rank = 1, WORLD - 1 do
  local out = children[rank]:read("a")
  local ok, how, code = children[rank]:close() -- reaps the child
  if not ok then
    failed = failed + 1
    io.stderr:write(string.format("rank %d failed (%s %s):\n%s", rank, how, code, out))
  end
end
store:wait({"saw/1", "saw/2", "saw/3"}, 10)
local all_read = #greetings == WORLD
for _, n in ipairs(store:multi_get{"saw/1", "saw/2", "saw/3"}) do
  all_read = all_read and tonumber(n) == WORLD
end

print(string.format("crun store demo: %d processes met on 127.0.0.1:%d", WORLD, store:port()))
for _, g in ipairs(greetings) do print("  " .. g) end
print(string.format("  arrived = %s, sum of ranks = %s (expected %d), append order: %s",
                    store:get("arrived"), store:get("sum_of_ranks"), WORLD * (WORLD - 1) // 2,
                    store:get("order")))
print(string.format("  keys in the store: %d; every rank read all %d greetings: %s; %.0f ms",
                    store:num_keys(), WORLD, all_read and "yes" or "NO",
                    (crun.clock() - t0) * 1000))
local good = failed == 0 and all_read and tonumber(store:get("sum_of_ranks")) == 6
os.exit(good and 0 or 1, true)

-- A child process for spec/store_multiproc_spec.lua:
--   lua5.4 store_worker.lua <tcp|file> <port|path> <index> <adds> <slots>
-- Opens the store, adds 1 to "counter" <adds> times, tries to claim slot
-- 0..<slots>-1 with compare_set("", me), records what it won and saw, then
-- waits on a shared barrier. Prints "OK <index>" and exits 0, or prints the
-- error and exits 1.
local crun = require "crun"
local kind, where, idx, adds, slots = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5])

local ok, err = pcall(function()
  local s
  if kind == "tcp" then
    s = crun.store.tcp{host = "127.0.0.1", port = tonumber(where), timeout = 60, connect_timeout = 30}
  else
    s = crun.store.file(where)
  end
  local last = 0
  for _ = 1, adds do
    local v = s:add("counter", 1)
    assert(v > last, "add went backwards")
    last = v
  end
  for slot = 0, slots - 1 do
    local got = s:compare_set("slot" .. slot, "", tostring(idx))
    s:append("seen" .. slot, got .. ",")
  end
  s:set("done/" .. idx, tostring(last))
  crun.store.barrier(s, "end", tonumber(os.getenv("WORKERS") or "1"), idx, 60)
  s:close()
end)
if ok then
  print("OK " .. idx)
  os.exit(0)
end
print("FAIL " .. idx .. ": " .. tostring(err))
os.exit(1)

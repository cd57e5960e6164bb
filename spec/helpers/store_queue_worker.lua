-- A child process for the queue and file-users cases of
-- spec/store_multiproc_spec.lua:
--   lua5.4 store_queue_worker.lua pop  <tcp|file> <port|path> <index>
--     pushes its index onto "ready", then pops "work" (blocking) until it
--     gets "\0END"; prints "ITEM <hex>" per item.
--   lua5.4 store_queue_worker.lua push <tcp|file> <port|path> <delay s> <hex value>
--     sleeps, then pushes the value onto queue "wake".
--   lua5.4 store_queue_worker.lua user <path> <world_size> <close|gc|crash>
--     opens the file store, adds 1 to "open", waits for "go", then closes
--     it (close), leaves it to the collector at the end (gc), or exits
--     without either (crash: never counted out).
-- Prints "OK" and exits 0, or prints the error and exits 1.
local crun = require "crun"
local mode = arg[1]

local function open(kind, where)
  if kind == "tcp" then
    return crun.store.tcp{host = "127.0.0.1", port = tonumber(where), timeout = 60, connect_timeout = 30}
  end
  return crun.store.file(where)
end

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local function unhex(h) return (h:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end)) end

local ok, err = pcall(function()
  if mode == "pop" then
    local s = open(arg[2], arg[3])
    s:queue_push("ready", arg[4])
    local out = {}
    while true do
      local v = s:queue_pop("work", 60)
      if v == "\0END" then break end
      out[#out + 1] = "ITEM " .. hex(v)
    end
    print(table.concat(out, "\n"))
    s:close()
  elseif mode == "push" then
    local s = open(arg[2], arg[3])
    os.execute("sleep " .. arg[4])
    s:queue_push("wake", unhex(arg[5]))
    s:close()
  elseif mode == "user" then
    local s = crun.store.file(arg[2], {world_size = tonumber(arg[3])})
    s:add("open", 1)
    s:wait({"go"}, 60)
    if arg[4] == "close" then s:close() end
    if arg[4] == "crash" then
      print("OK")
      io.stdout:flush()
      os.exit(0, false) -- no lua_close: no finalizer runs, as when killed
    end
  else
    error("unknown mode " .. tostring(mode))
  end
end)
if ok then
  print("OK")
  return -- a normal end: lua.c closes the state and runs the finalizers (gc mode)
end
print("FAIL: " .. tostring(err))
os.exit(1)

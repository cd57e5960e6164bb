-- neighbour_store.lua — run by security_spec as another user on the host:
--   client <port> [tcp]: opens an open (token "") client of the store at
--     127.0.0.1:<port> (tcp: CRUN_STORE_UNIX=0 is set by the caller), reads
--     key "secret" and sets it to "pwned"; prints what it got.
--   server: serves an open store on 127.0.0.1, prints its port, lives 20 s.
local crun = require "crun"
if arg[1] == "server" then
  local srv = crun.store.server{host = "127.0.0.1", port = 0, token = ""}
  io.stdout:write(srv:port(), "\n")
  io.stdout:flush()
  os.execute("sleep 20")
  return
end
local ok, s = pcall(crun.store.tcp, {host = "127.0.0.1", port = tonumber(arg[2]), token = "", timeout = 3})
if not ok then print("refused: " .. tostring(s)) return end
local okg, v = pcall(s.get, s, "secret")
print("read: " .. tostring(okg) .. " " .. tostring(v))
print("set: " .. tostring((pcall(s.set, s, "secret", "pwned"))))

--- security_job.lua — a job for security_spec, run under crun-lua:
--   security_job.lua outsider   rank 0 starts a process without the job's
--                               secret (or with another) that tries to read
--                               and set the store's keys; prints what it got
--   security_job.lua mesh       (3 ranks, CRUN_SHM=0) rank 1 first sends junk
--                               bytes and a forged hello for rank 2 to rank
--                               0's mesh port, then every rank all-reduces
--   security_job.lua stall      (3 ranks, CRUN_SHM=0) rank 1 opens 150 connections
--                               to rank 0's mesh port that say nothing (a few say
--                               one byte) and holds them 40 s; the mesh still forms
-- Every rank prints "rank <r> ok <case>" when its checks passed.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local case = arg[1]
local rank = tonumber(os.getenv("RANK"))

local function check(cond, fmt, ...)
  if not cond then error(string.format("rank %d: " .. fmt, rank, ...), 0) end
end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

if case == "outsider" then
  dist.init_process_group{backend = "cpu", timeout = 30}
  if rank == 0 then
    dist.get_store():set("precious", "mine")
    local probe = [[
      local S = require("crun.store")
      local ok, s = pcall(S.tcp, {host = "127.0.0.1", port = PORT, timeout = 2, connect_timeout = 1})
      if not ok then print("refused: " .. tostring(s)) return end
      local got = s:check({"precious"})
      s:set("crun/repl/chunk", "os.exit(7)")
      s:add("default/incarnation", 1)
      print("got in: " .. tostring(got))
    ]]
    for _, env in ipairs{"CRUN_TOKEN=", "CRUN_TOKEN=guessed-secret", "CRUN_TOKEN= CRUN_STORE_UNIX=0"} do
      local p = io.popen(string.format("env %s lua5.4 -e 'PORT=%s' -e %s 2>&1", env, os.getenv("MASTER_PORT"), sh_quote(probe)))
      local out = p:read("a")
      p:close()
      check(out:match("^refused: EACCES: "), "an outsider with %s got: %s", env, out)
      print("outsider (" .. env .. "): " .. out:gsub("\n", " "))
    end
    check(not dist.get_store():check({"crun/repl/chunk"}), "the outsider's key is there")
  end
  dist.barrier()
  local t = T.full({4}, rank + 1, "float32")
  dist.all_reduce(t)
  check(t[4] == dist.get_world_size() * (dist.get_world_size() + 1) / 2, "all_reduce after the outsiders: %s", t[4])
elseif case == "mesh" then
  if rank == 1 then
    -- knowing the address, as anyone on the host can (ss -ltn), not the secret
    local s = crun.store.from_env{}
    s:wait({"default/0/tcp/0"}, 20)
    local addr = s:get("default/0/tcp/0")
    local host, port = addr:match("^(.*):(%d+)$")
    local h = 2166136261
    for c in ("default/0"):gmatch(".") do h = ((h ~ c:byte()) * 16777619) & 0xffffffff end
    local function le32(v) local b = {} for i = 0, 3 do b[#b + 1] = string.format("\\x%02x", (v >> (8 * i)) & 0xff) end return table.concat(b) end
    local hello = le32(0x4f4c4548) .. le32(h) .. le32(2) .. le32(3)
    -- rank 0's mesh listener (still open: rank 2 is late) is on the published address only
    local seen = {}
    for line in io.lines("/proc/net/tcp") do
      local a, p, st = line:match("^%s*%d+: (%x+):(%x+) %x+:%x+ (%x+)")
      if st == "0A" and tonumber(p, 16) == tonumber(port) then seen[#seen + 1] = a end
    end
    check(#seen == 1 and seen[1] == "0100007F", "rank 0's mesh port %s listens on %s", port, table.concat(seen, ","))
    local forged = hello .. string.rep("\\x00", 64) .. string.rep("\\x01", 256)
    os.execute(string.format([[bash -c 'exec 3<>/dev/tcp/%s/%s; printf "GET / HTTP/1.1\r\n\r\n" >&3; sleep 0.2; exec 3>&-' ]] ..
                             [[; bash -c 'exec 3<>/dev/tcp/%s/%s; printf "%s" >&3; sleep 0.5; exec 3>&-' ]], host, port, host, port, forged))
  elseif rank == 2 then
    os.execute("sleep 1.5")  -- the forger claims this rank's place first
  end
  dist.init_process_group{backend = "cpu", timeout = 30}
  local t = T.full({1000}, rank + 1, "float32")
  dist.all_reduce(t)
  check(t[1000] == 6 and t[1] == 6, "all_reduce after junk and a forged hello gave %s", t[1])
elseif case == "stall" then
  if rank == 1 then
    local s = crun.store.from_env{}
    s:wait({"default/0/tcp/0"}, 20)
    local host, port = s:get("default/0/tcp/0"):match("^(.*):(%d+)$")
    -- idle connections, held open past the job's 30 s timeout (a handshake that
    -- waited on each in turn would never reach the real ranks)
    os.execute(string.format([[bash -c 'for i in $(seq 150); do exec {fd}<>/dev/tcp/%s/%s || exit 1; ]] ..
      [[[ $((i %% 10)) = 0 ] && printf x >&$fd; done; sleep 40' >/dev/null 2>&1 &]], host, port))
    os.execute("sleep 1")
  elseif rank == 2 then
    os.execute("sleep 1.5")  -- after the strangers
  end
  dist.init_process_group{backend = "cpu", timeout = 30}
  local t = T.full({1000}, rank + 1, "float32")
  dist.all_reduce(t)
  check(t[1000] == 6 and t[1] == 6, "all_reduce after 150 stalled connections gave %s", t[1])
end
print(string.format("rank %d ok %s", rank, case))

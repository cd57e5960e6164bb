-- security_spec.lua — the job's secret keeps outsiders out (issue 16 items
-- 1-4): a process without it (or with a guessed one) cannot read or set a
-- store key over TCP or the unix socket, so it can neither plant a REPL chunk
-- nor break the rendezvous; junk and a forged hello on a mesh port do not
-- break the job or reach an all_reduce; listeners bind the published address.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local run = require "helpers.dist_run"

local function job(n, case, env)
  local code, out = run.run(n, "spec/helpers/security_job.lua", case, {limit = 60, env = env})
  assert.are.equal(0, code, out)
  for r = 0, n - 1 do assert.is_truthy(out:find("rank " .. r .. " ok " .. case, 1, true), out) end
  return out
end

-- Listening TCP sockets of processes whose command line contains `marker`:
-- {"127.0.0.1:port", ...} from /proc/net/tcp (inodes matched via /proc/<pid>/fd).
local function listeners_of(pids)
  local inodes = {}
  for _, pid in ipairs(pids) do
    local p = io.popen("ls -l /proc/" .. pid .. "/fd 2>/dev/null")
    for ino in p:read("a"):gmatch("socket:%[(%d+)%]") do inodes[ino] = true end
    p:close()
  end
  local out = {}
  for line in io.lines("/proc/net/tcp") do
    local a, port, st, ino = line:match("^%s*%d+: (%x+):(%x+) %x+:%x+ (%x+) %x+:%x+ %x+:%x+ %x+%s+%d+%s+%d+%s+(%d+)")
    if a and st == "0A" and inodes[ino] then
      local n = tonumber(a, 16)
      out[#out + 1] = string.format("%d.%d.%d.%d:%d", n & 255, (n >> 8) & 255, (n >> 16) & 255, n >> 24, tonumber(port, 16))
    end
  end
  return out
end

describe("security", function()
  it("an outsider without the job's secret cannot read or set the store's keys", function()
    local out = job(2, "outsider")
    assert.is_truthy(out:find("requires the job's secret", 1, true), out)
    assert.is_truthy(out:find("refused this client's proof", 1, true), out)
  end)

  it("junk bytes and a forged hello on a mesh port (bound to 127.0.0.1) neither stop the job nor reach its all_reduce", function()
    job(3, "mesh", "CRUN_SHM=0")
  end)

  it("150 connections that stall in the mesh handshake do not keep the real ranks out (run at once, oldest dropped)", function()
    job(3, "stall", "CRUN_SHM=0")
  end)

  it("the launcher's store listens on 127.0.0.1 for a one-host job, not 0.0.0.0 (the mesh: see above)", function()
    local crun_lua = os.getenv("CRUN_LUA")
    if not crun_lua then pending("CRUN_LUA is not set (run through ctest)") return end
    local marker = "crun-bind-" .. math.random(1, 1e9)
    local script = tmpname()
    local f = assert(io.open(script, "w"))
    f:write('local d = require("crun").dist; d.init_process_group{backend="cpu"}; d.barrier(); ' ..
            'io.open(arg[1] .. "." .. d.get_rank(), "w"):close(); os.execute("sleep 2"); d.barrier()\n')
    f:close()
    local flag = tmpname()
    local p = io.popen(string.format("CRUN_SHM=0 timeout -s KILL 30 %s -n 2 --master-port 0 %s %s %s & echo $!",
                                     crun_lua, script, flag, marker))
    local pid = p:read("l")
    p:close()
    for _ = 1, 100 do
      local a, b = io.open(flag .. ".0"), io.open(flag .. ".1")
      if a and b then a:close(); b:close(); break end
      if a then a:close() end
      if b then b:close() end
      os.execute("sleep 0.05")
    end
    local pids = {}
    local kids = io.popen("pgrep -f " .. marker)
    for k in kids:read("a"):gmatch("%d+") do pids[#pids + 1] = k end
    kids:close()
    local socks = listeners_of(pids)
    os.execute("sleep 2.5")
    os.remove(script); os.remove(flag); os.remove(flag .. ".0"); os.remove(flag .. ".1")
    assert.is_true(#socks >= 1, "expected the store's listener, got: " .. table.concat(socks, " "))
    for _, a in ipairs(socks) do
      assert.is_truthy(a:match("^127%.0%.0%.1:"), "a listener on " .. a)
    end
  end)
  -- Another user's process on the same host (run with setpriv as `nobody`;
  -- the spec must run as root to switch users).
  local function as_nobody(cmd)
    return string.format("setpriv --reuid=nobody --regid=%s --clear-groups env LUA_PATH=%q LUA_CPATH=%q %s",
                         io.popen("id -g nobody"):read("l"), package.path, package.cpath, cmd)
  end
  local function can_switch_user()
    local p = io.popen("id -u; command -v setpriv")
    local out = p:read("a")
    p:close()
    return out:match("^0\n") and out:find("setpriv", 1, true) and os.execute("id nobody >/dev/null 2>&1")
  end

  it("a store without a secret serves no other user's process on its host (TCP or unix socket), and its "
     .. "clients refuse another user's server on the port", function()
    if not can_switch_user() then pending("needs root and setpriv to act as user nobody") return end
    local store = require("crun").store
    local srv = store.server{host = "127.0.0.1", port = 0, token = ""}
    local s = store.tcp{host = "127.0.0.1", port = srv:port(), token = "", timeout = 5}
    s:set("secret", "-271")
    for _, env in ipairs{"", "CRUN_STORE_UNIX=0 "} do
      local p = io.popen(as_nobody(env .. "lua5.4 spec/helpers/neighbour_store.lua client " .. srv:port()) .. " 2>&1")
      local out = p:read("a")
      p:close()
      assert.is_truthy(out:find("refused: EACCES: the store server 127.0.0.1:" .. srv:port()
                                .. " serves only its own user's processes on its host", 1, true), env .. out)
      assert.is_falsy(out:find("-271", 1, true), out)
    end
    assert.are.equal("-271", s:get("secret"))
    s:close()
    srv:stop()
    -- the neighbour holds the port: a client without a secret refuses its server
    local p = io.popen(as_nobody("lua5.4 spec/helpers/neighbour_store.lua server") .. " 2>&1 & echo $!")
    local pid, port = p:read("l"), tonumber(p:read("l"))
    p:close()
    local ok, err = pcall(store.tcp, {host = "127.0.0.1", port = port, token = "", timeout = 3})
    os.execute("kill " .. pid .. " 2>/dev/null")
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("EACCES: the store server 127.0.0.1:" .. port
                                       .. " is a process of another user", 1, true), tostring(err))
  end)
  it("a job without a secret refuses another user's process that claims a rank on its mesh port "
     .. "(it would get the rank's all_reduce data)", function()
    if not can_switch_user() then pending("needs root and setpriv to act as user nobody") return end
    local store = require("crun").store
    local srv = store.server{host = "127.0.0.1", port = 0, token = ""}
    local s = store.tcp{host = "127.0.0.1", port = srv:port(), token = "", timeout = 5}
    local outs = {tmpname(), tmpname()}
    for r = 0, 1 do -- rank 1 comes 2 s late: the neighbour connects first
      os.execute(string.format("CRUN_SHM=0 timeout -s KILL 20 lua5.4 spec/helpers/neighbour_mesh_job.lua %d %d %d > %s 2>&1 &",
                               r, srv:port(), 2 * r, outs[r + 1]))
    end
    local addr
    for _ = 1, 200 do
      for _, k in ipairs(s:list_keys()) do if k == "default/0/tcp/0" then addr = s:get(k) end end
      if addr then break end
      os.execute("sleep 0.025")
    end
    assert.is_truthy(addr, "rank 0 never published its mesh address")
    local p = io.popen(as_nobody("timeout 10 python3 spec/helpers/neighbour_mesh.py 127.0.0.1 "
                                 .. addr:match(":(%d+)$") .. " default/0 1 2") .. " 2>&1")
    local attack = p:read("a")
    p:close()
    local got = {}
    for _ = 1, 200 do
      for r = 1, 2 do
        local f = io.open(outs[r])
        got[r] = f and f:read("a") or ""
        if f then f:close() end
      end
      if got[1]:find("all_reduce:", 1, true) and got[2]:find("all_reduce:", 1, true) then break end
      os.execute("sleep 0.05")
    end
    os.remove(outs[1]); os.remove(outs[2])
    s:close()
    srv:stop()
    assert.is_truthy(attack:find("attacker: refused", 1, true), attack)
    assert.is_falsy(attack:find("stole", 1, true), attack)
    for r = 0, 1 do -- (-3.5 + r) summed over ranks 0, 1; 7.25 twice; (-11 - r) summed
      assert.is_truthy(got[r + 1]:find("rank " .. r .. " all_reduce: true -6.0,14.5,-23.0", 1, true), got[r + 1])
    end
  end)
  -- a unix socket's connect waits, with no timeout, while the listener's
  -- backlog is full: a name held that way (by anyone: abstract names have no
  -- owner) used to hang every client of the store in connect()
  it("a client does not hang on a store socket name held with a full backlog (it goes over TCP)", function()
    local p = io.popen("timeout -s KILL 20 python3 spec/helpers/squat_store_name.py 15 2>&1 & echo $!")
    local pid, port = p:read("l"), tonumber(p:read("l"))
    p:close()
    assert.is_truthy(port, "the squatter printed no port")
    local code = string.format([[local store = require("crun").store
      local srv = store.server{host = "127.0.0.1", port = %d, token = "-7"}
      local s = store.tcp{host = "127.0.0.1", port = %d, token = "-7", timeout = 3}
      s:set("k", "-13.5"); print("got " .. s:get("k"))]], port, port)
    local c = io.popen("timeout -s KILL 10 lua5.4 -e " .. string.format("%q", code) .. " 2>&1; echo rc=$?")
    local out = c:read("a")
    c:close()
    os.execute("kill " .. pid .. " 2>/dev/null")
    assert.is_truthy(out:find("got -13.5\nrc=0", 1, true), out)
  end)
  -- the mesh's connect was blocking: an address that drops SYNs (a listener
  -- with a full backlog, a host gone from the network) held the rank for the
  -- kernel's SYN retries (about 2 minutes) whatever the group's timeout
  it("a rank whose peer's mesh address drops its SYNs fails at the group's timeout, not minutes later", function()
    local p = io.popen("timeout -s KILL 20 python3 spec/helpers/full_backlog_tcp.py 15 2>&1 & echo $!")
    local pid, port = p:read("l"), tonumber(p:read("l"))
    p:close()
    assert.is_truthy(port, "no listener port")
    local code = string.format([[local crun = require "crun"
      local srv = crun.store.server{host = "127.0.0.1", port = 0, token = "-3"}
      local st = crun.store.tcp{host = "127.0.0.1", port = srv:port(), token = "-3", timeout = 5}
      st:set("default/0/tcp/0", "127.0.0.1:%d")
      print(pcall(crun.dist.init_process_group, {backend = "cpu", store = st, rank = 1, world_size = 2, timeout = 2}))]],
      port)
    local c = io.popen("CRUN_SHM=0 timeout -s KILL 10 lua5.4 -e " .. string.format("%q", code) .. " 2>&1; echo rc=$?")
    local out = c:read("a")
    c:close()
    os.execute("kill " .. pid .. " 2>/dev/null")
    assert.is_truthy(out:find("false\tETIMEDOUT: group 'default/0' on rank 1: mesh not connected, missing ranks 0 "
                              .. "(ETIMEDOUT: connect to 127.0.0.1:" .. port, 1, true), out)
    assert.is_truthy(out:find("rc=0", 1, true), out)
  end)
  -- a file store in a shared directory (torch's init_method file:///tmp/...)
  -- used a file that another user made first (world-writable: they read the
  -- job's keys and forge their own), and wrote through a planted link
  it("a file store refuses a file of another user, a world-writable one, and a symbolic link", function()
    local store = require("crun").store
    local dir = tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -m 1777 " .. dir))
    local function refused(path, pattern)
      local ok, err = pcall(store.file, path)
      assert.is_false(ok, path)
      assert.is_truthy(tostring(err):find(pattern, 1, true), tostring(err))
    end
    assert(os.execute("touch " .. dir .. "/ww && chmod 0666 " .. dir .. "/ww"))
    refused(dir .. "/ww", "EACCES: file store '" .. dir .. "/ww' is writable by every user (mode 666)")
    local target = dir .. "/mine"
    assert(io.open(target, "w")):close()
    assert(os.execute("ln -s " .. target .. " " .. dir .. "/link"))
    refused(dir .. "/link", "EINVAL: file store '" .. dir .. "/link' is a symbolic link")
    local f = assert(io.open(target))
    assert.are.equal("", f:read("a")) -- nothing was written through the link
    f:close()
    if can_switch_user() then
      assert(os.execute(as_nobody("sh -c 'umask 0; : > " .. dir .. "/theirs; chmod 0644 " .. dir .. "/theirs'")))
      refused(dir .. "/theirs", "EACCES: file store '" .. dir .. "/theirs' belongs to uid ")
    end
    local s = store.file(dir .. "/fresh") -- a new file: private to this user
    s:set("k", "-8")
    local p = io.popen("stat -c %a " .. dir .. "/fresh")
    assert.are.equal("600", p:read("l"))
    p:close()
    s:close()
    os.execute("rm -rf " .. dir)
  end)
end)

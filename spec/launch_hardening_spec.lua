-- Issue 16, items 12-15 and 17: what crun-lua and crun.save do with files,
-- pipes, signals during start-up, escaping descendants and runaway REPL
-- chunks. Every case is bounded; cases this machine cannot run are pending
-- with the reason.
local U = require "helpers.launcher_util"
local C = require "helpers.common"
local q = U.q

--- Runs `crun-lua <args>` with `text` arriving through a pipe on its stdin
-- (not a file: /dev/stdin is then a pipe).
local function run_piped(args, text, env)
  local dir = U.tmpdir()
  C.write(dir .. "/script", text)
  local r = C.run(args, {env = "cat " .. q(dir .. "/script") .. " | " .. (env or "")})
  U.rmrf(dir)
  return r
end

describe("a script from a pipe (item 13)", function()
  it("runs the same bytes on every rank and in every restart", function()
    local script = [[
local rank, attempt = os.getenv("RANK"), os.getenv("CRUN_RESTART_COUNT")
print(string.format("ran rank=%s attempt=%s", rank, attempt))
if attempt == "0" and rank == "1" then os.exit(3) end
]]
    local r = run_piped("-n 3 --master-port 0 --max-restarts 1 --grace-period 1 /dev/stdin", script)
    assert.are.equal(0, r.code, r.err)
    for rank = 0, 2 do
      assert.are.equal(1, U.count(r.out, "ran rank=" .. rank .. " attempt=1\n"), r.out)
    end
    assert.are.equal(1, U.count(r.out, "ran rank=1 attempt=0\n"), r.out)
    assert.is_truthy(r.err:find("job succeeded after 2 attempts", 1, true), r.err)
  end)

  it("keeps line numbers after a #! line and names the script in errors", function()
    local r = run_piped("-n 2 --master-port 0 /dev/stdin", "#!/usr/bin/env crun-lua\n\nerror('boom')\n")
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("/dev/stdin:3: boom", 1, true), r.err)
  end)

  it("refuses an endless stream once 256 MiB came, before any rank starts", function()
    local r = C.run("-n 2 --master-port 0 /dev/zero")
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("/dev/zero is longer than 256 MiB: not a script", 1, true), r.err)
  end)

  it("reports a syntax error in piped text once", function()
    local r = run_piped("-n 2 --master-port 0 /dev/stdin", "x = = 1\n")
    assert.are.equal(1, r.code, r.err)
    assert.are.equal(1, U.count(r.err, "/dev/stdin:1:"), r.err)
  end)
end)

describe("crun.save refuses targets that are not regular files (item 12)", function()
  local serialize = require "crun.serialize"
  local dir
  before_each(function() dir = U.tmpdir() end)
  after_each(function() U.rmrf(dir) end)

  local function kind(path)
    local p = io.popen("stat -c %F " .. q(path) .. " 2>/dev/null")
    local k = p:read("l")
    p:close()
    return k
  end

  it("leaves a symbolic link and the file it points to alone", function()
    C.write(dir .. "/victim", "precious\n")
    assert(os.execute("ln -s victim " .. q(dir .. "/link")))
    local ok, err = pcall(serialize.save, dir .. "/link", {epoch = 1})
    assert.is_false(ok)
    assert.are.equal("EINVAL: crun.save: " .. dir .. "/link is a symbolic link, not a regular "
                     .. "file; refusing to replace it", err)
    assert.are.equal("symbolic link", kind(dir .. "/link"))
    assert.are.equal("precious\n", U.slurp(dir .. "/victim"))
  end)

  it("refuses a fifo, a directory and (as root) a device node", function()
    assert(os.execute("mkfifo " .. q(dir .. "/fifo") .. " && mkdir " .. q(dir .. "/d")))
    local targets = {fifo = "a fifo", d = "a directory"}
    if os.execute("mknod " .. q(dir .. "/null") .. " c 1 3 2>/dev/null") then
      targets.null = "a character device"
    end
    for name, what in pairs(targets) do
      local ok, err = pcall(serialize.save, dir .. "/" .. name, 42)
      assert.is_false(ok, name)
      assert.are.equal("EINVAL: crun.save: " .. dir .. "/" .. name .. " is " .. what ..
                       ", not a regular file; refusing to replace it", err)
    end
    assert.are.equal("fifo", kind(dir .. "/fifo"))
    assert.are.equal("directory", kind(dir .. "/d"))
    if targets.null then assert.are.equal("character special file", kind(dir .. "/null")) end
    local left = io.popen("ls -A " .. q(dir)):read("a")
    assert.are.equal(nil, left:find("tmp", 1, true), left) -- no temp file left behind
  end)

  it("never writes through a link planted at the temp file's name", function()
    C.write(dir .. "/victim", "precious\n")
    local pid = require("crun.core").getpid()
    assert(os.execute(string.format("ln -s victim %s", q(dir .. "/ck.tmp." .. pid))))
    serialize.save(dir .. "/ck", {epoch = 7})
    assert.are.equal(7, serialize.load(dir .. "/ck").epoch)
    assert.are.equal("precious\n", U.slurp(dir .. "/victim"))
    assert.are.equal("symbolic link", kind(dir .. "/ck.tmp." .. pid))
  end)

  it("replaces a regular file and creates a missing one", function()
    C.write(dir .. "/ck", "old")
    serialize.save(dir .. "/ck", {a = 1})
    serialize.save(dir .. "/new", {b = 2})
    assert.are.equal(1, serialize.load(dir .. "/ck").a)
    assert.are.equal(2, serialize.load(dir .. "/new").b)
    local ok, err = pcall(serialize.save, dir .. "/no/such/dir/x", 1)
    assert.is_false(ok)
    assert.is_truthy(err:match("^EIO: crun.save: cannot create " .. dir:gsub("%p", "%%%0") ..
                               "/no/such/dir/x%.tmp%.%d+: No such file or directory$"), err)
  end)
end)

describe("log files never follow a link (item 12)", function()
  local dir
  before_each(function() dir = U.tmpdir() end)
  after_each(function() U.rmrf(dir) end)

  it("--log-dir refuses a symbolic link at a log file's name and leaves its target alone", function()
    C.write(dir .. "/victim", "precious\n")
    assert(os.execute("mkdir -p " .. q(dir .. "/logs/attempt_0") .. " && ln -s ../../victim " ..
                      q(dir .. "/logs/attempt_0/rank_1.stderr")))
    local r = U.run("-n 2 --master-port 0 --log-dir " .. q(dir .. "/logs") .. " " ..
                    q(U.FIX .. "env.lua"))
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("EINVAL: cannot create log file " .. dir ..
      "/logs/attempt_0/rank_1.stderr: it is a symbolic link, not a regular file", 1, true), r.err)
    assert.are.equal("precious\n", U.slurp(dir .. "/victim"))
  end)

  it("--log-dir refuses an attempt directory that is a symbolic link", function()
    assert(os.execute("mkdir -p " .. q(dir .. "/elsewhere") .. " " .. q(dir .. "/logs") ..
                      " && ln -s ../elsewhere " .. q(dir .. "/logs/attempt_0")))
    local r = U.run("-n 1 --master-port 0 --log-dir " .. q(dir .. "/logs") .. " " ..
                    q(U.FIX .. "env.lua"))
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("EINVAL: cannot create log files in " .. dir ..
      "/logs/attempt_0: it is not a directory", 1, true), r.err)
    assert.are.equal("", io.popen("ls -A " .. q(dir .. "/elsewhere")):read("a"))
  end)

  it("--log-dir replaces a regular file of an earlier job without writing through its hard links", function()
    assert(os.execute("mkdir -p " .. q(dir .. "/logs/attempt_0")))
    C.write(dir .. "/victim", "precious\n")
    assert(os.execute("ln " .. q(dir .. "/victim") .. " " .. q(dir .. "/logs/attempt_0/rank_0.stdout")))
    local r = U.run("-n 1 --master-port 0 --log-dir " .. q(dir .. "/logs") .. " " ..
                    q(U.FIX .. "env.lua"))
    assert.are.equal(0, r.code, r.err)
    assert.is_truthy(U.slurp(dir .. "/logs/attempt_0/rank_0.stdout"):find("ENV ", 1, true))
    assert.are.equal("precious\n", U.slurp(dir .. "/victim"))
  end)

  it("CRUN_DEBUG_FILE does not follow a symbolic link: the warning goes to stderr", function()
    C.write(dir .. "/victim", "precious\n")
    assert(os.execute("ln -s victim " .. q(dir .. "/dbg.0.log")))
    local r = U.run("-n 1 --master-port 0 " .. q(U.FIX .. "env.lua"),
                    "CRUN_DEBUG=INFO CRUN_DEBUG_FILE=" .. q(dir .. "/dbg.%r.log"))
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("precious\n", U.slurp(dir .. "/victim"))
    assert.is_truthy(r.err:find("EINVAL: CRUN_DEBUG_FILE=" .. dir .. "/dbg.%r.log: cannot log to " ..
      dir .. "/dbg.0.log: it is a symbolic link (not followed); logging to stderr instead", 1, true), r.err)
    assert.are.equal(1, U.count(r.err, "CRUN_DEBUG_FILE="), r.err) -- said once
  end)

  -- a misspelt level or subsystem left the log at WARN, or empty, without a word
  it("CRUN_DEBUG and CRUN_DEBUG_SUBSYS name an unknown value on stderr", function()
    local r = U.run("-n 2 --master-port 0 " .. q(U.FIX .. "env.lua"), "CRUN_DEBUG=INOF CRUN_DEBUG_SUBSYS=STORE,COLLS")
    assert.are.equal(0, r.code, r.err)
    assert.is_truthy(r.err:find("EINVAL: CRUN_DEBUG=INOF: expected NONE, WARN, INFO or TRACE; logging at WARN",
                                1, true), r.err)
    assert.is_truthy(r.err:find("EINVAL: CRUN_DEBUG_SUBSYS=STORE,COLLS: unknown subsystem 'COLLS' (known: " ..
                                "CORE, STORE, PG, COLL, NET, SHM, DDP, LAUNCH, LUA; ALL, or ^ to exclude)", 1, true), r.err)
    assert.are.equal(1, U.count(r.err, "CRUN_DEBUG=INOF"), r.err) -- by the launcher, not by every rank
  end)

  -- crun_env_int / crun_env_double fell back to their default without a word
  it("a CRUN_* number that does not parse is named on stderr, once per process", function()
    local r = U.run("-n 2 --master-port 0 " .. q(U.FIX .. "env.lua"), "CRUN_HEAP_SLOT_GB=64G CRUN_HEAP_CACHE=99999999999999999999")
    assert.are.equal(0, r.code, r.err)
    -- the heap's size: read by the launcher, which maps it; the cache's: by each rank
    assert.are.equal(1, U.count(r.err, "EINVAL: CRUN_HEAP_SLOT_GB=64G is not an integer; the default 64 is used"), r.err)
    assert.are.equal(2, U.count(r.err, "EINVAL: CRUN_HEAP_CACHE=99999999999999999999 is not an integer in range; "
      .. "the default 256 is used"), r.err)
  end)
end)

describe("/dev/shm after the launcher is killed during start-up (item 14)", function()
  -- A private /dev/shm (a mount namespace) so that the segments of jobs
  -- running beside this spec are not counted.
  local function can_unshare()
    return os.execute("unshare -m sh -c 'mount -t tmpfs none /dev/shm' 2>/dev/null")
  end

  it("leaves no crun-shm-* segment, whatever moment of start-up a signal hits", function()
    if not can_unshare() then
      pending("needs a private /dev/shm: unshare -m and mount -t tmpfs are not permitted here")
      return
    end
    local dir = U.tmpdir()
    C.write(dir .. "/job.lua", [[
local crun = require "crun"
crun.dist.init_process_group{backend = "auto"}
local t = crun.tensor.ones({1000})
crun.dist.all_reduce(t)
]])
    math.randomseed(os.time())
    -- how each run is killed: the launcher only (its SIGTERM is forwarded),
    -- the launcher and its workers at once (as pkill would), the launcher by
    -- SIGKILL (the watchdog stops the workers) with and without the workers
    local modes = {
      "kill -TERM $p",
      "kill -TERM $p $(pgrep -P $p)",
      "kill -KILL $p",
      "kill -TERM $(pgrep -P $p) $p",
      "kill -KILL $p; kill -TERM $(pgrep -P $p) 2>/dev/null",
    }
    local lines = {"mount -t tmpfs none /dev/shm || exit 99"}
    local runs = 60
    for i = 1, runs do
      lines[#lines + 1] = string.format(
        "%s -n 4 --master-port 0 %s >/dev/null 2>&1 & p=$!; sleep %.3f; %s; wait $p",
        q(U.CRUN_LUA), q(dir .. "/job.lua"), math.random(0, 40) / 1000, modes[(i - 1) % #modes + 1])
    end
    -- the watchdog of a SIGKILLed launcher cleans up on its own: wait for it
    lines[#lines + 1] = "i=0; while [ $i -lt 100 ] && [ -n \"$(ls -A /dev/shm)\" ]; do sleep 0.1; i=$((i+1)); done"
    lines[#lines + 1] = "ls -A /dev/shm > " .. q(dir .. "/left")
    C.write(dir .. "/run.sh", table.concat(lines, "\n") .. "\n")
    local ok = os.execute("timeout -s KILL 300 unshare -m sh " .. q(dir .. "/run.sh") .. " 2>/dev/null")
    local left = U.slurp(dir .. "/left")
    U.rmrf(dir)
    assert.is_truthy(left, "the kill loop did not finish: " .. tostring(ok))
    assert.are.equal("", left, "segments left in /dev/shm after " .. runs .. " killed start-ups")
  end)
end)

describe("descendants that leave the process group (item 15)", function()
  -- kills what a failed case left (our own marker processes, by pid)
  local function reap(marker)
    for _, pid in ipairs(U.pids_with(marker)) do os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
  end

  for _, case in ipairs({
    {name = "a job that succeeds", code = 0, tail = ""},
    {name = "a job whose rank 1 fails", code = 3,
     tail = "if os.getenv('RANK') == '1' then os.exit(3) end\nos.execute('sleep 30')\n"},
  }) do
    it("end with " .. case.name .. " (setsid sleep in every worker)", function()
      local marker = string.format("%d.%04d", math.random(100, 899), math.random(0, 9999))
      local dir = U.tmpdir()
      C.write(dir .. "/job.lua", "os.execute('setsid sleep " .. marker .. " >/dev/null 2>&1 &')\n" ..
        "os.execute('sleep 0.2')\n" .. case.tail)
      local r = U.run("-n 2 --master-port 0 --grace-period 1 " .. q(dir .. "/job.lua"))
      U.rmrf(dir)
      local no_cg = r.err:match("warning: no cgroup for the workers %(([^)]*)%)")
      if no_cg then
        reap("sleep " .. marker)
        pending("no writable cgroup v2 here (" .. no_cg .. "): the process-group kill cannot reach setsid descendants")
        return
      end
      assert.are.equal(case.code, r.code, r.err)
      local left = U.wait_for(function() return #U.pids_with("sleep " .. marker) == 0 end, 5)
      local pids = U.pids_with("sleep " .. marker)
      reap("sleep " .. marker)
      assert.is_truthy(left, "setsid descendants outlived the job: pids " .. table.concat(pids, ","))
    end)
  end

  it("leaves no empty dump directory when the launcher is killed with SIGKILL (its watchdog removes it)", function()
    local dir, tmp = U.tmpdir(), U.tmpdir()
    C.write(dir .. "/s.lua", "os.execute('sleep 20')\n")
    local pid = C.spawn(dir, "-n 2 --master-port 0 " .. q(dir .. "/s.lua"), "TMPDIR=" .. q(tmp))
    local function flight_dirs()
      local p = io.popen("ls -A " .. q(tmp))
      local names = p:read("a")
      p:close()
      return select(2, names:gsub("crun%-flight%-", ""))
    end
    local made = C.wait_for(function() return flight_dirs() > 0 end, 10)
    os.execute("kill -9 " .. pid)
    local gone = C.wait_for(function() return flight_dirs() == 0 end, 10)
    C.wait_rc(dir, 10)
    U.rmrf(dir)
    U.rmrf(tmp)
    assert.is_truthy(made, "no dump directory appeared in TMPDIR")
    assert.is_truthy(gone, "the dump directory of the killed launcher is left")
  end)

  -- a rank killed while it wrote its dump leaves flight_rank<r>.txt.tmp; the
  -- launcher removed only finished dumps and the watchdog only an empty
  -- directory, so the rmdir failed and the directory stayed in TMPDIR though
  -- no analysis named it
  for _, killed in ipairs{false, true} do
    it("leaves no dump directory holding only a rank's partial dump (flight_rank<r>.txt.tmp) when it "
       .. (killed and "is killed with SIGKILL" or "ends"), function()
      local dir, tmp = U.tmpdir(), U.tmpdir()
      C.write(dir .. "/s.lua", "io.open(os.getenv('CRUN_FLIGHT_DIR') .. '/flight_rank' .. os.getenv('RANK') .. "
        .. "'.txt.tmp', 'w'):close()\n" .. (killed and "os.execute('sleep 20')\n" or ""))
      local function left()
        local p = io.popen("cd " .. q(tmp) .. " && find . -mindepth 1 | sort")
        local names = p:read("a")
        p:close()
        return names
      end
      local made, code = true, 0
      if killed then
        local pid = C.spawn(dir, "-n 2 --master-port 0 " .. q(dir .. "/s.lua"), "TMPDIR=" .. q(tmp))
        made = C.wait_for(function() return select(2, left():gsub("%.txt%.tmp", "")) == 2 end, 10)
        os.execute("kill -9 " .. pid)
        C.wait_rc(dir, 10)
      else
        code = U.run("-n 2 --master-port 0 " .. q(dir .. "/s.lua"), "TMPDIR=" .. q(tmp)).code
      end
      local gone = C.wait_for(function() return left() == "" end, 10)
      local names = left()
      U.rmrf(dir)
      os.execute("rm -rf " .. q(tmp))
      assert.is_truthy(made, "the ranks wrote no partial dump")
      assert.are.equal(0, code)
      assert.is_truthy(gone, "left in TMPDIR:\n" .. names)
    end)
  end

  it("removes its cgroup directories, and those that launchers killed with SIGKILL left", function()
    local p = io.popen("awk '$9 == \"cgroup2\" {print $5}' /proc/self/mountinfo | head -1")
    local mnt = p:read("l")
    p:close()
    local own = io.popen("sed -n 's/^0:://p' /proc/self/cgroup"):read("l")
    local base = mnt and own and (mnt .. (own == "/" and "" or own))
    -- a launcher that died with its watchdog (SIGKILL to the whole group) left
    -- crun-<pid>/a0 behind: a pid that is certainly dead names it
    local dead = tonumber(io.popen("sh -c 'echo $$'"):read("l"))
    local stale = base and string.format("%s/crun-%d", base, dead)
    local made = stale and os.execute("mkdir -p " .. q(stale .. "/a0") .. " 2>/dev/null")
    local r = U.run("-n 2 --master-port 0 " .. q(U.FIX .. "env.lua"), "CRUN_DEBUG=INFO CRUN_DEBUG_SUBSYS=LAUNCH")
    if r.err:match("warning: no cgroup for the workers") then
      if made then os.execute("rmdir " .. q(stale .. "/a0") .. " " .. q(stale)) end
      pending("no writable cgroup v2 here")
      return
    end
    assert.are.equal(0, r.code, r.err)
    local mine = r.err:match("the job's cgroup: (%S+)")
    assert.is_truthy(mine, r.err)
    assert.is_falsy(io.open(mine .. "/cgroup.procs"), "the job's cgroup is left: " .. mine)
    if made then
      local gone = not io.open(stale .. "/cgroup.procs")
      if not gone then os.execute("rmdir " .. q(stale .. "/a0") .. " " .. q(stale)) end
      -- removed by this launcher or by another that started meanwhile (tests run in parallel)
      assert.is_true(gone, "the stale " .. stale .. " was not removed:\n" .. r.err)
    end
  end)
end)

describe("a piped REPL session with a runaway chunk (item 17)", function()
  it("interrupts the chunk at CRUN_REPL_TIMEOUT with ETIMEDOUT on every rank running it and goes on", function()
    local input = "x = 10\n:on 1 while true do x = x + 1 end\n'after ' .. tostring(x > 10)\n" ..
                  "y = 0; while true do y = y - 1 end\ny < 0\n"
    local r = C.run("-n 3 -i", {input = input, env = "CRUN_REPL_TIMEOUT=1", timeout = 60})
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(1, U.count(r.err, "%[1%] ETIMEDOUT: chunk 2 ran longer than CRUN_REPL_TIMEOUT=1 s; interrupted\n"), r.err)
    assert.are.equal(1, U.count(r.err, "%[0%-2%] ETIMEDOUT: chunk 4 ran longer than CRUN_REPL_TIMEOUT=1 s; interrupted\n"), r.err)
    -- the session went on: rank 1 ran its loop, the others did not; every rank ran chunk 5
    assert.is_truthy(r.out:find("[0,2] after false\n[1] after true\n", 1, true), r.out .. r.err)
    assert.is_truthy(r.out:find("[0-2] true\n", 1, true), r.out .. r.err)
  end)

  it("ends at the end of the input even when a rank ignores the interrupt", function()
    local input = "while true do pcall(function() while true do end end) end\n"
    local r = C.run("-n 2 -i --grace-period 1", {input = input, env = "CRUN_REPL_TIMEOUT=1", timeout = 60})
    assert.is_truthy(r.err:find("[0-1] (still running after the chunk timeout and an interrupt; " ..
                                "no longer waited for; see :ranks)", 1, true), r.err)
    assert.is_truthy(r.err:find("ranks still busy", 1, true), r.err)
    assert.are.equal(128 + 15, r.code, r.err) -- the supervisor stopped them with SIGTERM
  end)
end)

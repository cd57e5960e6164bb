-- crun-lua -i: the REPL. Chunks run on every rank; results come back to the
-- front end grouped by identical output. Most cases pipe their input (the
-- scripted use); the last ones drive a real terminal through tmux.
local U = require "helpers.repl_util"
local q = U.q

local ARGS = "--master-port 0 -i"

--- Pipes `input` into an n-rank REPL session that must end with code 0.
local function session(n, input)
  local r = U.run("-n " .. n .. " " .. ARGS, input)
  assert.are.equal(0, r.code, r.err)
  return r
end

local count = U.count

-- Whether crun.dist loads in this build (the dist cases need it).
local function have_dist()
  local r = U.run("-n 1 " .. ARGS, "dist ~= nil\n")
  return r.out == "[0] true\n"
end

describe("crun-lua -i with piped input", function()
  it("evaluates expressions and statements on every rank and folds equal output", function()
    local r = session(4, "x = 21\nx * 2\n'a' .. 'b', 7\n")
    assert.are.equal("[0-3] 42\n[0-3] ab\t7\n", r.out)
    assert.are.equal("", r.err)
  end)

  it("lists ranks whose output differs, one line each", function()
    local r = session(3, "rank = tonumber(os.getenv('RANK'))\nrank * 10\nrank % 2\n")
    assert.are.equal("[0] 0\n[1] 10\n[2] 20\n[0,2] 0\n[1] 1\n", r.out)
  end)

  it("leaves no flight-recorder directory behind when the session ends", function()
    local dir = U.tmpdir()
    local r = U.run("-n 2 " .. ARGS, "x = 1\nx + 1\n", "TMPDIR=" .. q(dir))
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("[0-1] 2\n", r.out)
    local left = io.popen("ls -A " .. q(dir)):read("a")
    U.rmrf(dir)
    assert.are.equal("", left) -- the supervisor's $TMPDIR/crun-flight-<pid>-XXXXXX went with it
  end)

  it("continues incomplete chunks over several lines", function()
    local input = "function f(a)\n  return a + 1\nend\nf(41)\nfor i = 1, 3 do\n  print(i)\nend\nt = {\n1,\n2}\n#t\n"
    local r = session(2, input)
    assert.are.equal("[0-1] 42\n[0-1] 1\n      2\n      3\n[0-1] 2\n", r.out)
  end)

  it("captures print and io.write per rank, and restores them", function()
    local input = "print('r', os.getenv('RANK'))\nio.write('a', 1, '\\n'); print(nil)\nprint == _G.print\n"
    local r = session(2, input)
    assert.are.equal("[0] r\t0\n[1] r\t1\n[0-1] a1\n      nil\n[0-1] true\n", r.out)
  end)

  it("shows errors with tracebacks for the ranks that failed and goes on", function()
    local input = "r = tonumber(os.getenv('RANK'))\n"
                  .. "if r == 1 then error('boom on ' .. r) end; return 'fine'\n"
                  .. "1 + 1\n"
    local r = session(3, input)
    assert.are.equal("[0,2] fine\n[0-2] 2\n", r.out)
    assert.is_truthy(r.err:find("[1] stdin:1: boom on 1\n", 1, true), r.err)
    assert.is_truthy(r.err:find("stack traceback:", 1, true), r.err)
    assert.is_truthy(r.err:find("stdin:1: in main chunk", 1, true), r.err)
    assert.is_falsy(r.err:find("repl.lua", 1, true), "the REPL's own frames are trimmed:\n" .. r.err)
    assert.are.equal(1, count(r.err, "%[%d"), r.err)
  end)

  it("reports a syntax error once, without running anything", function()
    local r = session(4, "x = = 1\n'still here'\n")
    assert.are.equal("stdin:1: unexpected symbol near '='\n", r.err)
    assert.are.equal("[0-3] still here\n", r.out)
  end)

  it("runs :on chunks on some ranks only", function()
    local input = ":on 0,2 y = 5\ny\n:on 1-2 print('here')\n:on 1 for i = 1, 2 do\nprint(i) end\n"
                  .. ":on 7 y\n:on 0,x y\n:on 1,99999999999999999999 y\n'after'\n"
    local r = session(3, input)
    assert.are.equal("[0,2] 5\n[1] nil\n[1-2] here\n[1] 1\n    2\n[0-2] after\n", r.out)
    assert.is_truthy(r.err:find(":on: bad rank '99999999999999999999' in '1,99999999999999999999'", 1, true), r.err)
    assert.is_truthy(r.err:find(":on: no rank 7: the world has ranks 0-2", 1, true), r.err)
    assert.is_truthy(r.err:find(":on: bad rank list '0,x'", 1, true), r.err)
  end)

  it("answers :ranks and :help, rejects unknown commands", function()
    local r = session(2, ":ranks\n:help\n:bogus\n::top:: do return 'label' end\n")
    assert.is_truthy(r.out:match("%[0%] pid %d+ +idle\n%[1%] pid %d+ +idle\n"), r.out)
    assert.is_truthy(r.out:find(":on 0,2 <chunk>", 1, true), r.out)
    assert.is_truthy(r.err:find("unknown command ':bogus'", 1, true), r.err)
    assert.is_truthy(r.out:find("[0-1] label\n", 1, true), "a ::label:: is Lua:\n" .. r.out)
  end)

  it("ends every rank cleanly at EOF and at :quit, without prompt noise", function()
    for _, input in ipairs({":ranks\n", ":ranks\n:quit\n1\n"}) do
      local r = session(3, input)
      assert.is_falsy(r.out:find("> ", 1, true), r.out)
      assert.are.equal("", r.err)
      local pids = U.pids(r.out)
      for rank = 0, 2 do
        assert.is_number(pids[rank], r.out)
        assert.is_false(U.alive(pids[rank]), "rank " .. rank .. " still runs")
      end
    end
  end)

  it("starts the REPL for crun-lua -n N without a script", function()
    local r = U.run("-n 2 --master-port 0", "os.getenv('WORLD_SIZE')\n")
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("[0-1] 2\n", r.out)
  end)

  it("runs the script first and keeps its globals; shows its errors grouped", function()
    local dir = U.tmpdir()
    finally(function() U.rmrf(dir) end)
    U.write(dir .. "/s.lua", "greeting = 'hi ' .. os.getenv('RANK')\nargs = select('#', ...)\n")
    U.write(dir .. "/bad.lua", "if os.getenv('RANK') == '1' then error('script failed') end\nok = true\n")
    local r = U.run("-n 2 " .. ARGS .. " " .. q(dir .. "/s.lua") .. " a b", "greeting\nargs\n")
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("[0] hi 0\n[1] hi 1\n[0-1] 2\n", r.out)
    r = U.run("-n 2 " .. ARGS .. " " .. q(dir .. "/bad.lua"), "ok\n")
    assert.are.equal(0, r.code, r.err)
    assert.is_truthy(r.err:find("[1] " .. dir .. "/bad.lua:1: script failed", 1, true), r.err)
    assert.are.equal("[0] true\n[1] nil\n", r.out)
    r = U.run("-n 2 " .. ARGS .. " " .. q(dir .. "/missing.lua"), "")
    assert.are.equal(1, r.code)
    assert.is_truthy(r.err:find("cannot open " .. dir .. "/missing.lua", 1, true), r.err)
    U.rmrf(dir)
  end)

  it("keeps the prompt working when a rank dies", function()
    local input = ":on 1 os.exit(3)\n1 + 1\n:on 0-1 'x'\n:ranks\n"
    local r = U.run("-n 3 " .. ARGS, input)
    assert.is_truthy(r.err:find("[1] (died while running the chunk)", 1, true), r.err)
    assert.is_truthy(r.out:find("[0,2] 2\n[0] x\n", 1, true), r.out)
    assert.are.equal(1, count(r.err, "%[1%] %(dead%)"), r.err)
    assert.is_truthy(r.out:match("%[1%] pid %d+ +dead"), r.out)
    assert.is_truthy(r.out:match("%[2%] pid %d+ +idle"), r.out)
    assert.are.equal(3, r.code, "the exit code tells that rank 1 failed")
  end)

  it("leaves when every rank has ended", function()
    local r = U.run("-n 2 " .. ARGS, "os.exit(0)\n1\n2\n")
    assert.is_truthy(r.err:find("[0-1] (died while running the chunk)\ncrun-lua: every rank has ended", 1, true), r.err)
    assert.are.equal("", r.out)
    assert.are.equal(0, r.code, r.err)
  end)

  it("ends when nobody reads its output any more", function()
    local p = io.popen(string.format("cd %s && exec 3>&1 && { yes 'x = (x or 0) + 1; return x' | timeout -s KILL 30 %s -n 2 %s; echo rc=$? >&3; } | head -2",
                                     q(U.SOURCE), q(U.CRUN_LUA), ARGS))
    local out = p:read("a")
    p:close()
    assert.are.equal("[0-1] 1\n[0-1] 2\nrc=0\n", out)
  end)

  it("rejects -i across nodes", function()
    local r = U.run("--nnodes 2 --master-port 29555 -i", "")
    assert.are.equal(2, r.code)
    assert.is_truthy(r.err:find("-i runs on one node only", 1, true), r.err)
  end)
end)

describe("crun-lua -i signals", function()
  it("interrupts a running chunk on every rank with SIGINT and goes on", function()
    local h = U.start("-n 2 " .. ARGS)
    finally(function() h:cleanup() end)
    h:send("'ready'\n")
    assert.is_truthy(U.wait_for(function() return h:out():find("[0-1] ready", 1, true) end, 20), h:err())
    h:send("n = 0; while true do n = n + 1 end\n")
    U.sleep(1)
    h:signal("INT")
    assert.is_truthy(U.wait_for(function() return h:err():find("interrupted!", 1, true) end, 20),
                     "no interruption:\n" .. h:out() .. h:err())
    h:send("n > 0\n")
    h:close()
    local r = h:wait(30)
    assert.are.equal(0, r.code, r.err)
    assert.is_truthy(r.err:find("[0-1] interrupted!", 1, true), r.err)
    assert.is_truthy(r.out:find("[0-1] true\n", 1, true), r.out)
  end)

  it("gives up on a chunk stuck in C after a second SIGINT, and ends on SIGTERM", function()
    local h = U.start("-n 2 " .. ARGS)
    finally(function() h:cleanup() end)
    h:send(":on 1 os.execute('sleep 4')\n")
    U.sleep(1)
    h:signal("INT")
    U.sleep(0.5)
    h:signal("INT")
    assert.is_truthy(U.wait_for(function() return h:err():find("still running", 1, true) end, 10),
                     h:out() .. h:err())
    h:send(":ranks\n")
    assert.is_truthy(U.wait_for(function() return h:out():find("running chunk 1", 1, true) end, 10),
                     h:out() .. h:err())
    h:signal("TERM")
    local r = h:wait(30)
    assert.are.equal(128 + 15, r.code)
    local pids = U.pids(r.out)
    for rank = 0, 1 do assert.is_false(U.alive(pids[rank])) end
  end)
end)

describe("crun-lua -i when the launcher is killed", function()
  it("takes every rank with it", function()
    local h = U.start("-n 3 " .. ARGS)
    finally(function() h:cleanup() end)
    h:send(":ranks\n")
    assert.is_truthy(U.wait_for(function() return h:out():find("[2] pid", 1, true) end, 20), h:err())
    local pids = U.pids(h:out())
    h:signal("KILL")
    h:wait(10)
    for rank = 0, 2 do
      assert.is_truthy(U.wait_for(function() return not U.alive(pids[rank]) end, 15),
                       "rank " .. rank .. " outlived the launcher")
    end
  end)
end)

describe("crun-lua -i with dist", function()
  local run_it = have_dist() and it or pending
  run_it("makes dist and T globals with the default group initialized", function()
    local input = "x = dist.get_rank()\nx * 2\nt = T.ones({2}); dist.all_reduce(t, 'sum'); return t[1]\n"
    local r = session(4, input)
    assert.is_truthy(r.out:find("[0] 0\n[1] 2\n[2] 4\n[3] 6\n", 1, true), r.out)
    assert.is_truthy(r.out:find("[0-3] 4.0\n", 1, true) or r.out:find("[0-3] 4\n", 1, true), r.out)
  end)

  run_it("ends a collective called on some ranks only with the collective timeout", function()
    local input = ":on 0 dist.all_reduce(T.ones({2}), 'sum')\n'after'\n"
                  .. "dist.destroy_process_group(); dist.init_process_group{}\n"
                  .. "t = T.ones({2}); dist.all_reduce(t, 'sum'); return t[2]\n"
    local t0 = os.time()
    local r = U.run("-n 2 " .. ARGS, input, "CRUN_REPL_TIMEOUT=2")
    assert.is_truthy(r.err:find("[0] ETIMEDOUT", 1, true), r.err)
    assert.is_truthy(r.out:find("[0-1] after\n", 1, true), r.out)
    assert.is_truthy(r.out:find("[0-1] 2.0\n", 1, true), "a new group works:\n" .. r.out .. r.err)
    assert.is_true(os.time() - t0 < 30)
    assert.are.equal(0, r.code, r.err)
  end)
end)

describe("crun-lua -i in a terminal", function()
  local has_tmux = os.execute("command -v tmux >/dev/null 2>&1")
  local run_it = has_tmux and it or pending

  run_it("shows prompts, folds output, interrupts with Ctrl-C, keeps history, ends with Ctrl-D", function()
    local dir = U.tmpdir()
    finally(function() U.rmrf(dir) end)
    local hist = dir .. "/history"
    local t = U.tmux("-n 2 " .. ARGS, "CRUN_HISTORY=" .. q(hist))
    local ok, err = pcall(function()
      assert(t:wait_screen("REPL on 2 ranks", 20), t:screen())
      t:type("1 + 1"); t:keys("Enter")
      assert(t:wait_screen("%[0%-1%] 2\n>", 20), t:screen())
      t:type("for i = 1, 2 do"); t:keys("Enter")
      assert(t:wait_screen("\n>>", 10), t:screen())
      t:type("print(i * 10) end"); t:keys("Enter")
      assert(t:wait_screen("%[0%-1%] 10\n      20\n>", 20), t:screen())
      t:type("while true do end"); t:keys("Enter")
      U.sleep(1)
      t:keys("C-c")
      assert(t:wait_screen("%[0%-1%] interrupted!", 20), t:screen())
      assert(t:wait_screen("in main chunk\n>", 10), t:screen())
      t:type("abc"); t:keys("C-c", "Enter")        -- Ctrl-C at the prompt drops the line
      t:keys("Up", "Up", "Enter")          -- the history: ..., for ..., while ...
      -- keys typed while a chunk runs meet a cooked terminal (as with lua.c):
      -- Ctrl-D waits for the prompt, i.e. for readline
      assert(t:wait_screen("> for i = 1, 2 do\n>? ?print%(i %* 10%) end\n%[0%-1%] 10\n      20\n>%s*$", 20),
             t:screen())
      assert.is_falsy(t:screen():find("[0-1] nil", 1, true), "abc was run:\n" .. t:screen())
      t:keys("C-d")
      assert(U.wait_for(function() return t:dead() end, 20), t:screen())
      assert.are.equal("0", t:dead())
    end)
    t:kill()
    local h = U.slurp(hist) or ""
    local t2 = ok and U.tmux("-n 1 " .. ARGS, "CRUN_HISTORY=" .. q(hist))
    if t2 then -- a new session recalls the last one's chunks
      ok, err = pcall(function()
        assert(t2:wait_screen("REPL on 1 rank", 20), t2:screen())
        t2:keys("Up", "Up")
        assert(t2:wait_screen("\n> while true do end%s*$", 10), t2:screen())
        t2:keys("C-u", "C-d")
        assert(U.wait_for(function() return t2:dead() end, 20), t2:screen())
      end)
      t2:kill()
    end
    U.rmrf(dir)
    assert(ok, err)
    assert.is_truthy(h:find("1 + 1", 1, true), h)
    assert.is_truthy(h:find("while true do end", 1, true), h)
  end)
end)

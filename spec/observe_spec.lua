-- Seeing a job: the merged timeline (crun-lua --timeline), the flight
-- recorder's dumps and analysis (failure, SIGUSR1), and dist.stats.
-- Five short jobs of 2-3 ranks (a few seconds in all; the hang case waits for
-- its 2 s collective timeout).
local C = require "helpers.common"
local json = require "dkjson" -- lua-dkjson (scripts/setup.sh)
local q = C.q
local FIX = C.SOURCE .. "/spec/fixtures/observe/"

local function run(args, env) return C.run(args, {env = env, timeout = 60}) end

describe("crun-lua --timeline", function()
  local dir, trace, res
  setup(function()
    dir = C.tmpdir("observe")
    res = run("-n 3 --master-port 0 --timeline " .. q(dir .. "/t.json") .. " " .. q(FIX .. "known.lua"))
    trace = json.decode(C.slurp(dir .. "/t.json") or "null")
  end)
  teardown(function() C.rmrf(dir) end)

  it("writes one JSON trace with one process per rank and removes the rank files", function()
    assert.are.equal(0, res.code, res.err)
    assert.is_table(trace, "the trace does not parse as JSON")
    local procs = {}
    for _, e in ipairs(trace.traceEvents) do
      if e.ph == "M" and e.name == "process_name" then procs[#procs + 1] = e.pid end
    end
    table.sort(procs)
    assert.are.same({0, 1, 2}, procs)
    for r = 0, 2 do assert.is_nil(C.slurp(dir .. "/t.json.rank" .. r)) end
    assert.matches("timeline: .-3 ranks", res.err)
  end)

  it("holds every operation of the script with its name, bytes and times", function()
    local by = {}
    for _, e in ipairs(trace.traceEvents) do
      if e.cat == "coll" or e.cat == "p2p" then
        by[e.pid] = by[e.pid] or {}
        table.insert(by[e.pid], e)
        assert.is_true(e.dur >= 0, "end before start")
        assert.is_true(e.args.enqueue_us <= e.ts + 1e-3, "enqueued after start")
        assert.is_true(e.args.wait_us >= 0 and e.args.wait_us <= e.dur + 1, "wait outside the op")
        assert.are.equal("default/0", e.args.group)
      end
    end
    for r = 0, 2 do
      local ops = by[r]
      table.sort(ops, function(a, b) return a.ts < b.ts end)
      local want = {{"all_reduce #1", 4000, "float32"}, {"all_reduce #2", 4000, "float32"}, {"broadcast #3", 296, "int64"}}
      if r == 0 then want[#want + 1] = {"send to 1", 40, "float64"} end
      if r == 1 then want[#want + 1] = {"recv from 0", 40, "float64"} end
      want[#want + 1] = {"barrier #4", 0, "uint8"}
      want[#want + 1] = {"all_reduce #5", 4000, "float32"} -- after the stats
      assert.are.equal(#want, #ops, "rank " .. r)
      for i, w in ipairs(want) do
        assert.are.equal(w[1], ops[i].name, "rank " .. r)
        assert.are.equal(w[2], ops[i].args.bytes, "rank " .. r .. " " .. w[1])
        assert.are.equal(w[3], ops[i].args.dtype)
      end
    end
  end)

  it("nests spans and records the nn modules and the optimizer step", function()
    for r = 0, 2 do
      local s = {}
      for _, e in ipairs(trace.traceEvents) do
        if e.pid == r and e.ph == "X" and e.tid == 0 then s[e.name] = e end
      end
      local outer, inner = assert(s.outer, "no outer span"), assert(s.inner, "no inner span")
      assert.is_true(outer.ts <= inner.ts and inner.ts + inner.dur <= outer.ts + outer.dur + 1e-3, "inner not inside outer")
      local seq, lin = assert(s["Sequential.forward"]), assert(s["Linear.forward"])
      assert.is_true(seq.ts <= lin.ts and lin.ts + lin.dur <= seq.ts + seq.dur + 1e-3)
      assert.are.equal("backward", assert(s["Sequential.backward"]).cat)
      assert.are.equal("optim", assert(s["SGD.step"]).cat)
    end
  end)

  it("keeps at most CRUN_TIMELINE_EVENTS events per rank and says how many it dropped", function()
    local t = dir .. "/small.json"
    local r = run("-n 2 --master-port 0 --timeline " .. q(t) .. " " .. q(FIX .. "known.lua"), "CRUN_TIMELINE_EVENTS=4")
    assert.are.equal(0, r.code, r.err)
    local d = assert(json.decode(C.slurp(t) or "null"), "the trace does not parse")
    local n = {}
    for _, e in ipairs(d.traceEvents) do
      if e.ph == "X" or e.ph == "i" then n[e.pid] = (n[e.pid] or 0) + 1 end
    end
    assert.are.same({[0] = 4, [1] = 4}, n)
    assert.are.equal(2, C.count(r.err, "%d+ events dropped: buffer full"), r.err)
  end)

  it("merges timelines written by ranks started otherwise (--merge-timeline)", function()
    local t = dir .. "/m.json"
    C.write(t .. ".rank0", "# crun-timeline 1\nP\t0\t1\t0\t1\t0\nG\t1\tg/0\nO\tall_reduce\t1\t1\t2\t8\tfloat32\tring\t-1\t0\t100\t200\t5000\t1000\n")
    C.write(t .. ".rank1", "# crun-timeline 1\nP\t1\t2\t-150\t9\t3\nG\t1\tg/0\nO\tall_reduce\t1\t1\t2\t8\tfloat32\tring\t-1\t0\t300\t1350\t5300\t0\n")
    local r = run("--merge-timeline " .. q(t))
    assert.are.equal(0, r.code, r.err)
    local d = json.decode(C.slurp(t))
    local ev = {}
    for _, e in ipairs(d.traceEvents) do if e.cat == "coll" then ev[e.pid] = e end end
    -- rank 1's start 1350 - 150 = 1200 aligned; the earliest event (enqueue 100) is 0
    assert.are.equal(0.1, ev[0].ts)
    assert.are.equal(1.1, ev[1].ts)
    assert.are.equal(1.0, ev[0].args.skew_us) -- rank 0 waited 1 us for rank 1 to enter
    assert.are.equal(0, ev[1].args.skew_us)
    assert.matches("3 events dropped", r.err)
  end)

  it("merges with --merge-timeline the part of every rank found, past rank 4095 too", function()
    local t = dir .. "/big.json"
    for _, rank in ipairs{0, 4096, 70001} do
      C.write(t .. ".rank" .. rank, "# crun-timeline 1\nP\t" .. rank .. "\t1\t0\t1\t0\nG\t1\tg/0\n"
        .. "O\tall_reduce\t1\t1\t2\t8\tfloat32\tring\t-1\t0\t100\t200\t5000\t1000\n")
    end
    C.write(t .. ".rank12.tmp", "not a part")
    local r = run("--merge-timeline " .. q(t))
    assert.are.equal(0, r.code, r.err)
    local procs = {}
    for _, e in ipairs(json.decode(C.slurp(t)).traceEvents) do
      if e.ph == "M" and e.name == "process_name" then procs[#procs + 1] = e.pid end
    end
    assert.are.same({0, 4096, 70001}, procs)
    assert.matches("3 ranks", r.err)
  end)

  it("fails (exit 1, EIO, the rank files kept) when the trace cannot be written, and ENOTFOUND without rank files", function()
    local t = dir .. "/unwritable"
    assert(os.execute("ln -s /nonexistent-crun-dir/t.json " .. q(t))) -- passes the check at start, fails at the end
    local r = run("-n 2 --master-port 0 --timeline " .. q(t) .. " " .. q(FIX .. "known.lua"))
    assert.are.equal(1, r.code, r.err)
    assert.matches("crun%-lua: EIO: cannot write the timeline [^\n]*unwritable: No such file or directory", r.err)
    for rank = 0, 1 do assert.is_string(C.slurp(t .. ".rank" .. rank), "rank file " .. rank .. " removed") end
    r = run("--merge-timeline " .. q(dir .. "/none.json"))
    assert.are.equal(1, r.code, r.err)
    assert.matches("crun%-lua: ENOTFOUND: no timeline file [^\n]*none.json.rank<r> was written", r.err)
  end)

  it("merges the parts of a subgroup's ranks with trace.finish(path, group), not those of ranks 0..n-1", function()
    local s = dir .. "/sub.lua"
    C.write(s, [[local crun = require "crun"
      local dist, path = crun.dist, arg[1]
      crun.trace.start(path)
      dist.init_process_group()
      local g = dist.new_group({2, 3})
      if dist.get_rank() >= 2 then
        dist.all_reduce(crun.tensor.ones{4}, {group = g})
        local text = crun.trace.finish(path, g)
        if text then print(text) end
      end]])
    local t = dir .. "/sub.json"
    local r = run("-n 4 --master-port 0 " .. q(s) .. " " .. q(t))
    assert.are.equal(0, r.code, r.err)
    local d = json.decode(C.slurp(t) or "null")
    assert.is_table(d, "no trace")
    local procs = {}
    for _, e in ipairs(d.traceEvents) do
      if e.ph == "M" and e.name == "process_name" then procs[#procs + 1] = e.pid end
    end
    table.sort(procs)
    assert.are.same({2, 3}, procs)
    for rank = 2, 3 do assert.is_nil(C.slurp(t .. ".rank" .. rank), "rank " .. rank .. "'s part left") end
  end)

  it("writes valid UTF-8 JSON when a span name holds bytes that are not UTF-8", function()
    local s, t = dir .. "/utf.lua", dir .. "/utf.json"
    C.write(s, [[local crun = require "crun"
      crun.dist.init_process_group()
      crun.trace.span("bad\xff\xfename", function() crun.dist.barrier() end)
      crun.trace.span("caf\xc3\xa9 \"q\"\t\\", function() end)]])
    local r = run("-n 1 --master-port 0 --timeline " .. q(t) .. " " .. q(s))
    assert.are.equal(0, r.code, r.err)
    local text = C.slurp(t)
    assert.is_truthy(utf8.len(text), "the trace is not valid UTF-8")
    local names = {}
    for _, e in ipairs(json.decode(text).traceEvents) do
      if e.cat == "user" then names[#names + 1] = e.name end
    end
    table.sort(names)
    assert.are.same({"bad\u{FFFD}\u{FFFD}name", "caf\u{E9} \"q\" \\"}, names)
  end)

  it("refuses recorder sizes the ranks would ignore (they turned the timeline or the recorder off silently)", function()
    for _, c in ipairs{{"CRUN_TIMELINE_EVENTS", "0", "1..67108864"}, {"CRUN_TIMELINE_EVENTS", "99999999999", "1..67108864"},
                       {"CRUN_TIMELINE_EVENTS", "1e3", "1..67108864"}, {"CRUN_FLIGHT_RECORDER", "-5", "0..16777216"},
                       {"CRUN_FLIGHT_RECORDER", "99999999999", "0..16777216"}} do
      local r = run("-n 2 --master-port 0 --timeline " .. q(dir .. "/env.json") .. " " .. q(FIX .. "known.lua"),
        c[1] .. "=" .. c[2])
      assert.are.equal(2, r.code, c[1] .. "=" .. c[2] .. ": " .. r.err)
      assert.is_truthy(r.err:find("crun-lua: " .. c[1] .. ": expected an integer in " .. c[3] .. ", got '" .. c[2] .. "'",
        1, true), r.err)
      assert.are.equal("", r.out)
    end
  end)

  it("refuses, before any rank runs, a timeline whose directory is missing or that is a directory", function()
    local r = run("-n 2 --master-port 0 --timeline /nonexistent-crun-dir/t.json " .. q(FIX .. "known.lua"))
    assert.are.equal(2, r.code, r.err)
    assert.matches("crun%-lua: %-%-timeline /nonexistent%-crun%-dir/t.json: the directory /nonexistent%-crun%-dir "
      .. "does not exist", r.err)
    assert.are.equal("", r.out)
    r = run("-n 2 --master-port 0 --timeline " .. q(dir) .. " " .. q(FIX .. "known.lua"))
    assert.are.equal(2, r.code, r.err)
    assert.matches("that is a directory; give a file name", r.err, 1, true)
    assert.are.equal("", r.out)
  end)
end)

describe("dist.stats", function()
  it("counts the operations and bytes of a known script, and resets", function()
    local r = run("-n 2 --master-port 0 " .. q(FIX .. "known.lua"))
    assert.are.equal(0, r.code, r.err)
    for rank = 0, 1 do
      local function lines(tag)
        local t = {}
        for op, n, b, ok1, ok2 in r.out:gmatch("%[" .. rank .. "%] " .. tag .. " (%S+) (%d+) (%d+) (%S+) (%S+)") do
          t[op] = {tonumber(n), tonumber(b)}
          assert.are.equal("true", ok1)
          assert.are.equal("true", ok2)
        end
        return t
      end
      local want = {all_reduce = {2, 8000}, broadcast = {1, 296}, barrier = {1, 0}}
      if rank == 0 then want.send = {1, 40} else want.recv = {1, 40} end
      assert.are.same(want, lines("STAT"))
      assert.are.same(want, lines("AGAIN")) -- reset=true returns the counts, then zeroes them
      assert.are.same({}, lines("RESET"))
      assert.are.same({all_reduce = {1, 4000}}, lines("AFTER"))
    end
  end)

  it("times many short operations close to what the loop around them took (their ends are sampled)", function()
    local dir = C.tmpdir("observe")
    C.write(dir .. "/s.lua", [[local crun = require("crun"); local d, T = crun.dist, crun.tensor
      d.init_process_group(); local t, u = T.ones({2}), T.ones({3}, "float64")
      for _ = 1, 200 do d.all_reduce(t) end
      d.barrier(); d.reset_stats()
      local t0 = crun.clock()
      for i = 1, 20000 do d.all_reduce(t); if i % 5 == 0 then d.broadcast(u, 1) end end
      local wall = crun.clock() - t0
      local s = d.stats()
      print(string.format("TIMES %d %d %.9f %.9f %.9f", s.all_reduce.ops, s.broadcast.ops, s.all_reduce.time,
        s.broadcast.time, wall))]])
    local r = run("-n 2 --master-port 0 " .. q(dir .. "/s.lua"))
    C.rmrf(dir)
    assert.are.equal(0, r.code, r.err)
    local seen = 0
    for n_ar, n_bc, ar, bc, wall in r.out:gmatch("TIMES (%d+) (%d+) (%S+) (%S+) (%S+)") do
      seen = seen + 1
      ar, bc, wall = tonumber(ar), tonumber(bc), tonumber(wall)
      assert.are.equal("20000 4000", n_ar .. " " .. n_bc)
      -- each op's time runs from its post to its end: a good part of the loop for
      -- all_reduce, never more than all of it (a broadcast's root waits for no
      -- one: its share may be tiny)
      assert.is_true(ar > 0.1 * wall and bc > 0 and ar + bc < 1.2 * wall,
        string.format("all_reduce %.6f s, broadcast %.6f s, loop %.6f s", ar, bc, wall))
    end
    assert.are.equal(2, seen, r.out)
  end)

  it("raises ESTATE when neither the flight recorder nor the timeline is on", function()
    local dir = C.tmpdir("observe")
    C.write(dir .. "/s.lua", [[local d = require("crun").dist; d.init_process_group();
      local ok, e = pcall(d.stats); print(ok, e)]])
    local r = run("-n 1 --master-port 0 " .. q(dir .. "/s.lua"), "CRUN_FLIGHT_RECORDER=0")
    C.rmrf(dir)
    assert.are.equal(0, r.code, r.err)
    assert.matches("false%s+ESTATE: pg_stats on rank 0", r.out)
  end)
end)

describe("flight recorder", function()
  it("writes the dumps of ranks started without crun-lua to a private directory per job", function()
    local dir = C.tmpdir("observe")
    C.write(dir .. "/d.lua", [[local crun = require "crun"; crun.dist.init_process_group{}
      print("DUMP " .. crun.trace.dump("test")); crun.dist.destroy_process_group()]])
    local B = os.getenv("CRUN_BUILD_DIR")
    local function dump(env)
      local cmd = string.format("env -u CRUN_FLIGHT_DIR TMPDIR=%s RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "
        .. "MASTER_ADDR=127.0.0.1 MASTER_PORT=0 LUA_PATH=%s LUA_CPATH=%s %s timeout -s KILL 30 lua5.4 %s 2>&1",
        q(dir .. "/tmp"), q(B .. "/lua/?.lua;" .. B .. "/lua/?/init.lua;;"), q(B .. "/lua/?.so;;"), env, q(dir .. "/d.lua"))
      local p = io.popen(cmd)
      local out = p:read("a")
      p:close()
      return out:match("DUMP (%S+)"), out
    end
    os.execute("mkdir -p " .. q(dir .. "/tmp"))
    local a, out = dump("SLURM_JOB_ID=77 SLURM_STEP_ID=3")
    assert.are.equal(dir .. "/tmp/crun-flight-" .. C.uid() .. "-slurm-77.3/flight_rank0.txt", a, out)
    local b = dump("PMIX_NAMESPACE='prterun-h/1@1'")
    assert.are.equal(dir .. "/tmp/crun-flight-" .. C.uid() .. "-mpi-prterun-h_1_1/flight_rank0.txt", b)
    assert.matches("^# crun%-flight 1", C.slurp(a))
    assert.matches("^# crun%-flight 1", C.slurp(b))
    local p = io.popen("stat -c %a " .. q(a:match("(.*)/")))
    assert.are.equal("700", p:read("l"))
    p:close()
    -- a directory of that name open to others is not used (it would hand them the dump)
    local shared = dir .. "/tmp/crun-flight-" .. C.uid() .. "-slurm-88.0"
    os.execute("mkdir -m 777 " .. q(shared))
    local c = dump("SLURM_JOB_ID=88")
    assert.is_truthy(c, "no dump")
    assert.are_not.equal(shared .. "/flight_rank0.txt", c)
    assert.matches("/crun%-flight%-%d+%-slurm%-88%.0%-......", c)
    C.rmrf(dir)
  end)

  it("dumps every rank when one rank skips a collective and names it as behind", function()
    local dir = C.tmpdir("observe")
    local r = run("-n 3 --master-port 0 --log-dir " .. q(dir) .. " " .. q(FIX .. "hang.lua"))
    assert.are_not.equal(0, r.code)
    for rank = 0, 2 do
      local d = C.slurp(dir .. "/attempt_0/flight_rank" .. rank .. ".txt")
      assert.is_string(d, "no dump from rank " .. rank)
      assert.matches("\nR\t" .. rank .. "\t", d)
    end
    assert.matches("dumps of 3 of 3 ranks", r.err)
    assert.matches("rank 1 is behind: its last op is all_reduce #5 %(done%) while ranks 0,2 are at all_reduce #6", r.err)
    C.rmrf(dir)
  end)

  it("names as behind a rank that has not entered the group's first op (not 'every rank reached #1')", function()
    local dir = C.tmpdir("observe")
    local r = run("-n 3 --master-port 0 --log-dir " .. q(dir) .. " " .. q(FIX .. "hang.lua"), "BEFORE=0")
    C.rmrf(dir)
    assert.are_not.equal(0, r.code)
    assert.matches("dumps of 3 of 3 ranks", r.err)
    assert.matches("rank 1 is behind: it has no op of this group yet while ranks 0,2 are at all_reduce #1 %(%a+%); "
      .. "it has not entered #1", r.err)
    assert.matches("no mismatch in the sequences recorded %(#1%.%.#1%)", r.err)
    assert.not_matches("every rank reached", r.err)
  end)

  it("does not say 'every rank reached' an op when a rank left no dump", function()
    -- rank 1 exits (code 3) instead of entering all_reduce #6; ranks 0,2 wait in it
    local dir = C.tmpdir("observe")
    local s = dir .. "/exit.lua"
    C.write(s, [[local crun = require "crun"
      local dist = crun.dist
      dist.init_process_group{timeout = 20}
      local t = crun.tensor.ones({300}, "float32")
      for _ = 1, 5 do dist.all_reduce(t) end
      if dist.get_rank() == 1 then os.exit(3) end
      dist.all_reduce(t)]])
    local r = run("-n 3 --master-port 0 --log-dir " .. q(dir) .. " " .. q(s))
    C.rmrf(dir)
    assert.are.equal(3, r.code, r.err)
    assert.matches("dumps of 2 of 3 ranks", r.err)
    assert.matches("no fresh dump from rank 1", r.err)
    assert.matches("group default/0: every rank with a fresh dump %(ranks 0,2%) reached #6 %(all_reduce%)", r.err)
    assert.not_matches("every rank reached", r.err)
  end)

  it("finds the first mismatch in the sequences", function()
    local dir = C.tmpdir("observe")
    local r = run("-n 3 --master-port 0 " .. q(FIX .. "hang.lua"), "MODE=mismatch CRUN_FLIGHT_DIR=" .. q(dir))
    C.rmrf(dir)
    assert.are_not.equal(0, r.code)
    assert.matches("first mismatch at #6: ranks 0,2 called all_reduce%(float32%[300%]%); rank 1 called barrier", r.err)
  end)

  -- without --log-dir the dumps went to $TMPDIR/crun-flight-<pid>, a name
  -- known in advance: another user could make that directory first with a
  -- symlink flight_rank0.txt.tmp -> any file of ours, and rank 0's dump
  -- overwrote that file
  it("dumps without --log-dir into a fresh private directory, never through a planted symlink", function()
    local dir = C.tmpdir("observe")
    C.write(dir .. "/victim", "precious")
    local r = run("-n 3 --master-port 0 " .. q(FIX .. "hang.lua"), "MODE=mismatch TMPDIR=" .. q(dir))
    assert.are_not.equal(0, r.code)
    local p = io.popen("cd " .. q(dir) .. " && for d in crun-flight-*; do echo \"$d $(stat -c %a \"$d\")\"; done")
    local made = p:read("a")
    p:close()
    assert.matches("^crun%-flight%-%d+%-%w%w%w%w%w%w 700\n$", made)
    os.execute("mkdir " .. q(dir .. "/fd") .. " && ln -s " .. q(dir .. "/victim") .. " " .. q(dir .. "/fd/flight_rank0.txt.tmp"))
    r = run("-n 3 --master-port 0 " .. q(FIX .. "hang.lua"), "MODE=mismatch CRUN_FLIGHT_DIR=" .. q(dir .. "/fd"))
    assert.are_not.equal(0, r.code)
    assert.are.equal("precious", C.slurp(dir .. "/victim"))
    C.rmrf(dir)
  end)

  it("dumps on :dump in the REPL", function()
    local dir = C.tmpdir("observe")
    local r = C.run("-n 2 -i", {input = "x = T.ones({4})\ndist.all_reduce(x)\n:dump\nos.execute('sleep 2')\n:quit\n",
      timeout = 60, env = "CRUN_FLIGHT_DIR=" .. q(dir)})
    C.rmrf(dir)
    assert.are.equal(0, r.code, r.err)
    assert.matches("asked every rank for its flight recorder", r.out)
    assert.matches("dumps of 2 of 2 ranks", r.err)
    assert.matches("every rank reached #1 %(all_reduce%)", r.err)
  end)

  -- Runs fixtures/observe/usr1.lua on 2 ranks with env, sends SIGUSR1 to
  -- crun-lua once both ranks are ready (and `settle` s later), lets the job
  -- finish; returns crun-lua's stderr up to the analysis (nil: none), the
  -- exit status, stdout and rank 0's dump as SIGUSR1 left it.
  local function usr1_job(env, settle)
    local dir = C.tmpdir("observe")
    env = env .. " CRUN_FLIGHT_DIR=" .. q(dir .. "/fr") .. " GO_FILE=" .. q(dir .. "/go")
    local pid = C.spawn(dir, "-n 2 --master-port 0 " .. q(FIX .. "usr1.lua"), env)
    assert.is_truthy(C.wait_for(function()
      local o = C.slurp(dir .. "/out") or ""
      return o:match("READY 0") and o:match("READY 1")
    end, 30), "the job did not get ready")
    if settle then os.execute("sleep " .. settle) end
    os.execute("kill -USR1 " .. pid)
    local err = C.wait_for(function()
      local e = C.slurp(dir .. "/err") or ""
      return e:match("dumps of %d of 2") and e
    end, 15)
    local d0 = C.slurp(dir .. "/fr/flight_rank0.txt") or "" -- before the script's own dump
    C.write(dir .. "/go", "")
    local rc = C.wait_rc(dir, 30)
    local out = C.slurp(dir .. "/out") or ""
    C.rmrf(dir)
    assert.is_string(err, "no analysis after SIGUSR1")
    return err, rc, out, d0
  end

  it("dumps on SIGUSR1 to crun-lua while the job goes on, keeping the last N operations", function()
    local err, rc, out = usr1_job("CRUN_FLIGHT_RECORDER=3")
    assert.matches("SIGUSR1: asked every worker", err)
    assert.matches("dumps of 2 of 2 ranks", err)
    assert.matches("every rank reached #4 %(broadcast%)", err)
    assert.are.equal(0, rc)
    assert.matches("RING 0 3", out) -- 5 collectives so far, a ring of 3
    assert.matches("RING 1 3", out)
  end)

  it("shows the collective a rank is waiting in as started when SIGUSR1 comes", function()
    -- rank 0 waits in all_reduce #5 for rank 1, which is still at broadcast #4
    -- (0.3 s after both were ready, rank 0 is in its all_reduce)
    local err, rc, _, d0 = usr1_job("STUCK=1", 0.3)
    assert.matches("rank 1 is behind: its last op is broadcast #4 %(done%) while ranks? 0 %a* ?at all_reduce #5", err)
    assert.matches("all_reduce[^\n]*started", d0)
    assert.are.equal(0, rc)
  end)
end)

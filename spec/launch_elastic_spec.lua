-- Elastic c10d jobs: separate crun-lua processes ("nodes", on 127.0.0.1)
-- meet at one endpoint with --nnodes MIN:MAX; the membership then changes
-- while the workers run. A node that arrives grows the world (a new round,
-- every node's workers restarted); a node whose agent stops beating
-- (SIGSTOP: heartbeat_timeout passes) is dropped and the survivors go on in
-- a smaller world, and the stopped node, once continued, ends saying it was
-- declared lost; a node lost below MIN ends the job with an error naming it.
-- Node 0 prints one line per round. The job (spec/fixtures/launcher/
-- elastic_job.lua) checks every step that all ranks of its world answer.
-- Short timeouts keep each case to a few seconds (heartbeat_timeout 3 s,
-- last_call_timeout 1 s); every wait has a deadline.
local U = require "helpers.launcher_util"
local q, FIX = U.q, U.FIX

local ENV = "CRUN_TOKEN=spec-elastic-secret"
local JOB = q(FIX .. "elastic_job.lua")
local CONF = "last_call_timeout=1,heartbeat_timeout=3,join_timeout=30"

--- How often the plain text `text` occurs in s.
local function count(s, text)
  local n, at = 0, 1
  while true do
    local i = s:find(text, at, true)
    if not i then return n end
    n, at = n + 1, i + #text
  end
end

local function c10d(port, id, nnodes)
  return string.format("--nnodes %s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s --rdzv-conf %s "
                       .. "--rdzv-timeout 30", nnodes, port, id, CONF)
end

--- Every handle's stderr and stdout so far (the files of a running crun-lua).
local function so_far(hs, what)
  local parts = {}
  for _, h in ipairs(hs) do parts[#parts + 1] = U.slurp(h.dir .. "/" .. what) or "" end
  return table.concat(parts, "\n")
end

--- Waits (at most `timeout` s) until `pattern` (plain) shows in the stderr
-- (what = "err") or stdout ("out") of the handles; fails naming it.
local function await(hs, what, text, timeout, times)
  local ok = U.wait_for(function() return count(so_far(hs, what), text) >= (times or 1) end, timeout)
  assert(ok, "no '" .. text .. "' within " .. timeout .. " s:\n" .. so_far(hs, "err") .. "\n" .. so_far(hs, "out"))
end

--- The "ELASTIC store=..." lines of round `round` of run `id`, by rank.
local function round_lines(outs, id, round)
  local by_rank, n = {}, 0
  for body in table.concat(outs, "\n"):gmatch("%] ELASTIC (store=[^\n]*)") do
    local e = {}
    for k, v in body:gmatch("(%w+)=(%S+)") do e[k] = tonumber(v) or v end
    if e.store == "crun/job/" .. id .. "/" .. round then
      assert.is_nil(by_rank[e.rank], "rank " .. e.rank .. " twice in round " .. round)
      by_rank[e.rank], n = e, n + 1
    end
  end
  return by_rank, n
end

describe("crun-lua elastic c10d jobs", function()
  it("grows the world when a node arrives while the job runs below MAX", function()
    local port, dir = U.free_port(), U.tmpdir()
    local opts = c10d(port, "grow", "2:3") .. " -n 1 " .. JOB .. " " .. q(dir)
    local hs = {U.start(opts, ENV)}
    U.sleep(0.3)
    hs[2] = U.start(opts, ENV)
    local ok, err = pcall(function()
      await(hs, "err", "rendezvous 'grow' at 127.0.0.1:" .. port .. " closed: 2 node(s), world size 2\n", 30)
      await(hs, "out", "ELASTIC store=crun/job/grow/0", 30, 2)
      hs[3] = U.start(opts, ENV)
      await(hs, "err", "rendezvous 'grow' round 1: 3 node(s), world size 3 (1 node(s) waiting to join)\n", 30)
      await(hs, "out", "ELASTIC store=crun/job/grow/1", 30, 3)
    end)
    U.write(dir .. "/go", "")
    local rs = U.wait_all(hs, 30)
    U.rmrf(dir)
    assert(ok, err)
    local outs, errs = {}, {}
    for i, r in ipairs(rs) do
      assert.are.equal(0, r.code, r.err)
      outs[i], errs[i] = r.out, r.err
    end
    local all_err = table.concat(errs, "\n")
    assert.are.equal(1, count(all_err, "rendezvous 'grow' round 1:"), all_err) -- node 0 only
    assert.are.equal(0, count(all_err, "round 2"), all_err)
    local r0, n0 = round_lines(outs, "grow", 0)
    local r1, n1 = round_lines(outs, "grow", 1)
    assert.are.equal(2, n0)
    assert.are.equal(3, n1)
    for rank = 0, 2 do
      assert.is_table(r1[rank], "no rank " .. rank .. " in round 1")
      assert.are.equal(3, r1[rank].world)
      assert.are.equal(3, r1[rank].nodes)
      assert.are.equal(rank, r1[rank].node) -- one worker per node: node-major
      assert.are.equal(0, r1[rank].restarts) -- a membership change is not a restart
      if rank < 2 then assert.are.equal(2, r0[rank].world) end
    end
    assert.are.equal(3, count(table.concat(outs, "\n"), "ELASTIC done"))
  end)

  it("goes on without a node whose heartbeats stop (SIGSTOP), which ends saying it was lost", function()
    local port, dir = U.free_port(), U.tmpdir()
    local opts = c10d(port, "stop", "2:3") .. " -n 1 " .. JOB .. " " .. q(dir)
    local hs = {}
    for i = 1, 3 do
      hs[i] = U.start(opts, ENV)
      U.sleep(0.3) -- the first serves the endpoint; the last is stopped
    end
    local stopped = hs[3]
    local ok, err = pcall(function()
      await(hs, "out", "ELASTIC store=crun/job/stop/0", 30, 3)
      os.execute("kill -STOP " .. stopped.pid)
      await(hs, "err", "rendezvous 'stop' round 1: 2 node(s), world size 2 (node ", 30)
      await(hs, "out", "ELASTIC store=crun/job/stop/1", 30, 2)
    end)
    U.write(dir .. "/go", "")
    local done = U.wait_for(function() return count(so_far({hs[1], hs[2]}, "out"), "ELASTIC done") >= 2 end, 30)
    -- the node serving the endpoint keeps serving while the stopped node holds its connections
    os.execute("kill -CONT " .. stopped.pid)
    local rs = U.wait_all(hs, 30)
    local rs3 = rs[3]
    assert.is_truthy(done, so_far(hs, "err"))
    assert.are.same({}, U.pids_with(dir)) -- every worker, also the stopped node's, reaped
    U.rmrf(dir)
    assert(ok, err)
    local all_err = rs[1].err .. rs[2].err
    for i = 1, 2 do assert.are.equal(0, rs[i].code, all_err) end
    local node, host, pid = all_err:match("rendezvous 'stop' round 1: 2 node%(s%), world size 2 %(node (%d) %(([^,]+), " ..
                                          "pid (%d+)%) lost: no heartbeat for 3 s%)\n")
    assert.are.equal(tostring(stopped.pid), pid, all_err)
    assert.is_truthy(host and #host > 0, all_err)
    local r1, n1 = round_lines({rs[1].out, rs[2].out}, "stop", 1)
    assert.are.equal(2, n1)
    for rank = 0, 1 do assert.are.equal(2, r1[rank].world) end
    assert.are.equal(1, rs3.code, rs3.err)
    assert.is_truthy(rs3.err:find("ESTATE: rendezvous 'stop' round 0: this node (node " .. node .. ") was declared lost (node " ..
                                  node .. " (" ..
                                  host .. ", pid " .. pid .. ") lost: no heartbeat for 3 s); the job went on without it",
                                  1, true), rs3.err)
  end)

  -- A c10d job of 1 to 2 nodes, one worker each, under rendezvous id `id`:
  -- each worker prints "UP node=<group rank> nodes=<n>" and waits (up to 30
  -- s) for the file <dir>/go. Returns the endpoint's port, dir and the options.
  local function two_node_job(id)
    local port, dir = U.free_port(), U.tmpdir()
    U.write(dir .. "/job.lua", [[
print("UP node=" .. os.getenv("GROUP_RANK") .. " nodes=" .. os.getenv("GROUP_WORLD_SIZE"))
io.stdout:flush()
for _ = 1, 600 do
  local f = io.open(arg[1] .. "/go")
  if f then f:close(); break end
  os.execute("sleep 0.05")
end
]])
    return port, dir, string.format("--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s " ..
                                    "--rdzv-conf last_call_timeout=1,heartbeat_timeout=20,join_timeout=30 " ..
                                    "--rdzv-timeout 30 -n 1 %s %s", port, id, q(dir .. "/job.lua"), q(dir))
  end

  it("notices at once, naming it, a node whose crun-lua leaves by SIGTERM (not after heartbeat_timeout)", function()
    -- the workers never talk to each other, so only the agents can tell that a node left
    local port, dir, opts = two_node_job("leave")
    local a = U.start(opts, ENV)
    U.sleep(0.3) -- a serves the endpoint; b leaves
    local b = U.start(opts, ENV)
    local ok, err = pcall(function()
      await({a, b}, "out", "nodes=2", 30, 2)
      os.execute("kill -TERM " .. b.pid)
      local t0 = os.time()
      await({a}, "err", "rendezvous 'leave' round 1: 1 node(s), world size 1 (", 30)
      local took = os.time() - t0
      assert(took <= 5, "noticed after " .. took .. " s (heartbeat_timeout 20 s):\n" .. so_far({a}, "err"))
    end)
    U.write(dir .. "/go", "")
    local ra, rb = table.unpack(U.wait_all({a, b}, 30))
    U.rmrf(dir)
    assert(ok, err)
    assert.are.equal(143, rb.code, rb.err)
    assert.are.equal(0, ra.code, ra.err)
    local host = ra.err:match("rendezvous 'leave' round 1: 1 node%(s%), world size 1 %(node 1 %(([^,]+), pid " ..
                              b.pid .. "%) left the job: its crun%-lua ended%)\n")
    assert.is_truthy(host and #host > 0, ra.err)
  end)

  it("keeps serving the endpoint's store for the others when the node serving it leaves by SIGTERM, saying why", function()
    local port, dir, opts = two_node_job("serve")
    local a = U.start(opts, ENV)
    U.sleep(0.3) -- a serves the endpoint and leaves
    local b = U.start(opts, ENV)
    local ok, err = pcall(function()
      await({a, b}, "out", "nodes=2", 30, 2)
      os.execute("kill -TERM " .. a.pid)
      await({b}, "err", "rendezvous 'serve' round 1: 1 node(s), world size 1 (node 0 (", 10)
      await({a}, "err", "still serving", 10)
    end)
    U.write(dir .. "/go", "")
    local ra, rb = table.unpack(U.wait_all({a, b}, 30))
    U.rmrf(dir)
    assert(ok, err)
    assert.are.equal(0, rb.code, rb.err)
    assert.are.equal(143, ra.code, ra.err)
    assert.is_nil(ra.err:find("job done", 1, true), ra.err)
    assert.is_truthy(ra.err:find("crun%-lua: this node left the job; still serving the rendezvous store at 127%.0%.0%.1:" ..
                                 port .. " for %d+ connection%(s%) %(other nodes or runs%) until they leave %(Ctrl%-C stops it%)\n"),
                     ra.err)
  end)

  it("fails naming the lost node when fewer than MIN nodes are left", function()
    local port, dir = U.free_port(), U.tmpdir()
    local opts = c10d(port, "few", "2:3") .. " -n 1 " .. JOB .. " " .. q(dir)
    local a = U.start(opts, ENV)
    U.sleep(0.3)
    local b = U.start(opts, ENV)
    local ok, err = pcall(function()
      await({a, b}, "out", "ELASTIC store=crun/job/few/0", 30, 2)
    end)
    os.execute("kill -KILL " .. b.pid)
    local ra = U.wait_all({a}, 30)[1]
    pcall(b.wait, b, 5)
    U.rmrf(dir)
    assert(ok, err)
    assert.are.equal(1, ra.code, ra.err)
    local want = "ESTATE: rendezvous 'few' round 0: node 1 %(%S+, pid " .. b.pid .. "%) lost: no heartbeat for 3 s; " ..
                 "1 node%(s%) left, fewer than the minimum 2 %(%-%-nnodes 2:3%)\n"
    assert.is_truthy(ra.err:find(want), ra.err)
  end)

  it("trains on, with one node fewer, after a node is killed: every sample of each epoch once", function()
    -- examples/elastic_train.lua: DDP, a checkpoint every 2 steps with the
    -- sampler's state; the survivors resume the interrupted epoch at world 2
    local port, dir = U.free_port(), U.tmpdir()
    local rec = dir .. "/record"
    local opts = c10d(port, "train", "2:3") .. " -n 1 " .. q(U.SOURCE .. "/examples/elastic_train.lua") ..
                 " --epochs 3 --samples 240 --batch 4 --ckpt-every 2 --step-delay 0.1 --ckpt " .. q(dir .. "/ck.crun") ..
                 " --record " .. q(rec)
    local hs = {}
    for i = 1, 3 do
      hs[i] = U.start(opts, ENV)
      U.sleep(0.3) -- the first serves the endpoint; the last is killed
    end
    local ok, err = pcall(await, hs, "out", "checkpoint epoch 2 consumed 48/240 world 3", 60)
    os.execute("kill -KILL " .. hs[3].pid)
    local rs = U.wait_all({hs[1], hs[2]}, 60)
    pcall(hs[3].wait, hs[3], 5)
    local left = U.pids_with(dir)
    local record = U.slurp(rec) or ""
    U.rmrf(dir)
    assert(ok, err)
    local all_err = rs[1].err .. rs[2].err
    for i = 1, 2 do assert.are.equal(0, rs[i].code, all_err) end
    assert.are.same({}, left) -- the killed node's workers too
    local pid = all_err:match("rendezvous 'train' round 1: 2 node%(s%), world size 2 %(node %d %([^,]+, pid (%d+)%) " ..
                              "lost: no heartbeat for 3 s%)\n")
    assert.are.equal(tostring(hs[3].pid), pid, all_err)
    local out = rs[1].out .. rs[2].out
    assert.is_truthy(out:find("resumed at epoch 2 after %d+ of its 240 samples, world size 2 %(restart count 0%)"), out)
    assert.is_truthy(out:find("done: 3 epochs, world size 2, loss [%d.]+", 1), out)
    -- every sample of every epoch consumed exactly once; epoch 2 split between the worlds
    local seen, worlds = {}, {}
    for e, idx, w in record:gmatch("(%d+) (%d+) (%d+)\n") do
      e, idx = tonumber(e), tonumber(idx)
      seen[e] = seen[e] or {}
      worlds[e] = worlds[e] or {}
      assert.is_nil(seen[e][idx], string.format("epoch %d: sample %d twice", e, idx))
      seen[e][idx] = true
      worlds[e][w] = (worlds[e][w] or 0) + 1
    end
    for e = 1, 3 do
      for idx = 1, 240 do assert.is_true(seen[e] and seen[e][idx], string.format("epoch %d: sample %d never seen", e, idx)) end
    end
    assert.are.same({["3"] = 240}, worlds[1])
    assert.is_true(worlds[2]["3"] >= 48 and worlds[2]["2"] >= 1 and worlds[2]["3"] + worlds[2]["2"] == 240,
                   "epoch 2 by world size: " .. tostring(worlds[2]["3"]) .. " / " .. tostring(worlds[2]["2"]))
    assert.are.same({["2"] = 240}, worlds[3])
  end)
end)

describe("examples/elastic_train.lua options", function()
  it("trains afresh when run again with the same run id (it resumed the finished run and trained nothing)", function()
    local ex = q(U.SOURCE .. "/examples/elastic_train.lua")
    local id = U.unique_marker("again"):gsub("[^%w]", "-")
    local ckpt = "/tmp/crun-elastic-" .. id .. ".crun" -- tmp-ok: the example's default path for this run id (removed below)
    local runs = {}
    for i = 1, 2 do
      runs[i] = U.run("-n 2 --master-port 0 --rdzv-id " .. id .. " " .. ex .. " --epochs 2 --samples 8 --batch 2", nil, 60)
    end
    os.remove(ckpt)
    for i, r in ipairs(runs) do
      assert.are.equal(0, r.code, "run " .. i .. ": " .. r.err)
      assert.is_nil(r.out:find("resumed at", 1, true), "run " .. i .. ":\n" .. r.out)
      for epoch = 1, 2 do
        assert.are.equal(1, count(r.out, "[0] checkpoint epoch " .. epoch .. " consumed 8/8 world 2\n"), "run " .. i .. ":\n" .. r.out)
      end
      assert.are.equal(1, count(r.out, "[0] done: 2 epochs, world size 2"), r.out)
    end
    assert.is_truthy(runs[2].out:find("[0] " .. ckpt .. " holds a finished run (2 epochs): training afresh", 1, true),
                     runs[2].out)
    assert.are.equal(runs[1].out:match("done: [^\n]*"), runs[2].out:match("done: [^\n]*")) -- the same training
  end)

  it("refuses values that are not what an option takes, before training (--batch 2.5 trained on 2-sample batches)", function()
    local ex = q(U.SOURCE .. "/examples/elastic_train.lua")
    for _, c in ipairs{{"--batch", "0", "a whole number >= 1"}, {"--batch", "2.5", "a whole number >= 1"},
                       {"--ckpt-every", "0", "a whole number >= 1"}, {"--epochs", "-1", "a whole number >= 1"},
                       {"--lr", "0", "a number > 0"}, {"--step-delay", "-1", "a number >= 0"},
                       {"--seed", "1e400", "a whole number"}} do
      local r = U.run("-n 1 --master-port 0 " .. ex .. " --ckpt /nonexistent-crun-dir/x.crun " .. c[1] .. " " .. c[2],
        nil, 30)
      assert.are.equal(1, r.code, c[1] .. " " .. c[2] .. ": " .. r.err)
      assert.is_truthy(r.err:find("EINVAL: elastic_train.lua: " .. c[1] .. ": expected " .. c[3] .. ", got '" .. c[2] .. "'",
        1, true), r.err)
      assert.are.equal("", r.out)
    end
  end)
end)

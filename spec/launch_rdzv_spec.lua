-- crun-lua --rdzv-backend c10d: separate crun-lua processes ("nodes", all on
-- 127.0.0.1) meet at one endpoint; the first to bind it serves the store,
-- the others connect; node ranks are the order they joined. Covered: 2
-- and 3 nodes with unequal worker counts, MIN:MAX with a node that comes late
-- (inside the last call) and with the last call over, two run ids on one
-- endpoint at once, a store served by another process, restarts, the job's
-- secret, and the join deadline. The
-- job (spec/fixtures/launcher/rdzv_job.lua) checks its world with an
-- all_reduce and its store keys against the other run's. Each case is bounded
-- by its timeouts (at most 30 s; most take about a second).
local U = require "helpers.launcher_util"
local q, FIX = U.q, U.FIX

local ENV = "CRUN_TOKEN=spec-rdzv-secret"
local JOB = q(FIX .. "rdzv_job.lua")

--- The common c10d options for run id `id` at `port`.
local function c10d(port, id, nnodes, conf)
  return string.format("--nnodes %s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s %s",
                       nnodes, port, id, conf and ("--rdzv-conf " .. conf) or "")
end

--- Parses every "RDZV k=v ..." line of the outputs into a list of tables.
local function placements(outs)
  local t = {}
  for _, out in ipairs(outs) do
    for body in out:gmatch("%[%d+%] RDZV ([^\n]*)") do
      local e = {}
      for k, v in body:gmatch("(%w+)=(%S+)") do e[k] = tonumber(v) or v end
      t[#t + 1] = e
    end
  end
  return t
end

--- Checks that the nodes' outputs form one job of run `id`: every rank 0..world-1
-- once, node-major (node g holds a contiguous block, in node order), every node
-- rank 0..nnodes-1 used by exactly one output, and one "closed" line from node 0.
local function check_job(results, id, world, nnodes)
  local outs, closed = {}, 0
  for _, r in ipairs(results) do
    assert.are.equal(0, r.code, r.err)
    outs[#outs + 1] = r.out
    closed = closed + U.count(r.err, "rendezvous '" .. id:gsub("%p", "%%%0") .. "' at 127%.0%.0%.1:%d+ closed: " .. nnodes ..
                                     " node%(s%), world size " .. world .. "\n")
  end
  assert.are.equal(1, closed, "node 0 announces the round once")
  local by_rank, first_of_node = {}, {}
  for _, e in ipairs(placements(outs)) do
    if e.id == id then
      assert.is_nil(by_rank[e.rank], "rank " .. e.rank .. " twice")
      by_rank[e.rank] = e
      assert.are.equal(world, e.world)
      assert.are.equal(nnodes, e.nodes)
      if e["local"] == 0 then first_of_node[e.node] = e.rank end
    end
  end
  for rank = 0, world - 1 do assert.is_table(by_rank[rank], "no rank " .. rank) end
  local prev = -1
  for node = 0, nnodes - 1 do
    assert.is_number(first_of_node[node], "no node " .. node)
    assert.is_true(first_of_node[node] > prev, "ranks are node-major")
    prev = first_of_node[node]
    local r = first_of_node[node]
    while by_rank[r] and by_rank[r].node == node do
      assert.are.equal(r - first_of_node[node], by_rank[r]["local"])
      r = r + 1
    end
  end
end

describe("crun-lua c10d rendezvous", function()
  it("forms one job of 2 nodes with unequal worker counts", function()
    local port = U.free_port()
    local h = U.start(c10d(port, "two", 2) .. " -n 2 " .. JOB, ENV)
    local r = U.run(c10d(port, "two", 2) .. " --nproc-per-node 1 " .. JOB, ENV)
    check_job({U.wait_all({h}, 30)[1], r}, "two", 3, 2)
  end)

  it("forms one job of 3 nodes started at once (underscore spellings too)", function()
    local port = U.free_port()
    local opts = string.format("--nnodes=3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:%d --rdzv_id=three ", port)
    local a = U.start(opts .. "-n 1 " .. JOB, ENV)
    local b = U.start(opts .. "-n 2 " .. JOB, ENV)
    local r = U.run(opts .. "-n 1 " .. JOB, ENV)
    local rs = U.wait_all({a, b}, 30)
    check_job({rs[1], rs[2], r}, "three", 4, 3)
  end)

  it("closes at MAX at once when the late node comes inside the last call", function()
    local port = U.free_port()
    local opts = c10d(port, "late-in", "2:3", "last_call_timeout=20,join_timeout=30") .. " -n 1 " .. JOB
    local a = U.start(opts, ENV)
    local b = U.start(opts, ENV)
    U.sleep(0.5)
    local r = U.run(opts, ENV)
    local rs = U.wait_all({a, b}, 30)
    check_job({rs[1], rs[2], r}, "late-in", 3, 3)
    assert.is_true(r.seconds < 15, "the round waited for the last call although MAX nodes joined")
  end)

  it("joins a store another process serves at the endpoint, node ranks first come", function()
    local store = require("crun").store
    local port = U.free_port()
    local srv = store.server{host = "127.0.0.1", port = port, token = "spec-rdzv-secret"}
    local client = store.tcp{host = "127.0.0.1", port = port, token = "spec-rdzv-secret", timeout = 20}
    local first = U.start(c10d(port, "fc", 2) .. " -n 2 " .. JOB, ENV)
    local ok, err = pcall(client.wait, client, {"crun/rdzv/fc/0/slot/1"}, 20) -- it joined first
    local r = U.run(c10d(port, "fc", 2) .. " -n 1 " .. JOB, ENV)
    local rf = U.wait_all({first}, 30)[1]
    client:close()
    srv:stop()
    assert.is_true(ok, tostring(err))
    check_job({rf, r}, "fc", 3, 2)
    assert.is_truthy(rf.out:find("[1] RDZV id=fc rank=1 world=3 node=0 nodes=2 local=1\n", 1, true), rf.out)
    assert.is_truthy(r.out:find("[2] RDZV id=fc rank=2 world=3 node=1 nodes=2 local=0\n", 1, true), r.out)
  end)

  it("runs MIN:MAX with the nodes present when the last call ends", function()
    -- a node that comes later joins a new round (spec/launch_elastic_spec.lua)
    local port = U.free_port()
    local opts = c10d(port, "late-out", "2:3", "last_call_timeout=1,join_timeout=30") .. " -n 1 " .. JOB
    local a = U.start(opts, ENV)
    local r = U.run(opts, ENV)
    check_job({U.wait_all({a}, 30)[1], r}, "late-out", 2, 2)
  end)

  it("keeps two run ids on one endpoint apart", function()
    local port = U.free_port()
    local hs = {}
    for i = 1, 3 do
      hs[#hs + 1] = U.start(c10d(port, "alpha", 3) .. " -n 1 " .. JOB, ENV)
      if i <= 2 then hs[#hs + 1] = U.start(c10d(port, "beta", 2) .. " -n 2 " .. JOB, ENV) end
    end
    local alpha, beta = {}, {}
    for i, r in ipairs(U.wait_all(hs, 30)) do
      table.insert((i == 1 or i == 3 or i == 5) and alpha or beta, r)
    end
    check_job(alpha, "alpha", 3, 3)
    check_job(beta, "beta", 4, 2)
  end)

  it("restarts every node's workers together, counting TORCHELASTIC_RESTART_COUNT", function()
    local port = U.free_port()
    local opts = c10d(port, "again", 2) .. " --max-restarts 1 -n 1 " .. q(FIX .. "env.lua") .. " fail-once"
    local h = U.start(opts, ENV)
    local r = U.run(opts, ENV)
    local rh = U.wait_all({h}, 30)[1]
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(0, rh.code, rh.err)
    local last = {}
    for _, e in ipairs(U.env_by_rank(r.out .. rh.out, true)) do
      assert.are.equal("again", e.TORCHELASTIC_RUN_ID)
      assert.are.equal("crun/job/again/" .. e.TORCHELASTIC_RESTART_COUNT, e.CRUN_STORE_PREFIX) -- a prefix per round
      assert.are.equal("2", e.GROUP_WORLD_SIZE)
      assert.are.equal(tostring(port), e.MASTER_PORT)
      if e.TORCHELASTIC_RESTART_COUNT == "1" then last[e.RANK] = e end
    end
    assert.is_table(last["0"], r.out .. rh.out)
    assert.is_table(last["1"], r.out .. rh.out)
  end)
end)

describe("crun-lua c10d rendezvous errors", function()
  it("needs the job's secret on every node", function()
    local port = U.free_port()
    local r = U.run(c10d(port, "secret", 2) .. " -n 1 " .. JOB, "CRUN_TOKEN=")
    assert.are.equal(2, r.code, r.err)
    assert.is_truthy(r.err:find("every node needs the same secret in CRUN_TOKEN", 1, true), r.err)
    local h = U.start(c10d(port, "secret", 2, "join_timeout=3") .. " -n 1 " .. JOB, ENV)
    U.sleep(0.3)
    r = U.run(c10d(port, "secret", 2, "join_timeout=3") .. " -n 1 " .. JOB, "CRUN_TOKEN=another-secret")
    local r0 = U.wait_all({h}, 30)[1]
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("EACCES", 1, true) and r.err:find("job's secret", 1, true), r.err)
    assert.are.equal(1, r0.code, r0.err) -- alone, it gives up at join_timeout
    assert.is_truthy(r0.err:find("ETIMEDOUT: rendezvous 'secret' at 127.0.0.1:" .. port ..
                                 ": only 1 of at least 2 node(s) joined round 0 within join_timeout 3 s", 1, true), r0.err)
  end)

  it("fails at once, naming it, on a store address that does not resolve (it retried until the deadline)", function()
    -- .invalid never resolves (RFC 6761): a permanent EAI_NONAME, not a DNS hiccup to wait out
    local host = "no-such-host.invalid"
    for _, args in ipairs({
      "--nnodes 2 --node-rank 1 --master-addr " .. host .. " --master-port 29555 --rdzv-timeout 20",
      "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint " .. host .. ":29555 --rdzv-timeout 20",
    }) do
      local r = U.run(args .. " -n 1 " .. JOB, ENV)
      assert.are.equal(1, r.code, r.err)
      assert.is_truthy(r.err:find("EINVAL: ", 1, true) and r.err:find("cannot resolve '" .. host .. "'", 1, true), r.err)
      assert.is_true(r.seconds <= 2, args .. ": took " .. r.seconds .. " s")
      assert.are.equal("", r.out)
    end
  end)

  it("ends the wait for the round on SIGTERM, saying so", function()
    local port = U.free_port()
    local h = U.start(c10d(port, "term", 2, "join_timeout=20") .. " -n 1 " .. JOB, ENV)
    local client = require("crun").store.tcp{host = "127.0.0.1", port = port, token = "spec-rdzv-secret",
                                             timeout = 20}
    local ok, err = pcall(client.wait, client, {"crun/rdzv/term/0/slot/1"}, 20) -- it waits in the round
    client:close()
    os.execute("kill -TERM " .. h.pid)
    local r = U.wait_all({h}, 10)[1]
    assert.is_true(ok, tostring(err))
    assert.are.equal(143, r.code, r.err)
    assert.is_truthy(r.err:find("EINTR: rendezvous 'term' at 127.0.0.1:" .. port .. ": interrupted by a signal",
                                1, true), r.err)
  end)
end)

-- crun-lua's torchrun options: each accepted in both spellings and taking
-- effect (the workers' TORCHELASTIC_*/GROUP_*/ROLE_* variables, --redirects
-- and --tee files, --local-ranks-filter, -m, --nproc-per-node auto|cpu|gpu,
-- --standalone), and bad values rejected with the option's name. The c10d
-- rendezvous is spec/launch_rdzv_spec.lua. Every job here takes well under a second.
local U = require "helpers.launcher_util"
local q, FIX = U.q, U.FIX

local NODES_ENV = "CRUN_TOKEN=spec-torchrun-secret"

--- The CPUs os.cpu_count() would give, and the GPUs the launcher can see.
local function machine()
  local p = io.popen("getconf _NPROCESSORS_ONLN")
  local cpus = tonumber(p:read("l"))
  p:close()
  p = io.popen("ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l")
  local gpus = tonumber(p:read("l")) or 0
  p:close()
  return cpus, gpus
end

--- The files under dir, as a sorted list of paths relative to it.
local function files_under(dir)
  local p = io.popen("cd " .. q(dir) .. " && find . -type f | sort")
  local t = {}
  for l in p:lines() do t[#t + 1] = l:sub(3) end
  p:close()
  return t
end

describe("crun-lua torchrun variables", function()
  it("gives TORCHELASTIC_*, GROUP_WORLD_SIZE and ROLE_* their torchrun meanings across a restart", function()
    local r = U.run("--nproc_per_node 3 --master-port 0 --max_restarts 2 --rdzv_id run-7 --role trainer " ..
                    q(FIX .. "env.lua") .. " fail-once")
    assert.are.equal(0, r.code, r.err)
    local lines = U.env_by_rank(r.out, true)
    local seen = {}
    for _, e in ipairs(lines) do
      local attempt = tonumber(e.TORCHELASTIC_RESTART_COUNT)
      seen[attempt .. ":" .. e.RANK] = true
      assert.are.equal(e.CRUN_RESTART_COUNT, e.TORCHELASTIC_RESTART_COUNT)
      assert.are.equal("2", e.TORCHELASTIC_MAX_RESTARTS)
      assert.are.equal("run-7", e.TORCHELASTIC_RUN_ID)
      assert.are.equal("1", e.GROUP_WORLD_SIZE)
      assert.are.equal(e.RANK, e.ROLE_RANK)
      assert.are.equal("3", e.ROLE_WORLD_SIZE)
      assert.are.equal("trainer", e.ROLE_NAME)
      -- static rendezvous: the job owns its store; a restart takes fresh keys (torch: /worker/attempt_<k>)
      assert.are.equal(attempt == 0 and "nil" or "crun/restart/" .. attempt, e.CRUN_STORE_PREFIX)
    end
    for rank = 0, 2 do assert.is_true(seen["1:" .. rank], "attempt 1 of rank " .. rank .. " missing:\n" .. r.out) end
    assert.is_true(seen["0:1"], r.out)
  end)

  it("defaults to run id none, role default, no restarts", function()
    local r = U.run("-n 1 --master-port 0 " .. q(FIX .. "env.lua"))
    assert.are.equal(0, r.code, r.err)
    local e = U.env_by_rank(r.out)[0]
    assert.are.equal("none", e.TORCHELASTIC_RUN_ID)
    assert.are.equal("default", e.ROLE_NAME)
    assert.are.equal("0", e.TORCHELASTIC_MAX_RESTARTS)
    assert.are.equal("0", e.TORCHELASTIC_RESTART_COUNT)
  end)

  it("counts ROLE_RANK and ROLE_WORLD_SIZE per role across two nodes", function()
    local port = U.free_port()
    local common = "--nnodes 2 --rdzv-endpoint 127.0.0.1:" .. port .. " --rdzv-timeout 30 "
    local h = U.start(common .. "--node_rank 1 -n 3 --role b " .. q(FIX .. "env.lua"), NODES_ENV)
    local r0 = U.run(common .. "--node-rank 0 -n 2 --role a " .. q(FIX .. "env.lua"), NODES_ENV)
    local r1 = h:wait(30)
    assert.are.equal(0, r0.code, r0.err)
    assert.are.equal(0, r1.code, r1.err)
    local e0, e1 = U.env_by_rank(r0.out), U.env_by_rank(r1.out)
    for rank = 0, 4 do
      local e = rank < 2 and e0[rank] or e1[rank]
      assert.is_table(e, "rank " .. rank)
      assert.are.equal("5", e.WORLD_SIZE)
      assert.are.equal("2", e.GROUP_WORLD_SIZE)
      assert.are.equal(tostring(port), e.MASTER_PORT) -- static: the endpoint is node 0's store
      assert.are.equal(rank < 2 and "a" or "b", e.ROLE_NAME)
      assert.are.equal(tostring(rank < 2 and rank or rank - 2), e.ROLE_RANK)
      assert.are.equal(rank < 2 and "2" or "3", e.ROLE_WORLD_SIZE)
    end
  end)

  it("refuses a second crun-lua with the same --node-rank (both ran rank 2 and the job hung)", function()
    local port = U.free_port()
    local common = "--nnodes 2 --master-port " .. port .. " --rdzv-timeout 10 -n 1 "
    local h0 = U.start(common .. "--node-rank 0 " .. q(FIX .. "env.lua"), NODES_ENV)
    local ha = U.start(common .. "--node-rank 1 " .. q(FIX .. "env.lua"), NODES_ENV)
    local hb = U.start(common .. "--node-rank 1 " .. q(FIX .. "env.lua"), NODES_ENV)
    local r0, ra, rb = table.unpack(U.wait_all({h0, ha, hb}, 20))
    assert.are.equal(0, r0.code, r0.err)
    local ok, bad = ra, rb
    if ra.code ~= 0 then ok, bad = rb, ra end
    assert.are.equal(0, ok.code, ok.err)
    assert.are.equal(1, bad.code, bad.err)
    assert.matches("EINVAL: rendezvous: node rank 1 joined twice: the node of '1 default [^ ]+ %d+'", bad.err)
    assert.are.equal("", bad.out)
    assert.are.equal("2", U.env_by_rank(ok.out)[1].WORLD_SIZE)
  end)
end)

describe("crun-lua --redirects, --tee and --local-ranks-filter", function()
  it("sends redirected streams to the log files only and teed ones to both", function()
    local dir = U.tmpdir()
    local r = U.run("-n 3 --master-port 0 --log_dir " .. q(dir) .. " --redirects 3 --tee 0:3,2:2 " ..
                    q(FIX .. "output.lua"))
    assert.are.equal(0, r.code, r.err)
    assert.is_truthy(r.out:find("[0] out-a-0-b\n", 1, true), r.out)   -- rank 0: teed
    assert.is_nil(r.out:find("[1]", 1, true), r.out)                   -- rank 1: redirected
    assert.is_nil(r.out:find("[2]", 1, true), r.out)                   -- rank 2: stdout redirected,
    assert.is_truthy(r.err:find("[2] err-2\n", 1, true), r.err)       -- stderr teed
    assert.is_nil(r.err:find("[1] err-1", 1, true), r.err)
    for rank = 0, 2 do
      assert.are.equal("out-a-" .. rank .. "-b\n\nline2-" .. rank .. "\nlast-" .. rank,
                       U.slurp(string.format("%s/attempt_0/rank_%d.stdout", dir, rank)))
      assert.are.equal("err-" .. rank .. "\n", U.slurp(string.format("%s/attempt_0/rank_%d.stderr", dir, rank)))
    end
    U.rmrf(dir)
  end)

  it("writes only the selected streams' files, per local rank", function()
    local dir = U.tmpdir()
    local r = U.run("-n 2 --master-port 0 --log-dir " .. q(dir) .. " -r 0:1,1:2 " .. q(FIX .. "output.lua"))
    assert.are.equal(0, r.code, r.err)
    assert.are.same({"attempt_0/rank_0.stdout", "attempt_0/rank_1.stderr"}, files_under(dir))
    assert.is_nil(r.out:find("[0] out", 1, true), r.out)
    assert.is_truthy(r.out:find("[1] out-a-1-b\n", 1, true), r.out)
    assert.is_truthy(r.err:find("[0] err-0\n", 1, true), r.err)
    assert.is_nil(r.err:find("[1] err", 1, true), r.err)
    U.rmrf(dir)
  end)

  it("takes a fresh directory when --tee has no --log-dir, and names it", function()
    local r = U.run("-n 2 --master-port 0 --tee 1 " .. q(FIX .. "output.lua"))
    assert.are.equal(0, r.code, r.err)
    local dir = r.err:match("worker log files in (%S+)\n")
    assert.is_string(dir, r.err)
    assert.are.equal("out-a-1-b\n\nline2-1\nlast-1", U.slurp(dir .. "/attempt_0/rank_1.stdout"))
    assert.is_nil(U.slurp(dir .. "/attempt_0/rank_1.stderr"))
    assert.is_truthy(r.out:find("[1] out-a-1-b\n", 1, true), r.out)
    assert.is_truthy(r.err:find("[1] err-1\n", 1, true), r.err)
    os.execute("rm -rf " .. q(dir))
  end)

  it("creates a --log-dir whose parents do not exist yet, as torchrun's makedirs", function()
    local dir = U.tmpdir()
    local r = U.run("-n 2 --master-port 0 --log-dir " .. q(dir .. "/runs/job-1") .. " -r 3 " .. q(FIX .. "output.lua"))
    assert.are.equal(0, r.code, r.err)
    for rank = 0, 1 do
      assert.are.equal("err-" .. rank .. "\n", U.slurp(string.format("%s/runs/job-1/attempt_0/rank_%d.stderr", dir, rank)))
    end
    local f = dir .. "/file"
    U.write(f, "")
    r = U.run("-n 1 --master-port 0 --log-dir " .. q(f .. "/sub") .. " -r 3 " .. q(FIX .. "output.lua"))
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("ESYS: cannot create the log directory " .. f .. "/sub: Not a directory", 1, true), r.err)
    U.rmrf(dir)
  end)

  it("shows only the listed local ranks with --local-ranks-filter; files keep every rank", function()
    local dir = U.tmpdir()
    local r = U.run("-n 4 --master-port 0 --local_ranks_filter 1,3 --log-dir " .. q(dir) .. " --tee 3 " ..
                    q(FIX .. "output.lua"))
    assert.are.equal(0, r.code, r.err)
    for rank = 0, 3 do
      local shown = rank == 1 or rank == 3
      assert.are.equal(shown, r.out:find("[" .. rank .. "] out-a-" .. rank .. "-b\n", 1, true) ~= nil, r.out)
      assert.are.equal(shown, r.err:find("[" .. rank .. "] err-" .. rank .. "\n", 1, true) ~= nil, r.err)
      assert.are.equal("err-" .. rank .. "\n", U.slurp(string.format("%s/attempt_0/rank_%d.stderr", dir, rank)))
    end
    U.rmrf(dir)
  end)
end)

describe("crun-lua takes torchrun's command-line forms", function()
  -- --no-python was an unknown option: a C program linking libcrunrt had no launcher
  it("--no-python execs a program on every worker, with its arguments and torchrun's variables", function()
    local r = U.run("-n 3 --master-port 0 --no_python sh -c " ..
                    q('echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK arg $0 $1"') .. " x y")
    assert.are.equal(0, r.code, r.err)
    for k = 0, 2 do
      assert.is_truthy(r.out:find(string.format("[%d] rank %d of 3 local %d arg x y", k, k, k), 1, true), r.out)
    end
    local exe = os.getenv("CRUN_BUILD_DIR") and os.getenv("CRUN_BUILD_DIR") .. "/examples/allreduce"
    if exe and U.slurp(exe) then -- the C example, through the launcher's store
      r = U.run("-n 2 --master-port 0 --no-python " .. q(exe))
      assert.are.equal(0, r.code, r.err)
      assert.are.equal(2, U.count(r.out, ": all_reduce ok "), r.out)
    end
    r = U.run("-n 2 --master-port 0 --no-python sh -c " .. q("exit $((RANK + 3))"))
    assert.is_true(r.code == 3 or r.code == 4, r.err)
    r = U.run("-n 2 --no-python ./no-such-program")
    assert.are.equal(1, r.code)
    assert.is_truthy(r.err:find("crun-lua: --no-python: ./no-such-program: No such file or directory", 1, true), r.err)
    r = U.run("-n 2 --no-python -i sh")
    assert.are.equal(2, r.code, r.err)
    assert.is_truthy(r.err:find("--no-python runs a program on every worker; it does not go with -i", 1, true), r.err)
  end)

  it("takes a short option's value attached (-r3, -t2, -n2, -r=1), as argparse does", function()
    local both = {"attempt_0/rank_0.stderr", "attempt_0/rank_0.stdout", "attempt_0/rank_1.stderr",
                  "attempt_0/rank_1.stdout"}
    for _, c in ipairs({ -- options, stdout shown, stderr shown, log files
      {"-n2 -r3", false, false, both},
      {"-n2 -t2", true, true, {"attempt_0/rank_0.stderr", "attempt_0/rank_1.stderr"}},
      {"-n2 -r=1 -t0:2", false, true, {"attempt_0/rank_0.stderr", "attempt_0/rank_0.stdout", "attempt_0/rank_1.stdout"}},
      {"-n2 -t 1", true, true, {"attempt_0/rank_0.stdout", "attempt_0/rank_1.stdout"}},
    }) do
      local dir = U.tmpdir()
      local r = U.run(c[1] .. " --master-port 0 --log-dir " .. q(dir) .. " " .. q(FIX .. "output.lua"))
      assert.are.equal(0, r.code, c[1] .. " gave: " .. r.err)
      for rank = 0, 1 do
        assert.are.equal(c[2], r.out:find("[" .. rank .. "] out-a-" .. rank .. "-b\n", 1, true) ~= nil,
                         c[1] .. " rank " .. rank .. " stdout:\n" .. r.out)
        assert.are.equal(c[3], r.err:find("[" .. rank .. "] err-" .. rank .. "\n", 1, true) ~= nil,
                         c[1] .. " rank " .. rank .. " stderr:\n" .. r.err)
      end
      assert.are.same(c[4], files_under(dir), c[1])
      U.rmrf(dir)
    end
  end)

  it("accepts --run-path and --run_path (a Lua script is always run by path)", function()
    for _, flag in ipairs({"--run-path", "--run_path"}) do
      local r = U.run("-n 2 " .. flag .. " --master-port 0 " .. q(FIX .. "env.lua"))
      assert.are.equal(0, r.code, flag .. " gave: " .. r.err)
      assert.are.equal("2", U.env_by_rank(r.out)[1].WORLD_SIZE, r.out)
    end
    assert.is_truthy(U.run("--help").out:find("--run-path", 1, true))
  end)

  it("takes its defaults from torchrun's PET_* variables (as Kubeflow sets them); the command line wins", function()
    local r = U.run("--master-port 0 " .. q(FIX .. "env.lua"),
                    "PET_NPROC_PER_NODE=3 PET_MAX_RESTARTS=2 PET_RDZV_ID=pet-1 PET_ROLE=petrole")
    assert.are.equal(0, r.code, r.err)
    local e = U.env_by_rank(r.out)
    assert.are.equal("3", e[2].WORLD_SIZE)
    assert.are.equal("2", e[2].TORCHELASTIC_MAX_RESTARTS)
    assert.are.equal("pet-1", e[2].TORCHELASTIC_RUN_ID)
    assert.are.equal("petrole", e[2].ROLE_NAME)
    r = U.run("-n 2 --master-port 0 " .. q(FIX .. "env.lua"), "PET_NPROC_PER_NODE=3")
    assert.are.equal(0, r.code, r.err)
    assert.are.equal("2", U.env_by_rank(r.out)[1].WORLD_SIZE)
    r = U.run(q(FIX .. "env.lua"), "PET_STANDALONE=1 PET_NPROC_PER_NODE=2")
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(32, #U.env_by_rank(r.out)[1].TORCHELASTIC_RUN_ID)
    r = U.run("--master-port 0 " .. q(FIX .. "env.lua"), "PET_NNODES=two")
    assert.are.equal(2, r.code, r.err)
    assert.is_truthy(r.err:find("crun-lua: --nnodes: expected an integer in 1..65536, got 'two' (PET_NNODES in the environment)", 1, true), r.err)
    assert.are.equal("", r.out)
  end)

  it("takes every option in torchrun's underscore spelling", function()
    local dir = U.tmpdir()
    local r = U.run("--nproc_per_node=2 --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port 0 " ..
                    "--rdzv_backend static --rdzv_id under-1 --rdzv_conf join_timeout=20 --rdzv_timeout 20 " ..
                    "--max_restarts 1 --monitor_interval 1 --log_dir " .. q(dir) .. " --redirects 0 --tee 3 " ..
                    "--local_ranks_filter 1 --grace_period 2 --cpu_bind none --no_prefix --run_path --start_method spawn " ..
                    q(FIX .. "env.lua"))
    assert.are.equal(0, r.code, r.err)
    local e = U.env_by_rank(r.out)
    assert.is_nil(e[0], r.out)          -- filtered out
    assert.are.equal("2", e[1].WORLD_SIZE)
    assert.are.equal("under-1", e[1].TORCHELASTIC_RUN_ID)
    assert.are.equal("1", e[1].TORCHELASTIC_MAX_RESTARTS)
    assert.is_nil(r.out:find("[1]", 1, true), r.out) -- --no_prefix
    assert.are.same({"attempt_0/rank_0.stderr", "attempt_0/rank_0.stdout", "attempt_0/rank_1.stderr",
                     "attempt_0/rank_1.stdout"}, files_under(dir))
    U.rmrf(dir)
  end)
end)

describe("crun-lua -m, --nproc-per-node, --standalone, --monitor-interval", function()
  it("runs a module found on package.path with -m, as python -m", function()
    local env = "LUA_PATH=" .. q(FIX .. "mods/?.lua;;")
    local r = U.run("-n 2 --master-port 0 -m pkg.hello_mod one 'two words'", env)
    assert.are.equal(0, r.code, r.err)
    for rank = 0, 1 do
      assert.is_truthy(r.out:find(string.format("[%d] MOD rank=%d arg0=%smods/pkg/hello_mod.lua args=one|two words\n",
                                                rank, rank, FIX), 1, true), r.out)
    end
    r = U.run("--module -n 1 pkg.no_such_mod", env)
    assert.are.equal(1, r.code, r.err)
    assert.is_truthy(r.err:find("-m: module 'pkg.no_such_mod' not found on package.path:", 1, true), r.err)
    assert.is_truthy(r.err:find("mods/pkg/no_such_mod.lua", 1, true), r.err)
  end)

  it("takes the CPU count for cpu, and the GPU count (or CPUs without a GPU) for auto", function()
    local cpus, gpus = machine()
    local r = U.run("--nproc-per-node cpu --master-port 0 --cpu-bind none " .. q(FIX .. "env.lua"))
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(tostring(cpus), U.env_by_rank(r.out)[0].WORLD_SIZE)
    r = U.run("-n auto --master-port 0 --cpu-bind none " .. q(FIX .. "env.lua"))
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(tostring(gpus > 0 and gpus or cpus), U.env_by_rank(r.out)[0].WORLD_SIZE)
    r = U.run("-n gpu --master-port 0 " .. q(FIX .. "env.lua"))
    if gpus > 0 then
      assert.are.equal(0, r.code, r.err)
      assert.are.equal(tostring(gpus), U.env_by_rank(r.out)[0].WORLD_SIZE)
    else
      assert.are.equal(2, r.code, r.err)
      assert.is_truthy(r.err:find("-n gpu: no CUDA device found", 1, true), r.err)
    end
    r = U.run("-n auto --master-port 0 " .. q(FIX .. "env.lua"), "CUDA_VISIBLE_DEVICES=")
    assert.are.equal(tostring(cpus), U.env_by_rank(r.out)[0].WORLD_SIZE) -- no GPU visible
  end)

  it("runs --standalone on a free port with a fresh run id, twice at once", function()
    local a = U.start("--standalone --nproc-per-node 2 " .. q(FIX .. "env.lua"))
    local r = U.run("--standalone -n 2 --monitor-interval 0.5 --monitor_interval=5 " .. q(FIX .. "env.lua"))
    local ra = a:wait(30)
    assert.are.equal(0, r.code, r.err)
    assert.are.equal(0, ra.code, ra.err)
    local e, ea = U.env_by_rank(r.out), U.env_by_rank(ra.out)
    assert.are.equal("2", e[1].WORLD_SIZE)
    assert.are_not.equal("29500", e[0].MASTER_PORT)
    assert.are.equal(e[0].MASTER_PORT, e[1].MASTER_PORT)
    assert.are_not.equal(ea[0].MASTER_PORT, e[0].MASTER_PORT)
    assert.is_truthy(e[0].TORCHELASTIC_RUN_ID:match("^%x+$") and #e[0].TORCHELASTIC_RUN_ID == 32, e[0].TORCHELASTIC_RUN_ID)
    assert.are_not.equal(ea[0].TORCHELASTIC_RUN_ID, e[0].TORCHELASTIC_RUN_ID)
    assert.are.equal(e[0].TORCHELASTIC_RUN_ID, e[1].TORCHELASTIC_RUN_ID)
  end)
end)

describe("crun-lua torchrun options: bad values", function()
  it("rejects each bad value with the option's name", function()
    local cases = {
      {"--nnodes 3:2 x.lua", "%-%-nnodes 3:2: MIN is above MAX"},
      {"--nnodes 1:x x.lua", "%-%-nnodes: expected an integer in 1%.%.65536, got 'x'"},
      {"--nnodes 1:2 x.lua", "%-%-nnodes 1:2: a range needs %-%-rdzv%-backend c10d"},
      {"--rdzv-backend etcd x.lua", "%-%-rdzv%-backend: unknown backend 'etcd' %(expected c10d or static%)"},
      {"--rdzv-backend c10d x.lua", "%-%-rdzv%-backend c10d needs %-%-rdzv%-endpoint HOST%[:PORT%]"},
      {"--rdzv-backend c10d --rdzv-endpoint h:0 x.lua", "%-%-rdzv%-endpoint h:0: the other nodes could not know the port"},
      {"--rdzv-endpoint :29400 x.lua", "%-%-rdzv%-endpoint: bad address ':29400'"},
      {"--rdzv-endpoint host:99999 x.lua", "%-%-rdzv%-endpoint: expected an integer in 0%.%.65535, got '99999'"},
      {"--rdzv-id a/b x.lua", "%-%-rdzv%-id: 'a/b' is not a run id"},
      {"--rdzv-conf foo=1,join_timeout=3 x.lua", "%-%-rdzv%-conf: unknown key 'foo' %(known: join_timeout, last_call_timeout, close_timeout, heartbeat_timeout%)"},
      {"--rdzv_conf join_timeout=soon x.lua", "%-%-rdzv%-conf join_timeout: expected a number of seconds, got 'soon'"},
      {"--rdzv-conf last_call_timeout x.lua", "%-%-rdzv%-conf: 'last_call_timeout' is not key=value"},
      {"--rdzv-backend c10d --rdzv-endpoint h:29400 --rdzv-conf heartbeat_timeout=1e-300 x.lua",
       "%-%-rdzv%-conf heartbeat_timeout: 1e%-300 s is below 0%.1 s"},
      {"--rdzv-backend c10d --rdzv-endpoint h:29400 --rdzv-conf heartbeat_timeout=0 x.lua",
       "%-%-rdzv%-conf heartbeat_timeout: 0 s is below 0%.1 s"},
      {"--redirects 4 x.lua", "%-%-redirects: expected 0 %(none%), 1 %(stdout%), 2 %(stderr%), 3 %(both%) or a per local rank map like 0:1,1:2, got '4'"},
      {"-r 0:1,1 x.lua", "%-%-redirects: expected .* got '0:1,1'"},
      {"--tee=0:5 x.lua", "%-%-tee: expected .* got '0:5'"},
      {"--local-ranks-filter 0,a x.lua", "%-%-local%-ranks%-filter: expected local ranks separated by commas %(e%.g%. 0,2%), got '0,a'"},
      {"--role '' x.lua", "%-%-role: '' is not a role name"},
      {"--monitor-interval -1 x.lua", "%-%-monitor%-interval: expected a number of seconds, got '%-1'"},
      {"--nproc-per-node many x.lua", "%-%-nproc%-per%-node: expected an integer in 1%.%.4096, got 'many'"},
      {"--standalone --nnodes 2 x.lua", "%-%-standalone runs one node; drop %-%-nnodes 2"},
      {"-m", "%-m needs a module name"},
      {"-m -i", "%-m runs a module; it does not go with %-i"},
      {"--standalone=1 x.lua", "option %-%-standalone takes no value"},
      {"--start-method thread x.lua", "%-%-start%-method: unknown method 'thread' %(expected spawn, fork or forkserver%)"},
    }
    for _, v in ipairs({"inf", "nan", "-1", "soon"}) do -- read once a worker failed: checked at start
      cases[#cases + 1] = {"x.lua", "CRUN_STOP_DELAY: expected a number of seconds, got '" .. v:gsub("%-", "%%-") .. "'",
                           "CRUN_STOP_DELAY=" .. v}
    end
    for _, c in ipairs(cases) do
      local r = U.run(c[1], c[3])
      assert.are.equal(2, r.code, c[1] .. " gave: " .. r.err)
      assert.is_truthy(r.err:match(c[2]), c[1] .. " gave: " .. r.err)
      assert.are.equal("", r.out, c[1])
    end
  end)
end)

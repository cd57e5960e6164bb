-- slurm_spec.lua — crun under Slurm: a one-host cluster from Debian's packages
-- (munged, slurmctld, slurmd; scripts/slurm_local.sh, everything in a
-- temporary directory, ports picked at random) runs `srun -n 4 crun-lua job`
-- (every rank's placement and collectives checked) and
-- `sbatch examples/slurm/train.sbatch` to the end of training. Pending with
-- the reason where the cluster cannot start (not root, packages missing, no
-- cgroup file system for slurmd).
local c = require "helpers.common"

local SCRIPT = c.SOURCE .. "/scripts/slurm_local.sh"

-- Runs the sh command line `cmd` on a fresh cluster; returns code, output
-- and the cluster's directory (removed by the caller).
local function on_cluster(cmd, limit)
  local dir = c.tmpdir("slurm")
  local port = math.random(21000, 30000)
  local full = string.format(
    "cd %s && unset CRUN_BACKEND CRUN_LAUNCHER RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT; " ..
    "CRUN_SLURM_PORT=%d MASTER_PORT=%d timeout -s KILL %d %s %s sh -c %s 2>&1",
    c.q(c.SOURCE), port, port + 100, limit, c.q(SCRIPT), c.q(dir), c.q(cmd))
  local p = io.popen(full)
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out, dir
end

-- The reason the cluster did not start, when the output says so.
local function not_started(code, out)
  if code == 77 then return out:match("slurm_local%.sh: ([^\n]*)") or out end
end

describe("Slurm", function()
  local p = io.popen(c.q(SCRIPT) .. " check 2>&1")
  local why = p:read("a")
  if not p:close() then
    pending("skipped: " .. why:gsub("%s+$", ""))
    return
  end

  it("runs `srun -n 4 crun-lua job.lua`: 4 ranks placed by Slurm, the collectives checked on each", function()
    local code, out, dir = on_cluster("MASTER_ADDR=127.0.0.1 CRUN_TOKEN=slurm-spec srun -n 4 " ..
                                      c.q(c.CRUN_LUA) .. " spec/helpers/multihost_job.lua check", 90)
    c.rmrf(dir)
    local why_not = not_started(code, out)
    if why_not then return pending("the Slurm cluster did not start: " .. why_not) end
    assert.are.equal(0, code, out)
    local host = io.popen("hostname"):read("l")
    for r = 0, 3 do
      -- SLURM_LOCALID is the local rank; one node, so the shared-memory engine
      assert.is_truthy(out:find(string.format("rank %d of 4 on %s (local %d, backend cpu)", r, host, r), 1, true), out)
      assert.is_truthy(out:find(string.format("rank %d ok 7", r), 1, true), out)
    end
  end)

  it("runs `sbatch examples/slurm/train.sbatch` to the end of training on 4 ranks", function()
    local code, out, dir = on_cluster(
      "CRUN_LUA=" .. c.q(c.CRUN_LUA) .. " sbatch --wait --output=\"$SLURM_CONF.train.out\" " ..
      "examples/slurm/train.sbatch --epochs 2 --samples 4000 --no-ckpt; rc=$?; " ..
      "cat \"$SLURM_CONF.train.out\"; exit $rc", 120)
    c.rmrf(dir)
    local why_not = not_started(code, out)
    if why_not then return pending("the Slurm cluster did not start: " .. why_not) end
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("Submitted batch job %d+"), out)
    local acc = out:match("final test accuracy ([%d.]+)%% %(800 test samples, each evaluated once over 4 ranks%)")
    assert.is_not_nil(acc, out)
    -- 2 short epochs: well above chance (25 %), far from the 10-epoch result
    assert.is_true(tonumber(acc) > 50, out)
  end)
end)

-- dist_p2p_spec.lua — point-to-point progress on the cpu backend from Lua:
-- ring exchanges where every rank posts its send (or receive) first, from 8 B
-- to 4 MiB; many messages in flight to one peer keep their order per tag;
-- p2p between all_reduce and uneven all_to_all followed by a 128 KiB ring;
-- sends no receive took yet are buffered up to CRUN_TCP_UNEXPECTED_MAX only.
-- Each case runs at 2, 3 and 4 ranks, over TCP alone and with the shm engine.
local run = require "helpers.dist_run"

local function job(n, case, shm, rounds, env)
  local code, out = run.run(n, "spec/helpers/dist_p2p.lua", case .. " " .. (rounds or 1),
                            {limit = 90, env = "CRUN_SHM=" .. shm .. (env and " " .. env or "")})
  assert.are.equal(0, code, out)
  for r = 0, n - 1 do
    assert.is_truthy(out:find("rank " .. r .. " ok " .. case, 1, true), out)
  end
  return out
end

describe("dist p2p", function()
  for _, shm in ipairs{"0", "1"} do
    local mode = shm == "0" and "tcp only" or "with shm"
    for n = 2, 4 do
      it(string.format("isend+recv and irecv+send rings, 8 B to 4 MiB, %d ranks, %s", n, mode), function()
        job(n, "ring", shm)
      end)
      it(string.format("p2p between all_reduce and uneven all_to_all, %d ranks, %s", n, mode), function()
        job(n, "mixed", shm, 3)
      end)
    end
    it("many messages in flight to one peer arrive in order per tag, " .. mode, function()
      job(3, "order", shm)
    end)
    it("a recv that times out names the frame its peer sent with another tag, " .. mode, function()
      job(3, "tag", shm)
    end)
  end

  it("48 MiB of sends no recv took yet stay within a 4 MiB limit, and all arrive once received", function()
    local out = job(2, "flood", "0", 1, "CRUN_TCP_UNEXPECTED_MAX=4194304")
    local kb = tonumber(out:match("rank 0 peak rss growth (%-?%d+) kB"))
    assert.is_truthy(kb, out)
    assert.is_true(kb < 16384, out)   -- unbounded, the whole 48 MiB was buffered
  end)

  it("a collective behind more unreceived sends than the limit fails with ENOMEM naming them", function()
    job(2, "overrun", "0", 1, "CRUN_TCP_UNEXPECTED_MAX=4194304")
  end)

  it("a recv stuck behind more unreceived sends than the limit times out saying the reading is paused", function()
    job(2, "paused", "0", 1, "CRUN_TCP_UNEXPECTED_MAX=4194304")
  end)

  it("an all_reduce whose frame waits behind a full buffer of unreceived sends completes", function()
    job(2, "held_coll", "0", 1, "CRUN_TCP_UNEXPECTED_MAX=4194304 CRUN_RING_SLICE=524288")
  end)

  it("examples/ring_allreduce.lua on 4 ranks", function()
    local code, out = run.run(4, "examples/ring_allreduce.lua", "", {limit = 60})
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("ring all-reduce gave 10.0 (expected 10.0)", 1, true), out)
  end)
end)

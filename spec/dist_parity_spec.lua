-- dist_parity_spec.lua — torch.distributed parity from Lua: positional
-- init_process_group("gloo"), option tables that reject unknown keys,
-- group.WORLD, new_group sorting its ranks and naming disagreements,
-- new_subgroups*, all_to_all_single with uneven splits, batch_isend_irecv,
-- monitored_barrier naming missing ranks, torch-shaped object collectives (a
-- broadcast_object_list of a million values too),
-- and DDP on a sub-group given as torch's process_group; dist.all_reduce(t)
-- on the binding's shortest path, and the calls that must leave it.
local run = require "helpers.dist_run"

local function job(n, case, shm)
  local code, out = run.run(n, "spec/helpers/dist_parity.lua", case, {limit = 90, env = "CRUN_SHM=" .. shm})
  assert.are.equal(0, code, out)
  for r = 0, n - 1 do assert.is_truthy(out:find("rank " .. r .. " ok " .. case, 1, true), out) end
  return out
end

describe("torch.distributed parity", function()
  for _, c in ipairs{
    {"init", {2}}, {"default_call", {2, 3}}, {"new_group_sorted", {3, 4}}, {"new_group_mismatch", {3, 4}}, {"subgroups", {4}},
    {"a2a_single", {2, 3, 4}}, {"batch", {2, 3, 4}}, {"batch_bad_entry", {2, 3}}, {"monitored", {2, 4}}, {"monitored_reinit", {3}}, {"objects", {2, 3}},
    {"object_list_1m", {2}}, {"object_list_src", {2, 3}}, {"object_list_nil_slots", {2, 3}}, {"work_source_rank", {3}}, {"ddp_group", {4}},
    {"positional_group", {2, 3}},
  } do
    for _, n in ipairs(c[2]) do
      for _, shm in ipairs{"0", "1"} do
        it(string.format("%s, %d ranks, %s", c[1], n, shm == "0" and "tcp" or "shm"), function()
          local out = job(n, c[1], shm)
          if c[1] == "ddp_group" then
            -- the inert torch option is reported once, on rank 0 only
            local _, k = out:gsub("option 'find_unused_parameters' has no effect in crun", "")
            assert.are.equal(1, k, out)
          end
        end)
      end
    end
  end
end)

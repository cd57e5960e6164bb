-- dist_errors_spec.lua — what ranks see when a job goes wrong: a collective
-- mismatch, a count mismatch, a late rank (timeout report read from the
-- store's progress board) and a peer killed mid all_reduce. Every rank must
-- fail with a message naming the ranks and calls, never hang.
local run = require "helpers.dist_run"
local expect = require "helpers.dist_expect"

local SCRIPT = "spec/helpers/dist_errors.lua"

-- Over TCP alone (CRUN_SHM=0) unless opts.env says otherwise.
local function scenario(mode, opts)
  opts = opts or {limit = 60}
  opts.env = opts.env or "CRUN_SHM=0"
  local dir = run.tmpdir()
  local _, out = run.run(3, SCRIPT, mode .. " " .. dir, opts)
  local res = {}
  for r = 0, 2 do res[r] = run.text(dir, r) end
  run.cleanup(dir)
  return res, out
end

-- n ranks (2 or 3) over TCP alone unless env says otherwise; direct: started
-- without the launcher (which would stop the others when a rank dies).
local function scenario_n(n, mode, env, direct)
  local dir = run.tmpdir()
  local _, out = run.run(n, SCRIPT, mode .. " " .. dir, {limit = 60, env = env or "CRUN_SHM=0", direct = direct})
  local res = {}
  for r = 0, n - 1 do res[r] = run.text(dir, r) end
  run.cleanup(dir)
  return res, out
end

-- Asserts what each of the n ranks saw after the last rank alone refused
-- its part of call #1 (kind) for reason why: every rank fails #1 with the
-- EINVAL (the peers naming the last rank), then #2 with ESTATE quoting it,
-- within 10 s.
local lone_refusal

-- The lines of a rank's record.
local function lines(text)
  local l = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do l[#l + 1] = line end
  return l
end

function lone_refusal(res, out, n, why, kind)
  for r = 0, n - 1 do
    local l = lines(res[r])
    local says = "rank " .. r .. ": " .. res[r] .. "\n" .. out
    assert.is_truthy(l[1] and l[1]:match("^error EINVAL: ") and l[1]:find(why, 1, true), says)
    if r ~= n - 1 then
      assert.is_truthy(l[1]:find(string.format("rank %d refused its part of %s #1", n - 1, kind), 1, true), says)
    end
    assert.is_truthy(l[2] and l[2]:find(string.format("^error ESTATE: all_reduce #2 on rank %d: ", r))
                     and l[2]:find(why, 1, true), says)
    assert.is_truthy(tonumber(l[3]:match("^elapsed (%S+)")) < 10, says)
  end
end

-- Asserts what each of the n ranks saw after rank 1 (or the root) refused a
-- call: its first line is the EINVAL naming why, its second (the group's next
-- call) fails with the same text, and no EMISMATCH; with kind, a peer's first
-- line also says rank 1 refused its part of that call.
local function every_rank_refused(res, out, n, why, kind)
  for r = 0, n - 1 do
    local l = lines(res[r])
    assert.is_truthy(l[1] and l[1]:match("^error EINVAL: ") and l[1]:find(why, 1, true),
                     "rank " .. r .. ": " .. res[r] .. "\n" .. out)
    if kind and r ~= 1 then
      assert.is_truthy(l[1]:find("rank 1 refused its part of " .. kind, 1, true), "rank " .. r .. ": " .. l[1])
    end
    assert.is_truthy(l[2] and l[2]:match("^error E") and l[2]:find(why, 1, true), "rank " .. r .. ": " .. res[r])
    assert.is_falsy(res[r]:find("EMISMATCH", 1, true), res[r])
  end
end

describe("dist failures", function()
  it("report a different collective on every rank, naming both calls", function()
    expect.mismatch(scenario("mismatch"))
  end)

  it("report a mismatch on every rank with the shared-memory engine too", function()
    local res, out = scenario("count", {limit = 60, env = "CRUN_SHM=1"})
    for r = 0, 2 do
      assert.is_truthy(res[r]:match("^error EMISMATCH: "), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
      assert.is_truthy(res[r]:find("float32[512]", 1, true), res[r])
    end
  end)

  -- after calls that passed, a failing one breaks the group on every rank:
  -- the next call fails at once with the group's failure (the group's lane
  -- for repeated all_reduces, pg/work.c crun__pg_all_reduce_now, included)
  it("fail every rank's next call after a mismatch that follows calls that passed (shm)", function()
    local res, out = scenario("countlater", {limit = 60, env = "CRUN_SHM=1"})
    for r = 0, 2 do
      local l = lines(res[r])
      local says = "rank " .. r .. ": " .. res[r] .. "\n" .. out
      assert.are.equal("sum 243", l[1], says) -- 3^5
      assert.is_truthy(l[2] and l[2]:match("^error EMISMATCH: "), says)
      assert.is_truthy(l[3] and l[3]:find(string.format("^error ESTATE: all_reduce #%%d+ on rank %d: the group is "
                                                        .. "unusable after an earlier failure: ", r)), says)
      assert.is_truthy(l[3]:find("float32[3]", 1, true), says) -- the failure it quotes
    end
  end)

  it("report a different count on every rank", function()
    expect.count(scenario("count"))
  end)

  -- Ranks that disagree on a rooted collective's src/dst: a rank that takes
  -- itself for the root only sends, and a gather's two roots wait for each
  -- other, so no data frame shows it. The ranks agree on the root first, and
  -- every rank fails the call itself, naming both roots and the ranks that
  -- gave them, within a second (timeout 30 s); or, when a rank that found it
  -- first failed the group while this one still waited in the exchange on
  -- another rank, with that rank's text, reported by it or relayed by a rank
  -- that had it from it.
  for _, k in ipairs{{"broadcast", "src"}, {"reduce", "dst"}, {"gather", "dst"}, {"scatter", "src"}} do
    for _, n in ipairs{2, 3} do
      it(string.format("report a %s whose %s differs between ranks at once (tcp, %d ranks)", k[1], k[2], n), function()
        local res, out = scenario_n(n, "roots_" .. k[1], "CRUN_SHM=0")
        for r = 0, n - 1 do
          local why = ": the ranks disagree on " .. k[2] .. ": rank 0 gave 0, rank 1 gave 1"
          local by = tonumber(res[r]:match("^error EMISMATCH: " .. k[1] .. " #1 on rank (%d+)" .. why:gsub("%p", "%%%0")))
          -- relayed: by the finder, or by a rank that had it from the finder
          local seen = by == r or (by and res[r]:find(string.format("%%[reported by rank %%d+; rank %d was in %s #1%%]", r,
                                                                    k[1])))
          assert.is_truthy(seen, "rank " .. r .. ": " .. res[r] .. "\n" .. out)
          assert.is_true(tonumber(res[r]:match("elapsed ([%d.]+)")) < 2, res[r])
        end
      end)
    end
  end

  -- Without that check (CRUN_ROOT_CHECK=0), ranks that each take themselves
  -- for the broadcast's root only send: the frames nobody received are
  -- reported when the group is destroyed.
  it("warn at destroy about a broadcast whose src differed over TCP (CRUN_ROOT_CHECK=0)", function()
    local res, out = scenario("root", {limit = 60, env = "CRUN_SHM=0 CRUN_ROOT_CHECK=0"})
    for r = 0, 2 do assert.are.equal("ok", res[r], out) end
    assert.is_truthy(out:find("WARN PG: EMISMATCH: group 'default/0': rank %d sent broadcast #1 float32%[4%] root %d to rank %d, and no operation of rank %d received it"), out)
  end)

  -- A rank whose object cannot be sent (it does not serialize, or the root's
  -- arguments are wrong) still takes part in the exchange: every rank raises
  -- its error naming it, and the group stays usable.
  for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
    it("report an object collective's local failure on every rank (" .. env .. ")", function()
      local res, out = scenario("object", {limit = 60, env = env})
      for r = 0, 2 do
        local l = lines(res[r])
        assert.is_truthy(l[1] and l[1]:find("^error EINVAL: all_gather_object: rank 1 could not send its object: "
                         .. "crun.save: cannot save a function"), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
        assert.is_truthy(l[2] and l[2]:find("^error EINVAL: scatter_object_list: rank 0 could not send its object: "
                         .. "scatter_object_list on rank 0 %(src%): the input list must have 3 elements"), res[r])
        assert.are.same({"ok", "sum 3"}, {l[3], l[4]}, res[r])
      end
    end)
  end

  -- A rank that passes something other than a list as an object
  -- collective's list fails alone (after the exchange), the others complete
  -- instead of waiting for it until the timeout; a src that does fails the
  -- call on every rank, naming itself.
  it("fail only the rank whose object list is not a table, promptly", function()
    local t0 = os.time()
    local res, out = scenario("objlist")
    assert.is_true(os.time() - t0 < 20, "took " .. (os.time() - t0) .. " s\n" .. out)
    local src = "error EINVAL: broadcast_object_list: rank 0 could not send its object: broadcast_object_list on "
                .. "rank 0: the object list must be a table, got string"
    for r = 0, 2 do
      local l = lines(res[r])
      local want
      if r == 1 then
        want = {"error EINVAL: all_gather_object on rank 1: the output list must be a table, got string", "gathered ",
                "error EINVAL: broadcast_object_list on rank 1: the object list must be a table, got string",
                "broadcast false,false",
                "error EINVAL: scatter_object_list on rank 1: the output list must be a table, got string",
                "scattered nil", src, "ok", "sum 3"}
      else
        want = {"ok", "gathered -1,-8,-15", "ok", "broadcast x,-3", "ok", "scattered " .. (-10 * (r + 1)), src, "ok", "sum 3"}
      end
      assert.are.same(want, {table.unpack(l, 1, 9)}, "rank " .. r .. ": " .. res[r] .. "\n" .. out)
    end
  end)

  -- A check only the root makes (its own buffers overlap) fails the call
  -- there; the root fails the group with its reason (over TCP, and through the
  -- shared-memory engine's abort record), so that every
  -- rank learns it (in the call itself: they wait for the root in the check
  -- of the root, or for its data), never as an EMISMATCH between later calls.
  for _, k in ipairs{{"rootgather", "gather on rank 0: the input overlaps the output for rank 0"},
                     {"rootscatter", "scatter on rank 0: the output overlaps the input for rank 0"}} do
    for _, n in ipairs{2, 3} do for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
      it("tell every rank why the root refused its " .. k[1]:sub(5) .. " (" .. env .. ", " .. n .. " ranks)", function()
        local res, out = scenario_n(n, k[1], env)
        every_rank_refused(res, out, n, k[2])
      end)
    end end
  end

  -- The same for the bindings' own check of the root's list (its length):
  -- every rank fails the call itself (the others wait in the root check).
  for _, k in ipairs{"gather", "scatter"} do
    for _, n in ipairs{2, 3} do for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
      it("tell every rank why the root refused its " .. k .. " list (" .. env .. ", " .. n .. " ranks)", function()
        local res, out = scenario_n(n, "rootlist" .. k, env)
        local why = "EINVAL: bad argument #2 to '" .. k .. "' (list of " .. n .. " tensors expected, got 1)"
        for r = 0, n - 1 do
          local first = res[r]:match("^[^\n]*")
          -- (a shared-memory peer's text starts "EINVAL: shm scatter #1 on rank r: rank 0 failed first: ")
          assert.is_truthy(first:match("^error EINVAL: ") and first:find(why, 1, true), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
          if r > 0 then assert.is_truthy(first:find("rank 0, the root, refused its part of " .. k, 1, true), first) end
          assert.is_falsy(res[r]:find("EMISMATCH", 1, true), res[r])
        end
      end)
    end end
  end

  -- all_to_all_single's split sizes (and tensors) are checked on each rank
  -- alone: a rank whose sizes are wrong refuses the call for the group, so every rank fails
  -- it naming that rank and the fault, not the next call with an EMISMATCH.
  for _, k in ipairs{{"len", "input split sizes must be a list of %d integers (one per rank), got %d"},
                     {"sum", "input split sizes add up to %d, dim 1 of the input tensor is %d"},
                     {"neg", "input split size 1 is -1"},
                     {"dtype", "the output tensor is float64, the input float32"}} do
    for _, n in ipairs{2, 3} do for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
      it(string.format("tell every rank why rank 1 refused all_to_all_single (%s splits, %s, %d ranks)", k[1], env, n),
         function()
        local res, out = scenario_n(n, "a2asplit_" .. k[1], env)
        local why = "all_to_all_single on rank 1: " .. (k[1] == "len" and k[2]:format(n, n - 1)
                                                         or k[1] == "sum" and k[2]:format(2 * n + 1, 2 * n) or k[2])
        every_rank_refused(res, out, n, why)
      end)
    end end
  end

  -- A rooted collective's src/dst is checked on each rank alone too (the
  -- bindings' range check; dist's global-to-group mapping for a subgroup): a
  -- rank whose root is bad refuses the call for the group, so every rank fails
  -- it naming rank 1 and the fault. Before, rank 1 alone raised; its peers
  -- waited for it and met its next call as an EMISMATCH.
  for _, c in ipairs{{"broadcast", "src"}, {"reduce", "dst"}, {"gather", "dst"}, {"scatter", "src"}} do
    for _, k in ipairs{"range", "type", "outside"} do
      for _, n in ipairs{2, 3} do for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
        it(string.format("tell every rank why rank 1 refused %s (bad %s: %s, %s, %d ranks)", c[1], c[2], k, env, n),
           function()
          local res, out = scenario_n(n, "rootarg:" .. c[1] .. ":" .. k, env)
          local why = c[1] .. " on rank 1: " .. c[2] ..
                      (k == "range" and (" " .. n .. " is out of range (0.." .. (n - 1) .. ")")
                       or k == "type" and " must be an integer rank, got string"
                       or (" " .. (n + 3) .. " is not in the group"))
          every_rank_refused(res, out, n, why)
        end)
      end end
    end
  end

  -- The object collectives' src/dst too (dist's obj_root): before, rank 1
  -- alone raised and its peers met its next call as an EMISMATCH.
  for _, c in ipairs{{"broadcast_object_list", "src"}, {"gather_object", "dst"}, {"scatter_object_list", "src"},
                     {"broadcast_object", "src"}} do
    it(string.format("tell every rank why rank 1 refused %s (bad %s: outside, range; 3 ranks)", c[1], c[2]), function()
      local res, out = scenario("objroot:" .. c[1])
      expect.objroot_refused(res, out, 3, c[1], c[2])
    end)
  end

  -- Split sizes whose sum is right only modulo 2^64 (each a valid integer)
  -- are refused like any wrong sum, never used to address far outside the
  -- tensor (4 ranks: 2 and 3 cannot wrap with rank 1's own block right).
  it("tell every rank why rank 1 refused all_to_all_single (split sizes that wrap, 4 ranks)", function()
    local res, out = scenario_n(4, "a2asplit_wrap", "CRUN_SHM=0")
    local why = "all_to_all_single on rank 1: input split sizes add up to more than "
                .. math.maxinteger .. ", dim 1 of the input tensor is 8"
    for r = 0, 3 do
      local first = (res[r] or ""):match("^[^\n]*")
      assert.is_truthy(first:match("^error EINVAL: ") and first:find(why, 1, true), "rank " .. r .. ": "
                       .. tostring(res[r]) .. "\n" .. out)
    end
  end)

  -- The list forms (all_gather, reduce_scatter, all_to_all) check their
  -- arguments on each rank alone too (the bindings' list checks, the
  -- runtime's overlap and self-count checks): a rank whose list is wrong
  -- refuses the call for the group, so every rank fails that call naming
  -- rank 1 and the fault (%d: the world size), never the next call with an
  -- EMISMATCH or a timeout.
  local LISTBAD = {
    {"all_gather", "len", "bad argument #1 to 'all_gather' (list of %d tensors expected, got %d)"},
    {"all_gather", "dtype", "bad argument #1 to 'all_gather' (tensor 2 is float64[4], expected float32[4] like "
                            .. "the other argument)"},
    {"all_gather", "notensor", "bad argument #1 to 'all_gather' (entry 2: crun.Tensor expected, got number)"},
    {"all_gather", "input", "bad argument #2 to 'all_gather' (crun.Tensor expected, got string)"},
    {"all_gather", "overlap", "all_gather on rank 1: the input overlaps the output for rank 0 (only this rank's "
                              .. "may be the input itself)"},
    {"reduce_scatter", "len", "bad argument #2 to 'reduce_scatter' (list of %d tensors expected, got %d)"},
    {"reduce_scatter", "size", "bad argument #2 to 'reduce_scatter' (tensor 2 is float32[3], expected float32[4] "
                               .. "like the other argument)"},
    {"reduce_scatter", "noncontig", "bad argument #2 to 'reduce_scatter' (tensor 2 must be contiguous; call "
                                    .. ":contiguous())"},
    {"reduce_scatter", "overlap", "reduce_scatter on rank 1: the output overlaps the input for rank 0 (inputs are "
                                  .. "read while the output is written: give a separate output)"},
    {"all_to_all", "len", "bad argument #2 to 'all_to_all' (list of %d tensors expected, got %d)"},
    {"all_to_all", "dtype", "bad argument #2 to 'all_to_all' (tensor 2 is float64, tensor 1 is float32)"},
    {"all_to_all", "mixed", "bad argument #1 to 'all_to_all' (outputs are float64, inputs float32)"},
    {"all_to_all", "notensor", "bad argument #1 to 'all_to_all' (entry 2: crun.Tensor expected, got string)"},
    {"all_to_all", "self", "all_to_all on rank 1: sends 4 elements to itself but expects 3"},
    {"all_to_all_single", "self", "all_to_all on rank 1: sends 1 elements to itself but expects 2"},
    {"all_gather_into_tensor", "size", function(n)
      return ("all_gather_into_tensor: the output tensor has %d elements, expected %d (world size %d x 4)"):format(
        4 * n + 1, 4 * n, n)
    end},
    {"reduce_scatter_tensor", "size", function(n)
      return ("reduce_scatter_tensor: the input tensor has %d elements, expected %d (world size %d x 4)"):format(
        4 * n - 1, 4 * n, n)
    end},
    {"all_gather_into_tensor", "closed", "all_gather_into_tensor: the output tensor is closed"},
    {"reduce_scatter_tensor", "closed", "reduce_scatter_tensor: the output tensor is closed"},
  }
  for _, k in ipairs(LISTBAD) do
    for _, run_on in ipairs{{2, "CRUN_SHM=0"}, {3, "CRUN_SHM=0"}, {3, "CRUN_SHM=1"}} do
      local n, env = run_on[1], run_on[2]
      it(string.format("tell every rank why rank 1 refused its %s (%s, %s, %d ranks)", k[1], k[2], env, n), function()
        local res, out = scenario_n(n, "listbad:" .. k[1] .. ":" .. k[2], env)
        local why = type(k[3]) == "function" and k[3](n) or k[3]:format(n, n - 1)
        local kind = ({all_to_all_single = "all_to_all", all_gather_into_tensor = "all_gather",
                       reduce_scatter_tensor = "reduce_scatter"})[k[1]] or k[1]
        every_rank_refused(res, out, n, why, kind)
      end)
    end
  end

  -- A reduce op that is wrong on one rank alone (an unknown name, a NaN
  -- premul_sum factor) is refused for the group as the list faults are:
  -- every rank fails that call naming rank 1's fault, not the next one with
  -- an EMISMATCH.
  for _, c in ipairs{{"all_reduce", 2, "all_reduce"}, {"reduce", 3, "reduce"}, {"reduce_scatter", 3, "reduce_scatter"},
                     {"reduce_scatter_tensor", 3, "reduce_scatter"}} do
    for _, k in ipairs{"name", "nan"} do
      for _, run_on in ipairs{{2, "CRUN_SHM=0"}, {3, "CRUN_SHM=0"}, {3, "CRUN_SHM=1"}} do
        local n, env = run_on[1], run_on[2]
        it(string.format("tell every rank why rank 1 refused its %s (bad op: %s, %s, %d ranks)", c[1], k, env, n), function()
          local res, out = scenario_n(n, "badop:" .. c[1] .. ":" .. k, env)
          local why = k == "nan" and "premul_sum: the factor is NaN (dist.make_premul_sum refuses it too)"
            or string.format("bad argument #%d to '%s' (unknown reduce op 'nosuchop'; use sum, ", c[2], c[1])
          every_rank_refused(res, out, n, why, c[3])
        end)
      end
    end
  end

  -- An all_reduce argument that only the last rank refuses (avg of its bool
  -- tensor where the others give float32; its strided tensor, which the
  -- bindings refuse) is refused for the group: that rank fails it with its
  -- EINVAL, every peer fails the same call naming it (not pairing it with the
  -- last rank's next call: an EMISMATCH, or a wrong sum where the calls look
  -- alike), and every rank's next call is #2, ESTATE.
  for _, k in ipairs{{"boolavg", "all_reduce on rank %d: avg is not defined on bool"},
                     {"noncontig", "bad argument #1 to 'all_reduce' (tensor must be contiguous; call :contiguous())"}} do
    for _, run_on in ipairs{{2, "CRUN_SHM=0"}, {3, "CRUN_SHM=0"}, {3, "CRUN_SHM=1"}} do
      local n, env = run_on[1], run_on[2]
      it(string.format("fail every rank when rank %d alone refuses its all_reduce (%s, %s)", n - 1, k[1], env), function()
        local res, out = scenario_n(n, "localref:" .. k[1], env)
        local why = k[2]:format(n - 1)
        lone_refusal(res, out, n, why, "all_reduce")
      end)
    end
  end

  -- An argument mistake that the Lua layer (dist.lua) catches on the last
  -- rank alone (an unknown option key, op name, or an argument past torch's
  -- positional ones) is refused for the call's group as the bindings' are:
  -- that rank fails with its EINVAL, every peer fails the same call naming
  -- it (never ok: the peers' call used to pair with the last rank's next
  -- one, a wrong sum reported ok), and every rank's next call is ESTATE. So
  -- is an option's value that the bindings refuse (a timeout that is no number).
  local LUAREF = {
    {"all_reduce", "badkey", "all_reduce", "unknown option 'asyncop'"},
    {"all_reduce", "badop", "all_reduce", "unknown reduce op 'summ'"},
    {"all_reduce", "extra", "all_reduce", "argument #5 (number) is one too many"},
    {"all_reduce", "asyncpos", "all_reduce",
     "all_reduce on rank %d: bad argument #4 'async_op' (boolean expected, got number)"},
    {"all_reduce", "subkey", "all_reduce", "unknown option 'asyncop'"},
    {"all_gather_object", "badkey", "all_gather", "all_gather_object: unknown option 'timeot'"},
    {"all_gather_object", "extra", "all_gather", "argument #4 (number) is one too many"},
    {"all_gather_object", "subkey", "all_gather", "all_gather_object: unknown option 'timeot'"},
    {"barrier", "badkey", "barrier", "barrier: unknown option 'asyncop'"},
    {"barrier", "extra", "barrier", "argument #4 (number) is one too many"},
    {"barrier", "subkey", "barrier", "barrier: unknown option 'asyncop'"},
    {"all_reduce", "typogroup", "all_reduce", "all_reduce: unknown option 'grop'"},
    -- and the bindings' check of the options' values, naming the rank (%d: the last one)
    {"all_reduce", "badtime", "all_reduce", "all_reduce on rank %d: bad field 'timeout' (number expected, got string)"},
    {"all_gather_object", "badtime", "all_gather",
     "all_gather_bytes on rank %d: bad field 'timeout' (number expected, got string)"},
    {"barrier", "badtime", "barrier", "barrier on rank %d: bad field 'timeout' (number expected, got string)"},
    {"all_gather_into_tensor", "badtime", "all_gather",
     "all_gather_into_tensor on rank %d: bad field 'timeout' (number expected, got string)"},
  }
  for _, k in ipairs(LUAREF) do
    for _, run_on in ipairs{{2, "CRUN_SHM=0"}, {3, "CRUN_SHM=1"}} do
      local n, env = run_on[1], run_on[2]
      it(string.format("fail every rank when rank %d alone refuses its %s's arguments (%s, %s)", n - 1, k[1], k[2], env),
         function()
        local res, out = scenario_n(n, "luaref:" .. k[1] .. ":" .. k[2], env)
        lone_refusal(res, out, n, k[4]:format(n - 1), k[3])
      end)
    end
  end

  -- An argument fault beside a destroyed group names the fault, not the
  -- refusal that dist.lua could not make on that group (ECLOSED 'refuse()').
  it("name an argument fault beside a destroyed group (2 ranks)", function()
    local res, out = scenario_n(2, "destroyedref")
    for r = 0, 1 do
      local l, says = lines(res[r]), "rank " .. r .. ": " .. res[r] .. "\n" .. out
      assert.is_truthy(l[1] and l[1]:find("^error EINVAL: all_reduce: unknown option 'asyncop'"), says)
      assert.are.equal("ok", l[2], says)
    end
  end)

  -- monitored_barrier runs on the store, not as a call of the group: a
  -- fault of its arguments on one rank alone is that rank's own error at
  -- once, its peers' barrier names the rank that did not arrive (what it is
  -- for), and the group goes on, as in torch. (Refused for the group, the
  -- fault held that rank 5 s, told the peers nothing and stopped the group.)
  it("keep a monitored_barrier's argument fault on its rank, the peers naming it (2 ranks)", function()
    local res, out = scenario_n(2, "mbref")
    local sum = 0
    for r = 0, 1 do sum = sum + (r - 3.5) end
    for r = 0, 1 do
      local l, says = lines(res[r]), "rank " .. r .. ": " .. res[r] .. "\n" .. out
      local want = r == 1 and "^error EINVAL: monitored_barrier: unknown option 'timeot'"
                   or "^error ETIMEDOUT: monitored_barrier: rank 1 did not arrive within 3 s"
      assert.is_truthy(l[1] and l[1]:find(want), says)
      assert.is_falsy(l[1]:find("refused", 1, true), says)
      assert.are.equal(string.format("ok %.2f", sum), l[2], says)
    end
  end)

  -- Rank 0 refuses, then sends to rank 1, which receives before it makes the
  -- same refusal: rank 0's wait for the peers to refuse too (or run the
  -- call) is bounded (5 s), so both fail with the refusal instead of
  -- waiting for each other until the group's timeout (300 s).
  it("stop waiting for a peer's matching refusal after a bound when the peer waits for this rank (2 ranks)", function()
    local res, out = scenario_n(2, "refusep2p")
    for r = 0, 1 do
      local l = lines(res[r])
      local says = "rank " .. r .. ": " .. res[r] .. "\n" .. out
      assert.is_truthy(l[1] and l[1]:match("^error E"), says)
      assert.is_truthy(l[2] and l[2]:match("^error E"), says)
      assert.is_truthy(res[r]:find("avg is not defined on bool", 1, true), says)
      local s = tonumber(l[3]:match("^elapsed (%S+)"))
      assert.is_truthy(s and s < 20, says)
    end
  end)

  -- The same refusal on every rank (a REPL line runs on every rank) stops
  -- nothing: no rank sent or waits for anything of call #1, every rank
  -- numbered it, and the group goes on as torch's does.
  for _, k in ipairs{{"boolavg", "all_reduce on rank %d: avg is not defined on bool"},
                     {"noncontig", "bad argument #1 to 'all_reduce' (tensor must be contiguous; call :contiguous())"}} do
    for _, run_on in ipairs{{2, "CRUN_SHM=0"}, {3, "CRUN_SHM=1"}} do
      local n, env = run_on[1], run_on[2]
      it(string.format("go on when every rank refuses the same all_reduce (%s, %d ranks, %s)", k[1], n, env), function()
        local res, out = scenario_n(n, "allref:" .. k[1], env)
        local sum = -3.5 * n + n * (n - 1) / 2
        for r = 0, n - 1 do
          local l = lines(res[r])
          local says = "rank " .. r .. ": " .. res[r] .. "\n" .. out
          assert.is_truthy(l[1] and l[1]:match("^error EINVAL: ") and l[1]:find(k[2]:format(r), 1, true)
                           and l[1]:find("every rank refused all_reduce #1: the group goes on", 1, true), says)
          assert.are.equal(string.format("ok %.2f %.2f", sum, sum), l[2], says)
          assert.is_truthy(tonumber(l[3]:match("^elapsed (%S+)")) < 10, says)
        end
      end)
    end
  end

  -- A gather/scatter list on a rank that is not the root is an error, as in
  -- torch ("must NOT be specified on non-destination ranks"), on every rank.
  for _, k in ipairs{{"gather", "gather_list", "destination"}, {"scatter", "scatter_list", "source"}} do
    for _, n in ipairs{2, 3} do for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
      it(string.format("tell every rank that non-root rank 1 gave a %s (%s, %d ranks)", k[2], env, n), function()
        local res, out = scenario_n(n, "nonroot" .. k[1], env)
        local why = string.format("%s on rank 1: %s must not be given on a rank that is not the %s (rank 0), as in "
                                  .. "torch.distributed", k[1], k[2], k[3])
        for r = 0, n - 1 do
          local first = res[r]:match("^[^\n]*")
          assert.is_truthy(first:match("^error EINVAL: ") and first:find(why, 1, true), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
          assert.is_falsy(res[r]:find("EMISMATCH", 1, true), res[r])
        end
      end)
    end end
  end

  -- new_group's timeout is the new group's: a rank that reaches new_group later
  -- than that does not fail the agreement on (and so break) the default group.
  it("let a rank reach new_group later than the new group's timeout", function()
    local res, out = scenario("ngslow", {limit = 60})
    for r = 0, 2 do assert.are.equal("ok", res[r], "rank " .. r .. ": " .. res[r] .. "\n" .. out) end
  end)

  -- monitored_barrier: a rank 0 that arrives after the others gave up on it
  -- raises their verdict too, instead of releasing a barrier nobody waits at.
  it("give every rank of a monitored_barrier the same verdict when rank 0 is late", function()
    local res, out = scenario("mblate", {limit = 60})
    for r = 0, 2 do
      assert.is_truthy(res[r]:match("^error ETIMEDOUT: monitored_barrier on rank [12]: group rank 0 %(global 0%) "
                                    .. "did not release the barrier within 5.5 s"), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
    end
  end)

  -- A rank that destroyed the group is gone for the others at once, on either
  -- transport (TCP sees the connection close; shm sees the rank's mark).
  for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
    it("fail promptly when a rank destroyed the group (" .. env .. ")", function()
      local res, out = scenario("left", {limit = 60, env = env})
      assert.are.equal("ok", res[0], out)
      for r = 1, 2 do
        local t = res[r]
        assert.is_truthy(t:match("^error EPEERDIED: "), "rank " .. r .. ": " .. t .. "\n" .. out)
        assert.is_truthy(t:find("rank 0 destroyed the group", 1, true) or t:find("connection to rank 0", 1, true), t)
        assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 3, t)
      end
    end)
  end

  -- A point-to-point operation that waits on a peer over TCP fails with
  -- EPEERDIED naming it as soon as the peer goes away (killed, destroyed the
  -- group, or exited), not at its 30 s deadline: also a recv whose reader is
  -- paused behind a frame of that peer too large for the stash (from it, or
  -- from any source). Rank 1 goes (rank 0 hosts the store of a direct job).
  local p2p_want = {recv = "recv from rank 1 (tag 2) on rank 0: connection to rank 1 ",
                    send = "send to rank 1 (tag 2) on rank 0: connection to rank 1 ",
                    any = "recv from any rank (tag 2) on rank 0: every peer closed its connection"}
  for _, k in ipairs{{"recv", "kill"}, {"recv", "left"}, {"irecv", "kill"}, {"irecv", "left"},
                     {"held", "kill"}, {"held", "exit"}, {"anyheld", "kill"}, {"isend", "kill"},
                     {"isend", "left"}} do
    it(string.format("fail a pending %s with EPEERDIED at once when the peer goes (%s, tcp)", k[1], k[2]), function()
      local dir = run.tmpdir()
      local _, out = run.run(2, SCRIPT, "p2p:" .. k[1] .. ":" .. k[2] .. " " .. dir,
                             {limit = 60, direct = true, env = "CRUN_SHM=0 CRUN_TCP_UNEXPECTED_MAX=65536"})
      local t0, t1 = run.text(dir, 0), run.text(dir, 1)
      run.cleanup(dir)
      local what = p2p_want[k[1] == "isend" and "send" or k[1] == "anyheld" and "any" or "recv"]
      assert.is_truthy(t0:find("error EPEERDIED: " .. what, 1, true) == 1, t0 .. "\n" .. out)
      -- how it ended reads as a sentence: "closed (" or "failed: <errno text> ("
      local how = t0:sub(#("error EPEERDIED: " .. what) + 1)
      if k[1] ~= "anyheld" then
        assert.is_truthy(how:match("^closed %(the process died") or how:match("^failed: %u[%a ]+ %(the process died"), t0)
      end
      if k[1]:find("held") then assert.is_truthy(t0:find("(reading from rank 1 is paused: ", 1, true), t0) end
      -- a peer that left stays up 3 s: the error came from its destroy
      assert.is_true(tonumber(t0:match("elapsed ([%d.]+)")) < (k[2] == "left" and 2.5 or 10), t0)
      assert.are.equal(k[2] == "kill" and "" or "ok", t1, out)
    end)
  end

  -- A rank that destroys a group another rank had failed (it never read that
  -- failure) finds a frame no operation of it received: it says the group
  -- had failed and why, not that the ranks' calls differed.
  it("say at destroy that a frame was left unread because a peer had failed the group (tcp, 3 ranks)", function()
    local res, out = scenario_n(3, "unreadabort", "CRUN_SHM=0")
    local why = "ETIMEDOUT: recv from rank 2 (tag 9) on rank 1: no data from rank 2 after 0.5 s"
    assert.are.equal(1, res[1]:find("error " .. why, 1, true), res[1] .. "\n" .. out)
    assert.are.equal("ok", res[0], out)
    assert.is_falsy(out:find("no operation of rank 0 received it", 1, true), out)
    assert.is_truthy(out:find("WARN PG: group 'default/0' was destroyed on rank 0 after rank 1 had failed it (" .. why,
                              1, true), out)
    assert.is_truthy(out:find("rank 2's barrier #%d+ [^\n]*to rank 0 was left unread"), out)
  end)

  -- A recv from any source that was filling its buffer from rank 1 when rank 1
  -- died names rank 1, not "every peer closed" (rank 2 is still there).
  it("name the peer whose frame a recv from any source was taking when it died (tcp, 3 ranks)", function()
    local res, out = scenario_n(3, "p2panymid", "CRUN_SHM=0", true)
    assert.are.equal(1, res[0]:find("error EPEERDIED: recv from any rank (tag 2) on rank 0: connection to rank 1 "
                                    .. "closed (the process died or left the group)", 1, true), res[0] .. "\n" .. out)
    assert.is_true(tonumber(res[0]:match("elapsed ([%d.]+)")) < 10, res[0])
    assert.are.equal("", res[1])
    assert.are.equal("ok", res[2])
  end)

  -- A peer that failed its group (its recv of tag 9 timed out) and stays up:
  -- rank 0's pending send or recv to it fails at once with that peer's
  -- reason, not when the peer exits or at rank 0's own deadline; also a recv
  -- whose reader is paused at a frame of that peer too large for the stash
  -- (the peer's abort frame waits behind it).
  for _, kind in ipairs{"isend", "recv", "held"} do
    it("fail a pending " .. kind .. " with the reason of a peer that failed its group and stays up (tcp)", function()
      local dir = run.tmpdir()
      local _, out = run.run(2, SCRIPT, "p2p:" .. kind .. ":fail " .. dir,
                             {limit = 60, direct = true, env = "CRUN_SHM=0 CRUN_TCP_UNEXPECTED_MAX=65536"})
      local t0, t1 = run.text(dir, 0), run.text(dir, 1)
      run.cleanup(dir)
      local why = "recv from rank 0 (tag 9) on rank 1: no data from rank 0 after 0.5 s"
      assert.are.equal(1, t1:find("error ETIMEDOUT: " .. why, 1, true), t1 .. "\n" .. out)
      local mine = kind == "isend" and "send to rank 1 (tag 2)" or "recv from rank 1 (tag 2)"
      assert.are.equal(1, t0:find("error ETIMEDOUT: " .. mine .. " on rank 0: " .. why, 1, true), t0 .. "\n" .. out)
      assert.is_truthy(t0:find("[reported by rank 1; rank 0 was in a point-to-point operation]", 1, true), t0)
      assert.is_true(tonumber(t0:match("elapsed ([%d.]+)")) < 2.5, t0) -- rank 1 stays up 3 s
    end)
  end

  -- destroy_process_group with an isend or irecv still pending (its Work
  -- held) fails that Work with ECLOSED and closes the connections, as torch
  -- aborts pending work there: the peer waiting on this rank fails at once
  -- with EPEERDIED, not at its deadline (rank 0 stays up 3 s). The isend's
  -- frame is half sent into a reader paused behind the stash's limit.
  for _, kind in ipairs{"isend", "irecv"} do
    it("fail pending " .. kind .. " work at destroy_process_group and tell the peer at once (tcp)", function()
      local dir = run.tmpdir()
      local _, out = run.run(2, SCRIPT, "destroypending:" .. kind .. " " .. dir,
                             {limit = 60, env = "CRUN_SHM=0 CRUN_TCP_UNEXPECTED_MAX=65536"})
      local t0, t1 = run.text(dir, 0), run.text(dir, 1)
      run.cleanup(dir)
      local mine = kind == "isend" and "send to rank 1 (tag 3)" or "recv from rank 1 (tag 3)"
      assert.are.equal(1, t0:find("ok\nerror ECLOSED: " .. mine .. " on rank 0: the group was destroyed while it was "
                                  .. "pending\n", 1, true), t0 .. "\n" .. out)
      assert.are.equal(1, t1:find("error EPEERDIED: recv from rank 0 (tag 2) on rank 1: connection to rank 0 ", 1, true),
                       t1 .. "\n" .. out)
      for _, t in ipairs{t0, t1} do assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 2.5, t) end
    end)
  end

  -- A recv that timed out with its frame half read (the sender stopped
  -- midway) fails the group; an all_reduce that was waiting to read from that
  -- sender names that timeout and the stream left mid-frame, not a broken
  -- pipe, a dead peer or a garbled frame, and at once; the sender's calls
  -- name it too.
  it("name the timed-out recv that left a stream mid-frame in a collective reading it (tcp)", function()
    local res, out = scenario_n(2, "p2pcut")
    local why = "recv from rank 1 (tag 2) on rank 0: no data from rank 1 after 1.0 s"
    local l0 = {res[0]:match("^([^\n]*)\n([^\n]*)")}
    assert.are.equal(1, (l0[1] or ""):find("error ESTATE: all_reduce #2 on rank 0: the group is unusable after an "
                                           .. "earlier failure: ETIMEDOUT: " .. why, 1, true), res[0] .. "\n" .. out)
    assert.is_truthy(l0[1]:find("(the connection from rank 1 stopped mid-frame where a receive from it failed)", 1,
                                true), res[0])
    assert.are.equal(1, (l0[2] or ""):find("error ETIMEDOUT: " .. why, 1, true), res[0])
    local l1 = {res[1]:match("^([^\n]*)\n([^\n]*)")}
    assert.is_truthy(l1[1] and l1[1]:match("^error E") and l1[1]:find(why, 1, true), res[1] .. "\n" .. out)
    assert.is_truthy(l1[2] and l1[2]:match("^error E") and l1[2]:find("send to rank 0 (tag 2) on rank 1: ", 1, true)
                     and l1[2]:find(why, 1, true), res[1])
    for r = 0, 1 do assert.is_falsy(res[r]:find("EPEERDIED") or res[r]:find("EPROTO"), res[r]) end
    -- at the recv's deadline (0.9 s after rank 0's all_reduce started), not the all_reduce's (30 s)
    assert.is_true(tonumber(res[0]:match("elapsed ([%d.]+)")) < 5, res[0])
  end)

  -- Ranks 0,1 all-reduce where ranks 2,3 all_gather (4 ranks over TCP):
  -- each rank waited for a peer that sent it nothing while the frame that
  -- showed the other call sat unread on another connection, so every rank
  -- failed with ETIMEDOUT at the group's timeout (20 s) instead of at once.
  for _, odd in ipairs{"2,3", "0,1"} do
    it("fail every rank at once when ranks " .. odd .. " all_gather where the others all-reduce (tcp, 4 ranks)",
       function()
      local _, out = run.run(4, "spec/helpers/dist_hier_disagree.lua", "all_gather " .. odd .. " 20",
                             {limit = 60, env = "CRUN_TRANSPORT=tcp"})
      for q = 0, 3 do
        local own = odd:find(tostring(q), 1, true) and "all_gather" or "all_reduce"
        local s, err = out:match("rank " .. q .. ": failed after ([%d.]+) s: ([^\n]*)")
        assert.is_not_nil(s, "rank " .. q .. " did not fail; output:\n" .. out)
        assert.is_true(tonumber(s) < 5, "rank " .. q .. " took " .. s .. " s: " .. err)
        -- the rank that saw the frame names both calls; the others relay it
        local said = err:match("^EMISMATCH: %a+_%a+ #1 on rank (%d): rank %d sent %a+_%a+ #1 float32%[3%]")
        assert.is_not_nil(said, "rank " .. q .. ": " .. err)
        assert.is_truthy(err:find("all_reduce #1", 1, true) and err:find("all_gather #1", 1, true), err)
        if tonumber(said) == q then
          assert.is_truthy(err:find("^EMISMATCH: " .. own .. " #1 on rank " .. q .. ": "), err)
        else
          assert.is_truthy(err:find("; rank " .. q .. " was in " .. own .. " #1]", 1, true), err)
        end
        assert.is_truthy(out:find("rank " .. q .. ": next ESTATE: ", 1, true), out)
      end
    end)
  end

  -- The shm engine compares an all_to_all's per-peer counts after the ops
  -- agree: a different op names it without a count.
  it("describe an all_to_all met by an all_reduce by its dtype alone (shm)", function()
    local res, out = scenario("a2akind", {limit = 60, env = "CRUN_SHM=1"})
    for r = 0, 2 do
      assert.is_truthy(res[r]:match("^error EMISMATCH: shm collective #1 on rank " .. r .. ": "), res[r] .. "\n" .. out)
      assert.is_truthy(res[r]:find(" called all_to_all(float32 blocks)", 1, true), res[r])
    end
  end)

  -- Over TCP without the root check, rank m's all_to_all meets the others'
  -- scatter from the last rank (which only sends): rank m alone sees it,
  -- by the root's frame while it waits for rank m - 1, which sends it
  -- nothing. Its text named its own side by the block it expects from rank
  -- m - 1 (0 elements here): "called all_to_all float32[0]"; it names the
  -- block from the rank whose frame it saw.
  for _, k in ipairs{{3, 1}, {4, 1}, {4, 2}} do
    local n, m = k[1], k[2]
    it(string.format("describe rank %d's all_to_all met by a scatter by its block from the root (%d ranks, tcp)", m, n),
       function()
      local res, out = scenario_n(n, string.format("a2apeek:%d:scatterlast:%d", m, m - 1), "CRUN_SHM=0 CRUN_ROOT_CHECK=0")
      local want = string.format("error EMISMATCH: all_to_all #1 on rank %d: rank %d sent scatter #1 float32[4] but rank "
                                 .. "%d called all_to_all, whose block from rank %d is float32[4] (seen while it waited "
                                 .. "for rank %d)", m, n - 1, m, n - 1, m - 1)
      assert.are.equal(want, res[m], out)
    end)
  end

  -- A sub-group's reports name its own ranks: the text says which global ranks they are.
  for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
    it("name the global ranks of a sub-group whose count differs (" .. env .. ")", function()
      local res, out = scenario("subcount", {limit = 60, env = env})
      assert.are.equal("ok", res[0], out)
      for r = 1, 2 do
        assert.is_truthy(res[r]:match("^error EMISMATCH: "), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
        assert.is_truthy(res[r]:find("[group 'default/0/g1': its ranks 0-1 are global ranks 1,2]", 1, true), res[r])
      end
    end)
  end

  -- A sub-group's refusal names the refusing rank once: its global rank and
  -- then its group rank in the refusal's note. (The note said "rank 1" after
  -- crun.opts's " (rank 2)": two ranks for one, and which was which?)
  for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
    it("name a sub-group's refusing rank once, global and group rank (" .. env .. ")", function()
      local res, out = scenario("subref", {limit = 60, env = env})
      local why = "EINVAL: all_reduce: unknown option 'timeot' (accepted: async_op, group, timeout)"
      assert.are.equal("ok", res[0], out)
      assert.are.equal("error " .. why .. " (rank 2)", lines(res[2])[1], out)
      -- over TCP the text is the refusal's; shm's engine relays it after its own prefix
      local peer = why .. " (rank 2 (group rank 1) refused its part of all_reduce #1: the group stops) "
      local l1 = lines(res[1])[1]
      if env == "CRUN_SHM=0" then assert.are.equal("error " .. peer, l1:sub(1, #peer + 6), res[1] .. "\n" .. out)
      else assert.is_truthy(l1:find("^error EINVAL: shm all_reduce #1 on rank 1 %(group rank 0%): rank 2 %(group rank "
                                    .. "1%) failed first: ")
                            and l1:find(peer, 1, true), res[1] .. "\n" .. out) end
      assert.is_truthy(res[1]:find("[group 'default/0/g1': its ranks 0-1 are global ranks 1,2]", 1, true), res[1])
    end)
  end

  -- On a sub-group whose ranks are not the global ones (new_group{1, 2}:
  -- global rank 1 is its group rank 0, rank 2 its group rank 1), every text
  -- names a rank by its global rank, what get_rank() returns and crun-lua's
  -- "[rank N]" shows, then its group rank: "rank 2 (group rank 1)". (It said
  -- "all_reduce on rank 1" for global rank 2, and "rank 0" for global rank
  -- 1: which rank 1 was meant?) Over TCP, and with the shm engine, whose
  -- texts ("shm all_reduce #1 on rank 1 (group rank 0): ...") and the
  -- group's next call ("the group is unusable") named group ranks.
  local SUBMAP = " [group 'default/0/g1': its ranks 0-1 are global ranks 1,2]"
  local function subrank(k, env)
    local dir = run.tmpdir()
    local _, out = run.run(3, SCRIPT, "subrank:" .. k .. " " .. dir,
                           {limit = 60, env = env or "CRUN_SHM=0", direct = k == "died"})
    local res = {}
    for r = 0, 2 do res[r] = lines(run.text(dir, r)) end
    run.cleanup(dir)
    assert.are.equal("ok", res[0][1], out)
    return res, out
  end
  local WHO = {[1] = "rank 1 (group rank 0)", [2] = "rank 2 (group rank 1)"}
  -- The group's next call on rank r after failure `text` (its status included).
  local function unusable(r, text)
    return "error ESTATE: all_reduce #2 on " .. WHO[r] .. ": the group is unusable after an earlier failure: " .. text
  end
  -- What shm rank r says when rank p's failure `text` stopped it: its own
  -- prefix, then rank p's text (as the engine recorded it).
  local function relayed(st, kind, r, p, text)
    return string.format("%s: shm %s #1 on %s: %s failed first: %s", st, kind, WHO[r], WHO[p], text)
  end
  -- What shm rank r said of a mismatch, own[q] being what rank q says when it
  -- sees it: its own text, or the other's relayed when that one saw it first.
  local function shm_mismatch(res, r, own, kind)
    local p = 3 - r
    local mine = "error EMISMATCH: " .. own[r] .. SUBMAP
    return res[r][1] == mine and mine or "error " .. relayed("EMISMATCH", kind, r, p, own[p]) .. SUBMAP
  end

  it("name a sub-group's rank by global rank, then group rank, in an argument check (subrank:arg)", function()
    local res, out = subrank("arg")
    local why = "EINVAL: all_reduce on rank 2 (group rank 1): avg is not defined on bool (torch has no bool average)"
    local note = " (rank 2 (group rank 1) refused its part of all_reduce #1: the group stops)"
    local peer = why .. note .. " [reported by rank 2 (group rank 1); rank 1 (group rank 0) was in all_reduce #1]"
                 .. SUBMAP
    assert.are.equal("error " .. why, res[2][1], out)
    assert.are.equal("error " .. peer, res[1][1], out)
    assert.are.equal(unusable(1, peer), res[1][2], out)
    assert.are.equal(unusable(2, why .. note), res[2][2], out)
  end)

  it("name a sub-group's rank by global rank, then group rank, in an argument check (subrank:arg, shm)", function()
    local res, out = subrank("arg", "CRUN_SHM=1")
    local why = "all_reduce on rank 2 (group rank 1): avg is not defined on bool (torch has no bool average)"
    local note = " (rank 2 (group rank 1) refused its part of all_reduce #1: the group stops)"
    local peer = relayed("EINVAL", "all_reduce", 1, 2, "EINVAL: " .. why .. note .. SUBMAP)
    assert.are.equal("error EINVAL: " .. why, res[2][1], out)
    assert.are.equal("error " .. peer, res[1][1], out)
    assert.are.equal(unusable(1, peer), res[1][2], out)
    assert.are.equal(unusable(2, "EINVAL: " .. why .. note), res[2][2], out)
  end)

  it("name a sub-group's ranks by global rank, then group rank, in a count mismatch (subrank:count)", function()
    local res, out = subrank("count")
    assert.are.equal("error EMISMATCH: all_reduce #1 on rank 1 (group rank 0) expected float32[3], rank 2 (group "
                     .. "rank 1) sent all_reduce float32[5]" .. SUBMAP, res[1][1], out)
    assert.are.equal("error EMISMATCH: all_reduce #1 on rank 2 (group rank 1) expected float32[5], rank 1 (group "
                     .. "rank 0) sent all_reduce float32[3]" .. SUBMAP, res[2][1], out)
  end)

  it("name a sub-group's ranks by global rank, then group rank, in a count mismatch (subrank:count, shm)", function()
    local res, out = subrank("count", "CRUN_SHM=1")
    local own = {}
    for r = 1, 2 do
      local p = 3 - r
      own[r] = string.format("shm collective #1 on %s: %s called all_reduce(float32[%d], sum) but %s called "
                             .. "all_reduce(float32[%d], sum)", WHO[r], WHO[p], p == 1 and 3 or 5, WHO[r],
                             r == 1 and 3 or 5)
    end
    for r = 1, 2 do assert.are.equal(shm_mismatch(res, r, own, "all_reduce"), res[r][1], out) end
  end)

  for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
    local shm = env == "CRUN_SHM=1" and "shm " or ""
    it("name a sub-group's ranks by global rank, then group rank, in a timeout (subrank:timeout, " .. env .. ")",
       function()
      local res, out = subrank("timeout", env)
      assert.are.equal("error ETIMEDOUT: " .. shm .. "all_reduce #1 on rank 1 (group rank 0): no data from rank 2 "
                       .. "(group rank 1) after 1.0 s; rank 1 (group rank 0) is at all_reduce #1; rank 2 (group rank "
                       .. "1) has not entered any collective" .. SUBMAP, res[1][1], out)
      assert.are.equal("ok", res[2][1], out)
      assert.is_falsy(out:find("rank 0's all_reduce", 1, true), out) -- the destroy's warning names rank 1 too
    end)
  end

  it("name a sub-group's ranks by global rank, then group rank, when a peer dies (subrank:died)", function()
    local res, out = subrank("died")
    local l = res[1][1]
    local head = "error EPEERDIED: all_reduce #1 on rank 1 (group rank 0): connection to rank 2 (group rank 1) "
    assert.are.equal(head, l:sub(1, #head), out)
    assert.are.equal(" (the process died or left the group)" .. SUBMAP, l:match(" %(the process died.*$"), l)
    assert.are.equal("ok", res[2][1], out)
  end)

  it("name a sub-group's ranks by global rank, then group rank, when a peer dies (subrank:died, shm)", function()
    local res, out = subrank("died", "CRUN_SHM=1")
    local l = res[1][1]
    local pid = l:match("^error EPEERDIED: shm all_reduce #1 on rank 1 %(group rank 0%): rank 2 %(group rank 1%) "
                        .. "%(pid (%d+)%) died")
    assert.is_truthy(pid, l .. "\n" .. out)
    assert.are.equal("error EPEERDIED: shm all_reduce #1 on rank 1 (group rank 0): rank 2 (group rank 1) (pid " .. pid
                     .. ") died" .. SUBMAP, l, out)
    assert.are.equal("ok", res[2][1], out)
  end)

  -- Two ranks that each take themselves for the root: the root they gave is
  -- the global rank (what broadcast's src is), the rank that gave it is
  -- named as every rank is. Over TCP the ranks' check of the root sees it
  -- (algo/root_agree.c), in the shm engine the op descriptions differ.
  it("name a sub-group's ranks and roots by global rank when the ranks disagree on src (subrank:root)", function()
    local res, out = subrank("root")
    for r = 1, 2 do
      local why = "EMISMATCH: broadcast #1 on " .. WHO[r] .. ": the ranks disagree on src: rank 1 (group rank 0) "
                  .. "gave 1, rank 2 (group rank 1) gave 2 (every rank must give the same)" .. SUBMAP
      assert.are.equal("error " .. why, res[r][1], out)
      assert.are.equal(unusable(r, why), res[r][2], out)
    end
  end)

  it("name a sub-group's ranks and roots by global rank when the ranks disagree on src (subrank:root, shm)",
     function()
    local res, out = subrank("root", "CRUN_SHM=1")
    local own = {}
    for r = 1, 2 do
      local p = 3 - r
      own[r] = string.format("shm collective #1 on %s: %s called broadcast(float32[4], root %d) but %s called "
                             .. "broadcast(float32[4], root %d)", WHO[r], WHO[p], p, WHO[r], r)
    end
    for r = 1, 2 do
      local why = shm_mismatch(res, r, own, "broadcast")
      assert.are.equal(why, res[r][1], out)
      assert.are.equal(unusable(r, why:sub(#"error " + 1)), res[r][2], out)
    end
  end)

  -- An object collective on some ranks and a plain int64 broadcast on another:
  -- the receivers never take the tensor's elements for an object's size.
  for _, k in ipairs{1, 2} do
    for _, env in ipairs{"CRUN_SHM=0", "CRUN_SHM=1"} do
      it(string.format("report an object collective met by an int64[%d] broadcast (%s)", k, env), function()
        local res, out = scenario("objcall" .. k, {limit = 60, env = env})
        for r = 1, 2 do
          assert.is_truthy(res[r]:match("^error EMISMATCH: "), "rank " .. r .. ": " .. res[r] .. "\n" .. out)
          if k == 2 then
            assert.is_truthy(res[r]:find("object collective on rank " .. r .. ": rank 0 did not call one (it sent -5, -5",
                                         1, true), res[r])
          end
        end
      end)
    end
  end

  -- The timeout and dead-peer scenarios on each engine: TCP alone (CRUN_SHM=0)
  -- and the shared-memory engine (CRUN_SHM=1, reports start "shm all_reduce").
  for _, eng in ipairs{{name = "tcp", env = "CRUN_SHM=0", prefix = ""},
                       {name = "shm", env = "CRUN_SHM=1", prefix = "shm "}} do
    it("time out naming the late rank and where every rank is (" .. eng.name .. ")", function()
      local res, out = scenario("timeout", {limit = 60, env = eng.env})
      for r = 0, 1 do
        local t = res[r]
        assert.is_truthy(t:match("^error ETIMEDOUT: "), "rank " .. r .. ": " .. t .. "\n" .. out)
        assert.is_truthy(t:find(eng.prefix .. "all_reduce #2 on rank ", 1, true), t) -- its own or relayed
        assert.is_truthy(t:find("rank 2 is at barrier #1", 1, true), t)
        assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 5, t)
      end
      -- over TCP rank 1 waits on rank 2 (ring order) and names it, unless
      -- rank 0's report (no data from rank 1, and where every rank is: rank 2
      -- at barrier #1, checked above) reached it first, as a waiting step
      -- reads an abort frame from any peer; in shm every rank waits on every
      -- peer, so both name it (or repeat the report of the rank that failed
      -- first)
      for r = eng.name == "tcp" and 1 or 0, 1 do
        assert.is_truthy(res[r]:find("no data from rank 2 after 1.0 s", 1, true) or
                         (eng.name == "tcp" and res[r]:find("[reported by rank 0; rank 1 was in all_reduce #2]", 1, true)),
                         res[r])
        assert.is_truthy(res[r]:find("ranks 0-1 are at all_reduce #2", 1, true), res[r])
      end
      -- the late rank fails too, in the collective the others gave up on,
      -- instead of hanging or succeeding alone
      assert.is_truthy(res[2]:match("^error ETIMEDOUT: "), res[2] .. "\n" .. out)
      if eng.name == "shm" then
        assert.is_truthy(res[2]:find("shm all_reduce #2 on rank 2: rank [01] failed first: ", 1, false), res[2])
      end
    end)

    it("fail promptly with EPEERDIED when a peer is killed mid all_reduce (" .. eng.name .. ")", function()
      local res, out = scenario("kill", {limit = 60, direct = true, env = eng.env})
      for r = 0, 1 do
        local t = res[r]
        assert.is_truthy(t:match("^error EPEERDIED: ") or t:match("^error ECONNRESET: "), "rank " .. r .. ": " .. t .. "\n" .. out)
        if eng.name == "shm" then assert.is_truthy(t:match("^error EPEERDIED: shm all_reduce #%d+ on rank " .. r), t) end
        assert.is_truthy(t:find("rank 2", 1, true), t)
        assert.is_falsy(t:find("rank [01] %(pid"), t) -- only the dead rank is blamed
        assert.is_true(tonumber(t:match("elapsed ([%d.]+)")) < 10, t)
      end
      -- the killed rank wrote nothing
      assert.are.equal("", res[2])
    end)
  end
end)

--- dist_parity.lua — a job for dist_parity_spec (torch.distributed parity),
-- run on N ranks: dist_parity.lua <case>. Every rank prints
-- "rank <r> ok <case>" when all its checks passed; a failed check errors.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

local case = arg[1]
dist.init_process_group("gloo", {timeout = 30})  -- torch's positional form
local rank, size = dist.get_rank(), dist.get_world_size()

local function check(cond, fmt, ...)
  if not cond then error(string.format("rank %d: " .. fmt, rank, ...), 0) end
end

local function same(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

local function expect_error(pattern, f, ...)
  local ok, err = pcall(f, ...)
  check(not ok and tostring(err):match(pattern), "expected an error matching %s, got %s", pattern, tostring(err))
  return err
end

local cases = {}

function cases.init()
  -- torch's name for it, as torch code compares it; the group's own backend() gives crun's
  check(dist.get_backend() == "gloo" and dist.get_backend() == dist.Backend.GLOO,
        "init_process_group('gloo') gave backend %s", dist.get_backend())
  check(dist.group.WORLD:backend() == "cpu", "group.WORLD:backend() is %s", dist.group.WORLD:backend())
  expect_error("^EINVAL: init_process_group: unknown option 'bogus' %(accepted: ", dist.init_process_group, {bogus = 1})
  expect_error("^ESTATE: init_process_group: already initialized", dist.init_process_group, "gloo")
  check(dist.group.WORLD == dist.group(), "group.WORLD is the default group")
  local all = dist.get_process_group_ranks(dist.group.WORLD)
  check(#all == size and all[1] == 0 and all[size] == size - 1, "WORLD ranks")
  -- a collective whose arguments a rank refuses stops its group (even where
  -- every rank made the mistake): this one runs on a group of its own
  expect_error("^EINVAL: all_reduce: unknown option 'async' %(accepted: async_op, group, timeout%)",
               dist.all_reduce, T.ones({2}), "sum", {group = dist.new_group(all), async = true})
  expect_error("^EINVAL: send: unknown option 'dst'", dist.send, T.ones({2}), (rank + 1) % size, {dst = 1})
  expect_error("^ENOTSUP: new_group: backend 'mpi' differs", dist.new_group, {0}, {backend = "mpi"})
  -- torch's positional new_group(ranks, timeout, backend[, pg_options[, use_local_synchronization]])
  expect_error("^ENOTSUP: new_group: backend 'mpi' differs", dist.new_group, {0}, 30, "mpi")
  expect_error("^ENOTSUP: new_group: backend 'mpi' differs", dist.new_group, {0}, nil, "mpi")
  expect_error("^EINVAL: new_group: argument #3 %(backend%) must be a string", dist.new_group, {0}, 30, 7)
  expect_error("^EINVAL: new_group: argument #2 %(timeout%) must be a number of seconds or an options table, got string",
               dist.new_group, {0}, "gloo")
  expect_error("^EINVAL: new_group: 1 argument after the options table %(pass torch's positional timeout, backend, ",
               dist.new_group, {0}, {timeout = 5}, "gloo")
  expect_error("^EINVAL: new_group: 6 arguments %(torch's positional ranks, timeout, backend, pg_options, "
               .. "use_local_synchronization at most%)", dist.new_group, {0}, 5, "gloo", nil, false, "desc")
  local g = dist.new_group({0, size - 1}, 17.5, "gloo")
  if rank == 0 or rank == size - 1 then
    check(g:timeout() == 17.5, "new_group(ranks, 17.5, 'gloo') has timeout %s", tostring(g:timeout()))
    local t = T.full({3}, rank - 4, "int32")
    dist.all_reduce(t, "sum", {group = g})
    check(t[3] == (size - 1) - 8, "all_reduce on the positional new_group gave %d", t[3])
  else
    check(g == dist.GroupMember.NON_GROUP_MEMBER, "non-member placeholder from the positional new_group")
  end
  dist.barrier()
end

function cases.new_group_sorted()
  local g = dist.new_group({size - 1, 0})  -- torch orders members by global rank
  if rank == 0 or rank == size - 1 then
    local want = rank == 0 and 0 or 1
    check(dist.get_rank(g) == want, "group rank %d, expected %d", dist.get_rank(g), want)
    check(same(dist.get_process_group_ranks(g), {0, size - 1}), "group ranks {%s}",
          table.concat(dist.get_process_group_ranks(g), ","))
    local t = T.full({5}, rank == size - 1 and -17 or 0, "int32")
    dist.broadcast(t, size - 1, {group = g})
    check(t[5] == -17, "broadcast from global rank %d in the group gave %d", size - 1, t[5])
  else
    check(g == dist.GroupMember.NON_GROUP_MEMBER, "non-member placeholder")
  end
end

function cases.new_group_mismatch()
  -- ranks 0 and 1 say {0, 1}; the last rank says {0, last}: everyone is told
  local list = rank == size - 1 and {0, size - 1} or {0, 1}
  expect_error("^EMISMATCH: new_group #1 on rank %d: ranks disagree on the members: rank %d gave {[%d,]+}, rank %d gave {[%d,]+}",
               dist.new_group, list)
end

function cases.subgroups()
  local mine, all = dist.new_subgroups(2)
  check(#all == size // 2, "%d subgroups", #all)
  local t = T.full({3}, rank * 10 - 25, "int64")
  dist.all_reduce(t, "sum", {group = mine})
  local base = rank - rank % 2
  check(t[3] == (base * 10 - 25) + ((base + 1) * 10 - 25), "pair sum %d", t[3])
  local odd, lists = dist.new_subgroups_by_enumeration({{0, size - 1}, {1}})
  check(#lists == 2, "two subgroups")
  if rank == 0 or rank == size - 1 then
    check(same(dist.get_process_group_ranks(odd), {0, size - 1}), "enumerated group")
  elseif rank == 1 then
    check(same(dist.get_process_group_ranks(odd), {1}), "singleton group")
  else
    check(odd == dist.GroupMember.NON_GROUP_MEMBER, "rank in no subgroup gets NON_GROUP_MEMBER")
  end
  expect_error("^EINVAL: new_subgroups: group_size 3 must be a positive integer dividing the world size",
               dist.new_subgroups, size == 3 and 2 or 3)
  expect_error("^EINVAL: new_subgroups_by_enumeration: rank 0 is in subgroups 1 and 2",
               dist.new_subgroups_by_enumeration, {{0}, {0, 1}})
end

-- dist.all_reduce(t) and dist.all_reduce(t, nil), the calls the binding
-- serves on its shortest path (bindings/pg.c), against sums computed here
-- element by element; then the calls that must leave that path for the
-- checked one and its errors (argument numbers as the user wrote them)
function cases.default_call()
  local function v(i, r, m) return (i * 7919 + r * 104729) % (2 * m + 1) - m end
  for _, c in ipairs{{"float32", 1000, {1, 7, 1000, 70000}}, {"float64", 1000, {3, 5000}},
                     {"int64", 1000000, {1, 9000}}, {"int32", 1000, {2, 300}}, {"int8", 30, {5, 4099}},
                     {"float16", 200, {6, 2500}}, {"uint8", 60, {17}}} do
    local dt, m = c[1], c[2]
    for _, n in ipairs(c[3]) do
      for _, with_nil in ipairs{false, true} do
        local vals = {}
        for i = 1, n do vals[i] = dt == "uint8" and v(i, rank, m) + m or v(i, rank, m) end
        local t = T.new(vals, dt)
        if with_nil then dist.all_reduce(t, nil) else dist.all_reduce(t) end
        for i = 1, n do
          local want = 0
          for r = 0, size - 1 do want = want + (dt == "uint8" and v(i, r, m) + m or v(i, r, m)) end
          if dt == "uint8" then want = want % 256 end
          check(t[i] == want, "%s[%d] all_reduce(t%s): element %d is %s, expected %s",
                dt, n, with_nil and ", nil" or "", i, tostring(t[i]), tostring(want))
        end
      end
    end
  end
  local b = T.new({rank == 0, false, rank == size - 1}, "bool")
  dist.all_reduce(b)
  check(b[1] == true and b[2] == false and b[3] == true, "bool all_reduce(t) is a logical or")
  local m = T.new({rank - 5, 2 * rank, -rank}, "int64")
  dist.all_reduce(m, "max")
  check(m[1] == size - 6 and m[2] == 2 * (size - 1) and m[3] == 0, "all_reduce(t, 'max') %d %d %d", m[1], m[2], m[3])
  local wide = T.new({1, 2, 3, 4, 5, 6}, "float32"):view({2, 3})
  expect_error("^EINVAL: bad argument #1 to 'all_reduce' %(tensor must be contiguous",
               dist.all_reduce, wide:transpose(1, 2))
  expect_error("^EINVAL: bad argument #1 to '[%w.]*all_reduce' %(crun.Tensor expected, got number%)", dist.all_reduce, 5)
  expect_error("^EINVAL: bad argument #2 .*unknown reduce op 'nosuchop'", dist.all_reduce, T.ones({2}), "nosuchop")
  local closed = T.ones({2})
  closed:close()
  expect_error("bad argument #1 to '[%w.]*all_reduce' %(tensor is closed%)", dist.all_reduce, closed)
  -- the binding's shortest path knows the last tensor it saw without its
  -- metatable: closing or collecting that tensor must make it forget it, so
  -- that the closed box, or another userdata that takes its memory (a file
  -- handle's box is as large), is refused, not read as a tensor
  local seen = T.ones({2})
  dist.all_reduce(seen)
  seen:close()
  expect_error("bad argument #1 to '[%w.]*all_reduce' %(tensor is closed%)", dist.all_reduce, seen)
  for _ = 1, 50 do
    local gone = T.ones({2})
    dist.all_reduce(gone)
    gone = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    local f = io.tmpfile()
    expect_error("bad argument #1 to '[%w.]*all_reduce' %(crun.Tensor expected, got FILE%*%)", dist.all_reduce, f)
    f:close()
  end
  -- the same calls still work after the group was replaced
  dist.destroy_process_group()
  dist.init_process_group("gloo", {timeout = 30})
  local again = T.new({rank + 0.5, -rank}, "float64")
  dist.all_reduce(again)
  check(again[1] == size * (size - 1) / 2 + size * 0.5 and again[2] == -size * (size - 1) / 2,
        "all_reduce(t) on the new default group gave %s %s", tostring(again[1]), tostring(again[2]))
end

-- value sent by rank s to rank d, row k, column c: signed and non-periodic
local function a2a_val(s, d, k, c) return (s * 7919 + d * 104729 + k * 31 + c) % 20011 - 10005 end
local function rows(s, d) return (s * 3 + d * 5) % 4 + (s == d and 0 or 1) end  -- some zero-row blocks

function cases.a2a_single()
  local in_splits, out_splits, nin, nout = {}, {}, 0, 0
  for j = 0, size - 1 do
    in_splits[j + 1], out_splits[j + 1] = rows(rank, j), rows(j, rank)
    nin, nout = nin + in_splits[j + 1], nout + out_splits[j + 1]
  end
  local input, output = T.zeros({nin, 3}, "int64"), T.full({nout, 3}, 99999, "int64")
  local at = 1
  for j = 0, size - 1 do
    for k = 1, in_splits[j + 1] do
      for c = 1, 3 do input[{at, c}] = a2a_val(rank, j, k, c) end
      at = at + 1
    end
  end
  local w = dist.all_to_all_single(output, input, out_splits, in_splits, {async_op = true})
  w:wait()
  at = 1
  for j = 0, size - 1 do
    for k = 1, out_splits[j + 1] do
      for c = 1, 3 do
        check(output[{at, c}] == a2a_val(j, rank, k, c), "row %d col %d from rank %d: %d, expected %d",
              at, c, j, output[{at, c}], a2a_val(j, rank, k, c))
      end
      at = at + 1
    end
  end
  -- equal splits (no sizes)
  local x, y = T.zeros({2 * size}, "float64"), T.zeros({2 * size}, "float64")
  for i = 1, 2 * size do x[i] = rank * 100 + i - 0.5 end
  dist.all_to_all_single(y, x)
  for j = 0, size - 1 do
    for k = 1, 2 do check(y[2 * j + k] == j * 100 + 2 * rank + k - 0.5, "equal split %d/%d", j, k) end
  end
  -- empty split lists mean equal blocks, as torch's [] (one side or both)
  for _, sp in ipairs{{{}, {}}, {{}, nil}, {nil, {}}} do
    local y2 = T.full({2 * size}, 99999, "float64")
    dist.all_to_all_single(y2, x, sp[1], sp[2], {})
    for j = 0, size - 1 do
      for k = 1, 2 do
        check(y2[2 * j + k] == j * 100 + 2 * rank + k - 0.5, "empty split lists: element %d is %s", 2 * j + k,
              tostring(y2[2 * j + k]))
      end
    end
  end
  expect_error("^EINVAL: all_to_all_single on rank " .. rank .. ": input split sizes add up to", dist.all_to_all_single, output, input,
               out_splits, {nin + 1, table.unpack(in_splits, 2)})
end

function cases.batch()
  local n = (1 << 20) + 7  -- crosses chunk sizes
  local right, left = (rank + 1) % size, (rank - 1 + size) % size
  local out, got = T.zeros({n}, "int32"), T.zeros({n}, "int32")
  for _, i in ipairs{1, 2, 4096, 4097, n} do out[i] = rank * 1000003 - i end
  -- even ranks list the receive first, odd ranks the send: no order deadlocks
  local ops = {dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)}
  if rank % 2 == 0 then ops[1], ops[2] = ops[2], ops[1] end
  local works = dist.batch_isend_irecv(ops)
  check(#works == 2, "one work per op")
  for _, w in ipairs(works) do w:wait() end
  for _, i in ipairs{1, 2, 4096, 4097, n} do
    check(got[i] == left * 1000003 - i, "element %d from rank %d: %d", i, left, got[i])
  end
  expect_error("^EINVAL: P2POp: op must be dist.isend or dist.irecv", dist.P2POp, dist.send, out, right)
end

-- a batch with a bad entry raises EINVAL naming it and posts none of its
-- entries: an irecv posted before the bad one would otherwise be left
-- behind and take the data of the next batch's send
function cases.batch_bad_entry()
  local right, left = (rank + 1) % size, (rank - 1 + size) % size
  local core = require "crun.core"
  local got = T.full({3}, -1, "int64")
  for _, bad in ipairs{
    {dist.P2POp(dist.isend, T.ones({2}), size + 3), "peer is out of range %(0%.%." .. (size - 1) .. "%)"},
    {dist.P2POp(dist.isend, T.ones({2}), rank), "the peer is this rank"},
    {dist.P2POp(dist.isend, "x", right), "the tensor must be a crun.Tensor, got string"},
    {dist.P2POp(dist.isend, T.ones({2}), right, nil, -2), "tag %-2 is not an integer >= 0"},
    {dist.P2POp(dist.isend, T.ones({2, 3}):transpose(1, 2), right), "the tensor must be contiguous"},
  } do
    expect_error("^EINVAL: batch_isend_irecv on rank " .. rank .. ": entry 2 %(isend to %-?%d+%): " .. bad[2],
                 dist.batch_isend_irecv, {dist.P2POp(dist.irecv, got, left), bad[1]})
  end
  local g = dist.new_group({0, 1})
  if rank <= 1 and size > 2 then
    expect_error("^EINVAL: batch_isend_irecv on rank " .. rank .. ": entry 2 %(isend to " .. (size - 1) ..
                 "%): rank " .. (size - 1) .. " is not in the group", dist.batch_isend_irecv,
                 {dist.P2POp(dist.irecv, got, 1 - rank, g), dist.P2POp(dist.isend, got, size - 1, g)})
  end
  collectgarbage(); collectgarbage()
  local t0 = core.clock()
  local out = T.new({rank * 1009 - 7, -rank, rank * rank + 3}, "int64")
  local ws = dist.batch_isend_irecv{dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)}
  for _, w in ipairs(ws) do w:wait(10) end
  check(got[1] == left * 1009 - 7 and got[2] == -left and got[3] == left * left + 3,
        "the batch after the refused ones got %d %d %d from rank %d", got[1], got[2], got[3], left)
  dist.barrier()
  check(core.clock() - t0 < 10, "the good batch took %.1f s", core.clock() - t0)
end

function cases.monitored()
  dist.monitored_barrier({timeout = 10})
  dist.monitored_barrier({timeout = 10, wait_all_ranks = true})
  -- the last two ranks do not come: rank 0 names them, every waiting rank is told
  local absent = rank >= size - 2 and rank > 0
  if not absent then
    local err = expect_error("^ETIMEDOUT: monitored_barrier: ranks? ", dist.monitored_barrier,
                             {timeout = 1, wait_all_ranks = true})
    local want = size == 2 and "rank 1 did" or string.format("ranks %d, %d did", size - 2, size - 1)
    check(err:find(want, 1, true), "error %s should name %s", err, want)
  end
  dist.barrier()
  if rank == 0 then
    -- without wait_all_ranks only the first missing rank is named
    local err = expect_error("^ETIMEDOUT: monitored_barrier: rank %d+ did not arrive", dist.monitored_barrier,
                             {group = dist.new_group({0, size - 1}), timeout = 0.5})
    check(err:find("rank " .. (size - 1) .. " did not arrive", 1, true), "names rank %d: %s", size - 1, err)
  else
    dist.new_group({0, size - 1})
  end
end

function cases.objects()
  local list = rank == 1 and {"a", {x = -3.5}, 42} or {false, false, false}
  dist.broadcast_object_list(list, 1)
  check(list[1] == "a" and list[2].x == -3.5 and list[3] == 42, "broadcast_object_list")
  local gathered = {}
  dist.all_gather_object(gathered, {r = rank, s = ("x"):rep(rank * 1000 + 1)})
  check(#gathered == size, "all_gather_object fills %d", #gathered)
  for r = 1, size do check(gathered[r].r == r - 1 and #gathered[r].s == (r - 1) * 1000 + 1, "entry %d", r) end
  local legacy = dist.all_gather_object(rank * 2 - 7)
  check(legacy[size] == (size - 1) * 2 - 7, "value-returning all_gather_object still works")
  -- torch's form with a nil object (rank 0's): still fills the list
  local with_nil = {}
  local ret = dist.all_gather_object(with_nil, rank > 0 and rank or nil)
  check(ret == nil and with_nil[1] == nil and with_nil[size] == size - 1,
        "all_gather_object(list, nil) fills the list: [1] = %s, [%d] = %s, returned %s", tostring(with_nil[1]),
        size, tostring(with_nil[size]), tostring(ret))
  -- torch's form whose object looks like options ({timeout=}, a group that
  -- is no process group): the object, not options, whatever the first
  -- argument; a {group = <process group>} (which cannot be sent) is options
  for _, mk in ipairs{function(r) return {timeout = 3 * r - 4} end, function(r) return {group = "g" .. r} end,
                      function(r) return {group = r - 9, timeout = -r} end} do
    local l = {"stale"}
    local got = dist.all_gather_object(l, mk(rank))
    check(got == nil and #l == size, "all_gather_object(list, %s) returned %s and filled %d entries",
          tostring(next(mk(rank))), tostring(got), #l)
    for r = 1, size do
      local want = mk(r - 1)
      for k, v in pairs(want) do check(l[r][k] == v, "entry %d.%s is %s, expected %s", r, k, tostring(l[r][k]), tostring(v)) end
    end
    local l3 = {}
    check(dist.all_gather_object(l3, mk(rank), {timeout = 20}) == nil and l3[size].timeout == mk(size - 1).timeout,
          "all_gather_object(list, obj, opts) with an options-like obj")
  end
  for _, o in ipairs{{timeout = 20}, {group = dist.group.WORLD}, {group = dist.group.WORLD, timeout = 20}} do
    local conv = dist.all_gather_object(3 * rank - 11, o)
    check(conv[size] == 3 * (size - 1) - 11, "all_gather_object(v, opts) still returns the list")
    local tab = dist.all_gather_object({k = -rank}, o.group and o or {group = dist.group.WORLD, timeout = 20})
    check(tab[size].k == 1 - size, "all_gather_object(table, {group=}) still returns the list")
  end
  local out = rank == size - 1 and {} or nil
  dist.gather_object(-rank, out, size - 1)
  if rank == size - 1 then for r = 1, size do check(out[r] == -(r - 1), "gather_object %d", r) end end
  local mine = {}
  local src_list
  if rank == 0 then src_list = {} for r = 1, size do src_list[r] = {"for", r - 1} end end
  dist.scatter_object_list(mine, src_list, 0)
  check(mine[1][2] == rank, "scatter_object_list gave %s", tostring(mine[1] and mine[1][2]))
end

function cases.ddp_group()
  local nn = require "crun.nn"
  local g = dist.new_group({0, 1})
  local net = nn.Sequential(nn.Linear(4, 3))
  expect_error("^EINVAL: DDP: unknown option 'bucket_size'", crun.DDP, net, {bucket_size = 1})
  if rank > 1 then return end  -- not in the group: nothing to hang on
  nn.manual_seed(rank + 1)     -- different on purpose: DDP broadcasts group rank 0's
  net = nn.Sequential(nn.Linear(4, 3))
  local model = crun.DDP(net, {process_group = g, find_unused_parameters = true})
  local opt = require("crun.optim").SGD(net, {lr = 0.1})
  for s = 1, 3 do
    opt:zero_grad()
    local x = T.randn({2, 4}, {seed = 10 * s + rank})
    local out = model:forward(x)
    model:backward(x, T.ones_like and T.ones_like(out) or T.full(out:size(), 1, "float32"))
    opt:step()
  end
  local mine = net.modules and net:parameters()[1] or net:parameters()[1]
  local other = mine:clone()
  dist.broadcast(other, 0, {group = g})
  check(mine:equal(other), "parameters equal on both group ranks after training")
  model:close()
end

-- monitored_barrier after destroy_process_group and a new init on the same
-- (launcher's) store: it still waits for every rank, and a verdict of the
-- group before (here an ETIMEDOUT naming the last rank) is not raised again
function cases.monitored_reinit()
  dist.monitored_barrier({timeout = 10})
  if rank ~= size - 1 then
    expect_error("^ETIMEDOUT: monitored_barrier: rank " .. (size - 1) .. " did not arrive", dist.monitored_barrier,
                 {timeout = 0.5})
  end
  dist.barrier()
  dist.destroy_process_group()
  dist.init_process_group("gloo", {timeout = 30})
  dist.monitored_barrier({timeout = 10})  -- the default group's first, as before
  local ok, err = pcall(dist.monitored_barrier, {timeout = 10})
  check(ok, "the second monitored_barrier after re-init raised %s", tostring(err))
  if rank == 0 then os.execute("sleep 1") end
  local t0 = require("crun.core").clock()
  dist.monitored_barrier({timeout = 10})
  local waited = require("crun.core").clock() - t0
  check(rank == 0 or waited > 0.7, "monitored_barrier returned after %.3f s, before rank 0 (1 s late) arrived", waited)
end

-- broadcast_object_list leaves src's own objects in its list (torch does not
-- replace them with copies): a table src keeps mutating stays the list's
-- entry there; every other rank gets a copy of the values src sent
function cases.object_list_src()
  local src = size - 1
  local cfg, w = {lr = -0.25, steps = {3, -7}}, T.new({-1.5, 2.25}, "float64")
  local list = rank == src and {cfg, w, "tail"} or {false, false, false}
  dist.broadcast_object_list(list, src)
  if rank == src then
    check(rawequal(list[1], cfg) and rawequal(list[2], w), "src's list entries were replaced: %s %s",
          tostring(list[1]), tostring(list[2]))
    cfg.lr = 7  -- torch's src sees its later changes through the list
    check(list[1].lr == 7, "src's list[1] is not its own table")
  else
    check(not rawequal(list[1], cfg) and list[1].lr == -0.25 and list[1].steps[2] == -7, "list[1] on rank %d", rank)
    check(list[2][1] == -1.5 and list[2][2] == 2.25 and list[2]:dtype() == "float64", "list[2] on rank %d", rank)
  end
  check(list[3] == "tail", "list[3] on rank %d is %s", rank, tostring(list[3]))
end

-- torch's Work.source_rank() after an irecv from any rank: the sender's rank
-- in the irecv's group (torch's recv() maps it to the global rank), on the
-- default group and on a sub-group of the last two ranks.
function cases.work_source_rank()
  local a, b = size - 2, size - 1
  local g = dist.new_group({a, b})
  if rank == b then
    local y = T.zeros({1}, "float64")
    local w = dist.irecv(y, nil, g)
    w:wait()
    check(w:source_rank() == 0 and y[1] == -2.5, "sub-group source_rank %s, value %s", tostring(w:source_rank()), y[1])
    w = dist.irecv(y)
    w:wait()
    check(w:source_rank() == 0 and y[1] == 6.75, "world source_rank %s, value %s", tostring(w:source_rank()), y[1])
  elseif rank == a then
    dist.send(T.new({-2.5}, "float64"), b, g)
  end
  if rank == 0 then dist.send(T.new({6.75}, "float64"), b) end
  dist.barrier()
end

-- torch's receivers pass [None] * n, which Lua spells {} (and a trailing
-- None shortens a list): every rank's list becomes src's, whatever its length
-- was, and the group goes on in step.
function cases.object_list_nil_slots()
  local src = size - 1
  local list
  if rank == src then list = {-3, nil, 2.5, "x"}
  elseif rank == 0 then list = {7, 7, 7, 7, 7, 7}  -- longer: the tail goes, as src's list has no such elements
  else list = {} end
  dist.broadcast_object_list(list, src)
  check(list[1] == -3 and list[2] == nil and list[3] == 2.5 and list[4] == "x" and list[5] == nil and list[6] == nil,
        "rank %d's list is {%s, %s, %s, %s, %s, %s}", rank, tostring(list[1]), tostring(list[2]), tostring(list[3]),
        tostring(list[4]), tostring(list[5]), tostring(list[6]))
  local t = T.new({rank + 0.5}, "float64")
  dist.all_reduce(t)
  check(t[1] == size * size / 2, "all_reduce after it gave %s", tostring(t[1]))
end

-- torch's positional group (and async_op / tag after it): all_reduce(t, op,
-- group), send(t, dst, group, tag), ... on a group of ranks 0 and 1; the other
-- ranks pass NON_GROUP_MEMBER there and take no part (they raised
-- "options must be a table, got userdata", or ran the collective on WORLD)
-- Element k of the block global rank r sends to group rank q (signed, not periodic).
local function el(r, q, k) return 10.5 * r - 3 * q - 1.25 * k + q * k end
local function blk(r, q) return T.new({el(r, q, 1), el(r, q, 2)}, "float64") end
local function zeros(n) return T.zeros({n}, "float64") end
local function zlist() return {zeros(2), zeros(2)} end

-- Checks t's elements against want (a list), naming what; on a rank outside
-- the group, that t kept its zeros (nothing ran).
local function expect_vals(t, want, member, what)
  local got = t:totable()
  for i = 1, #got do
    local w = member and want[i] or 0
    check(got[i] == w, "%s: element %d is %s, expected %s", what, i, tostring(got[i]), tostring(w))
  end
end

-- A call's result: nil, or a Work (waited on) when async; on a rank outside
-- the group, nil always.
local function ran(what, member, async, ...)
  local w = ...
  if not member or not async then
    check(select("#", ...) == 0 or w == nil, "%s returned %s", what, tostring(w))
  else
    check(type(w) == "userdata", "%s returned %s, expected a Work", what, tostring(w))
    w:wait()
  end
end

-- The tensor collectives of torch's signatures with a positional process
-- group (g, of global ranks 0 and 1) and async_op after it, on every rank:
-- a rank outside g (NON_GROUP_MEMBER) returns nil and touches nothing.
local function positional_lists(g, member)
  local gr = member and rank or -1
  for _, async in ipairs{false, true} do
    local a = async or nil
    local tag = async and ", true)" or ")"
    local list = zlist()
    ran("all_gather(list, t, group" .. tag, member, async, dist.all_gather(list, blk(rank, 0), g, a))
    for q = 0, 1 do expect_vals(list[q + 1], blk(q, 0):totable(), member, "all_gather block " .. q) end
    list = rank == 1 and zlist() or nil
    ran("gather(t, list, 1, group" .. tag, member, async, dist.gather(blk(rank, 1), list, 1, g, a))
    if rank == 1 then for q = 0, 1 do expect_vals(list[q + 1], blk(q, 1):totable(), member, "gather block " .. q) end end
    local t = zeros(2)
    ran("scatter(t, list, 0, group" .. tag, member, async,
        dist.scatter(t, rank == 0 and {blk(0, 0), blk(0, 1)} or nil, 0, g, a))
    expect_vals(t, blk(0, gr):totable(), member, "scatter")
    t = zeros(2)
    ran("reduce_scatter(out, list, 'sum', group" .. tag, member, async,
        dist.reduce_scatter(t, {blk(rank, 0), blk(rank, 1)}, "sum", g, a))
    expect_vals(t, {el(0, gr, 1) + el(1, gr, 1), el(0, gr, 2) + el(1, gr, 2)}, member, "reduce_scatter")
    list = zlist()
    ran("all_to_all(outs, ins, group" .. tag, member, async, dist.all_to_all(list, {blk(rank, 0), blk(rank, 1)}, g, a))
    for q = 0, 1 do expect_vals(list[q + 1], blk(q, gr):totable(), member, "all_to_all block " .. q) end
    t = zeros(4)
    ran("all_gather_into_tensor(out, t, group" .. tag, member, async, dist.all_gather_into_tensor(t, blk(rank, 0), g, a))
    expect_vals(t, {el(0, 0, 1), el(0, 0, 2), el(1, 0, 1), el(1, 0, 2)}, member, "all_gather_into_tensor")
    t = zeros(2)
    local big = T.new({el(rank, 0, 1), el(rank, 0, 2), el(rank, 1, 1), el(rank, 1, 2)}, "float64")
    ran("reduce_scatter_tensor(out, in, 'max', group" .. tag, member, async,
        dist.reduce_scatter_tensor(t, big, "max", g, a))
    expect_vals(t, {math.max(el(0, gr, 1), el(1, gr, 1)), math.max(el(0, gr, 2), el(1, gr, 2))}, member,
                "reduce_scatter_tensor")
    -- rank r sends r + 1 elements to group rank 0, 2 - r to group rank 1
    local mine = {}
    for k = 1, 3 do mine[k] = el(rank, 9, k) end
    local ins, outs = {rank + 1, 2 - rank}, {1, 2}
    if rank == 1 then outs = {2, 1} end
    t = zeros(3)
    ran("all_to_all_single(out, in, outs, ins, group" .. tag, member, async,
        dist.all_to_all_single(t, T.new(mine, "float64"), member and outs or nil, member and ins or nil, g, a))
    local want = gr == 0 and {el(0, 9, 1), el(1, 9, 1), el(1, 9, 2)} or {el(0, 9, 2), el(0, 9, 3), el(1, 9, 3)}
    expect_vals(t, want, member, "all_to_all_single")
    t = zeros(2)
    ran("all_to_all_single(out, in, nil, nil, group" .. tag, member, async,
        dist.all_to_all_single(t, T.new({el(rank, 5, 1), el(rank, 5, 2)}, "float64"), nil, nil, g, a))
    expect_vals(t, {el(0, 5, gr + 1), el(1, 5, gr + 1)}, member, "all_to_all_single (equal blocks)")
  end
end

-- The object collectives and monitored_barrier with torch's positional group.
local function positional_objects(g, member)
  local list = rank == 1 and {"s" .. rank, -rank - 0.5, {k = rank * 3 - 7}} or {false, false, false}
  check(dist.broadcast_object_list(list, 1, g) == nil, "broadcast_object_list returned something")
  local want = member and {"s1", -1.5, -4} or {false, false}
  check(list[1] == want[1] and list[2] == want[2] and (member and list[3].k == -4 or list[3] == false),
        "broadcast_object_list(list, 1, group): %s %s", tostring(list[1]), tostring(list[2]))
  local l = {"stale"}
  check(dist.all_gather_object(l, {r = rank - 4}, g) == nil, "all_gather_object returned something")
  check(member and #l == 2 and l[1].r == -4 and l[2].r == -3 or not member and #l == 1 and l[1] == "stale",
        "all_gather_object(list, obj, group): %d entries", #l)
  l = rank == 0 and {} or nil
  check(dist.gather_object(rank * 2 - 5.5, l, 0, g) == nil, "gather_object returned something")
  check(rank ~= 0 or l[1] == -5.5 and l[2] == -3.5, "gather_object(obj, list, 0, group): %s %s",
        tostring(l and l[1]), tostring(l and l[2]))
  local out = {"stale"}
  check(dist.scatter_object_list(out, rank == 1 and {-11, "to1"} or nil, 1, g) == nil,
        "scatter_object_list returned something")
  local w = not member and "stale" or rank == 0 and -11 or "to1"
  check(out[1] == w, "scatter_object_list(out, in, 1, group): %s, expected %s", tostring(out[1]), tostring(w))
  check(dist.monitored_barrier(g, 10) == nil, "monitored_barrier(group, timeout) returned something")
  check(dist.monitored_barrier(g, 10, true) == nil, "monitored_barrier(group, timeout, true) returned something")
end

function cases.positional_group()
  local g = dist.new_group({0, 1})
  local member = rank <= 1
  check(member == (g ~= dist.GroupMember.NON_GROUP_MEMBER), "new_group membership")
  local function v() return T.new({rank + 1.5, -(2 * rank + 0.25)}, "float64") end
  local t = v()
  check((dist.all_reduce(t, "sum", g)) == nil, "all_reduce returned something")
  local want = member and {4, -2.5} or {rank + 1.5, -(2 * rank + 0.25)}
  check(t[1] == want[1] and t[2] == want[2], "all_reduce(t, op, group): %g %g", t[1], t[2])
  t = v()
  local w = dist.all_reduce(t, dist.ReduceOp.MAX, g, true)
  if member then w:wait() else check(w == nil, "a non-member got a Work") end
  check(not member or t[1] == 2.5 and t[2] == -0.25, "all_reduce(t, op, group, true): %g %g", t[1], t[2])
  t = v()
  dist.broadcast(t, 1, g)
  check(not member or t[1] == 2.5 and t[2] == -2.25, "broadcast(t, src, group): %g %g", t[1], t[2])
  t = v()
  dist.reduce(t, 0, "sum", g)
  check(rank ~= 0 or t[1] == 4 and t[2] == -2.5, "reduce(t, dst, op, group): %g %g", t[1], t[2])
  dist.barrier(g)
  t = v()
  if rank == 0 then
    dist.send(t, 1, g, 7)
    dist.isend(t, 1, g, 9):wait()
  elseif rank == 1 then
    local u = T.zeros({2}, "float64")
    check(dist.recv(u, 0, g, 7) == 0 and u[1] == 1.5 and u[2] == -0.25, "recv(t, src, group, tag): %g %g", u[1], u[2])
    u:zero()
    dist.irecv(u, 0, g, 9):wait()
    check(u[1] == 1.5 and u[2] == -0.25, "irecv(t, src, group, tag): %g %g", u[1], u[2])
  end
  dist.barrier()
  positional_objects(g, member)
  positional_lists(g, member)
  -- torch's None in the group's place is the default group, async_op and
  -- timeout after it still count; after an options table they are EINVAL
  t = T.new({rank * 4 - 2.5}, "float64")
  w = dist.all_reduce(t, "sum", nil, true)
  check(type(w) == "userdata", "all_reduce(t, op, nil, true) returned %s, expected a Work", tostring(w))
  w:wait()
  local sum = 0
  for r = 0, size - 1 do sum = sum + r * 4 - 2.5 end
  check(t[1] == sum, "all_reduce(t, op, nil, true) gave %g, expected %g", t[1], sum)
  local list = {}
  for r = 1, size do list[r] = T.zeros({1}, "int32") end
  w = dist.all_gather(list, T.new({7 - 3 * rank}, "int32"), nil, true)
  check(type(w) == "userdata", "all_gather(list, t, nil, true) returned %s, expected a Work", tostring(w))
  w:wait()
  for r = 1, size do check(list[r][1] == 7 - 3 * (r - 1), "all_gather(list, t, nil, true)[%d] = %d", r, list[r][1]) end
  -- a collective whose arguments a rank refuses stops its group (even where
  -- every rank made the mistake): these run on a group of their own
  local every = {}
  for r = 0, size - 1 do every[r + 1] = r end
  local own = dist.new_group(every)
  expect_error("^EINVAL: all_gather: async_op given after an options table %(pass torch's positional group, async_op "
               .. "or one table {group=, async_op=}%)", dist.all_gather, list, T.zeros({1}, "int32"), {group = own}, true)
  expect_error("^EINVAL: send: tag given after an options table", dist.send, T.zeros({1}), 0, {}, 3)
  expect_error("^EINVAL: broadcast_object_list: device given after an options table", dist.broadcast_object_list,
               {1}, 0, {group = own}, "cuda")
  expect_error("^EINVAL: monitored_barrier: arguments after an options table", dist.monitored_barrier, {group = own}, 5)
  if rank == 0 then  -- the others do not come: rank 0 gives up after its 0.3 s, not the group's 30
    expect_error("^ETIMEDOUT: monitored_barrier: ranks? [%d, ]+ did not arrive within 0.3 s",
                 dist.monitored_barrier, nil, 0.3, true)
  end
  dist.barrier()
end

-- a broadcast_object_list past table.unpack's limit (about a million values)
function cases.object_list_1m()
  local n = 1000001
  local list = {}
  for i = 1, n do list[i] = rank == 0 and i or false end
  dist.broadcast_object_list(list, 0)
  check(list[1] == 1 and list[n] == n, "broadcast_object_list of %d: [%d] = %s", n, n, tostring(list[n]))
end

cases[case]()
print(string.format("rank %d ok %s", rank, case))

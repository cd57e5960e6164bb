-- dist_args_spec.lua — misuse of crun.dist's arguments in one process (a
-- world of 1 over a hash store): a wrong value where a process group belongs
-- raises "EINVAL: <call>: ..." that pcall users can match, never
-- "attempt to index" from inside dist.lua.
local crun = require "crun"
local dist, T = crun.dist, crun.tensor

describe("crun.dist arguments", function()
  setup(function()
    dist.init_process_group{backend = "cpu", world_size = 1, rank = 0, store = crun.store.hash()}
  end)
  teardown(function() dist.destroy_process_group() end)

  local function work() return dist.all_reduce(T.ones{2}, "sum", {async_op = true}) end
  local bad = {
    {"a tensor", function() return T.ones{2} end, "crun.Tensor"},
    {"a Work", work, "crun.Work"},
    {"a string", function() return "default" end, "string"},
    {"a number", function() return 0 end, "number"},
    {"a plain table", function() return {} end, "table"},
  }
  local calls = {
    {"all_reduce", function(g) return dist.all_reduce(T.ones{2}, "sum", {group = g}) end},
    {"broadcast", function(g) return dist.broadcast(T.ones{2}, 0, {group = g}) end},
    {"barrier", function(g) return dist.barrier{group = g} end},
    {"send", function(g) return dist.send(T.ones{2}, 0, {group = g}) end},
    {"get_rank", function(g) return dist.get_rank(g) end},
    {"get_world_size", function(g) return dist.get_world_size(g) end},
    {"get_group_rank", function(g) return dist.get_group_rank(g, 0) end},
    {"get_global_rank", function(g) return dist.get_global_rank(g, 0) end},
  }
  for _, b in ipairs(bad) do
    for _, c in ipairs(calls) do
      it(c[1] .. " rejects " .. b[1] .. " as the group with EINVAL naming the call", function()
        local ok, err = pcall(c[2], b[2]())
        assert.is_false(ok)
        assert.equal("EINVAL: " .. c[1] .. ": group must be a crun.ProcessGroup (from new_group), got "
                     .. b[3], err)
      end)
    end
  end

  -- new_group's placeholder on a rank outside the group: the calls that need
  -- the rank's place in it raise, naming the placeholder (not "got table",
  -- which read as if it had not come from new_group); get_rank/get_world_size
  -- give -1 and collectives do nothing, as in torch
  for _, c in ipairs{
    {"get_group_rank", function(g) return dist.get_group_rank(g, 0) end},
    {"get_global_rank", function(g) return dist.get_global_rank(g, 0) end},
    {"get_process_group_ranks", function(g) return dist.get_process_group_ranks(g) end},
    {"get_backend", function(g) return dist.get_backend(g) end},
  } do
    it(c[1] .. " names NON_GROUP_MEMBER when given it", function()
      local ok, err = pcall(c[2], dist.GroupMember.NON_GROUP_MEMBER)
      assert.is_false(ok)
      assert.equal("EINVAL: " .. c[1] .. " on rank 0: this rank is not in the group (new_group gave it "
                   .. "GroupMember.NON_GROUP_MEMBER)", err)
    end)
  end
  it("get_rank and get_world_size give -1 for NON_GROUP_MEMBER, collectives nil", function()
    local non = dist.GroupMember.NON_GROUP_MEMBER
    assert.equal(-1, dist.get_rank(non))
    assert.equal(-1, dist.get_world_size(non))
    assert.is_nil(dist.all_reduce(T.ones{2}, "sum", {group = non, async_op = true}))
    assert.equal(-1, dist.recv(T.ones{2}, 0, {group = non}))
  end)

  -- Other misused arguments: the same "EINVAL: <call>: ..." form.
  local misuse = {
    {"destroy_process_group(5)", function() dist.destroy_process_group(5) end,
     "EINVAL: destroy_process_group: group must be a crun.ProcessGroup (from new_group), got number"},
    {"batch_isend_irecv{1}", function() dist.batch_isend_irecv{1} end,
     "EINVAL: batch_isend_irecv: entry 1 is not a P2POp"},
    {"all_gather_into_tensor(nil, t)", function() dist.all_gather_into_tensor(nil, T.ones{2}) end,
     "EINVAL: all_gather_into_tensor: the output tensor must be a crun.Tensor, got nil"},
    {"all_gather_into_tensor(out, nil)", function() dist.all_gather_into_tensor(T.ones{2}, nil) end,
     "EINVAL: all_gather_into_tensor: the input tensor must be a crun.Tensor, got nil"},
    {"reduce_scatter_tensor(t, nil)", function() dist.reduce_scatter_tensor(T.ones{2}, nil) end,
     "EINVAL: reduce_scatter_tensor: the input tensor must be a crun.Tensor, got nil"},
    {"reduce_scatter_tensor(nil, t)", function() dist.reduce_scatter_tensor(nil, T.ones{2}) end,
     "EINVAL: reduce_scatter_tensor: the output tensor must be a crun.Tensor, got nil"},
    -- a closed tensor, a strided one, another dtype: named, not "bad argument to 'numel'" or a list entry's fault
    {"all_gather_into_tensor(out, closed)", function() local c = T.ones{2}; c:close(); dist.all_gather_into_tensor(T.ones{2}, c) end,
     "EINVAL: all_gather_into_tensor: the input tensor is closed"},
    {"all_gather_into_tensor(closed, t)", function() local c = T.ones{2}; c:close(); dist.all_gather_into_tensor(c, T.ones{2}) end,
     "EINVAL: all_gather_into_tensor: the output tensor is closed"},
    {"reduce_scatter_tensor(closed, t)", function() local c = T.ones{2}; c:close(); dist.reduce_scatter_tensor(c, T.ones{2}) end,
     "EINVAL: reduce_scatter_tensor: the output tensor is closed"},
    {"reduce_scatter_tensor(t, closed)", function() local c = T.ones{2}; c:close(); dist.reduce_scatter_tensor(T.ones{2}, c) end,
     "EINVAL: reduce_scatter_tensor: the input tensor is closed"},
    {"all_gather_into_tensor(out, strided)", function()
      dist.all_gather_into_tensor(T.ones{4}, T.ones({2, 2}):transpose(1, 2)) end,
     "EINVAL: all_gather_into_tensor: the input tensor must be contiguous"},
    {"reduce_scatter_tensor(float64, float32)", function()
      dist.reduce_scatter_tensor(T.ones({3}, "float64"), T.ones{3}) end,
     "EINVAL: reduce_scatter_tensor: the input tensor is float32, the output float64"},
    {"all_to_all_single(nil, t)", function() dist.all_to_all_single(nil, T.ones{2}) end,
     "EINVAL: all_to_all_single on rank 0: the output tensor must be a crun.Tensor, got nil"},
    {"all_to_all_single(closed, t)", function() local c = T.zeros{2}; c:close(); dist.all_to_all_single(c, T.ones{2}) end,
     "EINVAL: all_to_all_single on rank 0: the output tensor is closed"},
    {"get_group_rank(WORLD, 7)", function() dist.get_group_rank(dist.group.WORLD, 7) end,
     "EINVAL: get_group_rank: rank 7 is not in the group"},
    -- a rank that is no integer was "rank 0 is not in the group" for a string
    -- "0", the binding's "bad argument #1 to 'global_rank'" for 0.5, and a
    -- string "0" passed get_global_rank as the number 0
    {"get_group_rank(WORLD, '0')", function() dist.get_group_rank(dist.group.WORLD, "0") end,
     "EINVAL: get_group_rank: global_rank must be an integer, got string"},
    {"get_global_rank(WORLD, 0.5)", function() dist.get_global_rank(dist.group.WORLD, 0.5) end,
     "EINVAL: get_global_rank: group_rank must be an integer, got 0.5"},
    {"get_global_rank(WORLD, '0')", function() dist.get_global_rank(dist.group.WORLD, "0") end,
     "EINVAL: get_global_rank: group_rank must be an integer, got string"},
    {"isend(t, 0, 5)", function() dist.isend(T.ones{2}, 0, 5) end,
     "EINVAL: isend: options must be a table, got number"},
    {"gather_object(v, list, 7)", function() dist.gather_object(1, {}, 7) end,
     "EINVAL: gather_object on rank 0: dst 7 is out of range (0..0)"},
    {"broadcast_object_list(l, 7)", function() dist.broadcast_object_list({1}, 7) end,
     "EINVAL: broadcast_object_list on rank 0: src 7 is out of range (0..0)"},
    -- torch's gloo and MPI refuse a negative tag: every backend does, naming it
    {"send(t, 0, {tag = -1})", function() dist.send(T.ones{2}, 0, {tag = -1}) end,
     "EINVAL: send on rank 0: tag -1 is negative (tags must be 0 or more, as in torch.distributed)"},
    {"irecv(t, 0, {tag = -7})", function() dist.irecv(T.ones{2}, 0, {tag = -7}) end,
     "EINVAL: irecv on rank 0: tag -7 is negative (tags must be 0 or more, as in torch.distributed)"},
    {"new_group(5)", function() dist.new_group(5) end,
     "EINVAL: bad argument #1 to 'new_group' (list of ranks expected)"},
  }
  for _, m in ipairs(misuse) do
    it(m[1] .. " raises EINVAL naming the call", function()
      local ok, err = pcall(m[2])
      assert.is_false(ok)
      assert.equal(m[3], err)
    end)
  end

  -- reduce_scatter reads its inputs while it writes its output: an output
  -- that overlaps an input, even by part, is refused (the shm engine's
  -- one-shot path summed a clobbered input into it).
  for _, off in ipairs{0, 1} do
    it("reduce_scatter refuses an output overlapping its input by " .. (off == 0 and "all" or "part"), function()
      local big = T.ones{5}
      local ok, err = pcall(dist.reduce_scatter, big:narrow(1, 1 + off, 4), {big:narrow(1, 1, 4)})
      assert.is_false(ok)
      assert.equal("EINVAL: reduce_scatter on rank 0: the output overlaps the input for rank 0 (inputs are read "
                   .. "while the output is written: give a separate output)", err)
    end)
  end

  -- all_gather, gather and scatter take this rank's block as the other
  -- argument itself (in place), and refuse any other overlap.
  it("all_gather, gather and scatter refuse a partly overlapping block, take an exact one", function()
    local big = T.ones{5}
    local a, b = big:narrow(1, 1, 4), big:narrow(1, 2, 4)
    local want = "EINVAL: %s on rank 0: the %s overlaps the %s for rank 0 (only this rank's may be the %s itself)"
    for _, c in ipairs{
      {"all_gather", function() dist.all_gather({a}, b) end, "input", "output"},
      {"gather", function() dist.gather(b, {a}, 0) end, "input", "output"},
      {"scatter", function() dist.scatter(b, {a}, 0) end, "output", "input"},
    } do
      local ok, err = pcall(c[2])
      assert.is_false(ok, c[1])
      assert.equal(string.format(want, c[1], c[3], c[4], c[3]), err)
    end
    dist.all_gather({a}, a)
    dist.gather(a, {a}, 0)
    dist.scatter(a, {a}, 0)
  end)

  it("refuses a premul_sum op string whose factor is NaN, as make_premul_sum does", function()
    local ok, err = pcall(dist.all_reduce, T.ones{2}, "premul_sum:nan")
    assert.is_false(ok)
    assert.equal("EINVAL: premul_sum: the factor is NaN (dist.make_premul_sum refuses it too)", err)
    local t = T.ones{2}
    dist.all_reduce(t, dist.make_premul_sum(2.5))
    assert.same({2.5, 2.5}, t:totable())
  end)

  -- crun's form with the op left out puts the options table in the op's
  -- place: a group or async_op after it (torch's positional places) was
  -- dropped without a word (all_reduce(t, {group = g}, nil, true) returned
  -- nothing, blocking); now EINVAL, as after an options table in the group's place
  it("refuses a group or async_op after an options table in the op's or a split list's place", function()
    local g = dist.new_group{0}
    local after = "given after an options table (pass torch's positional group, async_op or one table {group=, "
                  .. "async_op=})"
    for _, c in ipairs{
      {"all_reduce", "async_op", function() return dist.all_reduce(T.ones{2}, {group = g}, nil, true) end},
      {"all_reduce", "async_op", function() return dist.all_reduce(T.ones{2}, {group = g}, nil, false) end},
      {"all_reduce", "group", function() return dist.all_reduce(T.ones{2}, {async_op = true}, g) end},
      {"reduce", "async_op", function() return dist.reduce(T.ones{2}, 0, {group = g}, nil, true) end},
      {"reduce", "group", function() return dist.reduce(T.ones{2}, 0, {async_op = true}, g) end},
      {"reduce_scatter", "async_op", function() return dist.reduce_scatter(T.zeros{2}, {T.ones{2}}, {group = g}, nil, true) end},
      {"reduce_scatter_tensor", "async_op", function()
        return dist.reduce_scatter_tensor(T.zeros{2}, T.ones{2}, {group = g}, nil, true) end},
      {"reduce_scatter_tensor", "group", function()
        return dist.reduce_scatter_tensor(T.zeros{2}, T.ones{2}, {async_op = true}, g) end},
    } do
      local ok, err = pcall(c[3])
      assert.is_false(ok, c[1] .. " " .. c[2])
      assert.equal("EINVAL: " .. c[1] .. ": " .. c[2] .. " " .. after, err)
    end
    -- all_to_all_single: the table in either split list's place
    for _, c in ipairs{
      {"input split sizes", function() return dist.all_to_all_single(T.zeros{2}, T.ones{2}, {async_op = true}, {2}) end},
      {"async_op", function() return dist.all_to_all_single(T.zeros{2}, T.ones{2}, {group = g}, nil, nil, true) end},
      {"group", function() return dist.all_to_all_single(T.zeros{2}, T.ones{2}, {async_op = true}, nil, g) end},
      {"group", function() return dist.all_to_all_single(T.zeros{2}, T.ones{2}, nil, {async_op = true}, g) end},
      {"async_op", function() return dist.all_to_all_single(T.zeros{2}, T.ones{2}, {2}, {group = g}, nil, true) end},
    } do
      local ok, err = pcall(c[2])
      assert.is_false(ok, "all_to_all_single " .. c[1])
      assert.equal("EINVAL: all_to_all_single: " .. c[1] .. " " .. after, err)
    end
    -- torch's positional forms still take them
    local out = T.zeros{2}
    local w = dist.all_to_all_single(out, T.new{-1.5, 2.25}, {2}, {2}, g, true)
    assert.equal("crun.Work", getmetatable(w).__name)
    w:wait()
    assert.same({-1.5, 2.25}, out:totable())
    dist.all_to_all_single(out, T.new{0.5, -3}, {group = g})
    assert.same({0.5, -3}, out:totable())
    dist.all_to_all_single(out, T.new{-0.25, 7}, {2}, {group = g})
    assert.same({-0.25, 7}, out:totable())
    local t = T.new{1.5, -2.25}
    local w = dist.all_reduce(t, "max", g, true)
    assert.equal("crun.Work", getmetatable(w).__name)
    w:wait()
    w = dist.reduce(t, 0, nil, g, true)
    assert.equal("crun.Work", getmetatable(w).__name)
    w:wait()
    assert.same({1.5, -2.25}, t:totable())
  end)

  -- recv(t, opts) leaves src out: a group after that table was dropped
  -- (the receive ran on the default group)
  it("recv and irecv refuse a group after an options table in src's place", function()
    local g = dist.new_group{0}
    for _, f in ipairs{"recv", "irecv"} do
      local ok, err = pcall(dist[f], T.zeros{2}, {tag = 3}, g)
      assert.is_false(ok, f)
      assert.equal("EINVAL: " .. f .. ": group given after an options table (pass torch's positional group, tag or "
                   .. "one table {group=, tag=})", err)
    end
  end)

  -- torch code checks get_backend() == "gloo" (or dist.Backend.GLOO); crun's
  -- cpu backend answered "cpu", so such a check failed, and dist.Backend was nil
  it("get_backend gives torch's name gloo for the cpu backend, and takes it back", function()
    assert.equal("gloo", dist.get_backend())
    assert.equal(dist.Backend.GLOO, dist.get_backend())
    assert.equal("cpu", dist.group.WORLD:backend())
    assert.equal("gloo", dist.Backend("GLOO"))
    assert.equal("nccl", dist.Backend("nccl"))
    local ok, err = pcall(dist.Backend, "cpu")
    assert.is_false(ok)
    assert.equal("EINVAL: Backend: unknown backend cpu (gloo, nccl, mpi or ucc, in any case)", err)
    for _, b in ipairs{dist.Backend.GLOO, "GLOO", "cpu", "auto"} do
      local g = dist.new_group({0}, {backend = b})
      assert.equal("gloo", dist.get_backend(g), b)
    end
  end)

  -- torch's positional timeout and backend after the rank lists (and after
  -- new_subgroups' unused group) were dropped: the groups got the default
  -- timeout and any backend was taken
  it("new_subgroups and new_subgroups_by_enumeration take torch's positional timeout and backend", function()
    local mismatch = "ENOTSUP: new_group: backend 'mpi' differs from the default group's 'cpu' (crun builds "
                     .. "sub-groups on the default group's backend)"
    for _, c in ipairs{
      {"by_enumeration", function(...) return dist.new_subgroups_by_enumeration({{0}}, ...) end},
      {"new_subgroups", function(...) return dist.new_subgroups(1, nil, ...) end},
    } do
      local ok, err = pcall(c[2], 12.5, "mpi")
      assert.is_false(ok, c[1])
      assert.equal(mismatch, err)
      local g = c[2](12.5, "gloo")
      assert.equal(12.5, g:timeout(), c[1])
    end
    local ok, err = pcall(dist.new_subgroups, {timeout = 3}, nil, 5)
    assert.is_false(ok)
    assert.equal("EINVAL: new_subgroups: arguments after the options table (pass one table {timeout=, backend=} or "
                 .. "torch's positional group_size, group, timeout, backend)", err)
    ok, err = pcall(dist.new_subgroups, 1, {timeout = 3}, 5)
    assert.is_false(ok)
    assert.equal("EINVAL: new_subgroups: argument #2 must be an options table {timeout=, backend=} with nothing "
                 .. "after it, or nil (torch's positional group, which it does not use), got table", err)
    assert.equal(3, dist.new_subgroups(1, {timeout = 3}):timeout())
  end)

  -- torch raises TypeError for a positional argument beyond its signature
  -- (all_reduce() takes from 1 to 4 positional arguments but 5 were given);
  -- crun dropped it without a word (all_reduce(t, op, group, true, 42))
  it("refuses an argument beyond torch's positional ones with EINVAL naming the call and its position", function()
    local t, v = T.ones{2}, {-1.5, 2}
    local p2p = {dist.P2POp("isend", T.ones{2}, 0)}
    for _, x in ipairs{42, true} do
      for _, c in ipairs{
        {"all_reduce", 5, "tensor, op, group, async_op", function() return dist.all_reduce(t, "sum", nil, false, x) end},
        {"all_reduce", 6, "tensor, op, group, async_op", function() return dist.all_reduce(t, "sum", nil, nil, nil, x) end},
        {"broadcast", 5, "tensor, src, group, async_op", function() return dist.broadcast(t, 0, nil, false, x) end},
        {"reduce", 6, "tensor, dst, op, group, async_op", function() return dist.reduce(t, 0, "sum", nil, false, x) end},
        {"all_gather", 5, "tensor_list, tensor, group, async_op",
         function() return dist.all_gather({T.zeros{2}}, t, nil, false, x) end},
        {"all_gather_into_tensor", 5, "output_tensor, input_tensor, group, async_op",
         function() return dist.all_gather_into_tensor(T.zeros{2}, t, nil, false, x) end},
        {"reduce_scatter_tensor", 6, "output, input, op, group, async_op",
         function() return dist.reduce_scatter_tensor(T.zeros{2}, t, "sum", nil, false, x) end},
        {"gather", 6, "tensor, gather_list, dst, group, async_op",
         function() return dist.gather(t, {T.zeros{2}}, 0, nil, false, x) end},
        {"scatter", 6, "tensor, scatter_list, src, group, async_op",
         function() return dist.scatter(T.zeros{2}, {t}, 0, nil, false, x) end},
        {"reduce_scatter", 6, "output, input_list, op, group, async_op",
         function() return dist.reduce_scatter(T.zeros{2}, {t}, "sum", nil, false, x) end},
        {"all_to_all", 5, "output_tensor_list, input_tensor_list, group, async_op",
         function() return dist.all_to_all({T.zeros{2}}, {t}, nil, false, x) end},
        {"all_to_all_single", 7, "output, input, output_split_sizes, input_split_sizes, group, async_op",
         function() return dist.all_to_all_single(T.zeros{2}, t, nil, nil, nil, false, x) end},
        {"barrier", 4, "group, async_op, device_ids", function() return dist.barrier(nil, false, nil, x) end},
        {"monitored_barrier", 4, "group, timeout, wait_all_ranks",
         function() return dist.monitored_barrier(nil, 5, false, x) end},
        {"send", 5, "tensor, dst, group, tag", function() return dist.send(t, 0, nil, 0, x) end},
        {"recv", 5, "tensor, src, group, tag", function() return dist.recv(t, 0, nil, 0, x) end},
        {"isend", 5, "tensor, dst, group, tag", function() return dist.isend(t, 0, nil, 0, x) end},
        {"irecv", 5, "tensor, src, group, tag", function() return dist.irecv(t, 0, nil, 0, x) end},
        {"broadcast_object", 4, "obj, src, group", function() return dist.broadcast_object(v, 0, nil, x) end},
        {"all_gather_object", 4, "object_list, obj, group", function() return dist.all_gather_object({}, v, nil, x) end},
        {"broadcast_object_list", 5, "object_list, src, group, device",
         function() return dist.broadcast_object_list({v}, 0, nil, nil, x) end},
        {"gather_object", 5, "obj, object_gather_list, dst, group",
         function() return dist.gather_object(v, {}, 0, nil, x) end},
        {"scatter_object_list", 5, "scatter_object_output_list, scatter_object_input_list, src, group",
         function() return dist.scatter_object_list({}, {v}, 0, nil, x) end},
        {"P2POp", 6, "op, tensor, peer, group, tag", function() return dist.P2POp("isend", t, 0, nil, 0, x) end},
        {"batch_isend_irecv", 2, "p2p_op_list", function() return dist.batch_isend_irecv(p2p, x) end},
      } do
        local ok, err = pcall(c[4])
        assert.is_false(ok, c[1] .. " #" .. c[2])
        assert.equal(string.format("EINVAL: %s: argument #%d (%s) is one too many: %s takes %d positional arguments "
                                   .. "at most (%s), as in torch", c[1], c[2], type(x), c[1], #c[3]:gsub("[^,]", "") + 1,
                                   c[3]), err)
      end
    end
    -- trailing nils are no arguments in Lua: wrappers pass theirs on
    local u = T.new{-1.5, 2.25}
    dist.all_reduce(u, "sum", nil, nil, nil, nil)
    dist.broadcast(u, 0, nil, false, nil)
    dist.reduce(u, 0, "max", nil, nil, nil)
    assert.same({-1.5, 2.25}, u:totable())
    assert.is_nil(dist.barrier(nil, nil, nil))
    -- torch's device_ids (a list of device indices) changes nothing in a barrier
    assert.is_nil(dist.barrier(nil, false, {0}))
    assert.is_nil(dist.barrier{device_ids = {0, 1}})
    for _, bad in ipairs{"cuda:0", {0.5}, {-1}} do
      local ok, err = pcall(dist.barrier, nil, nil, bad)
      assert.is_false(ok)
      assert.equal("EINVAL: barrier: device_ids must be a list of device indices (integers >= 0)", err)
    end
    local ok, err = pcall(dist.barrier, {}, nil, {0})
    assert.is_false(ok)
    assert.matches("^EINVAL: barrier: device_ids given after an options table", err)
    assert.same(v, dist.broadcast_object(v, 0, nil, nil))
    local got = {}
    dist.all_gather_object(got, v, nil, nil)
    assert.same({v}, got)
    local w = dist.all_reduce(u, "sum", nil, true, nil)
    assert.equal("crun.Work", getmetatable(w).__name)
    w:wait()
  end)

  -- torch's broadcast_object_list(object_list, src, group) takes the group
  -- positionally, as every other object collective of crun's does; crun's
  -- broadcast_object(v, src, group) refused it ("options must be a table")
  it("broadcast_object takes torch's positional group, and still an options table", function()
    local g = dist.new_group{0}
    local v = {-3, "x", {2.5}}
    assert.same(v, dist.broadcast_object(v, 0, g))
    assert.same(v, dist.broadcast_object(v, 0, {group = g, timeout = 5}))
    assert.same(v, dist.broadcast_object(v, 0, {timeout = 5}))
    assert.same(v, dist.broadcast_object(v, nil, dist.group.WORLD))
    local ok, err = pcall(dist.broadcast_object, v, 0, {group = g, tag = 1})
    assert.is_false(ok)
    assert.is_truthy(err:find("^EINVAL: broadcast_object"), err)
  end)

  it("still takes a real group and the default one", function()
    local g = dist.new_group{0}
    local t = T.ones{2}
    dist.all_reduce(t, "sum", {group = g})
    assert.same({1, 1}, t:totable())
    assert.equal(0, dist.get_rank(g))
    assert.equal(0, dist.get_global_rank(g, 0))
    assert.equal(0, dist.get_group_rank(g, 0))
    assert.equal(1, dist.get_world_size())
  end)

  -- async_op is a boolean, as torch's: a value Lua reads as true where Python
  -- reads it as false (0, "") made crun's call async where torch's blocks, and
  -- "yes" made any value an async Work; now EINVAL naming the call, in the
  -- options table or torch's positional place, through dist or a group's method
  -- (a positional one by its argument number: it was called a "field")
  it("refuses an async_op that is not true or false, naming the call", function()
    local function t() return T.new{-1.5, 2.25} end
    local calls = {
      {"all_reduce", function(v) return dist.all_reduce(t(), "sum", {async_op = v}) end},
      {"all_reduce", function(v) return dist.all_reduce(t(), "sum", nil, v) end, 4},
      {"all_reduce", function(v) return dist.group():all_reduce(t(), "sum", {async_op = v}) end},
      {"broadcast", function(v) return dist.broadcast(t(), 0, nil, v) end, 4},
      {"reduce", function(v) return dist.reduce(t(), 0, "sum", nil, v) end, 5},
      {"all_gather", function(v) return dist.all_gather({T.zeros{2}}, t(), nil, v) end, 4},
      {"all_gather_into_tensor", function(v) return dist.all_gather_into_tensor(T.zeros{2}, t(), nil, v) end, 4},
      {"reduce_scatter", function(v) return dist.reduce_scatter(T.zeros{2}, {t()}, "sum", nil, v) end, 5},
      {"reduce_scatter_tensor", function(v) return dist.reduce_scatter_tensor(T.zeros{2}, t(), "sum", nil, v) end, 5},
      {"gather", function(v) return dist.gather(t(), {T.zeros{2}}, 0, nil, v) end, 5},
      {"scatter", function(v) return dist.scatter(T.zeros{2}, {t()}, 0, nil, v) end, 5},
      {"all_to_all", function(v) return dist.all_to_all({T.zeros{2}}, {t()}, nil, v) end, 4},
      {"all_to_all_single", function(v) return dist.all_to_all_single(T.zeros{2}, t(), nil, nil, nil, v) end, 6},
      {"barrier", function(v) return dist.barrier(nil, v) end, 2},
      {"barrier", function(v) return dist.barrier{async_op = v} end},
      {"send", function(v) return dist.send(t(), 0, {async_op = v}) end},
      {"recv", function(v) return dist.recv(T.zeros{2}, 0, {async_op = v}) end},
    }
    for _, c in ipairs(calls) do
      for _, v in ipairs{"yes", 0, "", {}} do
        local ok, err = pcall(c[2], v)
        assert.is_false(ok, c[1] .. " took async_op = " .. tostring(v))
        -- in the options table a field; in torch's positional place its argument number
        local what = c[3] and string.format("bad argument #%d 'async_op'", c[3]) or "bad field 'async_op'"
        assert.equal(string.format("EINVAL: %s on rank 0: %s (boolean expected, got %s)", c[1], what, type(v)), err)
      end
    end
    -- true and false still pick the forms
    local w = dist.all_reduce(t(), "sum", {async_op = true})
    assert.equal("crun.Work", getmetatable(w).__name)
    w:wait()
    assert.is_nil(dist.broadcast(t(), 0, nil, false))
  end)

  -- The bindings' check of an option's value names the call and this rank,
  -- as the other argument faults do (it named the call alone).
  it("refuses an option of the wrong type naming the call and the rank", function()
    local function t() return T.new{-1.5, 2.25} end
    local cases = {
      {"EINVAL: all_reduce on rank 0: bad field 'timeout' (number expected, got string)",
       function() return dist.all_reduce(t(), "sum", {timeout = "x"}) end},
      {"EINVAL: all_reduce on rank 0: bad field 'async_op' (boolean expected, got number)",
       function() return dist.all_reduce(t(), "sum", {async_op = 3}) end},
      {"EINVAL: broadcast on rank 0: bad field 'timeout' (number expected, got table)",
       function() return dist.broadcast(t(), 0, {timeout = {}}) end},
      {"EINVAL: send on rank 0: bad field 'tag' (integer expected, got string)",
       function() return dist.group():send(t(), 0, {tag = "x"}) end},
      {"EINVAL: recv on rank 0: tag 4294967296 is out of range (-2147483648..2147483647)",
       function() return dist.group():recv(t(), 0, {tag = 1 << 32}) end},
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[2])
      assert.is_false(ok, c[1])
      assert.equal(c[1], err)
    end
  end)

  -- torch 2.x's new_group(..., use_local_synchronization = True) lets the
  -- ranks outside the new group skip the call; crun's new_group synchronizes
  -- the whole default group, so code relying on that blocked the members
  -- until the timeout (the option only warned). Now ENOTSUP saying that every
  -- rank must call it; false, torch's default, is taken as before.
  it("refuses new_group's use_local_synchronization = true, which crun cannot honour", function()
    local why = "ENOTSUP: new_group: use_local_synchronization = true is not implemented: crun's new_group "
      .. "synchronizes the whole default group, so every rank of it must call new_group (members or not, with the "
      .. "same ranks); pass false or leave it out"
    for _, f in ipairs{function() return dist.new_group({0}, {use_local_synchronization = true}) end,
                       function() return dist.new_group({0}, nil, nil, nil, true) end} do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.equal(why, err)
    end
    local ok, err = pcall(dist.new_group, {0}, {use_local_synchronization = "yes"})
    assert.is_false(ok)
    assert.equal("EINVAL: new_group: use_local_synchronization must be true or false, got yes", err)
    for _, g in ipairs{dist.new_group({0}, {use_local_synchronization = false}), dist.new_group({0}, 5, nil, nil, false)} do
      local t = T.new{-2.5, 1.25}
      dist.all_reduce(t, "sum", {group = g})
      assert.same({-2.5, 1.25}, {t[1], t[2]})
    end
  end)

  -- isend and irecv ran as send and recv, whose names their faults carried
  -- ("EINVAL: send on rank 0: cannot send to itself" for an isend); now each
  -- fault names the call the user made, whichever layer finds it
  it("names isend and irecv, not send and recv, in their faults", function()
    local neg = "tag -1 is negative (tags must be 0 or more, as in torch.distributed)"
    for _, c in ipairs{
      {"EINVAL: isend on rank 0: cannot send to itself", function() return dist.isend(T.ones{2}, 0) end},
      {"EINVAL: isend on rank 0: " .. neg, function() return dist.isend(T.ones{2}, 0, {tag = -1}) end},
      {"EINVAL: isend on rank 0: " .. neg, function() return dist.isend(T.ones{2}, 0, nil, -1) end},
      {"EINVAL: isend: dst 5 is out of range (0..0)", function() return dist.isend(T.ones{2}, 5) end},
      {"EINVAL: bad argument #1 to 'isend' (crun.Tensor expected, got string)", function() return dist.isend("x", 0) end},
      {"EINVAL: isend: group must be a crun.ProcessGroup (from new_group), got number",
       function() return dist.isend(T.ones{2}, 0, {group = 5}) end},
      {"EINVAL: irecv on rank 0: cannot receive from itself", function() return dist.irecv(T.ones{2}, 0) end},
      {"EINVAL: irecv on rank 0: " .. neg, function() return dist.irecv(T.ones{2}, nil, {tag = -1}) end},
      {"EINVAL: irecv: src 5 is out of range (0..0)", function() return dist.irecv(T.ones{2}, 5) end},
      {"EINVAL: bad argument #1 to 'irecv' (crun.Tensor expected, got string)", function() return dist.irecv("x", 0) end},
      -- and send / recv keep their own names
      {"EINVAL: send on rank 0: cannot send to itself", function() return dist.send(T.ones{2}, 0) end},
      {"EINVAL: recv on rank 0: " .. neg, function() return dist.recv(T.ones{2}, nil, {tag = -1}) end},
    } do
      local ok, err = pcall(c[2])
      assert.is_false(ok, c[1])
      assert.equal(c[1], err)
    end
  end)
end)

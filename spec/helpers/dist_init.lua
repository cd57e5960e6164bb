-- dist_init.lua OUTDIR — init_process_group in every form, on every rank:
-- env://, tcp://, file://, store=, destroy + re-init, and the misuse errors.
-- Writes "ok <case>" / "FAIL <case>: <why>" lines, then "done <n>".
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local outdir = assert(arg[1])
local rank, size = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
local out = assert(io.open(outdir .. "/rank" .. rank .. ".txt", "w"))
local n = 0

local function case(name, fn)
  n = n + 1
  local ok, err = pcall(fn)
  out:write(ok and ("ok " .. name) or ("FAIL " .. name .. ": " .. tostring(err)), "\n")
  out:flush()
end

local function expect_error(pattern, fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern), "error '" .. tostring(err) .. "' does not match " .. pattern)
end

local function sum_check()
  local t = T.full({3}, rank + 1, "float32")
  dist.all_reduce(t)
  assert(t[1] == size * (size + 1) / 2, "all_reduce gave " .. t[1])
end

case("before_init", function()
  assert(not dist.is_initialized())
  expect_error("^ESTATE: get_rank", dist.get_rank)
  expect_error("^ESTATE: all_reduce", dist.all_reduce, T.ones({1}))
end)

case("env", function()
  dist.init_process_group{}
  assert(dist.is_initialized() and dist.get_rank() == rank and dist.get_world_size() == size)
  assert(dist.get_backend() == "gloo" and dist.group.WORLD:backend() == "cpu")
  sum_check()
  expect_error("^ESTATE: init_process_group: already initialized", dist.init_process_group, {})
  dist.destroy_process_group()
  assert(not dist.is_initialized())
  -- dist.all_reduce's closure forgets the destroyed group (bindings/pg.c)
  expect_error("^ESTATE: all_reduce", dist.all_reduce, T.ones({1}))
end)

case("world_destroyed_under_dist_all_reduce", function()
  -- dist.all_reduce remembers the group it checked last: a destroyed one must
  -- still raise, and a new default group must be checked and used
  dist.init_process_group{}
  sum_check()
  dist.group.WORLD:destroy()
  expect_error("^ECLOSED: rank %d used a process group %(%d ranks?%) that was destroyed", dist.all_reduce, T.ones({2}))
  expect_error("^ECLOSED: rank %d called all_reduce%(%) on a process group", function() return dist.all_reduce(T.ones({2})) end)
  dist.destroy_process_group()
  dist.init_process_group{}
  sum_check()
  dist.destroy_process_group()
end)

case("env_again_after_destroy", function()
  dist.init_process_group{timeout = 30}
  sum_check()
  dist.destroy_process_group()
end)

case("file", function()
  local path = outdir .. "/filestore"
  dist.init_process_group{init_method = "file://" .. path, rank = rank, world_size = size}
  sum_check()
  local exists = io.open(path)
  assert(exists, "the file store's file is missing while the group runs")
  exists:close()
  dist.destroy_process_group()
  -- as torch's FileStore(path, world_size): the last rank out removes the file
  local S = crun.store
  local main = S.from_env{}
  if main:add("dist_init/file_closed", 1) == size then main:set("dist_init/file_closed_all", "1") end
  main:wait{"dist_init/file_closed_all"}
  local left = io.open(path)
  if left then left:close() end
  assert(not left, "the file store's file is left after every rank destroyed the group: " .. path)
end)

case("tcp", function()
  -- rank 0 hosts the tcp:// store, as torch does: it picks a free port (a
  -- server started and stopped, below the ephemeral range so that no other
  -- test's outgoing connection takes it meanwhile) and shares it through the
  -- job's store
  local S = crun.store
  local main = S.from_env{}
  local port
  if rank == 0 then
    repeat
      local ok, srv = pcall(S.server, {host = "127.0.0.1", port = 20000 + math.random(0, 12000)})
      if ok then port = srv:port(); srv:stop() end
    until port
    main:set("dist_init/port", tostring(port))
  else
    main:wait{"dist_init/port"}
    port = tonumber(main:get("dist_init/port"))
  end
  dist.init_process_group{init_method = "tcp://127.0.0.1:" .. port, rank = rank, world_size = size}
  sum_check()
  dist.barrier()
  dist.destroy_process_group()
end)

case("store", function()
  local s = crun.store.prefix("custom", crun.store.from_env{})
  dist.init_process_group{store = s, rank = rank, world_size = size}
  sum_check()
  dist.destroy_process_group()
end)

case("bad_arguments", function()
  expect_error("^ENOTSUP: backend 'nope'", dist.init_process_group, {backend = "nope"})
  expect_error("^EINVAL: init_process_group: unknown init_method", dist.init_process_group,
               {init_method = "udp://x"})
  expect_error("^EINVAL: init_process_group: rank 9 is out of range", dist.init_process_group,
               {rank = 9, world_size = 2})
  assert(not dist.is_initialized())
end)

case("timeout_option_reaches_the_group", function()
  dist.init_process_group{timeout = 12}
  assert(dist.group():timeout() == 12)
  dist.destroy_process_group()
end)

case("tensor_forms_check_sizes", function()
  -- a wrong size refuses the call for the group (every rank fails it, and the
  -- group stops, as for a fault on one rank alone): a new group for each
  dist.init_process_group{}
  local n = dist.get_world_size()
  expect_error("^EINVAL: all_gather_into_tensor: the output tensor has 3 elements, expected " .. 2 * n,
               dist.all_gather_into_tensor, T.zeros({3}), T.ones({2}))
  dist.destroy_process_group()
  dist.init_process_group{}
  expect_error("^EINVAL: reduce_scatter_tensor: the input tensor must be contiguous",
               dist.reduce_scatter_tensor, T.zeros({2}), T.zeros({2, 2 * n}):transpose(1, 2))
  dist.destroy_process_group()
  dist.init_process_group{}
  local out = T.zeros({n, 2}) -- any shape with the right element count
  dist.all_gather_into_tensor(out, T.full({2}, rank, "float32"))
  assert(out[n][2] == n - 1)
  dist.destroy_process_group()
end)

case("destroyed_group_raises", function()
  local pg = dist.init_process_group{}
  local w = dist.all_reduce(T.ones({4}), "sum", {async_op = true})
  dist.destroy_process_group()
  assert(w:wait() == true)         -- the work outlives the group handle
  expect_error("^ECLOSED: rank %d used a process group %(%d ranks?%) that was destroyed", pg.rank, pg)
  expect_error("^ECLOSED: rank %d called rank%(%) on a process group", function() return pg:rank() end)
  expect_error("^ECLOSED", pg.all_reduce, pg, T.ones({1}))
  w:__close()
  expect_error("^ECLOSED: the work handle was released", w.wait, w)
end)

out:write("done ", n, "\n")
out:close()

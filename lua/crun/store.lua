--- crun.store: key-value stores with torch.distributed's Store semantics.
--
--   local s = crun.store.tcp{host="127.0.0.1", port=29500, is_master=true, timeout=30}
--   s:set("k", "v"); s:get("k"); s:add("n", 1); s:wait{"k"}
--   s:queue_push("jobs", "a"); s:queue_pop("jobs", {timeout = 5}); s:queue_len("jobs")
--   s:list_keys() --> {"k", "n"} (sorted; queues have their own namespace)
--
-- Kinds: tcp (client of a server; is_master starts one in this process),
-- file (processes of one host share a file), hash (in-process) and prefix
-- (wraps another store). Every method of crun.Store is in bindings/store.c;
-- errors start with the status name ("ETIMEDOUT: ...").
local core = require "crun.core"
local O = require "crun.opts"

local M = {}

local TCP = O.spec{"host", "port", "is_master", "world_size", "timeout", "connect_timeout", "token", "async_set",
  aliases = {host_name = "host"},
  inert = {wait_for_workers = "a master with world_size always waits for the workers",
           multi_tenant = "every crun server serves any number of clients",
           use_libuv = "crun's server always runs on libuv"}}
local SERVER = O.spec{"host", "port", "token"}
local FILE = O.spec{"world_size"}
local FROM_ENV = O.spec{"host", "port", "is_master", "timeout", "world_size", "token"}

--- Opens a TCP store: {host=, port=, is_master=, world_size=, timeout=, connect_timeout=, token=,
-- async_set=}. port=0 with is_master=true picks a free port (see s:port()). token is the
-- job's secret that every connection proves (default: CRUN_TOKEN, which
-- crun-lua sets; "" for none): see the README's Security section.
-- set returns once sent, as torch's does (async_set, the default): its
-- failure surfaces at this store's next call (which is then not run), and
-- other clients see the key once one of this store's later calls returned or
-- after a dist.barrier() in this process (a get or wait of it simply waits).
-- async_set=false (or CRUN_STORE_ASYNC_SET=0) makes each set wait for the
-- server's acknowledgement (runtime/store/README.md).
function M.tcp(opts)
  if type(opts) ~= "table" then
    O.fail("EINVAL: crun.store.tcp: an options table is expected, got %s", type(opts))
  end
  return core.store_tcp(O.check(TCP, "crun.store.tcp", opts))
end

--- Opens (creating if needed) the file store at path: file(path[, {world_size=}])
-- (or file(path, world_size), as torch's FileStore(path, world_size)). Each
-- open counts as a user of the file until it is closed or collected; with
-- world_size the close that leaves no user, once world_size users closed,
-- removes the file. A process that dies without closing stays counted and
-- the file stays (as with torch).
function M.file(path, opts)
  if type(path) ~= "string" then
    O.fail("EINVAL: crun.store.file: the path must be a string, got %s", type(path))
  end
  if math.type(opts) == "integer" then opts = {world_size = opts} end
  opts = O.check(FILE, "crun.store.file", opts)
  return core.store_file(path, opts.world_size)
end

--- Creates an in-process store.
function M.hash()
  return core.store_hash()
end

--- Wraps store so that every key becomes "<prefix>/<key>".
function M.prefix(prefix, store)
  return core.store_prefix(prefix, store)
end

--- Starts a standalone TCP store server (host defaults to 127.0.0.1, port 0
-- picks a free one); returns an object with :port() and :stop().
function M.server(opts)
  opts = O.check(SERVER, "crun.store.server", opts)
  return core.store_server(opts.host, opts.port or 0, opts.token)
end

--- Builds a TCP store from the torchrun variables MASTER_ADDR / MASTER_PORT.
-- Under crun-lua (CRUN_LAUNCHER=1) the launcher hosts the server and every
-- rank is a client; otherwise rank 0 (RANK, default 0) hosts it, as torch's
-- env:// does. opts may override host, port, is_master, timeout, world_size;
-- the timeout defaults to CRUN_STORE_TIMEOUT (seconds) when that is set.
-- CRUN_STORE_PREFIX (set by crun-lua under --rdzv-backend c10d) puts every key
-- under that prefix, so jobs with different run ids share one store safely.
function M.from_env(opts)
  opts = O.check(FROM_ENV, "crun.store.from_env", opts)
  local env_port = os.getenv("MASTER_PORT")
  local port = opts.port or tonumber(env_port or "")
  if not port and env_port then
    O.fail("EINVAL: crun.store.from_env: MASTER_PORT is '%s', not a port number", env_port)
  elseif not port then
    O.fail("EINVAL: crun.store.from_env: MASTER_PORT is not set (run under crun-lua, or export MASTER_ADDR and MASTER_PORT)")
  end
  local rank = tonumber(os.getenv("RANK") or "0") or 0
  local is_master = opts.is_master
  if is_master == nil then
    is_master = os.getenv("CRUN_LAUNCHER") == nil and rank == 0
  end
  local env_timeout, timeout = os.getenv("CRUN_STORE_TIMEOUT"), opts.timeout
  if timeout == nil and env_timeout and env_timeout ~= "" then
    timeout = tonumber(env_timeout)
    if not timeout or timeout < 0 or timeout ~= timeout then
      O.fail("EINVAL: crun.store.from_env: CRUN_STORE_TIMEOUT is '%s', not a number of seconds >= 0", env_timeout)
    end
  end
  local s = core.store_tcp{
    host = opts.host or os.getenv("MASTER_ADDR") or "127.0.0.1",
    port = port,
    is_master = is_master,
    world_size = opts.world_size,
    timeout = timeout,
    token = opts.token,
  }
  -- crun-lua --rdzv-backend c10d: the endpoint's store may serve other run ids
  local prefix = os.getenv("CRUN_STORE_PREFIX")
  if prefix and prefix ~= "" then return core.store_prefix(prefix, s) end
  return s
end

--- Blocks until world_size ranks called barrier(store, name, ...) with the
-- same name, or raises "ETIMEDOUT: ..." after timeout seconds (default: the
-- store's). Reusable: the k-th use of a name waits for the k-th generation.
function M.barrier(store, name, world_size, rank, timeout)
  if type(name) ~= "string" then O.fail("EINVAL: crun.store.barrier: the name must be a string, got %s", type(name)) end
  O.int("crun.store.barrier", "world_size", world_size, 1)
  local key = "barrier/" .. name
  local n = store:add(key .. "/count", 1)
  local gen = (n - 1) // world_size
  local done = key .. "/done/" .. gen
  if n % world_size == 0 then store:set(done, "1") end
  local ok, err = pcall(store.wait, store, {done}, timeout)
  if not ok then
    if not tostring(err):match("^ETIMEDOUT") then error(err, 0) end
    local seen = tonumber(store:check{key .. "/count"} and store:get(key .. "/count")) or 0
    error(string.format("ETIMEDOUT: barrier '%s' on rank %s: %d of %d ranks arrived within %.3g s",
                        name, tostring(rank), seen - gen * world_size, world_size,
                        timeout or store:timeout()), 0)
  end
end

return M

--- crun: torch.distributed as a small C runtime, scripted in Lua 5.4.
-- `local crun = require "crun"`; submodules (crun.store, crun.tensor, crun.dist,
-- crun.nn, crun.optim, crun.data, ...) load on first use.
local core = require "crun.core"

local crun = {
  core = core,
  version = core.version,
  clock = core.clock,
  -- set_flush_denormal(true|false) -> supported: denormal floats become zero in
  -- this process's tensor math (off by default, as in torch)
  set_flush_denormal = core.set_flush_denormal,
  -- training shortcuts (lua/crun/ddp.lua, serialize.lua), loaded on call
  DDP = function(...) return require("crun.ddp").DDP(...) end,
  join = function(...) return require("crun.ddp").join(...) end,
  FSDP = function(...) return require("crun.fsdp").FSDP(...) end,
  save = function(...) return require("crun.serialize").save(...) end,
  load = function(...) return require("crun.serialize").load(...) end,
}

--- crun.lua_command() -> a shell command prefix that runs a Lua script with
-- crun available, for jobs that start helper processes: the interpreter this
-- script runs under (the lowest index of `arg`, as lua.c and crun-lua set it),
-- and for crun-lua a one-process job on a port of its own.
function crun.lua_command()
  local a = rawget(_G, "arg") or {}
  local i = 0
  while a[i - 1] ~= nil do i = i - 1 end
  local exe = i < 0 and a[i] or "lua5.4"
  local q = "'" .. tostring(exe):gsub("'", "'\\''") .. "'"
  if exe:match("crun%-lua$") then return q .. " -n 1 --master-port 0 --no-prefix" end
  return q
end

-- Submodules that load lazily from lua/crun/<name>.lua on first access.
local lazy = {
  store = true, tensor = true, dist = true, nn = true, optim = true,
  data = true, ddp = true, cuda = true, serialize = true, repl = true, comm_hooks = true, fsdp = true,
}

return setmetatable(crun, {
  __index = function(t, k)
    if lazy[k] then
      local m = require("crun." .. k)
      rawset(t, k, m)
      return m
    end
  end,
})

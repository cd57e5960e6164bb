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
  save = function(...) return require("crun.serialize").save(...) end,
  load = function(...) return require("crun.serialize").load(...) end,
}

-- Submodules that load lazily from lua/crun/<name>.lua on first access.
local lazy = {
  store = true, tensor = true, dist = true, nn = true, optim = true,
  data = true, ddp = true, serialize = true, repl = true,
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

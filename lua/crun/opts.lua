--- crun.opts: the one check every options table of the public API goes through.
--
--   local O = require "crun.opts"
--   local DDP_OPTS = O.spec{"group", "bucket_cap_mb",
--     aliases = {process_group = "group"},                 -- torch's name -> crun's
--     inert = {static_graph = "crun's reducer needs no graph hint"}}
--   opts = O.check(DDP_OPTS, "DDP", opts)                  -- nil -> {}, aliases renamed
--
-- An unknown key raises "EINVAL: DDP: unknown option 'x' (accepted: ...)"; an
-- inert key (accepted for torch's sake, no effect in crun) is dropped and
-- reported once per process, on rank 0 only, on stderr.
local M = {}

local warned = {}

--- Builds a spec from a list of accepted keys plus optional `aliases`
--- (alias -> key) and `inert` (key -> why it has no effect) maps.
function M.spec(t)
  local s = {known = {}, aliases = t.aliases or {}, inert = t.inert or {}}
  local names = {}
  for _, k in ipairs(t) do s.known[k] = true; names[#names + 1] = k end
  for k in pairs(s.aliases) do names[#names + 1] = k end
  for k in pairs(s.inert) do names[#names + 1] = k end
  table.sort(names)
  s.accepted = table.concat(names, ", ")
  return s
end

local function warn_inert(fname, key, why)
  local id = fname .. "\0" .. key
  if warned[id] then return end
  warned[id] = true
  local rank = os.getenv("RANK")
  if rank == nil or rank == "0" then
    io.stderr:write(string.format("crun: %s: option '%s' has no effect in crun (%s)\n", fname, key, why))
  end
end

--- Checks `opts` (nil or a table) against spec `s` for the call `fname`.
--- Returns `opts` itself when every key is known and none needs renaming,
--- otherwise a new table with aliases renamed and inert keys dropped.
function M.check(s, fname, opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(string.format("EINVAL: %s: options must be a table, got %s", fname, type(opts)), 0)
  end
  local copy
  for k, v in pairs(opts) do
    if not s.known[k] then
      local to, why = s.aliases[k], s.inert[k]
      if to == nil and why == nil then
        error(string.format("EINVAL: %s: unknown option '%s' (accepted: %s)", fname, tostring(k), s.accepted), 0)
      end
      if not copy then
        copy = {}
        for k2, v2 in pairs(opts) do copy[k2] = v2 end
      end
      copy[k] = nil
      if to ~= nil then
        if opts[to] ~= nil and opts[to] ~= v then
          error(string.format("EINVAL: %s: options '%s' and '%s' name the same thing with different values",
                              fname, k, to), 0)
        end
        copy[to] = v
      else
        warn_inert(fname, k, why)
      end
    end
  end
  return copy or opts
end

return M

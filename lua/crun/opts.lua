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

-- " (rank N)" when this process is one rank of a job (RANK is set), else "".
local function rank_suffix()
  local rank = os.getenv("RANK")
  return rank and (" (rank " .. rank .. ")") or ""
end

--- Raises string.format(fmt, ...) plus " (rank N)" under a job, with no
--- position prefix: the message starts with its status name ("EINVAL: ...")
--- so that pcall users can match it. Never returns.
function M.fail(fmt, ...)
  error(string.format(fmt, ...) .. rank_suffix(), 0)
end

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

--- Writes "crun: " .. string.format(fmt, ...) and a newline on stderr, the
--- first time this process reaches it with this `id`, on rank 0 only (or
--- outside a job): a warning that repeats nothing and floods no log.
function M.warn_once(id, fmt, ...)
  if warned[id] then return end
  warned[id] = true
  local rank = os.getenv("RANK")
  if rank == nil or rank == "0" then
    io.stderr:write("crun: " .. string.format(fmt, ...) .. "\n")
  end
end

local function warn_inert(fname, key, why)
  M.warn_once(fname .. "\0" .. key, "%s: option '%s' has no effect in crun (%s)", fname, key, why)
end

--- Returns v, or def when v is nil; raises "EINVAL: fname: what must be an
--- integer >= min, got v" otherwise.
function M.int(fname, what, v, min, def)
  if v == nil then v = def end
  if math.type(v) ~= "integer" or (min and v < min) then
    M.fail("EINVAL: %s: %s must be an integer%s, got %s", fname, what, min and (" >= " .. min) or "", tostring(v))
  end
  return v
end

--- Returns v, or def when v is nil; raises EINVAL unless v is a number >= min.
function M.num(fname, what, v, min, def)
  if v == nil then v = def end
  if type(v) ~= "number" or v ~= v or (min and v < min) then
    M.fail("EINVAL: %s: %s must be a number%s, got %s", fname, what, min and (" >= " .. min) or "", tostring(v))
  end
  return v
end

--- Returns v, or def when v is nil; raises EINVAL unless v is a boolean.
function M.bool(fname, what, v, def)
  if v == nil then v = def end
  if type(v) ~= "boolean" then
    M.fail("EINVAL: %s: %s must be true or false, got %s", fname, what, tostring(v))
  end
  return v
end

--- Checks `opts` (nil or a table) against spec `s` for the call `fname`.
--- Returns `opts` itself when every key is known and none needs renaming,
--- otherwise a new table with aliases renamed and inert keys dropped.
function M.check(s, fname, opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    M.fail("EINVAL: %s: options must be a table, got %s", fname, type(opts))
  end
  local copy
  for k, v in pairs(opts) do
    if not s.known[k] then
      local to, why = s.aliases[k], s.inert[k]
      if to == nil and why == nil then
        M.fail("EINVAL: %s: unknown option '%s' (accepted: %s)", fname, tostring(k), s.accepted)
      end
      if not copy then
        copy = {}
        for k2, v2 in pairs(opts) do copy[k2] = v2 end
      end
      copy[k] = nil
      if to ~= nil then
        if opts[to] ~= nil and opts[to] ~= v then
          M.fail("EINVAL: %s: options '%s' and '%s' name the same thing with different values", fname, k, to)
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

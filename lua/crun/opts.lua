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
-- reported once per process, on rank 0 only, on stderr. A `fixed` key
-- (fixed = {groups = 1}: torch's option, crun computes only that value) is
-- dropped silently when it holds that value (or a list of it: {1, 1}) and is
-- "ENOTSUP: nn.Conv2d: groups = 2 is not implemented ..." otherwise.
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
--- (alias -> key), `inert` (key -> why it has no effect) and `fixed` (key ->
--- the one value crun computes, torch's default) maps.
function M.spec(t)
  local s = {known = {}, aliases = t.aliases or {}, inert = t.inert or {}, fixed = t.fixed or {}}
  local names = {}
  for _, k in ipairs(t) do s.known[k] = true; names[#names + 1] = k end
  for k in pairs(s.aliases) do names[#names + 1] = k end
  for k in pairs(s.inert) do names[#names + 1] = k end
  for k in pairs(s.fixed) do names[#names + 1] = k end
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

--- The `fixed` value of an option whose torch default is None (max_norm,
--- divisor_override, weight): any value given is ENOTSUP.
M.NONE = setmetatable({}, {__tostring = function() return "None" end})

-- True when v is def, or a non-empty list of def only ({1, 1} for 1).
local function is_fixed_value(v, def)
  if v == def then return true end
  if def == M.NONE then return false end
  if type(v) ~= "table" or #v == 0 then return false end
  for k, x in pairs(v) do
    if math.type(k) ~= "integer" or x ~= def then return false end
  end
  return true
end

-- "2", "\"reflect\"" or "{2, 1}" for an option's value in a message.
local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) ~= "table" or v == M.NONE then return tostring(v) end
  local parts = {}
  for i = 1, #v do parts[i] = show(v[i]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- Raises as M.fail does; first, when given, hands the text to raise(fname,
-- text) (crun.dist refuses the call for its group there, see M.check).
local function check_fail(raise, fname, fmt, ...)
  local text = string.format(fmt, ...) .. rank_suffix()
  if raise then raise(fname, text) end
  error(text, 0)
end

-- Raises ENOTSUP unless fixed option k of fname holds the value crun computes.
local function check_fixed(fname, k, v, def, raise)
  if not is_fixed_value(v, def) then
    check_fail(raise, fname, "ENOTSUP: %s: %s = %s is not implemented (crun computes only torch's default, %s = %s)", fname, k,
      show(v), k, show(def))
  end
end

--- Checks the argument of a zero_grad (fname names it): torch's set_to_none,
--- positional or {set_to_none = }. false (and nil) is what crun does; true is
--- ENOTSUP: crun's gradients are tensors that every backward accumulates
--- into (a leaf written by the user need not report which it wrote), so there
--- is no "none" for an optimizer to skip, and zero-filling instead would
--- silently go on stepping (weight decay, momentum) a parameter that torch leaves.
function M.zero_grad_arg(fname, v)
  if type(v) == "table" then
    local o = M.check(M.spec{"set_to_none"}, fname, v)
    v = o.set_to_none
  end
  if v == nil or v == false then return end
  if v ~= true then M.fail("EINVAL: %s: set_to_none must be true or false, got %s", fname, tostring(v)) end
  M.fail("ENOTSUP: %s: set_to_none = true is not implemented: crun's gradients are tensors that backward " ..
    "accumulates into, and zero_grad zero-fills them (torch's set_to_none = false); call zero_grad() or " ..
    "zero_grad(false)", fname)
end

--- Checks `opts` (nil or a table) against spec `s` for the call `fname`.
--- Returns `opts` itself when every key is known and none needs renaming,
--- otherwise a new table with aliases renamed and inert keys dropped.
--- A fault raises; `raise`, when given, is called first with (fname, the
--- error's text) and may raise instead (crun.dist refuses the call there).
function M.check(s, fname, opts, raise)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    check_fail(raise, fname, "EINVAL: %s: options must be a table, got %s", fname, type(opts))
  end
  local copy
  for k, v in pairs(opts) do
    if not s.known[k] then
      local to, why, fixed = s.aliases[k], s.inert[k], s.fixed[k]
      if fixed ~= nil then check_fixed(fname, k, v, fixed, raise) end
      if to == nil and why == nil and fixed == nil then
        check_fail(raise, fname, "EINVAL: %s: unknown option '%s' (accepted: %s)", fname, tostring(k), s.accepted)
      end
      if not copy then
        copy = {}
        for k2, v2 in pairs(opts) do copy[k2] = v2 end
      end
      copy[k] = nil
      if to ~= nil then
        if opts[to] ~= nil and opts[to] ~= v then
          check_fail(raise, fname, "EINVAL: %s: options '%s' and '%s' name the same thing with different values", fname, k, to)
        end
        copy[to] = v
      elseif why ~= nil then
        warn_inert(fname, k, why)
      end
    end
  end
  return copy or opts
end

return M

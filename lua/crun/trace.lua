--- crun.trace: the timeline and the flight recorder from Lua (crun/trace.h;
-- README "Seeing a job").
--   crun.trace.span("data", function() ... end)   -- returns fn's results
-- With the timeline off (no --timeline / CRUN_TIMELINE / trace.start) span(name, fn)
-- just calls fn. While it is on, the nn modules' forward/backward, DDP's and
-- the optimizers' step are spans by themselves.
local core = require "crun.core"

local trace = {}
local enabled = core.trace_enabled()
local now, record = core.trace_now, core.trace_span
local wraps = {} -- every method that becomes a span while the timeline is on
local wrapped = setmetatable({}, {__mode = "k"}) -- class -> {method = true} once wrapped

--- enabled() -> whether the timeline records.
function trace.enabled() return enabled end

local function finish(name, cat, t0, ok, ...)
  record(name, cat, t0, now())
  if not ok then error((...), 0) end
  return ...
end

--- span(name, fn, ...) -> fn(...)'s results; records the span `name` around
-- the call (also when fn raises: the error goes on unchanged).
function trace.span(name, fn, ...)
  if type(name) ~= "string" then error("EINVAL: bad argument #1 to 'crun.trace.span' (string expected, got " .. type(name) .. ")", 2) end
  if type(fn) ~= "function" then error("EINVAL: bad argument #2 to 'crun.trace.span' (function expected, got " .. type(fn) .. ")", 2) end
  if not enabled then return fn(...) end
  return finish(name, "user", now(), pcall(fn, ...))
end

--- instant(name): a point on this rank's timeline.
function trace.instant(name) if enabled then core.trace_instant(name) end end

--- flush(): writes this process's part of the timeline now (also done at exit).
function trace.flush() core.trace_flush() end

--- dump([reason]) -> path: writes the flight recorder's ring now.
function trace.dump(reason) return core.flight_dump(reason) end

local function apply(w)
  local class, method, label, cat = w[1], w[2], w[3], w[4]
  local f = rawget(class, method)
  local done = wrapped[class] or {}
  if done[method] == f or not enabled or type(f) ~= "function" then return end
  local name = label .. "." .. method
  local g = function(...) return finish(name, cat, now(), pcall(f, ...)) end
  rawset(class, method, g)
  done[method], wrapped[class] = g, done
end

--- start(path): starts the timeline in this process now (before
-- init_process_group, so that the clocks get aligned), for a job that takes
-- --timeline itself; see finish().
function trace.start(path)
  core.trace_start(path)
  enabled = true
  for _, w in ipairs(wraps) do apply(w) end
end

--- stop(): stops the timeline and drops what it recorded (nothing is written).
function trace.stop()
  core.trace_start(nil)
  enabled = false
end

--- finish(path[, group]) -> summary text on rank 0 (nil elsewhere): every rank
-- (of group) writes its part, waits for the others (a barrier), and rank 0 (of
-- group) merges those ranks' parts into the trace started by trace.start
-- (crun.observe). The timeline
-- stops here. Raises (on rank 0) when the trace cannot be merged or written
-- (ENOTFOUND, EIO).
function trace.finish(path, group)
  local dist = require "crun.dist"
  core.trace_flush()
  trace.stop() -- the part is written: nothing more at exit
  dist.barrier{group = group}
  if dist.get_rank(group) ~= 0 then return nil end
  -- the parts are named by global rank: a subgroup's are its members'
  local members = group and dist.get_process_group_ranks(group) or dist.get_world_size()
  local text, err = require("crun.observe").merge(path, members)
  if not text then error(err, 0) end
  return text
end

--- mode([m]) -> previous mode: 0 nothing, 1 flight recorder, 2 timeline,
-- 3 both (what was configured only); for measuring the cost of recording.
function trace.mode(m) return core.trace_mode(m) end

-- _wrap(class, method, label, cat): while the timeline is on, class[method]
-- is a span "<label>.<method>" around the original (internal: nn, optim, ddp).
function trace._wrap(class, method, label, cat)
  local w = {class, method, label, cat}
  wraps[#wraps + 1] = w
  apply(w)
end

-- _watch(class, label): the same for forward/backward of an nn class, now
-- and as they are defined later (an nn.class made by user code).
function trace._watch(class, label)
  trace._wrap(class, "forward", label, "forward")
  trace._wrap(class, "backward", label, "backward")
  local mt = getmetatable(class) or {}
  local prev = mt.__newindex
  mt.__newindex = function(t, k, v)
    rawset(t, k, v)
    if k == "forward" or k == "backward" then trace._wrap(t, k, label, k) end
    if prev then prev(t, k, v) end
  end
  setmetatable(class, mt)
end

return trace

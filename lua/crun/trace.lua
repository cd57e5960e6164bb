--- crun.trace: spans on the timeline (see crun/trace.h and README "Seeing a job").
--   crun.trace.span("data", function() ... end)   -- returns fn's results
-- With the timeline off (no --timeline / CRUN_TIMELINE) span(name, fn) just
-- calls fn. The nn modules' forward/backward and the optimizers' step are
-- spans by themselves while the timeline is on.
local core = require "crun.core"

local trace = {}
local enabled = core.trace_enabled()
local now, record = core.trace_now, core.trace_span

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

-- wrap(class, method, label, cat): while the timeline is on, class[method]
-- becomes a span named "<label>.<method>" around the original (internal: nn,
-- optim and ddp call it).
function trace._wrap(class, method, label, cat)
  local f = rawget(class, method)
  if not enabled or type(f) ~= "function" then return end
  local name = label .. "." .. method
  rawset(class, method, function(...)
    return finish(name, cat, now(), pcall(f, ...))
  end)
end

-- _watch(class, label): wraps forward/backward of class now and as they are
-- defined later (an nn.class made by user code).
function trace._watch(class, label)
  if not enabled then return end
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

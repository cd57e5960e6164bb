--- crun.future: torch's Future over a crun.Work (w:get_future()).
--
--   local fut = dist.all_reduce(t, "sum", {async_op = true}):get_future()
--   local chained = fut:then_(function(f) return f:value()[1]:sum() end)
--   fut:wait()        -- {t}: the work's result list; raises the work's error
--   chained:wait()    -- the callback's value
--
-- `then` is a Lua keyword, so torch's fut.then(cb) is fut:then_(cb) here; the
-- callback runs on the caller's thread when the chained future is waited on
-- (or its value read after done() turned true).
local M = {}

local Future = {}
Future.__index = Future

--- Wraps a Work (or, internally, a parent future and a callback).
function M.new(work) return setmetatable({work = work}, Future) end

--- completed(value) -> a future already done with `value` (torch's
-- Future() + set_result).
function M.completed(value) return setmetatable({resolved = true, val = value}, Future) end

--- done() -> true once the value (or the error) is there; never blocks.
function Future:done()
  if self.resolved then return true end
  if self.work then return self.work:is_completed() end
  return self.parent:done()
end

--- wait() -> the value; raises the work's (or the callback's) error.
function Future:wait()
  if self.resolved then
    if self.err then error(self.err, 0) end
    return self.val
  end
  local ok, v
  if self.work then
    ok, v = pcall(function() self.work:wait(); return self.work:result() end)
  else
    ok, v = pcall(function() self.parent:wait(); return self.fn(self.parent) end)
  end
  self.resolved = true
  if ok then self.val = v else self.err = v end
  return self:wait()
end

--- value() -> the value of a done future; raises ESTATE while pending.
function Future:value()
  if not self:done() then error("ESTATE: Future:value(): the future is not done; call wait()", 0) end
  return self:wait()
end

--- then_(fn) -> a future whose value is fn(this_future).
function Future:then_(fn)
  if type(fn) ~= "function" then error("EINVAL: Future:then_: a function is expected", 0) end
  return setmetatable({parent = self, fn = fn}, Future)
end

Future.__tostring = function(f) return "crun.Future (" .. (f:done() and "done" or "pending") .. ")" end

return M

--- crun.cuda: devices, streams, events and device memory figures (torch.cuda).
--
--   local cuda = require "crun.cuda"
--   if cuda.is_available() then
--     local x = T.zeros({1024}, "float32", {device = "cuda"})   -- current device
--     local s = cuda.Stream()
--     cuda.set_stream(s)            -- this thread's work on the device goes to s
--     local e = cuda.Event{enable_timing = true}:record()
--     print(cuda.memory_allocated(), cuda.memory_reserved(), cuda.max_memory_allocated())
--   end
--
-- Devices are numbered from 0 (as torch's); under crun-lua each worker starts
-- on device LOCAL_RANK % device_count() (CRUN_CUDA_DEVICE overrides it).
-- Without a device every call but is_available / device_count /
-- unavailable_reason raises "ENOTSUP: no CUDA device (cudaGetDeviceCount: ...)"
-- or "ENOTSUP: ... crun was built without CUDA".
local core = require "crun.core"
local C = core.cuda
local O = require "crun.opts"

local M = {
  built = C.built,              -- true when this crun was compiled with CUDA
  is_available = C.is_available, -- true when a device is visible
  unavailable_reason = C.unavailable_reason, -- nil when available, else the text
  device_count = C.device_count, -- 0 without a device
  set_device = C.set_device,     -- set_device(dev): this thread's device
  current_device = C.current_device,
  empty_cache = C.empty_cache,   -- empty_cache([dev]): pool memory back to the driver
  reset_peak_memory_stats = C.reset_peak,
}

--- device_index(d) -> -1 for the host, else the device number. d may be
--- "cpu", "cuda" (the current device), "cuda:N", an integer N (cuda:N, as
--- torch's t.to(0)) or nil (the current device).
function M.device_index(d, fname)
  fname = fname or "device"
  if d == nil or d == "cuda" then return C.current_device() end
  if d == "cpu" or d == -1 then return -1 end
  if math.type(d) == "integer" and d >= 0 then return d end
  if type(d) == "string" then
    local n = d:match("^cuda:(%d+)$")
    if n then return math.tointeger(tonumber(n)) end
  end
  O.fail("EINVAL: %s: unknown device '%s' (expected \"cpu\", \"cuda\", \"cuda:N\" or an integer)", fname, tostring(d))
end

--- device_name(i) -> "cpu" or "cuda:i"
function M.device_name(i) return i < 0 and "cpu" or ("cuda:" .. i) end

-- Reads an optional device argument (the current device when nil).
local function dev_arg(d, fname)
  local i = M.device_index(d, fname)
  if i < 0 then O.fail("EINVAL: %s: needs a CUDA device, got cpu", fname) end
  return i
end

--- synchronize([dev]): waits on the host for all work queued on the device.
function M.synchronize(d) return C.synchronize(d == nil and -1 or dev_arg(d, "cuda.synchronize")) end

--- memory_allocated([dev]) / memory_reserved([dev]) / max_memory_allocated([dev])
--- -> bytes: live tensors / what the pool holds / the peak of the first.
function M.memory_allocated(d) return (C.memory(dev_arg(d, "cuda.memory_allocated"))) end
function M.memory_reserved(d) return select(2, C.memory(dev_arg(d, "cuda.memory_reserved"))) end
function M.max_memory_allocated(d) return select(3, C.memory(dev_arg(d, "cuda.max_memory_allocated"))) end

--- memory_stats([dev]) -> {allocated = , reserved = , peak = }
function M.memory_stats(d)
  local a, r, p = C.memory(dev_arg(d, "cuda.memory_stats"))
  return {allocated = a, reserved = r, peak = p}
end

--- Stream([dev] | {device = }) -> a new stream; current_stream([dev]),
--- default_stream([dev]); set_stream(s) makes s current on its device.
function M.Stream(opts)
  local d = type(opts) == "table" and opts.device or opts
  return C.Stream(d == nil and -1 or dev_arg(d, "cuda.Stream"))
end
function M.current_stream(d) return C.current_stream(d == nil and -1 or dev_arg(d, "cuda.current_stream")) end
function M.default_stream(d) return C.default_stream(d == nil and -1 or dev_arg(d, "cuda.default_stream")) end
M.set_stream = C.set_stream

local EVENT = O.spec{"enable_timing", "device", inert = {blocking = "crun's events are waited with synchronize()",
                                                         interprocess = "crun shares no events between processes"}}

--- Event{enable_timing = false, device = current} -> an event:
--- e:record([stream]) (returns e), e:wait([stream]), e:query(),
--- e:synchronize(), e:elapsed_time(later) -> milliseconds.
function M.Event(opts)
  opts = O.check(EVENT, "cuda.Event", opts)
  return C.Event(opts.enable_timing and true or false, opts.device == nil and -1 or dev_arg(opts.device, "cuda.Event"))
end

return M

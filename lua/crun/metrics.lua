--- crun.metrics: training curves for TensorBoard and for plain tools.
-- `SummaryWriter(logdir)` writes scalars and histograms as a TensorBoard
-- event file (`tensorboard --logdir DIR` shows them) and the same scalars as
-- `scalars.csv` (tag,step,value,wall_time) next to it, appended to a row at a
-- time (writers and runs sharing the directory keep every row). The encoding runs in C
-- (bindings/metrics.c: protobuf-c messages, CRC-32C framed records).
--
--    local w = crun.metrics.SummaryWriter("runs/exp1")   -- or a to-be-closed local
--    w:add_scalar("loss", 0.25, step)
--    w:add_histogram("fc1.weight", model.params[1], step)
--    w:close()
-- @module crun.metrics
local core = require "crun.core"
local O = require "crun.opts"

local M = {}

local WRITER = O.spec{"filename_suffix", inert = {
  comment = "crun takes the log directory as given",
  purge_step = "crun appends; it does not purge events of a crashed run",
  max_queue = "the event file is written out at flush(), close() or collection; scalars.csv row by row",
  flush_secs = "the event file is written out at flush(), close() or collection; scalars.csv row by row"}}

--- Whether this build can write event files (protobuf-c was found at
-- configure time).
M.available = core.have_metrics == true

--- Opens a writer on logdir (created with its parents when missing).
-- @tparam string logdir directory of the event file and the CSV
-- @tparam[opt] table opts `filename_suffix`: appended to both file names
--   (for several writers in one directory); torch's `comment`, `purge_step`,
--   `max_queue` and `flush_secs` have no effect (reported once); any other
--   key is EINVAL
-- @return a writer with `add_scalar(tag, value, step [, wall_time])`,
--   `add_histogram(tag, tensor_or_values, step [, bins [, wall_time]])`,
--   `flush()`, `close()` (also `<close>` and garbage collection) and
--   `paths()` (event file, CSV)
-- @raise `ENOTSUP` when built without protobuf-c; `EIO` when a file cannot be created; `EINVAL` for a bad option
function M.SummaryWriter(logdir, opts)
  if not M.available then
    error("ENOTSUP: crun.metrics.SummaryWriter: this build has no protobuf-c or CRUN_WITH_METRICS=OFF " ..
      "(apt-get install libprotobuf-c-dev protobuf-c-compiler, then rebuild)", 0)
  end
  if type(logdir) ~= "string" then
    error("EINVAL: bad argument #1 to 'SummaryWriter' (string expected, got " .. type(logdir) .. ")", 0)
  end
  local suffix = O.check(WRITER, "SummaryWriter", opts).filename_suffix or ""
  if type(suffix) ~= "string" then O.fail("EINVAL: SummaryWriter: filename_suffix must be a string, got %s", type(suffix)) end
  return core.summary_writer(logdir, suffix)
end

return M

-- gpu_gate.lua — runs a GPU spec only where a CUDA device is present.
--   lua5.4 tests/gpu_double/gpu_gate.lua <command> [args...]
-- Without a device (or in a build without CUDA) it prints why and exits
-- 77, which ctest reports as skipped (SKIP_RETURN_CODE 77), never as a
-- pass. With one it runs the command and exits with its status.
local ok, crun = pcall(require, "crun")
local why
if not ok then
  why = "crun did not load: " .. tostring(crun)
elseif not crun.cuda.is_available() then
  why = (crun.cuda.unavailable_reason() or "no CUDA device"):gsub("^ENOTSUP: ", "")
end
if why then
  io.write("SKIPPED: ", why, "; the same spec runs through the CUDA test double as ctest gpudouble.*\n")
  os.exit(77)
end
local words = {}
for i = 1, #arg do words[i] = "'" .. arg[i]:gsub("'", "'\\''") .. "'" end
local _, how, code = os.execute(table.concat(words, " "))
if how == "signal" then os.exit(128 + code) end
os.exit(code)

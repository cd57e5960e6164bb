-- mpi_run.lua — runs crun-lua jobs under Open MPI's mpirun for the mpi specs
-- (each process runs the script in-process as the rank mpirun assigns).
--   available() -> true, or false and why
--   run(n, script, args, {limit=, env=}) -> exit code, output
-- Output files are read back with helpers.dist_run (lines/text/cleanup).
local M = {}

-- Loopback only (the tcp BTL skips 127.0.0.0/8 by default), any number of
-- ranks on 2 cores, and root allowed (CI containers).
M.MPIRUN = "mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo " ..
           "--mca oob_tcp_if_include lo"

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.available()
  local ok, core = pcall(require, "crun.core")
  if not ok or not core.have_mpi then return false, "crun was built without MPI" end
  if not os.getenv("CRUN_LUA") then return false, "CRUN_LUA is not set" end
  if not os.execute("command -v mpirun >/dev/null 2>&1") then return false, "mpirun is not installed" end
  return true
end

function M.run(n, script, args, opts)
  opts = opts or {}
  local env = "unset CRUN_BACKEND CRUN_LAUNCHER RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE; "
  for k, v in pairs(opts.env or {}) do env = env .. k .. "=" .. sh_quote(v) .. " " end
  local cmd = string.format("%stimeout -s KILL %d %s -np %d %s %s %s", env, opts.limit or 120, M.MPIRUN, n,
                            sh_quote(os.getenv("CRUN_LUA")), sh_quote(script), args or "")
  local p = io.popen("{ " .. cmd .. "; } 2>&1")
  local out = p:read("a")
  local _, _, code = p:close()
  return code, out
end

return M

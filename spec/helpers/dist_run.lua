-- dist_run.lua — launches multi-rank jobs for the dist/collectives specs and
-- reads back what every rank wrote.
--   run(n, script, args, {limit=, direct=, env="K=V ..."}) -> exit code, output
-- By default the job runs under `$CRUN_LUA -n N --master-port 0`; direct=true
-- (or CRUN_SPEC_DIRECT=1) starts N lua5.4 processes with RANK/WORLD_SIZE/
-- MASTER_* set instead (rank 0 hosts the store), for cases where the
-- launcher's own supervision (stopping the other ranks when one dies) would
-- hide what the runtime does.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local M = {}

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.tmpdir()
  local p = tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p " .. sh_quote(p)))
  return p
end

-- A port for the store of a direct job: below Linux's ephemeral range
-- (32768 and up), so no outgoing connection of a test running beside this one
-- can hold it.
local function direct_port()
  return 20000 + math.random(0, 12000)
end

local function direct_cmd(n, script, args, limit)
  local port = direct_port()
  local parts = {"unset CRUN_LAUNCHER; pids=();"}
  for r = 0, n - 1 do
    parts[#parts + 1] = string.format(
      "(RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d MASTER_ADDR=127.0.0.1 MASTER_PORT=%d " ..
      "timeout -s KILL %d lua5.4 %s %s 2>&1 | sed 's/^/[%d] /'; exit ${PIPESTATUS[0]}) & pids+=($!);",
      r, n, r, n, port, limit, sh_quote(script), args, r)
  end
  parts[#parts + 1] = 'rc=0; for p in "${pids[@]}"; do wait $p || rc=1; done; exit $rc'
  return "bash -c " .. sh_quote(table.concat(parts, " "))
end

function M.run(n, script, args, opts)
  opts = opts or {}
  local limit = opts.limit or 120
  args = args or ""
  local cmd
  local direct = opts.direct or os.getenv("CRUN_SPEC_DIRECT") or not os.getenv("CRUN_LUA")
  if direct then
    cmd = direct_cmd(n, script, args, limit)
  else
    cmd = string.format("timeout -s KILL %d %s -n %d --master-port 0 %s %s", limit,
                        os.getenv("CRUN_LUA"), n, sh_quote(script), args)
  end
  if opts.env then cmd = "env " .. opts.env .. " " .. cmd end
  local p = io.popen("{ " .. cmd .. "; } 2>&1")
  local out = p:read("a")
  local _, _, code = p:close()
  if direct and not opts.retried and out:find("EADDRINUSE: store server: cannot listen", 1, true) then
    return M.run(n, script, args, setmetatable({retried = true}, {__index = opts}))  -- another port
  end
  return code, out
end

--- Returns the lines rank r wrote to <dir>/rank<r>.txt (empty if none).
function M.lines(dir, r)
  local f = io.open(dir .. "/rank" .. r .. ".txt")
  if not f then return {} end
  local t = {}
  for l in f:lines() do t[#t + 1] = l end
  f:close()
  return t
end

--- Returns the whole text rank r wrote ("" if none).
function M.text(dir, r) return table.concat(M.lines(dir, r), "\n") end

function M.cleanup(dir) os.execute("rm -rf " .. sh_quote(dir)) end

return M

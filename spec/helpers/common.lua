--- What many specs repeat: quoting for sh, temporary directories, reading
-- and writing files, polling with a deadline, and running crun-lua (in the
-- foreground bounded by a timeout, or in the background).
local M = {}

M.CRUN_LUA = os.getenv("CRUN_LUA")
M.SOURCE = os.getenv("CRUN_SOURCE_DIR") or "."

--- Quotes one word for sh.
function M.q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

--- The whole content of the file at `path`, or nil when it cannot be read.
function M.slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- How many times the Lua pattern `pat` matches in `s`.
function M.count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

--- Writes `s` to the file at `path` (replacing it).
function M.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

--- Where temporary files go: $TMPDIR, which ctest sets to a directory of the
-- spec's own, removed after it (tests/tmpdir_run.sh); /tmp without one.
M.TMP = (os.getenv("TMPDIR") or "") ~= "" and os.getenv("TMPDIR") or "/tmp"

--- A fresh directory M.TMP/crun-<tag>-spec.XXXXXX (removed by M.rmrf).
function M.tmpdir(tag)
  local p = io.popen("mktemp -d " .. M.q(M.TMP .. "/crun-" .. tag .. "-spec.XXXXXX"))
  local d = p:read("l")
  p:close()
  return d
end

--- A fresh empty file M.TMP/lua_XXXXXX: os.tmpname() under TMPDIR (Lua's
-- own always makes it in /tmp, where a spec's leftovers would stay).
function M.tmpname()
  local p = io.popen("mktemp " .. M.q(M.TMP .. "/lua_XXXXXX"))
  local name = p:read("l")
  p:close()
  return assert(name, "mktemp: cannot create a file in " .. M.TMP)
end

--- Removes a directory made by M.tmpdir (and nothing else).
function M.rmrf(dir)
  if dir and dir:sub(1, #M.TMP + 1) == M.TMP .. "/" and dir:sub(#M.TMP + 2):match("^crun%-[%w_]+%-spec%.[%w]+$") then
    os.execute("rm -rf " .. M.q(dir))
  end
end

--- Sleeps `s` seconds (fractions too) without a busy loop.
function M.sleep(s)
  os.execute("sleep " .. s)
end

--- Factor on the specs' own deadlines: CRUN_SAN_TIMEOUT_SCALE in a
-- sanitizer build (scripts/san_run.sh sets it; its `timeout` scales those
-- given to timeout(1)), 1 otherwise.
M.TIME_SCALE = tonumber(os.getenv("CRUN_SAN_TIMEOUT_SCALE") or "") or 1

--- Calls f every 50 ms until it returns a truthy value (returned) or
-- `timeout` seconds (times TIME_SCALE) pass (nil).
function M.wait_for(f, timeout)
  local deadline = os.time() + timeout * M.TIME_SCALE
  while true do
    local v = f()
    if v then return v end
    if os.time() > deadline then return nil end
    M.sleep(0.05)
  end
end

--- This process's effective user id (as a string).
function M.uid()
  local p = io.popen("id -u")
  local u = p:read("l")
  p:close()
  return u
end

local function crun_lua()
  return M.q(assert(M.CRUN_LUA, "CRUN_LUA must point at the built crun-lua"))
end

--- Runs `crun-lua <args>` (args already quoted for sh) from the source dir,
-- killed after opts.timeout seconds (default 60); opts.env is an env prefix
-- ("A=1 B=2"), opts.input text for its stdin (else it inherits ours).
-- Returns {code=, out=, err=, seconds=}.
function M.run(args, opts)
  opts = opts or {}
  local dir = M.tmpdir("run")
  local stdin = ""
  if opts.input then
    M.write(dir .. "/in", opts.input)
    stdin = "<" .. dir .. "/in"
  end
  local cmd = string.format("cd %s && %s timeout -s KILL %d %s %s %s >%s/out 2>%s/err",
    M.q(M.SOURCE), opts.env or "", opts.timeout or 60, crun_lua(), args, stdin, dir, dir)
  local t0 = os.time()
  local _, _, code = os.execute(cmd)
  local r = {code = code, out = M.slurp(dir .. "/out") or "", err = M.slurp(dir .. "/err") or "",
             seconds = os.time() - t0}
  M.rmrf(dir)
  return r
end

--- Starts `crun-lua <args>` in the background from the source dir, its
-- output in dir/out and dir/err, its exit code in dir/rc once it ended;
-- `stdin` an optional redirection ("<path"), `env` an env prefix. Returns
-- its pid (an error when it did not start within 10 s).
function M.spawn(dir, args, env, stdin)
  local script = string.format(
    "cd %s && { %s %s %s %s >%s/out 2>%s/err & echo $! >%s/pid.tmp; mv %s/pid.tmp %s/pid;"
    .. " wait $!; echo $? >%s/rc.tmp; mv %s/rc.tmp %s/rc; } 2>/dev/null &",
    M.q(M.SOURCE), env or "", crun_lua(), args, stdin or "", dir, dir, dir, dir, dir, dir, dir, dir)
  os.execute(script)
  assert(M.wait_for(function() return M.slurp(dir .. "/pid") end, 10), "crun-lua did not start")
  return tonumber(M.slurp(dir .. "/pid"))
end

--- The exit code of a process started by M.spawn in `dir`, waiting up to
-- `timeout` seconds; nil when it has not ended by then.
function M.wait_rc(dir, timeout)
  return tonumber(M.wait_for(function() return M.slurp(dir .. "/rc") end, timeout))
end

--- Asserts that each case {f, pattern} of the list raises an error that
--- matches pattern (a failure names the case's index).
function M.each_raises(cases)
  local assert = require "luassert"
  for i, c in ipairs(cases) do
    local ok, err = pcall(c[1])
    assert.is_false(ok, "case " .. i)
    assert.matches(c[2], err)
  end
end

return M

--- Helpers for the REPL specs: run crun-lua -i with piped input, in the
-- background with a fifo, or inside tmux (a real terminal).
local M = {}

local C = require("helpers.common")

M.CRUN_LUA = assert(C.CRUN_LUA, "CRUN_LUA must point at the built crun-lua")
M.SOURCE = C.SOURCE
M.count = C.count
M.q, M.slurp, M.write, M.rmrf, M.sleep, M.wait_for = C.q, C.slurp, C.write, C.rmrf, C.sleep, C.wait_for

function M.tmpdir() return C.tmpdir("repl") end

--- Runs `crun-lua <args>` with `input` on its stdin (a pipe). Returns
-- {code=, out=, err=}. Bounded by `timeout` seconds (default 60).
function M.run(args, input, env, timeout)
  return C.run(args, {input = input, env = env, timeout = timeout})
end

--- Starts crun-lua in the background reading a fifo; returns a handle:
-- h:send(text), h:signal(name), h:close() (EOF), h:wait(timeout) -> {code, out, err},
-- h:out(), h:err().
function M.start(args, env)
  local dir = M.tmpdir()
  assert(os.execute("mkfifo " .. M.q(dir .. "/in")))
  local h = {dir = dir, pid = C.spawn(dir, args, env, "<" .. dir .. "/in")}
  -- a holder keeps the fifo open for writing until h:close(), so that each
  -- h:send() does not end the input
  os.execute(string.format("{ sleep 600 >%s/in & echo $! >%s/holder.tmp; mv %s/holder.tmp %s/holder; }",
    dir, dir, dir, dir))
  assert(M.wait_for(function() return M.slurp(dir .. "/holder") end, 10))
  h.holder = tonumber(M.slurp(dir .. "/holder"))
  function h:send(text)
    local f = assert(io.open(dir .. "/in", "ab"))
    f:write(text)
    f:close()
  end
  function h:signal(name) os.execute("kill -" .. name .. " " .. self.pid) end
  function h:close() os.execute("kill " .. self.holder .. " 2>/dev/null") end
  -- For finally(): ends whatever is left of a session a failed spec abandoned.
  function h:cleanup()
    if self.done then return end
    self:close()
    if not M.slurp(dir .. "/rc") then os.execute("kill -TERM " .. self.pid .. " 2>/dev/null") end
    C.wait_rc(dir, 10)
    M.rmrf(dir)
  end
  function h:out() return M.slurp(dir .. "/out") or "" end
  function h:err() return M.slurp(dir .. "/err") or "" end
  function h:wait(timeout)
    local rc = C.wait_rc(dir, timeout or 30)
    self:close()
    if not rc then
      os.execute("kill -KILL " .. self.pid .. " 2>/dev/null")
      error("crun-lua (pid " .. self.pid .. ") did not exit in time; out:\n" .. self:out() .. "\nerr:\n" .. self:err())
    end
    local r = {code = rc, out = self:out(), err = self:err()}
    self.done = true
    M.rmrf(dir)
    return r
  end
  return h
end

--- The pids listed by :ranks output ("[r] pid N ...").
function M.pids(text)
  local t = {}
  for r, pid in text:gmatch("%[(%d+)%] pid (%d+)") do t[tonumber(r)] = tonumber(pid) end
  return t
end

--- Whether process pid exists (zombies count as gone).
function M.alive(pid)
  local s = M.slurp("/proc/" .. pid .. "/stat")
  return s ~= nil and not s:match("%) [ZX] ")
end

-- ---------------------------------------------------------------- tmux

local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local s = p:read("a")
  p:close()
  return s
end

--- Starts `crun-lua <args>` in a detached tmux session of its own server.
-- Returns a handle: t:type(text) (literal), t:keys(...) (key names: Enter,
-- C-c, Up; a word like "end" is a key name too), t:screen(), t:wait_screen(pat, timeout),
-- t:dead() (crun-lua's exit code once it ended), t:kill().
function M.tmux(args, env)
  local sock = "crun-repl-spec-" .. sh("echo $$"):match("%d+") .. "-" .. math.random(1, 1e9)
  local t = {sock = sock, rcfile = C.TMP .. "/" .. sock .. ".rc"}
  -- the server's socket under TMPDIR (TMUX_TMPDIR), not in the shared /tmp/tmux-<uid>
  local function tm(rest) return sh("TMUX_TMPDIR=" .. C.q(C.TMP) .. " tmux -L " .. sock .. " " .. rest) end
  -- the exit code goes to a file: tmux may notice the end of the pane late
  local inner = string.format("cd %s && %s %s %s; echo $? >%s.tmp; mv %s.tmp %s", M.q(M.SOURCE),
    env or "", M.q(M.CRUN_LUA), args, t.rcfile, t.rcfile, t.rcfile)
  tm("-f /dev/null new-session -d -x 120 -y 50 -s repl " .. M.q(inner))
  tm("set-option -t repl remain-on-exit on")
  function t:keys(...)
    local words = {}
    for i, k in ipairs({...}) do words[i] = M.q(k) end
    tm("send-keys -t repl " .. table.concat(words, " "))
  end
  function t:type(text) tm("send-keys -l -t repl " .. M.q(text)) end
  function t:screen() return tm("capture-pane -p -t repl -S -200") end
  function t:wait_screen(pat, timeout)
    return M.wait_for(function() return self:screen():find(pat) and true end, timeout or 20)
  end
  function t:dead()
    local rc = M.slurp(self.rcfile)
    return rc and rc:match("%d+")
  end
  function t:kill()
    tm("kill-server")
    os.remove(self.rcfile)
  end
  return t
end

return M

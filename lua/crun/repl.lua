--- crun.repl: the interactive mode of crun-lua (-i).
--
-- Two sides meet on the TCP store that the launcher serves:
--   * the front end (the launcher process, launcher/repl.c) reads chunks,
--     sets crun/repl/<n>/chunk = "<targets>\n<source>" and waits for
--     crun/repl/<n>/out/<rank> = "<kind>\n<text>" from every target rank,
--     then shows the results grouped: ranks with identical output share a line.
--   * every worker (launcher/repl_worker.c) runs the user script, initializes
--     the default process group, then takes chunk after chunk in order, runs
--     those it is a target of with print/io.write captured, and reports.
-- Other keys: pid/<rank> (set first), ready/<rank> (after the script and
-- init_process_group), state/<rank> ("idle <n>" or "running <n> <os.time>").
-- The chunk "!quit" ends every worker. Nothing here blocks without a
-- deadline: waits are short slices between which signals and liveness are
-- checked.
local M = {}

M.PREFIX = "crun/repl/"
M.QUIT = "!quit"
M.SLICE = 0.2          -- seconds of one store wait in the front end
M.WORKER_SLICE = 2.0   -- seconds of one store wait in an idle worker
M.MAX_OUTPUT = 64 << 20 -- bytes of one rank's result shown; the rest is cut
M.TIMEOUT_GRACE = 5.0  -- seconds to wait for ranks interrupted at the chunk timeout

local P = M.PREFIX

-- ---------------------------------------------------------------- rank sets

--- "[0-3]", "[0,2]", "[0-1,3]" for a sorted list of ranks.
function M.format_ranks(list)
  local parts, i = {}, 1
  while i <= #list do
    local j = i
    while j < #list and list[j + 1] == list[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and (list[i] .. "-" .. list[j]) or tostring(list[i])
    i = j + 1
  end
  return "[" .. table.concat(parts, ",") .. "]"
end

--- Parses "0,2", "1-3", "0,2-3" or "all" into a sorted list of distinct
-- ranks below world. Returns the list, or nil and a message.
function M.parse_ranks(spec, world)
  if spec == "all" or spec == "*" then
    local all = {}
    for r = 0, world - 1 do all[#all + 1] = r end
    return all
  end
  local seen, list = {}, {}
  for item in (spec .. ","):gmatch("([^,]*),") do
    local a, b = item:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
    if not a then a = item:match("^%s*(%d+)%s*$"); b = a end
    if not a then
      return nil, string.format("bad rank list '%s': expected ranks like 0,2 or 1-3", spec)
    end
    a, b = math.tointeger(tonumber(a)), math.tointeger(tonumber(b)) -- nil past 2^63: no such rank
    if not a or not b then
      return nil, string.format("bad rank '%s' in '%s': the world has ranks 0-%d", item, spec, world - 1)
    end
    if a > b then return nil, string.format("bad rank range '%s' in '%s'", item, spec) end
    for r = a, b do
      if r >= world then
        return nil, string.format("no rank %d: the world has ranks 0-%d", r, world - 1)
      end
      if not seen[r] then seen[r] = true; list[#list + 1] = r end
    end
  end
  table.sort(list)
  return list
end

-- ---------------------------------------------------------------- grouping

--- Groups results ({[rank] = {kind=, text=}}) of the ranks in `order`:
-- ranks with the same kind and text share a group. Returns a list of
-- {ranks = {...}, kind =, text =} ordered by each group's lowest rank.
function M.group(results, order)
  local groups, by_key = {}, {}
  for _, r in ipairs(order) do
    local res = results[r]
    if res then
      local key = res.kind .. "\0" .. res.text
      local g = by_key[key]
      if not g then
        g = {ranks = {}, kind = res.kind, text = res.text}
        by_key[key] = g
        groups[#groups + 1] = g
      end
      g.ranks[#g.ranks + 1] = r
    end
  end
  return groups
end

--- Renders one group: the first line after its rank label, the others
-- indented under it. Returns "" for a group with nothing to show.
function M.render_group(g)
  local text = g.text:gsub("\n$", "")
  if text == "" then return "" end
  local label = M.format_ranks(g.ranks)
  local pad = string.rep(" ", #label + 1)
  local out, first = {}, true
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    out[#out + 1] = (first and (label .. " ") or pad) .. line
    first = false
  end
  return table.concat(out, "\n") .. "\n"
end

--- Renders groups: returns the text for stdout (kind "ok") and for stderr
-- (errors, dead or abandoned ranks), in rank order within each.
function M.render(groups)
  local out, err = {}, {}
  for _, g in ipairs(groups) do
    local s = M.render_group(g)
    if g.kind == "ok" then out[#out + 1] = s else err[#err + 1] = s end
  end
  return table.concat(out), table.concat(err)
end

-- ---------------------------------------------------------------- worker

--- The first part of a worker's life, before the user script: connects to
-- the store and announces this process. h carries the C helpers (pid, run).
function M.worker_begin(h)
  local crun = require "crun"
  local rank = tonumber(os.getenv("RANK") or "")
  local world = tonumber(os.getenv("WORLD_SIZE") or "")
  if not rank or not world then
    error("EINVAL: crun.repl: RANK and WORLD_SIZE must be set (start it with crun-lua -i)", 0)
  end
  local store = crun.store.from_env()
  store:set(P .. "pid/" .. rank, tostring(h.pid))
  return {h = h, store = store, rank = rank, world = world}
end

-- Keeps the traceback lines down to the user's code: the REPL's own frames
-- (from the C helper h.run that called the chunk on) are noise.
local function trim_traceback(tb)
  local lines = {}
  for line in (tb .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  for i, line in ipairs(lines) do
    if line:find("crun/repl.lua:", 1, true) then
      local last = i - 1
      if last >= 1 and lines[last]:match("^\t%[C%]: in field 'run'$") then last = last - 1 end
      return table.concat(lines, "\n", 1, last)
    end
  end
  return tb
end

local function message_handler(m)
  if type(m) ~= "string" then
    local mt = getmetatable(m)
    if mt and mt.__tostring then m = tostring(m)
    else m = string.format("(error object is a %s value)", type(m)) end
  end
  return debug.traceback(m, 2)
end

-- Replacements for print and io.write that append to buf.
local function capture(buf)
  local function cprint(...)
    for i = 1, select("#", ...) do
      if i > 1 then buf[#buf + 1] = "\t" end
      buf[#buf + 1] = tostring((select(i, ...)))
    end
    buf[#buf + 1] = "\n"
  end
  local function cwrite(...)
    for i = 1, select("#", ...) do
      local v = select(i, ...)
      local t = type(v)
      if t ~= "string" and t ~= "number" then
        error(string.format("EINVAL: bad argument #%d to 'write' (string expected, got %s)", i, t), 0)
      end
      buf[#buf + 1] = tostring(v)
    end
    return io.stdout
  end
  return cprint, cwrite
end

--- Runs chunk source `src` in the global environment with print and
-- io.write captured; h.run arms the Ctrl-C hook around it. Returns kind
-- ("ok" or "err") and the text to show (printed output, then the values or
-- the error with its traceback).
function M.run_chunk(h, src, on_err)
  local fn, err = load(src, "=stdin", "t")
  if not fn then return "err", err end
  local buf = {}
  local cprint, cwrite = capture(buf)
  local saved_print, saved_write = print, io.write
  print, io.write = cprint, cwrite
  local res = table.pack(h.run(fn, message_handler))
  if print == cprint then print = saved_print end        -- the chunk may have
  if io.write == cwrite then io.write = saved_write end  -- replaced them itself
  if not res[1] then
    local msg = trim_traceback(tostring(res[2]))
    if on_err then msg = on_err(msg) end
    return "err", table.concat(buf) .. msg
  end
  if res.n > 1 then cprint(table.unpack(res, 2, res.n)) end
  return "ok", table.concat(buf)
end

-- The collective timeout of the REPL's process group, in seconds.
local function repl_timeout()
  local t = tonumber(os.getenv("CRUN_REPL_TIMEOUT") or "")
  return (t and t > 0) and t or 30
end

-- Makes crun, T and dist globals (unless the script took those names) and
-- initializes the default process group. Returns a note to show, or "".
local function setup_globals()
  local crun = require "crun"
  if rawget(_G, "crun") == nil then rawset(_G, "crun", crun) end
  if rawget(_G, "T") == nil then rawset(_G, "T", crun.tensor) end
  local ok, dist = pcall(require, "crun.dist")
  if not ok then
    return "note: crun.dist is not available, so there is no process group: "
           .. tostring(dist):match("^[^\n]*")
  end
  if rawget(_G, "dist") == nil then rawset(_G, "dist", dist) end
  if dist.is_initialized and dist.is_initialized() then return "" end
  local iok, ierr = pcall(dist.init_process_group, {timeout = repl_timeout()})
  if not iok then
    return "init_process_group failed: " .. tostring(ierr)
  end
  return ""
end

-- Waits for key in slices; returns true, or nil and a message when the
-- store is gone.
local function worker_wait(store, key)
  while true do
    local ok, err = pcall(store.wait, store, {key}, M.WORKER_SLICE)
    if ok then return true end
    if not tostring(err):match("^ETIMEDOUT") then return nil, tostring(err) end
  end
end

-- The ready message: the script's error (if any) and what setting up the
-- globals and the process group said.
local function ready_message(script_err)
  local kind, text = "ok", ""
  if script_err then kind, text = "err", trim_traceback(script_err) end
  local note = setup_globals()
  if note == "" then return kind .. "\n" .. text end
  if kind == "ok" and note:match("^note") then return "ok\n" .. note end
  return "err\n" .. text .. (text ~= "" and "\n" or "") .. note
end

--- Splits a chunk message "<targets>\n<source>" (the wire form of
-- crun/repl/<n>/chunk). Returns targets, source.
function M.parse_chunk(v)
  return v:match("^([^\n]*)\n(.*)$")
end

--- Whether the targets spec of a chunk ("*" or "0,2") names rank.
function M.is_target(targets, rank)
  if targets == "*" then return true end
  for r in targets:gmatch("%d+") do
    if tonumber(r) == rank then return true end
  end
  return false
end

-- Waits for chunk n and runs it when this rank is a target. Returns false
-- at "!quit", true otherwise; raises when the store is gone.
local function worker_step(st, n)
  local store, rank = st.store, st.rank
  local key = P .. n .. "/chunk"
  local ok, err = worker_wait(store, key)
  if not ok then
    error("ECONNRESET: rank " .. rank .. " lost the REPL's store (the launcher is gone?): " .. err, 0)
  end
  local v = store:get(key)
  if v == M.QUIT then return false end
  local targets, src = M.parse_chunk(v)
  if M.is_target(targets, rank) then
    store:set(P .. "state/" .. rank, string.format("running %d %d", n, os.time()))
    local k, t = M.run_chunk(st.h, src, function(msg)
      -- the front end interrupted this chunk at CRUN_REPL_TIMEOUT: say so
      -- (no rank in the text: ranks with the same result share one labelled line)
      local tkey = P .. n .. "/timeout"
      if not msg:match("^interrupted!") or not store:check{tkey} then return msg end
      return string.format("ETIMEDOUT: chunk %d ran longer than CRUN_REPL_TIMEOUT=%s s; "
        .. "interrupted", n, store:get(tkey)) .. msg:sub(#"interrupted!" + 1)
    end)
    if #t > M.MAX_OUTPUT then
      t = t:sub(1, M.MAX_OUTPUT) .. string.format("\n(%d more bytes not shown)\n", #t - M.MAX_OUTPUT)
    end
    store:set(P .. n .. "/out/" .. rank, k .. "\n" .. t)
    store:set(P .. "state/" .. rank, "idle " .. n)
  end
  return true
end

--- The rest of a worker's life, after the user script (script_err is its
-- error message with traceback, or nil): sets up the globals and the
-- process group, reports ready, then runs chunks until "!quit". Returns
-- nothing on a clean quit; raises when the front end's store goes away.
function M.worker_loop(st, script_err)
  local msg = ready_message(script_err)
  st.store:set(P .. "state/" .. st.rank, "idle 0")
  st.store:set(P .. "ready/" .. st.rank, msg)
  local n = 1
  while worker_step(st, n) do n = n + 1 end
end

-- ---------------------------------------------------------------- front end

local HELP = [[
Every chunk you enter runs on every rank; results come back grouped:
ranks with the same output share one line, e.g. "[0-3] 4.0".
  <expr>              shows its value on every rank (as the lua prompt does)
  <statement>         runs it; globals persist between chunks on each rank
  :on 0,2 <chunk>     runs the chunk on ranks 0 and 2 only (also 1-3, all)
  :ranks              which ranks are alive and what they are doing
  :dump               every rank writes its flight recorder (its last operations);
                      crun-lua prints who is behind, on which op, the first mismatch
  :help               this text
  :quit, Ctrl-D       end the session on every rank
Ctrl-C interrupts a running chunk on every rank (twice: stop waiting for it).
A chunk still running after CRUN_REPL_TIMEOUT seconds (default 30 when the
input is not a terminal; on a terminal only when the variable is set) is
interrupted on every rank with ETIMEDOUT, and the session goes on.
Globals: crun, T (= crun.tensor), dist (process group initialized; collective
timeout CRUN_REPL_TIMEOUT seconds, default 30). A collective that some ranks
did not enter ends in ETIMEDOUT and leaves the group unusable; start a new one
with: dist.destroy_process_group(); dist.init_process_group{}
print and io.write inside a chunk are captured per rank; other output of
the ranks appears as "[rank] line" when it is written.
]]

local Front = {}
Front.__index = Front

local function new_front(h, opts)
  local crun = require "crun"
  local store = crun.store.tcp{host = opts.host, port = opts.port, is_master = false,
                               timeout = 60, connect_timeout = 30}
  local all = {}
  for r = 0, opts.world - 1 do all[r + 1] = r end
  return setmetatable({h = h, store = store, world = opts.world, tty = opts.tty,
                       all = all, pid = {}, dead = {}, n = 0, busy = {}}, Front)
end

function Front:out(s)
  if s == "" then return end
  local ok = io.stdout:write(s)
  if not ok or not io.stdout:flush() then self.closed = true end -- nobody reads our output
end

function Front:err(s)
  if s ~= "" then io.stdout:flush(); io.stderr:write(s); io.stderr:flush() end
end

-- Learns the pid of rank r from the store once it is there.
function Front:learn_pid(r)
  if self.pid[r] then return self.pid[r] end
  local key = P .. "pid/" .. r
  if self.store:check{key} then self.pid[r] = tonumber(self.store:get(key)) end
  return self.pid[r]
end

-- Whether rank r is known to be gone (marks it dead).
function Front:check_dead(r)
  if self.dead[r] then return true end
  local pid = self:learn_pid(r)
  if (pid and not self.h.alive(pid)) or self.h.supervisor() then self.dead[r] = true end
  return self.dead[r] or false
end

-- Waits for keys[r] of every rank in `ranks`; returns {[r] = value}, the
-- ranks found dead, and why it stopped early ("interrupt", "terminate") or
-- nil. on_interrupt(pending) is called at the first Ctrl-C; a second one
-- gives up with "interrupt".
-- With `limit` (seconds), on_timeout(pending) is called once that long has
-- passed, and collect gives up with "timeout" M.TIMEOUT_GRACE seconds later.
function Front:collect(ranks, keyf, on_interrupt, limit, on_timeout)
  local got, pending = {}, {}
  for _, r in ipairs(ranks) do pending[#pending + 1] = r end
  local interrupts = 0
  local clock = require("crun.core").clock
  local deadline, timed_out = limit and clock() + limit, false
  while #pending > 0 do
    local still = {}
    for _, r in ipairs(pending) do
      local key = keyf(r)
      if self.store:check{key} then
        got[r] = self.store:get(key)
      elseif not self:check_dead(r) then
        still[#still + 1] = r
      elseif self.store:check{key} then -- it answered, then ended
        got[r] = self.store:get(key)
      end
    end
    pending = still
    if #pending == 0 then break end
    local sig = self.h.signals()
    if sig == "terminate" then return got, pending, "terminate" end
    if sig == "interrupt" then
      interrupts = interrupts + 1
      if interrupts >= 2 or not on_interrupt then return got, pending, "interrupt" end
      on_interrupt(pending)
    end
    if deadline and clock() > deadline then
      if timed_out then return got, pending, "timeout" end
      timed_out, deadline = true, clock() + M.TIMEOUT_GRACE
      on_timeout(pending)
    end
    pcall(self.store.wait, self.store, {keyf(pending[1])}, M.SLICE)
  end
  return got, {}, nil
end

--- Splits a result message "<kind>\n<text>" into {kind =, text =}.
function M.parse_result(v)
  local kind, text = v:match("^(%a+)\n(.*)$")
  return {kind = kind or "err", text = text or v}
end

-- Waits for every rank to be ready; shows what the script and
-- init_process_group said. Returns nil, or "interrupt"/"terminate".
function Front:startup()
  local got, _, why = self:collect(self.all, function(r) return P .. "ready/" .. r end)
  if why then return why end
  local results = {}
  for _, r in ipairs(self.all) do
    if got[r] then results[r] = M.parse_result(got[r])
    else results[r] = {kind = "dead", text = "(ended before the prompt opened)"} end
  end
  local out, err = M.render(M.group(results, self.all))
  self:out(out)
  self:err(err)
  return nil
end

-- The ranks of list that are not known dead; the dead ones get a "(dead)"
-- result when `named` (with :on), else only :ranks lists them.
function Front:split_live(list, named, results)
  local live = {}
  for _, r in ipairs(list) do
    if not self:check_dead(r) then live[#live + 1] = r
    elseif named then results[r] = {kind = "dead", text = "(dead)"} end
  end
  local notes = {}
  for _, r in ipairs(live) do
    if self.busy[r] then notes[#notes + 1] = string.format(
      "[%d] (still busy with chunk %d; this one runs after it)\n", r, self.busy[r]) end
  end
  self:err(table.concat(notes))
  return live
end

-- Turns what collect() returned for chunk n into results.
function Front:take_results(n, live, got, left, results, why)
  for r, v in pairs(got) do
    self.busy[r] = nil
    results[r] = M.parse_result(v)
    self.store:delete_key(P .. n .. "/out/" .. r)
  end
  for _, r in ipairs(live) do
    if not results[r] and self.dead[r] then
      results[r] = {kind = "dead", text = "(died while running the chunk)"}
    end
  end
  for _, r in ipairs(left) do
    self.busy[r] = n
    results[r] = {kind = "busy", text = why == "timeout"
      and "(still running after the chunk timeout and an interrupt; no longer waited for; see :ranks)"
      or "(still running; no longer waited for; see :ranks)"}
  end
end

--- Sends chunk src to the ranks `targets` (nil: all) and shows the grouped
-- results. Returns "terminate" when a SIGTERM/SIGHUP arrived, else nil.
function Front:run(src, targets)
  self.n = self.n + 1
  local n, list, results = self.n, targets or self.all, {}
  local live = self:split_live(list, targets ~= nil, results)
  local tspec = targets and table.concat(targets, ",") or "*"
  self.store:set(P .. n .. "/chunk", tspec .. "\n" .. src) -- after the liveness check
  local function interrupt(pending)
    for _, r in ipairs(pending) do
      if self.pid[r] then self.h.kill(self.pid[r]) end
    end
  end
  local limit = self:chunk_limit()
  local got, left, why = self:collect(live, function(r) return P .. n .. "/out/" .. r end,
    interrupt, limit and limit.wait, function(pending)
      self.store:set(P .. n .. "/timeout", limit.text) -- before the interrupt: the ranks look
      self.store:check{P .. n .. "/timeout"} -- applied (set does not wait) before the signal that makes them look
      interrupt(pending)
    end)
  self:take_results(n, live, got, left, results, why)
  local out, err = M.render(M.group(results, list))
  self:out(out)
  self:err(err)
  return why == "terminate" and why or nil
end

--- How long a chunk may run: {wait = seconds, text = CRUN_REPL_TIMEOUT's
-- value}, or nil for no limit. CRUN_REPL_TIMEOUT when set; else 30 s when
-- the input is not a terminal (a piped runaway chunk must not hang the
-- session), none on a terminal (Ctrl-C is there). The collectives of the
-- chunk time out after the same value, so the front waits a little longer
-- (a tenth, at least 1 s) and their own ETIMEDOUT comes first.
function Front:chunk_limit()
  local env = os.getenv("CRUN_REPL_TIMEOUT")
  local t = tonumber(env or "")
  if not (t and t > 0) then
    if self.tty then return nil end
    t, env = 30, "30"
  end
  return {wait = t + math.max(1, t / 10), text = env}
end

--- Sends SIGINT to the ranks still busy with a chunk nobody waits for (at
-- the end of the input: they then take "!quit").
function Front:interrupt_busy()
  for r in pairs(self.busy) do
    if self.pid[r] and not self:check_dead(r) then self.h.kill(self.pid[r]) end
  end
end

--- Whether every rank has ended (then says so).
function Front:all_gone()
  local alive = 0
  for _, r in ipairs(self.all) do
    if not self:check_dead(r) then alive = alive + 1 end
  end
  if alive > 0 then return false end
  self:err("crun-lua: every rank has ended; leaving the REPL\n")
  return true
end

--- Text for :ranks.
function Front:ranks_text()
  local lines, now = {}, os.time()
  for _, r in ipairs(self.all) do
    local pid = self:learn_pid(r)
    local what
    if self:check_dead(r) then
      what = "dead"
    else
      local sk = P .. "state/" .. r
      local s = self.store:check{sk} and self.store:get(sk) or "starting"
      local rn, t0 = s:match("^running (%d+) (%d+)")
      if rn then
        what = string.format("running chunk %s for %d s", rn, now - tonumber(t0))
      elseif s:match("^idle") then
        what = "idle"
      else
        what = s
      end
    end
    lines[#lines + 1] = string.format("[%d] pid %-8s %s", r, pid and tostring(pid) or "?", what)
  end
  return table.concat(lines, "\n") .. "\n"
end

--- Compiles a chunk the way lua.c does: "return <line>" first (for the first
-- line only), then the chunk itself. Returns the source to send, or nil and
-- "incomplete", or nil and the syntax error.
function M.compile(buf, first_only)
  if first_only then
    local ret = "return " .. buf
    if load(ret, "=stdin", "t") then return ret end
  end
  local fn, err = load(buf, "=stdin", "t")
  if fn then return buf end
  if err:match("<eof>$") then return nil, "incomplete" end
  return nil, err
end

-- Handles a meta command line (":..."). Returns
--   "chunk", targets, rest     to run rest on targets
--   "done"                     handled
--   "quit"                     end the session
function Front:meta(line)
  local cmd, rest = line:match("^:(%a+)%s*(.-)%s*$")
  if cmd == "help" or cmd == "h" then
    self:out(HELP)
  elseif cmd == "ranks" then
    self:out(self:ranks_text())
  elseif cmd == "dump" then
    if self.h.dump and self.h.dump() then
      self:out("asked every rank for its flight recorder; crun-lua prints the analysis\n")
    else
      self:err(":dump: the workers' supervisor is not running\n")
    end
  elseif cmd == "quit" or cmd == "q" or cmd == "exit" then
    return "quit"
  elseif cmd == "on" then
    local spec, body = rest:match("^(%S+)%s+(.+)$")
    if not spec then
      self:err("usage: :on <ranks> <chunk>   e.g. :on 0,2 x = 1\n")
      return "done"
    end
    local targets, err = M.parse_ranks(spec, self.world)
    if not targets then self:err(":on: " .. err .. "\n"); return "done" end
    return "chunk", targets, body
  else
    self:err(string.format("unknown command '%s' (:help lists them)\n", line))
  end
  return "done"
end

-- Reads one line; returns it, or nil at EOF, or false and why
-- ("interrupt", "terminate", "gone").
function Front:read(prompt)
  return self.h.readline(self.tty and prompt or "")
end

-- Reads the rest of a chunk whose first line is body (typed as line).
-- Returns the source to run (or nil and a syntax error, or nil and nil
-- after Ctrl-C), the text typed, and how input ended early ("terminate",
-- "gone") if it did.
function Front:read_chunk(body, line)
  local src, err = M.compile(body, true)
  local whole, typed = body, line
  while not src and err == "incomplete" do
    local more, how = self:read(">> ")
    if more == nil then return nil, "unexpected end of input in a multi-line chunk", typed end
    if more == false then return nil, nil, typed, how ~= "interrupt" and how or nil end
    whole, typed = whole .. "\n" .. more, typed .. "\n" .. more
    src, err = M.compile(whole, false)
  end
  return src, err, typed
end

-- Handles one line read at the main prompt. Returns how the session ends,
-- or nil to go on.
function Front:handle(line)
  if line:match("^%s*$") then return nil end
  local kind, targets, body = "chunk", nil, line
  if line:match("^:[^:]") then kind, targets, body = self:meta(line) end -- "::label::" is Lua
  if kind == "quit" then return "quit" end
  if kind ~= "chunk" then return nil end
  local src, err, typed, ended = self:read_chunk(body, line)
  self.h.add_history(typed)
  if ended then return ended end
  if src then return self:run(src, targets) end
  if err then self:err(err .. "\n") end
  return nil
end

--- The session: startup, then read-eval-print until EOF or :quit. Returns
-- how it ended: "quit", "gone" (every worker ended), "interrupt" (Ctrl-C
-- before the prompt opened) or "terminate" (SIGTERM/SIGHUP).
function Front:loop()
  local why = self:startup()
  if why then return why end
  if self.tty then
    self:out(string.format("crun %s REPL on %d rank%s (%s); :help for help, Ctrl-D to quit\n",
                           require("crun").version, self.world, self.world == 1 and "" or "s",
                           _VERSION))
  end
  while true do
    if self:all_gone() then return "gone" end
    if self.closed then return "quit" end
    local line, how = self:read("> ")
    if line == nil then
      if self.tty then self:out("\n") end
      self:interrupt_busy()
      return "quit"
    end
    if line == false and how ~= "interrupt" then return how end
    local ended = line and self:handle(line)
    if ended then return ended end
  end
end

--- The front end's entry point (launcher/repl.c). h: the C helpers;
-- opts: {host=, port=, world=, tty=}. Sends "!quit" to the workers when
-- the session ends normally. Returns how it ended (see Front:loop).
function M.front(h, opts)
  local f = new_front(h, opts)
  local how = f:loop()
  if how == "quit" then
    f.store:set(P .. (f.n + 1) .. "/chunk", M.QUIT)
  end
  f.store:close()
  return how
end

return M

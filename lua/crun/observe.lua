--- crun.observe: what crun-lua does with what the ranks recorded (see
-- crun/trace.h): merges the per-rank timeline files into one Chrome/Perfetto
-- JSON trace, and reads the flight recorder's dumps into a short analysis.
-- Plain Lua (no C): crun-lua runs it in a Lua state of its own.
local M = {}

local function split(line)
  local f = {}
  for v in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = v end
  return f
end

-- s with each byte that is not part of valid UTF-8 replaced by the JSON
-- escape \ufffd (a JSON text must be UTF-8: one such byte in a span or group
-- name made the whole trace unreadable).
local function utf8_only(s)
  local out, i = {}, 1
  while true do
    local n, bad = utf8.len(s, i)
    if n then out[#out + 1] = s:sub(i); return table.concat(out) end
    out[#out + 1] = s:sub(i, bad - 1) .. "\\ufffd"
    i = bad + 1
  end
end

local function jstr(s)
  return '"' .. utf8_only((tostring(s):gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end))) .. '"'
end

-- Reads "<path>.rank<r>": {rank=, pid=, offset=, rtt=, dropped=, groups={}, ops={}, spans={}, instants={}}.
local function read_rank(file)
  local f = io.open(file, "r")
  if not f then return nil end
  local r = {groups = {}, ops = {}, spans = {}, instants = {}}
  for line in f:lines() do
    local t = line:sub(1, 1)
    if t == "P" then
      local v = split(line)
      r.rank, r.pid, r.offset, r.rtt, r.dropped = tonumber(v[2]), tonumber(v[3]), math.tointeger(tonumber(v[4])),
        math.tointeger(tonumber(v[5])), math.tointeger(tonumber(v[6]))
    elseif t == "G" then
      local v = split(line)
      r.groups[tonumber(v[2])] = v[3]
    elseif t == "O" then
      local v = split(line)
      r.ops[#r.ops + 1] = {name = v[2], group = tonumber(v[3]), seq = math.tointeger(tonumber(v[4])),
        count = math.tointeger(tonumber(v[5])), bytes = math.tointeger(tonumber(v[6])), dtype = v[7], algo = v[8],
        peer = tonumber(v[9]), status = tonumber(v[10]), t_enq = math.tointeger(tonumber(v[11])),
        t0 = math.tointeger(tonumber(v[12])), t1 = math.tointeger(tonumber(v[13])), wait = math.tointeger(tonumber(v[14]))}
    elseif t == "S" or t == "I" then
      local cat, a, b, name = line:match("^.\t([^\t]*)\t(%d+)\t(%d+)\t(.*)$")
      local list = t == "S" and r.spans or r.instants
      list[#list + 1] = {cat = cat, t0 = math.tointeger(tonumber(a)), t1 = math.tointeger(tonumber(b)), name = name}
    end
  end
  f:close()
  return r.rank and r or nil
end

-- Length of the union of [t0, t1) intervals (nested spans counted once).
local function union(list)
  table.sort(list, function(a, b) return a[1] < b[1] end)
  local total, s, e = 0, nil, nil
  for _, iv in ipairs(list) do
    if s and iv[1] <= e then
      if iv[2] > e then e = iv[2] end
    else
      if s then total = total + (e - s) end
      s, e = iv[1], iv[2]
    end
  end
  if s then total = total + (e - s) end
  return total
end

local P2P = {send = true, recv = true}

-- Per collective (group name, seq): the latest aligned start over the ranks,
-- so each rank's "skew" is how long it waited for the last one to enter.
local function latest_starts(ranks)
  local last = {}
  for _, r in ipairs(ranks) do
    for _, o in ipairs(r.ops) do
      if not P2P[o.name] then
        local k = (r.groups[o.group] or "?") .. "#" .. o.seq
        local t = o.t0 + r.offset
        if not last[k] or t > last[k] then last[k] = t end
      end
    end
  end
  return last
end

local function us(ns) return string.format("%.3f", ns / 1000) end

-- Chrome trace events of one rank into out (a list of strings).
local function emit_rank(out, r, base, last)
  local pid, off = r.rank, r.offset
  out[#out + 1] = string.format('{"name":"process_name","ph":"M","pid":%d,"tid":0,"args":{"name":"rank %d"}}', pid, pid)
  out[#out + 1] = string.format('{"name":"process_sort_index","ph":"M","pid":%d,"tid":0,"args":{"sort_index":%d}}', pid, pid)
  out[#out + 1] = string.format('{"name":"thread_name","ph":"M","pid":%d,"tid":0,"args":{"name":"lua"}}', pid)
  for i, name in pairs(r.groups) do
    out[#out + 1] = string.format('{"name":"thread_name","ph":"M","pid":%d,"tid":%d,"args":{"name":%s}}', pid, 100 + i,
      jstr("group " .. name))
  end
  for _, s in ipairs(r.spans) do
    out[#out + 1] = string.format('{"name":%s,"cat":%s,"ph":"X","pid":%d,"tid":0,"ts":%s,"dur":%s}', jstr(s.name),
      jstr(s.cat), pid, us(s.t0 + off - base), us(s.t1 - s.t0))
  end
  for _, s in ipairs(r.instants) do
    out[#out + 1] = string.format('{"name":%s,"cat":%s,"ph":"i","s":"t","pid":%d,"tid":0,"ts":%s}', jstr(s.name),
      jstr(s.cat), pid, us(s.t0 + off - base))
  end
  for _, o in ipairs(r.ops) do
    local g = r.groups[o.group] or "?"
    local p2p = P2P[o.name]
    local name = p2p and string.format("%s %s %d", o.name, o.name == "send" and "to" or "from", o.peer)
      or string.format("%s #%d", o.name, o.seq)
    local skew = p2p and 0 or math.max(0, last[g .. "#" .. o.seq] - (o.t0 + off))
    out[#out + 1] = string.format('{"name":%s,"cat":"%s","ph":"X","pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":{'
      .. '"group":%s,"seq":%d,"bytes":%d,"count":%d,"dtype":%s,"algo":%s,"peer":%d,"status":%d,'
      .. '"enqueue_us":%s,"queued_us":%s,"wait_us":%s,"skew_us":%s}}',
      jstr(name), p2p and "p2p" or "coll", pid, 100 + o.group, us(o.t0 + off - base), us(o.t1 - o.t0), jstr(g), o.seq,
      o.bytes, o.count, jstr(o.dtype), jstr(o.algo), o.peer, o.status, us(o.t_enq + off - base), us(o.t0 - o.t_enq),
      us(o.wait), us(skew))
  end
end

-- One rank's totals (seconds): forward/backward/optim spans, time in
-- operations, blocked on peers, waiting for the last rank to enter.
local function totals(r, last)
  local by = {forward = {}, backward = {}, optim = {}}
  for _, s in ipairs(r.spans) do
    local l = by[s.cat]
    if l then l[#l + 1] = {s.t0, s.t1} end
  end
  local comm, wait, skew = {}, 0, 0
  for _, o in ipairs(r.ops) do
    comm[#comm + 1] = {o.t0, o.t1}
    wait = wait + o.wait
    if not P2P[o.name] then skew = skew + math.max(0, last[(r.groups[o.group] or "?") .. "#" .. o.seq] - (o.t0 + r.offset)) end
  end
  return {forward = union(by.forward) / 1e9, backward = union(by.backward) / 1e9, optim = union(by.optim) / 1e9,
    comm = union(comm) / 1e9, wait = wait / 1e9, skew = skew / 1e9, ops = #r.ops, spans = #r.spans}
end

--- merge(path, world) -> summary text: reads "<path>.rank<r>" for r in
-- 0..world-1, or for each global rank r in the list `world` (a group's
-- ranks), those present, and writes the Chrome/Perfetto trace to path.
-- On failure: nil and a text starting with the status name (ENOTFOUND: no
-- rank file; EIO: path cannot be written; the rank files then stay).
function M.merge(path, world)
  local ranks, list = {}, world
  if type(world) ~= "table" then
    list = {}
    for r = 0, world - 1 do list[#list + 1] = r end
  end
  for _, r in ipairs(list) do
    local x = read_rank(path .. ".rank" .. r)
    if x then ranks[#ranks + 1] = x end
  end
  if #ranks == 0 then return nil, string.format("ENOTFOUND: no timeline file %s.rank<r> was written", path) end
  local base
  for _, r in ipairs(ranks) do
    for _, list in ipairs{r.ops, r.spans, r.instants} do
      for _, e in ipairs(list) do
        local t = (e.t_enq or e.t0) + r.offset
        if not base or t < base then base = t end
      end
    end
  end
  base = base or 0
  local last = latest_starts(ranks)
  local out = {}
  for _, r in ipairs(ranks) do emit_rank(out, r, base, last) end
  local f, err = io.open(path, "w")
  if not f then return nil, "EIO: cannot write the timeline " .. tostring(err) end
  f:write('{"displayTimeUnit":"ms","traceEvents":[\n', table.concat(out, ",\n"), "\n]}\n")
  f:close()
  local lines = {string.format("timeline: %s, %d ranks, %d events", path, #ranks, #out)}
  lines[#lines + 1] = "  rank  forward_s backward_s  optim_s   comm_s   wait_s   skew_s  ops   clock_offset_us (rtt_us)"
  for _, r in ipairs(ranks) do
    local t = totals(r, last)
    lines[#lines + 1] = string.format("  %4d %10.4f %10.4f %8.4f %8.4f %8.4f %8.4f %4d   %.1f (%.1f)%s", r.rank, t.forward,
      t.backward, t.optim, t.comm, t.wait, t.skew, t.ops, r.offset / 1000, r.rtt / 1000,
      (r.dropped or 0) > 0 and string.format("  [%d events dropped: buffer full]", r.dropped) or "")
    os.remove(path .. ".rank" .. r.rank)
  end
  return table.concat(lines, "\n")
end

-- ---------------------------------------------------------------- flight recorder

-- Reads a dump: {rank=, pid=, time=, reason=, entries={{seq=, group=, op=, dtype=, count=, state=}, ...}}.
local function read_dump(file)
  local f = io.open(file, "r")
  if not f then return nil end
  local d = {entries = {}}
  for line in f:lines() do
    local v = split(line)
    if v[1] == "R" then
      d.rank, d.pid, d.time, d.keep, d.reason = tonumber(v[2]), tonumber(v[3]), math.tointeger(tonumber(v[4])),
        math.tointeger(tonumber(v[5])), v[6]
    elseif v[1]:match("^%d+$") then
      d.entries[#d.entries + 1] = {seq = math.tointeger(tonumber(v[2])), group = v[3], op = v[4], dtype = v[5],
        count = v[6], state = v[8], peer = tonumber(v[9])}
    end
  end
  f:close()
  return d.rank and d or nil
end
M.read_dump = read_dump

--- "rank 3", "ranks 0-2,5" for a list of ranks (sorted in place); the ranges
-- are crun.repl's format_ranks without its brackets.
local function ranks_text(list)
  table.sort(list)
  return (#list > 1 and "ranks " or "rank ") .. require("crun.repl").format_ranks(list):sub(2, -2)
end

local function sig(e) return string.format("%s(%s[%s])", e.op, e.dtype, e.count) end

-- Lines about one group: who is behind, on which op, the first mismatch.
local function analyze_group(name, per, lines, partial)
  -- per[rank] = {seq -> entry} of the group's collectives, and its max seq
  local maxseq, ranks = 0, {}
  for r, p in pairs(per) do
    ranks[#ranks + 1] = r
    if p.max > maxseq then maxseq = p.max end
  end
  table.sort(ranks)
  local behind, ahead = {}, {}
  for _, r in ipairs(ranks) do
    if per[r].max < maxseq then behind[#behind + 1] = r else ahead[#ahead + 1] = r end
  end
  local front = per[ahead[1]].by[maxseq]
  if #behind > 0 then
    local minmax = math.huge
    for _, r in ipairs(behind) do minmax = math.min(minmax, per[r].max) end
    for _, r in ipairs(behind) do
      local p = per[r]
      local e = p.by[p.max]
      local last = p.max == 0 and "it has no op of this group yet"
        or string.format("its last op is %s #%d (%s)", e and e.op or "?", p.max, e and e.state or "?")
      lines[#lines + 1] = string.format("  group %s: rank %d is behind: %s while %s %s at %s #%d (%s); "
        .. "it has not entered #%d", name, r, last, ranks_text({table.unpack(ahead)}),
        #ahead > 1 and "are" or "is", front.op, maxseq, front.state, p.max + 1)
    end
  else
    local stuck = {}
    for _, r in ipairs(ranks) do
      local e = per[r].by[maxseq]
      if e and e.state ~= "done" then stuck[#stuck + 1] = r end
    end
    lines[#lines + 1] = string.format("  group %s: %s reached #%d (%s)%s", name,
      partial and "every rank with a fresh dump (" .. ranks_text({table.unpack(ranks)}) .. ")" or "every rank", maxseq,
      front.op, #stuck > 0 and string.format("; not done on %s", ranks_text(stuck)) or "")
  end
  -- first mismatch: the lowest seq every rank recorded whose ops differ
  local lo = 0
  for _, r in ipairs(ranks) do
    if per[r].max > 0 then lo = math.max(lo, per[r].min) end
  end
  for s = lo, maxseq do
    local kinds, order = {}, {}
    for _, r in ipairs(ranks) do
      local e = per[r].by[s]
      if e then
        local k = sig(e)
        if not kinds[k] then kinds[k] = {}; order[#order + 1] = k end
        table.insert(kinds[k], r)
      end
    end
    if #order > 1 then
      local parts = {}
      for _, k in ipairs(order) do parts[#parts + 1] = ranks_text(kinds[k]) .. " called " .. k end
      lines[#lines + 1] = string.format("  group %s: first mismatch at #%d: %s", name, s, table.concat(parts, "; "))
      return
    end
  end
  lines[#lines + 1] = string.format("  group %s: no mismatch in the sequences recorded (#%d..#%d)", name, lo, maxseq)
end

--- analyze(dir, ranks, since_ns[, quiet]) -> text: reads dir/flight_rank<r>.txt
-- for each rank in the list (dumps older than since_ns, a monotonic time, are
-- reported stale and left out) and says, per group, which ranks are behind
-- and on which op, and where the sequences first differ. quiet: "" when no
-- dump holds a collective.
function M.analyze(dir, ranks, since_ns, quiet)
  local lines, groups, missing, fresh = {}, {}, {}, {}
  for _, r in ipairs(ranks) do
    local d = read_dump(dir .. "/flight_rank" .. r .. ".txt")
    if not d or (since_ns and d.time and d.time < since_ns) then
      missing[#missing + 1] = r
    else
      fresh[r] = d
      for _, e in ipairs(d.entries) do
        if e.seq and e.seq > 0 then
          local g = groups[e.group] or {}
          groups[e.group] = g
          local p = g[r] or {by = {}, max = 0, min = math.huge}
          g[r] = p
          p.by[e.seq] = e
          if e.seq > p.max then p.max = e.seq end
          if e.seq < p.min then p.min = e.seq end
        end
      end
    end
  end
  -- a rank whose whole history is in its dump (fewer entries than the ring
  -- keeps) and that has no op of a group made by init_process_group (a name
  -- "<name>/<n>", every rank a member; subgroups are "<parent>/g<k>") has
  -- not entered that group's first op: it is behind, not absent
  for gname, g in pairs(groups) do
    if gname:match("/%d+$") then
      for r, d in pairs(fresh) do
        if not g[r] and d.keep and #d.entries < d.keep then g[r] = {by = {}, max = 0, min = math.huge} end
      end
    end
  end
  if quiet and next(groups) == nil then return "" end
  lines[#lines + 1] = string.format("flight recorder: dumps of %d of %d ranks in %s", #ranks - #missing, #ranks, dir)
  if #missing > 0 then lines[#lines + 1] = "  no fresh dump from " .. ranks_text(missing) .. " (exited, killed or busy)" end
  local names = {}
  for n in pairs(groups) do names[#names + 1] = n end
  table.sort(names)
  for _, n in ipairs(names) do analyze_group(n, groups[n], lines, #missing > 0) end
  return table.concat(lines, "\n")
end

return M

-- metrics_spec.lua — crun.metrics.SummaryWriter: the event file is read back
-- here, independently of the writer: every record's framing and both masked
-- CRC-32C checksums (a bitwise CRC-32C in Lua, checked against the published
-- check value), then a minimal protobuf reader decodes the Event, Summary and
-- HistogramProto messages, which are compared with what was written; the CSV
-- too. Last, jobs/train.lua --logdir on 2 ranks.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local crun = require "crun"
local metrics = crun.metrics

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- CRC-32C bit by bit (reflected polynomial 0x82F63B78), no table.
local function crc32c(s)
  local c = 0xFFFFFFFF
  for i = 1, #s do
    c = c ~ s:byte(i)
    for _ = 1, 8 do
      if c & 1 == 1 then c = (c >> 1) ~ 0x82F63B78 else c = c >> 1 end
    end
  end
  return c ~ 0xFFFFFFFF
end

local function masked(c)
  return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
end

-- Splits an event file into its records' payloads; raises on any framing or
-- checksum error, naming the record and byte offset.
local function read_records(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  local out, pos = {}, 1
  while pos <= #s do
    local where = string.format("record %d at byte %d", #out + 1, pos - 1)
    assert(pos + 11 <= #s, where .. ": truncated header")
    local hdr = s:sub(pos, pos + 7)
    local len, lcrc = string.unpack("<I8I4", s, pos)
    assert(lcrc == masked(crc32c(hdr)), where .. ": length checksum mismatch")
    assert(pos + 12 + len + 3 <= #s, where .. ": truncated data")
    local data = s:sub(pos + 12, pos + 11 + len)
    local dcrc = string.unpack("<I4", s, pos + 12 + len)
    assert(dcrc == masked(crc32c(data)), where .. ": data checksum mismatch")
    out[#out + 1] = data
    pos = pos + 16 + len
  end
  return out
end

-- Minimal protobuf reader: returns a list of {field, wire type, value}
-- (varint as an integer, fixed64/fixed32 as raw 8/4-byte strings,
-- length-delimited as a string).
local function fields(s)
  local out, pos = {}, 1
  local function varint()
    local v, shift = 0, 0
    repeat
      local b = s:byte(pos)
      assert(b, "protobuf: truncated varint")
      pos = pos + 1
      v = v | ((b & 0x7F) << shift)
      shift = shift + 7
    until b < 0x80
    return v
  end
  while pos <= #s do
    local key = varint()
    local fnum, wt = key >> 3, key & 7
    local v
    if wt == 0 then v = varint()
    elseif wt == 1 then v = s:sub(pos, pos + 7); pos = pos + 8
    elseif wt == 5 then v = s:sub(pos, pos + 3); pos = pos + 4
    elseif wt == 2 then
      local n = varint()
      v = s:sub(pos, pos + n - 1)
      pos = pos + n
    else error("protobuf: unexpected wire type " .. wt) end
    out[#out + 1] = {fnum, wt, v}
  end
  assert(pos == #s + 1, "protobuf: message overruns its record")
  return out
end

local function f64(raw) return (string.unpack("<d", raw)) end

local function decode_histo(s)
  local h = {min = 0, max = 0, num = 0, sum = 0, sum_squares = 0, bucket_limit = {}, bucket = {}}
  local names = {"min", "max", "num", "sum", "sum_squares"}
  for _, fv in ipairs(fields(s)) do
    local n, wt, v = fv[1], fv[2], fv[3]
    if n <= 5 then assert(wt == 1); h[names[n]] = f64(v)
    elseif n == 6 or n == 7 then
      local list = n == 6 and h.bucket_limit or h.bucket
      assert(wt == 2 and #v % 8 == 0, "packed doubles expected")
      for i = 1, #v, 8 do list[#list + 1] = f64(v:sub(i, i + 7)) end
    end
  end
  return h
end

-- Decodes an Event: {wall_time, step, file_version?, values = {{tag, simple_value | histo}}}.
local function decode_event(s)
  local ev = {wall_time = 0, step = 0, values = {}}
  for _, fv in ipairs(fields(s)) do
    local n, wt, v = fv[1], fv[2], fv[3]
    if n == 1 then assert(wt == 1); ev.wall_time = f64(v)
    elseif n == 2 then assert(wt == 0); ev.step = v
    elseif n == 3 then assert(wt == 2); ev.file_version = v
    elseif n == 5 then
      for _, sv in ipairs(fields(v)) do
        assert(sv[1] == 1 and sv[2] == 2)
        local val = {}
        for _, x in ipairs(fields(sv[3])) do
          if x[1] == 1 then val.tag = x[3]
          elseif x[1] == 2 then assert(x[2] == 5); val.simple_value = (string.unpack("<f", x[3]))
          elseif x[1] == 5 then val.histo = decode_histo(x[3]) end
        end
        ev.values[#ev.values + 1] = val
      end
    end
  end
  return ev
end

local function read_events(path)
  local evs = {}
  for _, r in ipairs(read_records(path)) do evs[#evs + 1] = decode_event(r) end
  return evs
end

local function read_csv(path)
  local rows = {}
  local f = assert(io.open(path))
  assert.are.equal("tag,step,value,wall_time", f:read("l"))
  for line in f:lines() do
    local tag, rest = line:match('^"(.-)",(.*)$')
    if tag then tag = tag:gsub('""', '"') else tag, rest = line:match("^([^,]*),(.*)$") end
    local step, value, wt = rest:match("^(%-?%d+),([^,]+),([^,]+)$")
    rows[#rows + 1] = {tag = tag, step = math.tointeger(tonumber(step)), value = tonumber(value),
                       wall_time = tonumber(wt)}
  end
  f:close()
  return rows
end

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

describe("crun.metrics.SummaryWriter", function()
  if not metrics.available then
    pending("built without crun.metrics (no protobuf-c: apt-get install libprotobuf-c-dev protobuf-c-compiler; or CRUN_WITH_METRICS=OFF)")
    return
  end
  local dir = tmpname()
  os.remove(dir)
  teardown(function() os.execute("rm -rf " .. q(dir)) end)

  it("has a reader whose CRC-32C gives the published check value", function()
    assert.are.equal(0xE3069283, crc32c("123456789"))
    assert.are.equal(0x8A9136AA, crc32c(string.rep("\0", 32)))
  end)

  it("writes scalars that read back record by record, checksums and all, and as CSV", function()
    local w <close> = metrics.SummaryWriter(dir .. "/run/a")
    local ev_path, csv_path = w:paths()
    local written = {}
    -- 700 scalars (the file crosses several 4 KiB buffers), signed non-periodic
    -- values and steps, three tags, one needing CSV quoting
    local tags = {"loss", "lr/group 0", 'odd,"tag"'}
    for i = 1, 700 do
      local v = math.sin(i * 0.37) * (i % 11 - 5.5) * 10 ^ (i % 7 - 3)
      local step = i * 3 - 50
      local tag = tags[i % 3 + 1]
      w:add_scalar(tag, v, step, 1.7e9 + i / 8)
      written[i] = {tag = tag, value = v, step = step, wall_time = 1.7e9 + i / 8}
    end
    w:close()
    local evs = read_events(ev_path)
    assert.are.equal(701, #evs)
    assert.are.equal("brain.Event:2", evs[1].file_version)
    assert.is_true(math.abs(evs[1].wall_time - os.time()) < 3600)
    for i, e in ipairs(written) do
      local ev = evs[i + 1]
      assert.are.equal(1, #ev.values)
      assert.are.same({e.tag, e.step, e.wall_time, f32(e.value)},
                      {ev.values[1].tag, ev.step, ev.wall_time, ev.values[1].simple_value})
    end
    local rows = read_csv(csv_path)
    assert.are.equal(700, #rows)
    for i, e in ipairs(written) do
      assert.are.same({e.tag, e.step, e.value}, {rows[i].tag, rows[i].step, rows[i].value})
      assert.is_true(math.abs(rows[i].wall_time - e.wall_time) < 1e-5)
    end
  end)

  it("keeps every CSV row, each whole, when two writers share a directory and a run writes it again", function()
    -- two writers of one directory used to truncate each other's scalars.csv and
    -- write over each other's rows ('oss,2,...')
    local a = metrics.SummaryWriter(dir .. "/shared")
    a:add_scalar("loss", 1.25, 1, 1.7e9)
    a:flush()
    local b = metrics.SummaryWriter(dir .. "/shared")
    local want = {{"loss", 1, 1.25}}
    for i = 1, 300 do -- interleaved, past any 4 KiB buffer, signed non-periodic values
      local v = math.cos(i * 0.61) * (i % 7 - 3.5)
      if i % 2 == 0 then a:add_scalar("loss", v, i + 1, 1.7e9 + i) else b:add_scalar('acc,"x"', v, -i, 1.7e9 + i) end
      want[#want + 1] = {i % 2 == 0 and "loss" or 'acc,"x"', i % 2 == 0 and i + 1 or -i, v}
    end
    a:close()
    b:close()
    local again <close> = metrics.SummaryWriter(dir .. "/shared") -- a second run into the same directory
    local _, csv_path = again:paths()
    again:add_scalar("loss", -2.5, 7, 1.8e9)
    again:close()
    want[#want + 1] = {"loss", 7, -2.5}
    local got = {}
    for _, r in ipairs(read_csv(csv_path)) do got[#got + 1] = {r.tag, r.step, r.value} end
    assert.are.same(want, got)
  end)

  it("writes histograms of a tensor and of a table: statistics and equal-width buckets", function()
    local w <close> = metrics.SummaryWriter(dir .. "/hist", {filename_suffix = ".h"})
    local ev_path, csv_path = w:paths()
    assert.truthy(ev_path:match("%.h$") and csv_path:match("scalars%.h%.csv$"))
    local vals = {}
    for i = 1, 1000 do vals[i] = (i * 7919 % 1009 - 504) / 37 + math.cos(i) end
    local t = crun.tensor.new(vals, "float64")
    w:add_histogram("t", t, 5)
    w:add_histogram("list", {3, -1.5, 3, 2}, -2, 4)
    w:add_histogram("same", {2.5, 2.5}, 7)
    w:add_histogram("none", {}, 8)
    -- a transposed (non-contiguous) float32 view: the same histogram as its values listed
    local m = crun.tensor.new({{1.5, -2, 7}, {0.25, 3, -6.5}}, "float32")
    w:add_histogram("view", m:t(), 9, 3)
    w:add_histogram("view_list", {1.5, 0.25, -2, 3, 7, -6.5}, 9, 3)
    w:close()
    local evs = read_events(ev_path)
    assert.are.equal(7, #evs)
    assert.is_false(m:t():is_contiguous())
    assert.are.same(evs[7].values[1].histo, evs[6].values[1].histo)
    assert.are.same({1, 3, 2}, evs[6].values[1].histo.bucket)
    -- expected: computed here from the values
    local lo, hi, s, s2 = math.huge, -math.huge, 0, 0
    for _, v in ipairs(vals) do lo, hi, s, s2 = math.min(lo, v), math.max(hi, v), s + v, s2 + v * v end
    local counts = {}
    for b = 1, 30 do counts[b] = 0 end
    for _, v in ipairs(vals) do
      local b = math.min(math.floor((v - lo) / ((hi - lo) / 30)) + 1, 30)
      counts[b] = counts[b] + 1
    end
    local h = evs[2].values[1].histo
    assert.are.equal("t", evs[2].values[1].tag)
    assert.are.equal(5, evs[2].step)
    assert.are.same({lo, hi, 1000}, {h.min, h.max, h.num})
    assert.is_true(math.abs(h.sum - s) < 1e-9 * s2 and math.abs(h.sum_squares - s2) < 1e-9 * s2)
    assert.are.same(counts, h.bucket)
    assert.are.equal(30, #h.bucket_limit)
    assert.are.equal(hi, h.bucket_limit[30])
    assert.is_true(math.abs(h.bucket_limit[1] - (lo + (hi - lo) / 30)) < 1e-12 * (hi - lo))
    local l = evs[3].values[1].histo
    assert.are.equal(-2, evs[3].step)
    assert.are.same({-1.5, 3, 4, 6.5, 9 + 2.25 + 9 + 4}, {l.min, l.max, l.num, l.sum, l.sum_squares})
    assert.are.same({1, 0, 0, 3}, l.bucket) -- edges -0.375, 0.75, 1.875, 3
    assert.are.same({-1.5 + 4.5 / 4, -1.5 + 4.5 / 2, -1.5 + 4.5 * 3 / 4, 3}, l.bucket_limit)
    assert.are.same({2}, evs[4].values[1].histo.bucket)
    assert.are.same({2.5}, evs[4].values[1].histo.bucket_limit)
    assert.are.same({}, evs[5].values[1].histo.bucket)
    assert.are.equal(0, evs[5].values[1].histo.num)
    assert.are.same({}, read_csv(csv_path)) -- histograms do not go to the CSV
  end)

  it("has a reader that notices a flipped bit in data or length", function()
    local w = metrics.SummaryWriter(dir .. "/flip")
    local path = w:paths()
    w:add_scalar("x", 1.5, 1)
    w:close()
    local f = assert(io.open(path, "rb"))
    local s = f:read("a")
    f:close()
    local first = 16 + string.unpack("<I8", s)
    for _, at in ipairs{first + 3, first + 14, #s - 6} do -- length, data, data
      local bad = s:sub(1, at - 1) .. string.char(s:byte(at) ~ 0x10) .. s:sub(at + 1)
      local g = assert(io.open(path, "wb"))
      g:write(bad)
      g:close()
      local ok, err = pcall(read_records, path)
      assert.is_false(ok)
      assert.truthy(tostring(err):match("record 2"), err)
    end
  end)

  -- hi - lo overflowed to inf: the top value's bucket was inf / inf = NaN,
  -- cast to INT_MIN, and the count was written far before the buckets (SEGV)
  it("bins finite values whose range exceeds the largest double", function()
    local w <close> = metrics.SummaryWriter(dir .. "/hist_wide")
    local ev_path = w:paths()
    w:add_histogram("wide", {-1.5e308, 1.5e308, 0, 1.5e308}, 1, 4)
    w:add_histogram("wide1", {-1e308, 1e308}, 2, 1)
    w:close()
    local evs = read_events(ev_path)
    local h = evs[2].values[1].histo
    assert.are.same({1, 0, 1, 2}, h.bucket) -- 0 sits on the edge of buckets 2 and 3: the upper one
    assert.are.same({-0.75e308, 0, 0.75e308, 1.5e308}, h.bucket_limit)
    assert.are.same({-1.5e308, 1.5e308, 4}, {h.min, h.max, h.num})
    assert.are.same({2}, evs[3].values[1].histo.bucket)
  end)

  it("raises EINVAL for non-finite histogram values, empty tags and use after close", function()
    local w = metrics.SummaryWriter(dir .. "/err")
    local ok, err = pcall(w.add_histogram, w, "h", {1, 0 / 0, 2}, 1)
    assert.is_false(ok)
    assert.truthy(err:match("^EINVAL: add_histogram: value 2 is nan"), err)
    ok, err = pcall(w.add_scalar, w, "", 1, 1)
    assert.truthy(not ok and err:match("^EINVAL:.*empty tag"), err)
    w:close()
    w:close()
    ok, err = pcall(w.add_scalar, w, "a", 1, 1)
    assert.truthy(not ok and err:match("^EINVAL: SummaryWriter: used after close"), err)
    -- the CSV cannot be created (a directory has its name): EIO, and the
    -- half-made writer is collected without harm
    os.execute("mkdir -p " .. q(dir .. "/err2/scalars.csv"))
    ok, err = pcall(metrics.SummaryWriter, dir .. "/err2")
    assert.truthy(not ok and err:match("^EIO: SummaryWriter: cannot create .*/err2/scalars%.csv: Is a directory"), err)
    collectgarbage()
    collectgarbage()
    ok, err = pcall(metrics.SummaryWriter, "/proc/crun-no/such")
    assert.truthy(not ok and err:match("^EIO: SummaryWriter: cannot create directory /proc/crun%-no"), err)
  end)

  -- a misspelt option (filename_sufix) was ignored, as was a suffix of the wrong type
  it("raises EINVAL for an unknown option or a filename_suffix that is no string", function()
    local ok, err = pcall(metrics.SummaryWriter, dir .. "/opts", {filename_sufix = ".x"})
    assert.truthy(not ok and err:find("EINVAL: SummaryWriter: unknown option 'filename_sufix'", 1, true), err)
    ok, err = pcall(metrics.SummaryWriter, dir .. "/opts", {filename_suffix = 3})
    assert.truthy(not ok and err:find("EINVAL: SummaryWriter: filename_suffix must be a string, got number", 1, true), err)
    local w <close> = metrics.SummaryWriter(dir .. "/opts", {flush_secs = 10, max_queue = 5}) -- torch's, inert
    assert.truthy(w:paths():find("/opts/", 1, true))
  end)

  it("gets loss, accuracy, samples/s and step time from jobs/train.lua --logdir (rank 0)", function()
    local crun_lua = os.getenv("CRUN_LUA")
    if not crun_lua then
      pending("CRUN_LUA not set (run through ctest)")
      return
    end
    local logdir = dir .. "/train"
    local p = io.popen(string.format("timeout -s KILL 120 %s -n 2 --master-port 0 jobs/train.lua --epochs 2 " ..
      "--samples 1200 --no-ckpt --quiet --logdir %s 2>&1; echo rc=$?", q(crun_lua), q(logdir)))
    local out = p:read("a")
    p:close()
    assert.truthy(out:match("rc=0%s*$"), out)
    local pe = io.popen("ls " .. q(logdir))
    local names = pe:read("a")
    pe:close()
    local ev_name = names:match("(events%.out%.tfevents%.[^\n]+)")
    assert.truthy(ev_name, names)
    assert.are.equal(1, select(2, names:gsub("events%.out", ""))) -- rank 0 only
    local per_tag = {}
    for _, ev in ipairs(read_events(logdir .. "/" .. ev_name)) do
      for _, v in ipairs(ev.values) do
        per_tag[v.tag] = per_tag[v.tag] or {}
        table.insert(per_tag[v.tag], {ev.step, v.simple_value})
      end
    end
    -- 1200 samples, 20% held out, 2 ranks x batch 32: 15 steps per epoch
    assert.are.equal(30, #per_tag["train/loss"])
    assert.are.equal(30, #per_tag["train/step_time"])
    for _, tag in ipairs{"train/samples_per_s", "test/loss", "test/accuracy"} do
      assert.are.same({15, 30}, {per_tag[tag][1][1], per_tag[tag][2][1]})
    end
    for _, sv in ipairs(per_tag["test/accuracy"]) do assert.is_true(sv[2] >= 0 and sv[2] <= 1) end
    for _, sv in ipairs(per_tag["train/step_time"]) do assert.is_true(sv[2] > 0) end
    assert.is_true(per_tag["train/samples_per_s"][1][2] > 0)
    local rows = read_csv(logdir .. "/scalars.csv")
    assert.are.equal(30 + 30 + 6, #rows)
    assert.are.equal(f32(rows[1].value), per_tag["train/loss"][1][2])
  end)
end)

-- crun.data.load_digits (the UCI handwritten digits CSV of Debian's
-- python3-sklearn, gunzipped through zlib), train_test_split, and a short
-- jobs/digits.lua run on 2 ranks with DDP and with FSDP. The data file is
-- fetched by scripts/fetch_digits.sh when it is not cached; where that
-- cannot work (no apt, no network) the cases are pending with the reason.
local util = require "helpers.train_util"
local data = require "crun.data"

-- Returns the path of the digits file, or nil and why it is not there.
local function digits_file()
  local path = data.digits_path()
  local f = io.open(path, "rb")
  if f then f:close() return path end
  local p = io.popen("timeout 300 scripts/fetch_digits.sh 2>&1")
  local out = p:read("a")
  local ok = p:close()
  if ok then return path end
  return nil, "the digits file cannot be fetched: " .. (out:match("([^\n]+)\n*$") or "no output")
end

local function sh(cmd) assert(os.execute(cmd), cmd) end

describe("crun.data.load_digits", function()
  it("reads 1,797 images of 64 pixels with digits 0-9 in sklearn's class counts", function()
    local path, why = digits_file()
    if not path then pending(why) return end
    local X, Y, info = data.load_digits{path = path}
    assert.are.same({1797, 64}, X:size())
    assert.are.equal(1797, info.n)
    assert.are.equal("int64", Y:dtype())
    local counts, lo, hi = {}, math.huge, -math.huge
    for i = 1, 1797 do counts[Y[i]] = (counts[Y[i]] or 0) + 1 end
    -- sklearn's documented per-digit counts (load_digits: 178, 182, 177, ...)
    assert.are.same({178, 182, 177, 183, 181, 182, 181, 179, 174, 180}, counts)
    for _, v in ipairs(util.list(X)) do lo, hi = math.min(lo, v), math.max(hi, v) end
    assert.are.equal(0, lo)
    assert.are.equal(1, hi)
    -- the first image of the file (a 0), as sklearn prints digits.data[0]
    local first = {0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0}
    for k, v in ipairs(first) do assert.are.equal(v / 16, X[1][k]) end
    assert.are.equal(1, Y[1])
    local img = data.load_digits{path = path, image = true}
    assert.are.same({1797, 1, 8, 8}, img:size())
  end)

  it("names the file and the line of a malformed row, and the fetch script when the file is missing", function()
    local dir = util.tmpdir()
    local f = assert(io.open(dir .. "/bad.csv", "w"))
    f:write(string.rep("1,", 64) .. "3\n" .. string.rep("2,", 63) .. "7\n")
    f:close()
    sh("gzip -f '" .. dir .. "/bad.csv'")
    local ok, err = pcall(data.load_digits, {path = dir .. "/bad.csv.gz"})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^EINVAL: load_digits: .*bad%.csv%.gz line 2 has 64 fields"), err)
    -- a plain (not gzipped) file reads too (zlib passes it through)
    f = assert(io.open(dir .. "/ok.csv", "w"))
    f:write(string.rep("16,", 64) .. "9\n")
    f:close()
    local X, Y = data.load_digits{path = dir .. "/ok.csv"}
    assert.are.equal(1, X[1][64])
    assert.are.equal(10, Y[1])
    -- a NUL ended the path in io.open and zlib: ok.csv was read for ok.csv\0.gz
    ok, err = pcall(data.load_digits, {path = dir .. "/ok.csv\0.gz"})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^EINVAL: load_digits: path must be a string without a NUL byte"), err)
    ok, err = pcall(data.load_digits, {path = dir .. "/none.csv.gz"})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("^ENOTFOUND: .*none%.csv%.gz.*fetch_digits%.sh"), err)
    sh("rm -rf '" .. dir .. "'")
  end)

  it("train_test_split is a seeded partition", function()
    local tr, te = data.train_test_split(1797, 0.25, 2024)
    assert.are.equal(449, #te)
    assert.are.equal(1348, #tr)
    local seen = {}
    for _, i in ipairs(tr) do seen[i] = true end
    for _, i in ipairs(te) do assert.is_nil(seen[i]); seen[i] = true end
    for i = 1, 1797 do assert.is_true(seen[i]) end
    local tr2, te2 = data.train_test_split(1797, 0.25, 2024)
    assert.are.same(te, te2)
    local _, te3 = data.train_test_split(1797, 0.25, 7)
    assert.are_not.same(te, te3)
  end)
end)

describe("jobs/digits.lua", function()
  for _, mode in ipairs{"", "--fsdp"} do
    it("trains the CNN on 2 ranks " .. (mode == "" and "with DDP" or "with FSDP") .. " well above chance in 2 epochs", function()
      local path, why = digits_file()
      if not path then pending(why) return end
      if not util.have_launcher() then pending("crun-lua or crun.dist is not built") return end
      local ok, out = util.crun(2, "jobs/digits.lua", "--epochs 2 --quiet --data " .. path .. " " .. mode)
      assert.is_true(ok, out)
      local acc = tonumber(out:match("final test accuracy ([%d.]+)%%"))
      assert.is_truthy(acc, out)
      assert.is_true(acc > 80, out) -- chance is 10 %
      assert.is_truthy(out:match("confusion matrix"), out)
      assert.are.equal(10, select(2, out:gsub("\n%[0%]%s+%d:%s+%d", "")), out)
    end)
  end
end)

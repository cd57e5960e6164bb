-- crun.opts: the check behind every options table (unknown keys, torch's
-- aliases, options that have no effect in crun).
local O = require "crun.opts"

describe("crun.opts", function()
  local s = O.spec{"group", "timeout", aliases = {process_group = "group"},
                   inert = {static_graph = "no graph hint is needed"}}

  it("passes a table of known keys through unchanged, and nil as an empty table", function()
    local o = {group = 1, timeout = 5}
    assert.equal(o, O.check(s, "f", o))
    assert.same({}, O.check(s, "f", nil))
  end)

  it("rejects an unknown key with EINVAL naming it and the accepted keys", function()
    local ok, err = pcall(O.check, s, "DDP", {find_unusd = true})
    assert.is_false(ok)
    assert.equal("EINVAL: DDP: unknown option 'find_unusd' (accepted: group, process_group, static_graph, timeout)", err)
  end)

  it("renames torch's alias to crun's key without touching the caller's table", function()
    local o = {process_group = 7}
    local c = O.check(s, "f", o)
    assert.same({group = 7}, c)
    assert.same({process_group = 7}, o)
  end)

  it("rejects an alias and its key given different values", function()
    local ok, err = pcall(O.check, s, "f", {process_group = 1, group = 2})
    assert.is_false(ok)
    assert.matches("^EINVAL: f: options 'process_group' and 'group'", err)
  end)

  it("drops an inert key", function()
    assert.same({timeout = 1}, O.check(s, "f", {static_graph = true, timeout = 1}))
  end)

  it("rejects options that are not a table", function()
    local ok, err = pcall(O.check, s, "f", 3)
    assert.is_false(ok)
    assert.equal("EINVAL: f: options must be a table, got number", err)
  end)

  it("fail() raises its text with no position, plus the rank under a job", function()
    local ok, err = pcall(O.fail, "EINVAL: f: %s is %d", "x", -3)
    assert.is_false(ok)
    assert.equal("EINVAL: f: x is -3", err)
    local p = io.popen([[RANK=5 lua5.4 -e 'local O = require "crun.opts"
      io.write(select(2, pcall(O.fail, "ESTATE: g: %s", "late")))' 2>&1]])
    local out = p:read("a")
    p:close()
    assert.equal("ESTATE: g: late (rank 5)", out)
  end)

  it("int/num/bool give the default for nil and EINVAL naming the call and the option otherwise", function()
    assert.equal(7, O.int("f", "n", nil, 1, 7))
    assert.equal(-4, O.int("f", "n", -4))
    assert.equal(0.5, O.num("f", "x", 0.5, 0))
    assert.is_false(O.bool("f", "b", nil, false))
    local cases = {
      {function() O.int("f", "n", 0, 1) end, "EINVAL: f: n must be an integer >= 1, got 0"},
      {function() O.int("f", "n", 2.5) end, "EINVAL: f: n must be an integer, got 2.5"},
      {function() O.num("f", "x", -1, 0) end, "EINVAL: f: x must be a number >= 0, got -1"},
      {function() O.num("f", "x", 0 / 0) end, "EINVAL: f: x must be a number, got " .. tostring(0 / 0)},
      {function() O.num("f", "x", "1") end, "EINVAL: f: x must be a number, got 1"},
      {function() O.bool("f", "b", 1) end, "EINVAL: f: b must be true or false, got 1"},
    }
    for i, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok, "case " .. i)
      assert.equal(c[2], err)
    end
  end)
end)

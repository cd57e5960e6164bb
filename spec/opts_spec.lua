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
end)

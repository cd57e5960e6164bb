-- Fails (exit 1, naming file:line) when a test or spec makes a path in the
-- shared /tmp instead of under $TMPDIR: a string literal that starts with
-- /tmp/, or os.tmpname() (Lua's always makes /tmp/lua_XXXXXX). ctest gives
-- every test a TMPDIR of its own and removes it after (tests/tmpdir_run.sh),
-- so only such paths can outlive a test run. Allowed: "/tmp" alone as the
-- fallback of an unset TMPDIR (`or "/tmp"`, `: "/tmp"`), comments, and a
-- line that says why with `tmp-ok:`.
--   usage: lua5.4 tests/tmp_paths_check.lua SOURCE_DIR
local root = arg[1] or "."
local exts = {lua = "--", c = "//", h = "//", sh = "#", py = "#"}

--- The code of one line without its comment (approximate: a comment marker
-- inside a string cuts the line there too, which only hides, never invents).
local function code_of(line, marker)
  if line:match("^%s*/?%*") then return "" end -- inside a C block comment
  local at = line:find(marker, 1, true)
  return at and line:sub(1, at - 1) or line
end

local function bad(code)
  if code:find("os%.tmpname%s*%(") then return "os.tmpname() makes its file in /tmp" end
  for pre, q in code:gmatch("(.?.?.?.?)([\"'])/tmp/") do
    if not pre:match("%.%.%s*$") then return "a path literal in /tmp (use $TMPDIR)" end
  end
  for pre in code:gmatch("(.?.?.?.?)[\"']/tmp[\"']") do
    if not (pre:match("or%s+$") or pre:match(":%s*$") or pre:match("%.%.%s*$")) then
      return "/tmp as a directory (use $TMPDIR)"
    end
  end
end

local found = 0
local p = io.popen("cd '" .. root:gsub("'", "'\\''") .. "' && find spec tests -type f | sort")
for file in p:lines() do
  local marker = exts[file:match("%.(%w+)$") or ""]
  if marker and file ~= "tests/tmp_paths_check.lua" then
    local n = 0
    for line in io.lines(root .. "/" .. file) do
      n = n + 1
      local why = not line:find("tmp-ok:", 1, true) and bad(code_of(line, marker))
      if why then
        found = found + 1
        io.stderr:write(string.format("%s:%d: %s\n    %s\n", file, n, why, line))
      end
    end
  end
end
p:close()
if found > 0 then
  io.stderr:write(string.format("tmp_paths_check: %d path(s) outside $TMPDIR; a test run would leave them in /tmp\n", found))
  os.exit(1)
end
print("tmp_paths_check: every test and spec makes its temporary paths under $TMPDIR")

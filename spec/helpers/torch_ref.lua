-- torch_ref.lua — runs a Python script against torch itself, for the specs'
-- "matches torch itself" cases.
--   local why = torch_ref.missing()     -- nil when `import torch` works, else the reason
--   local out = torch_ref.run(script)   -- the script's stdout; raises when it fails
-- A case calls pending(why) when torch cannot be imported, and FAILS when torch
-- imports but the comparison script errors (exit status, traceback): a broken
-- comparison must never pass silently.
local tmpname = require("helpers.common").tmpname -- os.tmpname() under TMPDIR
local M = {}

-- The interpreters tried in order: CRUN_PYTHON when set, else Debian's
-- /usr/bin/python3 (where python3-torch installs) and then python3 on PATH
-- (which may be another installation, e.g. a pyenv shim).
local CANDIDATES = os.getenv("CRUN_PYTHON") and {os.getenv("CRUN_PYTHON")} or {"/usr/bin/python3", "python3"}
local PYTHON

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs cmd; returns its combined output and exit status.
local function capture(cmd)
  local p = assert(io.popen("{ " .. cmd .. "; } 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

local checked, why_missing = false, nil

--- Returns nil when one of the interpreters imports torch (and picks it for
--- run), else a one-line reason naming each one tried (cached).
function M.missing()
  if checked then return why_missing end
  checked = true
  local reasons = {}
  for _, py in ipairs(CANDIDATES) do
    local out, code = capture("timeout 300 " .. sh_quote(py) .. " -c 'import torch'")
    if code == 0 then
      PYTHON = py
      return nil
    end
    reasons[#reasons + 1] = py .. ": " .. (out:match("([^\n]+)\n*$") or ("exit status " .. tostring(code)))
  end
  why_missing = "torch is not importable (" .. table.concat(reasons, "; ") .. ")"
  return why_missing
end

--- Runs the Python source `script` (torch importable); returns its output.
--- Raises an error with the script's output when it exits non-zero.
function M.run(script)
  assert(PYTHON, "torch_ref.run before torch_ref.missing() found torch")
  local path = tmpname()
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local out, code = capture("timeout 300 " .. sh_quote(PYTHON) .. " " .. sh_quote(path))
  os.remove(path)
  if code ~= 0 then
    error(string.format("the torch comparison script failed (exit status %s):\n%s", tostring(code), out), 2)
  end
  return out
end

return M

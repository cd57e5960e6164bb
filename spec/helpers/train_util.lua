-- Shared helpers of the training specs: tensor access, finite differences,
-- and running a Lua script under crun-lua.
local util = {}

function util.T()
  local ok, t = pcall(require, "crun.tensor")
  return ok and t or require("crun.core").tensor
end

--- 1-d view of a contiguous tensor.
function util.flat(t) return t:view(t:numel()) end

--- Plain Lua list of a tensor's elements (row-major).
function util.list(t)
  local f, out = util.flat(t:contiguous()), {}
  for i = 1, t:numel() do out[i] = f[i] end
  return out
end

--- Largest |a - b| / max(1, |a|, |b|) over two tensors or lists.
function util.max_rel_err(a, b)
  local la = type(a) == "table" and a or util.list(a)
  local lb = type(b) == "table" and b or util.list(b)
  assert(#la == #lb, "size mismatch " .. #la .. " vs " .. #lb)
  local m = 0
  for i = 1, #la do
    local d = math.abs(la[i] - lb[i]) / math.max(1, math.abs(la[i]), math.abs(lb[i]))
    if d > m then m = d end
  end
  return m
end

--- sum(out .* r) for tensors of equal numel.
function util.dot(out, r)
  local fo, fr, s = util.flat(out:contiguous()), util.flat(r), 0
  for i = 1, out:numel() do s = s + fo[i] * fr[i] end
  return s
end

--- Central finite-difference gradient of f() with respect to tensor t.
function util.numgrad(f, t, eps)
  eps = eps or 1e-6
  local ft, g = util.flat(t), {}
  for i = 1, t:numel() do
    local v = ft[i]
    ft[i] = v + eps
    local fp = f()
    ft[i] = v - eps
    local fm = f()
    ft[i] = v
    g[i] = (fp - fm) / (2 * eps)
  end
  return g
end

--- Runs `crun-lua -n n script args...` and returns ok, output.
function util.crun(n, script, args, extra)
  local exe = os.getenv("CRUN_LUA") or "build/crun-lua"
  local cmd = string.format("timeout 120 %s -n %d --master-port 0 %s %s %s 2>&1", exe, n, extra or "",
    script, args or "")
  local p = io.popen(cmd)
  local out = p:read("a")
  local ok, _, code = p:close()
  return ok and code == 0, out, code
end

--- True when crun-lua and crun.dist exist in this build.
function util.have_launcher()
  local exe = os.getenv("CRUN_LUA") or "build/crun-lua"
  local f = io.open(exe, "rb")
  if not f then return false end
  f:close()
  return (pcall(require, "crun.dist"))
end

--- A fresh temporary directory (under $TMPDIR).
function util.tmpdir()
  return require("helpers.common").tmpdir("train")
end

--- Each case {fn, pattern} raises an error whose text matches pattern.
function util.refuses(cases)
  local check = require "luassert" -- busted's assert (the spec's global, not this module's)
  for _, c in ipairs(cases) do
    local ok, err = pcall(c[1])
    check.is_false(ok, c[2])
    check.matches(c[2], tostring(err))
  end
end

return util

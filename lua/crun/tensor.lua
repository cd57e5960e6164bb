--- crun.tensor: n-d tensors in the Torch7 style, backed by libcrunrt.
--   local T = require "crun.tensor"      -- or crun.tensor
--   local a = T.zeros({3, 4}, "float64"); a[1][2] = 5; print(a[1][2])
--   local b = T.new({{1, 2}, {3, 4}}, "int32"); T.randn({2, 3}, {seed = 1})
-- Dims and indices are 1-based (negative dims count from the end). Views
-- (narrow, select, view, transpose, t[i] of an n-d tensor) share storage.
local core = require "crun.core"
local C = core.tensor

local T = {}
for k, v in pairs(C) do
  if k ~= "methods" and k ~= "metatable" then T[k] = v end
end

local methods, mt = C.methods, C.metatable
local O = require "crun.opts"

-- Raises "EINVAL: bad argument #n to 'fname' (why)" (the binding's form).
local function argerror(n, fname, fmt, ...)
  O.fail("EINVAL: bad argument #%d to '%s' (%s)", n, fname, string.format(fmt, ...))
end
T.methods = methods     -- add methods here: every tensor sees them
T.metatable = mt

-- dtype shorthands, as in Torch7 (t:float(), t:double(), ...).
local shorthands = {float = "float32", double = "float64", half = "float16",
  bfloat16 = "bfloat16", int = "int32", long = "int64", byte = "uint8",
  char = "int8", short = "int16", bool = "bool"}
for name, dt in pairs(shorthands) do
  methods[name] = function(t) return t:to(dt) end
end

--- t:type() -> "crun.FloatTensor"-like name (Torch7 spelling of the dtype).
local tnames = {float32 = "Float", float64 = "Double", float16 = "Half", bfloat16 = "BFloat16",
  int32 = "Int", int64 = "Long", uint8 = "Byte",
  int8 = "Char", int16 = "Short", bool = "Bool"}
function methods.type(t) return "crun." .. tnames[t:dtype()] .. "Tensor" end

-- ------------------------------------------------------------ devices
-- A tensor lives on the host ("cpu") or on a CUDA device ("cuda:N"); see
-- crun.cuda. Math on a device tensor runs where the device kernels exist;
-- a host-only op raises "ENOTSUP: <op>: not implemented for a tensor on
-- cuda:N (copy it to the host with :cpu() first)".
local cuda_mod
local function CU()
  cuda_mod = cuda_mod or require "crun.cuda"
  return cuda_mod
end

-- true when x names a device ("cpu", "cuda", "cuda:N" or an integer N)
local function is_device(x)
  return math.type(x) == "integer" or x == "cpu" or x == "cuda" or
         (type(x) == "string" and x:match("^cuda:%d+$") ~= nil)
end

--- t:device() -> "cpu" or "cuda:N"; t:is_cuda(); t:is_pinned()
function methods.device(t)
  local d = C.device_of(t)
  return d < 0 and "cpu" or ("cuda:" .. d)
end
function methods.is_cuda(t) return C.device_of(t) >= 0 end
methods.is_pinned = C.is_pinned

--- t:cuda([dev]) -> t on device dev (default: the current device); t itself
--- when already there. t:cpu() -> t on the host (waits for the copy).
function methods.cuda(t, d) return C.to_device(t, CU().device_index(d == nil and "cuda" or d, "cuda")) end
function methods.cpu(t) return C.to_device(t, -1) end

--- t:pin_memory() -> a copy in page-locked host memory (copies between it
--- and a device run asynchronously on the current stream)
methods.pin_memory = C.pin_memory

--- t:to(dtype), t:to(device), t:to(device, dtype), t:to(dtype, device):
--- t itself when nothing changes, else a copy. A device is "cpu", "cuda",
--- "cuda:N" or an integer N (cuda:N, as torch's t.to(0)). Floats convert to
--- integers truncated toward zero; nan, inf or a value out of the integer
--- dtype's range is EINVAL naming the element (torch leaves it undefined);
--- integers convert to narrower ones wrapping, as torch's (300 -> 44 in int8).
local to_dtype = methods.to
function methods.to(t, a, b)
  local dev, dt
  for _, x in ipairs({a, b}) do
    if is_device(x) then dev = x else dt = x end
  end
  if a ~= nil and is_device(a) and b ~= nil and is_device(b) then
    argerror(3, "to", "two devices given ('%s' and '%s')", tostring(a), tostring(b))
  end
  if a ~= nil and not is_device(a) and b ~= nil and not is_device(b) then -- (the first was dropped)
    argerror(3, "to", "two dtypes given ('%s' and '%s')", tostring(a), tostring(b))
  end
  if dt ~= nil then t = to_dtype(t, dt) end
  if dev ~= nil then t = C.to_device(t, CU().device_index(dev, "to")) end
  return t
end

--- t:copy_(src) -> t: torch's copy_: src's values written into t (converted
--- to t's dtype), src broadcast to t's shape as torch's (a shape that does
--- not broadcast is EINVAL). A write into a view lands in its base, so
--- t:narrow(1, 2, 2):copy_(v) is torch's t[1:3] = v and t:select(2, 3):fill_(x)
--- its t[:, 2] = x. (t:copy(src), Torch7's, takes no broadcast.)
local copy_same = methods.copy
function methods.copy_(t, src)
  if not T.is_tensor(t) then argerror(1, "copy_", "tensor expected, got %s", type(t)) end
  if not T.is_tensor(src) then argerror(2, "copy_", "tensor expected, got %s", type(src)) end
  local ts, ss = t:size(), src:size()
  if table.concat(ts, "x") ~= table.concat(ss, "x") then
    local ok, e = pcall(methods.expand, src, ts)
    if not ok then
      O.fail("EINVAL: copy_: the source's shape %s does not broadcast to the destination's %s", table.concat(ss, "x"),
        table.concat(ts, "x"))
    end
    src = e
  end
  return copy_same(t, src)
end

-- Element reads go through a host copy on a device tensor (as torch's, they
-- wait for the device).
for _, name in ipairs({"item", "totable", "bytes"}) do
  local f = methods[name]
  methods[name] = function(t, ...)
    if C.device_of(t) >= 0 then t = C.to_device(t, -1) end
    return f(t, ...)
  end
end
methods.tolist = methods.totable

-- t:sum(), t:max(), t:eq(u):sum(), ... over every element return a Lua number
-- and t:all() / t:any() a Lua boolean (if t:all() then ... reads as in
-- torch), where torch returns a 0-d tensor, and ported code reads it with
-- .item(): numbers and booleans get item() and tolist() (the value itself);
-- another method on one is EINVAL saying why instead of "attempt to index a
-- number value". (Set only when nothing else gave that type a metatable.)
local function scalar_methods(sample, kind, why)
  if debug.getmetatable(sample) ~= nil then return end
  local own = {item = function(v) return v end, tolist = function(v) return v end}
  debug.setmetatable(sample, {__index = function(v, k)
    local m = own[k]
    if m then return m end
    O.fail("EINVAL: %s is a Lua %s, which has no method '%s' (%s; only item() and tolist() work on it)", tostring(v),
      kind, tostring(k), why)
  end})
end
scalar_methods(0, "number", "a reduction over every element, t:sum(), t:max(), ..., gives a number where torch " ..
  "gives a 0-d tensor")
scalar_methods(true, "boolean", "t:all() and t:any() over every element give a boolean where torch gives a 0-d tensor")

-- Options of the random factories: crun's seed, torch's dtype, generator,
-- device and pin_memory; requires_grad/layout change nothing. (zeros, ones,
-- empty, full, new and arange read {device =, dtype =, pin_memory =} in C.)
local RANDOM = O.spec{"seed", "dtype", "generator", "device", "pin_memory", inert = {
  requires_grad = "crun tensors record no autograd graph", layout = "crun tensors are strided"}}

-- Moves a new host tensor where the options say (device, pin_memory).
local function place(t, dev, pin)
  if dev ~= nil and dev >= 0 then
    if pin then O.fail("EINVAL: pin_memory applies to host tensors, not cuda:%d", dev) end
    return C.to_device(t, dev)
  end
  if pin then return C.pin_memory(t) end
  return t
end

-- Wraps factory `name` so that its options table (the first table after
-- argument `first`) goes through crun.opts and its device / pin_memory apply.
local function checked_factory(name, first, spec)
  local f = T[name]
  T[name] = function(...)
    local args = table.pack(...)
    local dev, pin
    for i = first + 1, args.n do
      if type(args[i]) == "table" and getmetatable(args[i]) == nil then
        local o = O.check(spec, "tensor." .. name, args[i])
        if o.device ~= nil then dev = CU().device_index(o.device, "tensor." .. name) end
        pin = o.pin_memory
        o.device, o.pin_memory = nil, nil
        args[i] = o
        break
      end
    end
    return place(f(table.unpack(args, 1, args.n)), dev, pin)
  end
end
checked_factory("rand", 1, RANDOM)
checked_factory("randn", 1, RANDOM)
checked_factory("randint", 3, RANDOM)

--- T.randint([low,] high, shape[, opts]): torch's forms; low defaults to 0.
local randint_low_high = T.randint
function T.randint(a, b, ...)
  if math.type(a) == "integer" and type(b) == "table" and getmetatable(b) == nil then return randint_low_high(0, a, b, ...) end
  return randint_low_high(a, b, ...)
end

-- The dtype torch.tensor infers for data: float32 when an entry is a Lua
-- float, else int64 when one is an integer, else bool when there are
-- booleans; float32 for no entries. Entries that are neither go to T.new,
-- which names them.
local function inferred_dtype(data)
  local int, float, bool = false, false, false
  local function walk(v, depth)
    if float or depth > 64 then return end
    if type(v) == "table" then
      for i = 1, #v do walk(v[i], depth + 1) end
    elseif math.type(v) == "float" then float = true
    elseif math.type(v) == "integer" then int = true
    elseif type(v) == "boolean" then bool = true end
  end
  walk(data, 0)
  return float and "float32" or int and "int64" or bool and "bool" or "float32"
end

--- T.tensor(data[, dtype][, {device=, dtype=, pin_memory=}]): torch.tensor. A
--- new tensor from a number or boolean (0-d) or a nested table of them. Without
--- a dtype it is inferred as torch does: {1, 2} is int64 (labels), {1.5, 2} and
--- {1.0, 2} float32, {true, false} bool. (T.new always defaults to float32.)
function T.tensor(data, a, ...)
  if T.is_tensor(data) then return data:clone() end -- torch copies (and warns)
  local opts_dtype = type(a) == "table" and getmetatable(a) == nil and a.dtype ~= nil
  if type(a) ~= "string" and not opts_dtype then
    local dt = inferred_dtype(data)
    if a == nil then return T.tensor(data, dt) end
    local o = {}
    for k, v in pairs(a) do o[k] = v end
    o.dtype = dt
    return T.tensor(data, o, ...)
  end
  if type(data) == "number" or type(data) == "boolean" then
    return T.new({data}, a, ...):reshape({})
  end
  return T.new(data, a, ...)
end

--- T.zeros_like(t[, dtype]) / T.ones_like / T.empty_like / T.full_like(t, v[, dtype]):
--- on t's device
function T.zeros_like(t, dtype) return T.zeros(t:size(), dtype or t:dtype(), {device = t:device()}) end
function T.ones_like(t, dtype) return T.ones(t:size(), dtype or t:dtype(), {device = t:device()}) end
function T.empty_like(t, dtype) return T.empty(t:size(), dtype or t:dtype(), {device = t:device()}) end
function T.full_like(t, v, dtype) return T.full(t:size(), v, dtype or t:dtype(), {device = t:device()}) end

-- Checks that every tensor of list has the shape of list[1] except along dim.
local function check_cat(list, dim, fname)
  if type(list) ~= "table" or #list == 0 then
    argerror(1, fname, "non-empty list of tensors expected")
  end
  if not T.is_tensor(list[1]) then argerror(1, fname, "entry 1 is a %s, tensor expected", type(list[1])) end
  local first = list[1]:size()
  for i, t in ipairs(list) do
    if not T.is_tensor(t) then
      argerror(1, fname, "entry %d is a %s, tensor expected", i, type(t))
    end
    local s = t:size()
    if #s ~= #first then
      argerror(1, fname, "tensor %d has %d dims, tensor 1 has %d", i, #s, #first)
    end
    for d = 1, #s do
      if d ~= dim and s[d] ~= first[d] then
        argerror(1, fname, "tensor %d has size %d in dim %d, tensor 1 has %d", i, s[d], d, first[d])
      end
    end
  end
  return first
end

-- torch.promote_types over crun's dtypes: bool < integers < floats, the
-- wider of a kind; uint8 with int8 is int16, float16 with bfloat16 float32.
local PROMOTE_RANK = {bool = 0, uint8 = 1, int8 = 1, int16 = 2, int32 = 3, int64 = 4, float16 = 5, bfloat16 = 5,
  float32 = 6, float64 = 7}
local function promote(a, b)
  if a == b then return a end
  local ra, rb = PROMOTE_RANK[a], PROMOTE_RANK[b]
  if ra == rb then return ra == 1 and "int16" or "float32" end
  return ra > rb and a or b
end

-- The dtype of cat/stack's result: every input's promoted, as torch's (the
-- first one's truncated 2.5 to 2 in cat({int64, float32}) and wrapped 300 to
-- 44 in stack({int8, int64})).
local function result_dtype(list)
  local dt = list[1]:dtype()
  for i = 2, #list do dt = promote(dt, list[i]:dtype()) end
  return dt
end

--- T.cat(list, dim=1): concatenates tensors along an existing dim (dtypes
--- promoted as torch's: int64 with float32 gives float32).
function T.cat(list, dim)
  dim = dim or 1
  if math.type(dim) ~= "integer" then argerror(2, "cat", "integer dim expected, got %s", tostring(dim)) end
  local shape = check_cat(list, dim, "cat")
  if dim < 0 then dim = #shape + dim + 1 end
  if dim < 1 or dim > #shape then argerror(2, "cat", "dim %d out of range for %d-d tensors", dim, #shape) end
  local total = 0
  for _, t in ipairs(list) do total = total + t:size(dim) end
  shape[dim] = total
  local out, pos = T.empty(shape, result_dtype(list)), 1
  for _, t in ipairs(list) do
    local n = t:size(dim)
    if n > 0 then out:narrow(dim, pos, n):copy(t) end
    pos = pos + n
  end
  return out
end

--- T.stack(list, dim=1): stacks same-shaped tensors along a new dim (dtypes promoted as cat's).
function T.stack(list, dim)
  dim = dim or 1
  if math.type(dim) ~= "integer" then argerror(2, "stack", "integer dim expected, got %s", tostring(dim)) end
  local shape = check_cat(list, 0, "stack")
  if dim < 0 then dim = #shape + dim + 2 end
  if dim < 1 or dim > #shape + 1 then argerror(2, "stack", "dim %d out of range for %d-d tensors", dim, #shape) end
  table.insert(shape, dim, #list)
  local out = T.empty(shape, result_dtype(list))
  for i, t in ipairs(list) do out:select(dim, i):copy(t) end
  return out
end

-- t:softmax([dim][, dtype]) / t:log_softmax: along dim (1-based, negative
-- from the end), on t converted to dtype first when given (a name or
-- {dtype=}, torch's dtype=). With no dim, torch's implicit (deprecated) choice of
-- F.softmax / nn.Softmax(): dim 1 of a 0-, 1- or 3-d tensor, else dim 2,
-- with a warning once per process. A 0-d tensor takes dim 1 or -1 (torch's
-- 0 or -1) and gives a 0-d 1 (log: 0), as torch's. (Plain comments: LDoc
-- cannot attach a doc block to a loop.)
-- A dtype given as "float64" or {dtype = "float64"} (torch's dtype=), or nil.
local DTYPE = O.spec{"dtype"}
local function dtype_arg(fname, d)
  if type(d) == "table" and getmetatable(d) == nil then return O.check(DTYPE, fname, d).dtype end
  return d
end

for _, name in ipairs({"softmax", "log_softmax"}) do
  local f = methods[name]
  methods[name] = function(t, dim, dtype)
    dtype = dtype_arg(name, dtype)
    if dtype ~= nil and T.is_tensor(t) then t = t:to(dtype) end -- (torch converts the input first)
    if dim == nil and T.is_tensor(t) then
      local nd = t:dim()
      dim = (nd <= 1 or nd == 3) and 1 or 2
      O.warn_once("softmax_dim", "%s: implicit dim choice is deprecated, as in torch: dim %d of this %d-d tensor " ..
                  "taken by torch's rule (1-based; pass the dim)", name, dim, nd)
    end
    if T.is_tensor(t) and t:dim() == 0 and (dim == 1 or dim == -1) then
      return f(t:reshape({1}), 1):reshape({})
    end
    return f(t, dim)
  end
end

--- t:div(x[, {rounding_mode=}]) / t:div_: true division (integer tensors
--- divide in float, as torch's); rounding_mode "floor" rounds the quotient
--- toward -inf (floor_divide), "trunc" toward 0, both in the operands'
--- promoted dtype (integers stay integers; a zero integer divisor is EINVAL).
local DIV = O.spec{"rounding_mode"}
local DIV_ROUNDED = {floor = methods.floor_divide, trunc = methods._div_trunc}
for _, name in ipairs({"div", "div_"}) do
  local f = methods[name]
  methods[name] = function(a, b, opts)
    local mode = opts
    if type(opts) == "table" and getmetatable(opts) == nil then mode = O.check(DIV, "div", opts).rounding_mode end
    if mode == nil then return f(a, b) end
    local rounded = DIV_ROUNDED[mode]
    if rounded == nil then O.fail("EINVAL: div: rounding_mode must be 'floor', 'trunc' or nil, got %s", tostring(mode)) end
    if name == "div_" then return a:copy(rounded(a, b)) end
    return rounded(a, b)
  end
end

--- t:round([decimals]) / t:round_: to the nearest integer, half to even;
--- with decimals (or {decimals=}) to that many digits after the point (before
--- it when negative), computed as torch's round(x, decimals=): x * 10^d
--- rounded, divided by 10^d, in t's dtype.
local ROUND = O.spec{"decimals"}
for _, name in ipairs({"round", "round_"}) do
  local f, inplace = methods[name], name == "round_"
  methods[name] = function(t, d)
    if type(d) == "table" and getmetatable(d) == nil then d = O.check(ROUND, name, d).decimals end
    if d == nil or d == 0 or not T.is_tensor(t) or t:dtype():find("float") == nil then return f(t) end
    if math.type(d) ~= "integer" then O.fail("EINVAL: round: decimals must be an integer, got %s", tostring(d)) end
    local p = 10.0 ^ math.abs(d)
    if inplace then
      if d > 0 then return f(t:mul_(p)):div_(p) end
      return f(t:div_(p)):mul_(p)
    end
    if d > 0 then return f(t * p):div_(p) end
    return f(t / p):mul_(p)
  end
end

--- t:sum([dim][, keepdim][, dtype]) and mean / prod; t:max([dim][, keepdim])
--- and min / argmax / argmin, or all as one table t:argmax{dim=, keepdim=}
--- (torch's keywords): keepdim is true, false or nil, or an options
--- table {keepdim=, dtype=} (torch's keywords); dtype (sum, mean, prod: a
--- name or {dtype=}) converts t first, as torch's dtype=. Anything else in
--- those places is EINVAL rather than read as Lua truth (a 0 is true there).
--- t:max(u) / t:min(u) with a tensor u are t:maximum(u) / t:minimum(u).
local REDUCE = {with_dtype = O.spec{"keepdim", "dtype"}, plain = O.spec{"keepdim"}}
local REDUCE_KW = {with_dtype = O.spec{"dim", "keepdim", "dtype"}, plain = O.spec{"dim", "keepdim"}}
for _, name in ipairs({"sum", "mean", "prod", "max", "min", "argmax", "argmin"}) do
  local f, with_dtype = methods[name], name == "sum" or name == "mean" or name == "prod"
  local elementwise = (name == "max" or name == "min") and methods[name .. "imum"]
  methods[name] = function(t, dim, keepdim, dtype)
    if elementwise and T.is_tensor(dim) then return elementwise(t, dim) end -- torch.max(a, b)
    if type(dim) == "table" and getmetatable(dim) == nil then -- torch's t.argmax(dim=1, keepdim=True)
      local o = O.check(with_dtype and REDUCE_KW.with_dtype or REDUCE_KW.plain, name, dim)
      dim, keepdim, dtype = o.dim, o.keepdim, o.dtype
    end
    if type(keepdim) == "table" and getmetatable(keepdim) == nil then
      local o = O.check(with_dtype and REDUCE.with_dtype or REDUCE.plain, name, keepdim)
      keepdim, dtype = o.keepdim, o.dtype or dtype
    end
    if keepdim ~= nil and type(keepdim) ~= "boolean" then
      O.fail("EINVAL: %s: keepdim must be true or false, got %s", name, tostring(keepdim))
    end
    if dtype ~= nil then
      if not with_dtype then O.fail("EINVAL: %s: unexpected argument #4 (%s); %s takes no dtype", name, tostring(dtype), name) end
      dtype = dtype_arg(name, dtype)
      if dtype ~= nil and T.is_tensor(t) then t = t:to(dtype) end
    end
    return f(t, dim, keepdim)
  end
end

--- t:neg() / t:abs() / t:sign() (their _ forms, and -t) also on integer
--- tensors, as torch's: in t's dtype, wrapping (-x and abs(x) of the minimum
--- are the minimum; uint8's -x is 256 - x).
local INT_DTYPES = {int8 = true, int16 = true, int32 = true, int64 = true, uint8 = true}
local int_unary = {
  neg = function(t) return 0 - t end, -- (a Lua integer keeps t's dtype)
  abs = function(t) return t:dtype() == "uint8" and t:clone() or t:maximum(0 - t) end,
  sign = function(t) return t:gt(0):to(t:dtype()) - t:lt(0):to(t:dtype()) end,
}
for name, g in pairs(int_unary) do
  local f, f_ = methods[name], methods[name .. "_"]
  methods[name] = function(t)
    if T.is_tensor(t) and INT_DTYPES[t:dtype()] then return g(t) end
    return f(t)
  end
  methods[name .. "_"] = function(t)
    if T.is_tensor(t) and INT_DTYPES[t:dtype()] then return t:copy(g(t)) end
    return f_(t)
  end
end
mt.__unm = function(t) return methods.neg(t) end

--- t:cumsum(dim[, dtype]) / t:cumprod: running sums / products along dim
--- (integers and bools give int64, as torch's); dtype (a name or {dtype=})
--- converts t first.
local CUMULATIVE = {"cumsum", "cumprod"}
for _, name in ipairs(CUMULATIVE) do
  local f = methods[name]
  methods[name] = function(t, dim, dtype)
    dtype = dtype_arg(name, dtype)
    if dtype ~= nil and T.is_tensor(t) then t = t:to(dtype) end
    return f(t, dim)
  end
end

--- t:sort([dim][, descending]) or t:sort{dim=, descending=, stable=} ->
--- values, 1-based positions: along dim (the last by default), nan the
--- largest, equal values in their original order (torch's stable sort; its
--- unstable default may order ties otherwise). t:argsort(...) -> positions.
local SORT = O.spec{"dim", "descending", "stable"}
do
  local sort = methods.sort
  function methods.sort(t, dim, descending)
    if type(dim) == "table" and getmetatable(dim) == nil then
      local o = O.check(SORT, "sort", dim)
      dim, descending = o.dim, o.descending
    end
    if descending ~= nil and type(descending) ~= "boolean" then
      O.fail("EINVAL: sort: descending must be true or false, got %s", tostring(descending))
    end
    return sort(t, dim, descending)
  end
end
function methods.argsort(t, dim, descending) return select(2, methods.sort(t, dim, descending)) end

--- t:topk(k[, dim][, largest][, sorted]) or t:topk(k, {dim=, largest=, sorted=})
--- -> values, 1-based positions of the k largest (smallest when largest is
--- false) along dim (the last by default), largest first (nan counts as the
--- largest, as torch's); always sorted.
local TOPK = O.spec{"dim", "largest", "sorted"}
function methods.topk(t, k, dim, largest)
  if type(dim) == "table" and getmetatable(dim) == nil then
    local o = O.check(TOPK, "topk", dim)
    dim, largest = o.dim, o.largest
  end
  if largest ~= nil and type(largest) ~= "boolean" then
    O.fail("EINVAL: topk: largest must be true or false, got %s", tostring(largest))
  end
  if not T.is_tensor(t) then argerror(1, "topk", "tensor expected, got %s", type(t)) end
  local d = dim or (t:dim() == 0 and 1 or t:dim())
  local n = t:dim() == 0 and 1 or t:size(d)
  if math.type(k) ~= "integer" or k < 0 or k > n then
    O.fail("EINVAL: topk: k %s out of range for dim %d of size %d", tostring(k), d, n)
  end
  local v, i = methods.sort(t, d, largest ~= false)
  if t:dim() == 0 then return v, i end
  return v:narrow(d, 1, k):contiguous(), i:narrow(d, 1, k):contiguous()
end

--- t:expand(sizes...) or t:expand({sizes}): a size of -1 keeps that dim's
--- size, as torch's (only for t's own dims: new leading dims need a size).
local expand_sizes = methods.expand
function methods.expand(t, ...)
  local sizes = table.pack(...)
  if type(sizes[1]) == "table" then sizes = table.pack(table.unpack(sizes[1])) end
  if not T.is_tensor(t) then return expand_sizes(t, ...) end -- (the binding names the bad argument)
  local lead, fixed = sizes.n - t:dim(), {}
  for i = 1, sizes.n do
    local s = sizes[i]
    if s == -1 then
      if i <= lead then O.fail("EINVAL: expand: -1 for new dim %d (only a dim of the tensor keeps its size)", i) end
      s = t:size(i - lead)
    end
    fixed[i] = s
  end
  return expand_sizes(t, fixed)
end

-- A 1-based dim of a tensor of n dims (torch's negative dims count from
-- the end: -1 is n); EINVAL naming fname outside 1..n.
local function dim_of(fname, d, n)
  if math.type(d) ~= "integer" then O.fail("EINVAL: %s: dim must be an integer, got %s", fname, tostring(d)) end
  local r = d < 0 and n + 1 + d or d
  if r < 1 or r > n then O.fail("EINVAL: %s: dim %d out of range 1..%d (or -%d..-1)", fname, d, n, n) end
  return r
end

-- t reshaped to sizes: a view when t is contiguous, else a copy (crun's views
-- are of contiguous tensors; torch's unsqueeze/squeeze/flatten are views always).
local function reshaped(t, sizes)
  if t:is_contiguous() then return t:view(sizes) end
  return t:reshape(sizes)
end

--- t:unsqueeze(d): a size-1 dim inserted at 1-based d (1..dim+1; -1 appends).
function methods.unsqueeze(t, d)
  local s = t:size()
  table.insert(s, dim_of("unsqueeze", d, #s + 1), 1)
  return reshaped(t, s)
end

--- t:squeeze([d]): without the size-1 dims (only dim d, when it is size 1).
function methods.squeeze(t, d)
  local s, out = t:size(), {}
  if d ~= nil then d = dim_of("squeeze", d, math.max(#s, 1)) end
  for i, n in ipairs(s) do
    if n ~= 1 or (d ~= nil and i ~= d) then out[#out + 1] = n end
  end
  return reshaped(t, out)
end

--- t:flatten([start=1][, end=-1]): dims start..end merged into one.
function methods.flatten(t, a, b)
  local s = t:size()
  if #s == 0 then return reshaped(t, {1}) end
  a, b = dim_of("flatten", a or 1, #s), dim_of("flatten", b or -1, #s)
  if a > b then O.fail("EINVAL: flatten: start dim %d after end dim %d", a, b) end
  local out, n = {}, 1
  for i = 1, #s do
    if i < a or i > b then out[#out + 1] = s[i] else n = n * s[i]; if i == b then out[#out + 1] = n end end
  end
  return reshaped(t, out)
end

--- t:permute(d1, d2, ...) or t:permute({d1, ...}): a view with dim i of the
--- result being dim d_i of t (1-based; a permutation of 1..dim, as torch's).
function methods.permute(t, ...)
  local p = table.pack(...)
  if type(p[1]) == "table" then p = table.pack(table.unpack(p[1])) end
  local n, seen = t:dim(), {}
  if p.n ~= n then O.fail("EINVAL: permute: %d dims given for a tensor of %d", p.n, n) end
  local where, at = {}, {}   -- where[k]: the position of t's dim k in r; at[i]: the dim of t at position i
  for i = 1, n do
    local d = dim_of("permute", p[i], n)
    if seen[d] then O.fail("EINVAL: permute: dim %d repeated", d) end
    seen[d], where[i], at[i] = true, i, i
    p[i] = d
  end
  local r = t
  for i = 1, n do -- bring dim p[i] of t to position i by one swap
    local j = where[p[i]]
    if j ~= i then
      r = r:transpose(i, j)
      local k = at[i]
      at[i], at[j], where[p[i]], where[k] = p[i], k, i, j
    end
  end
  return r
end

-- t:all([dim][, keepdim]) / t:any: whether every (some) element is
-- nonzero: a Lua boolean over every element (as t:sum() gives a number;
-- :item() on it gives it back), a bool tensor along dim. (Plain comments:
-- LDoc cannot attach a doc block to a loop.)
for name, test in pairs({all = function(nz, n) return nz:eq(n) end, any = function(nz) return nz:gt(0) end}) do
  methods[name] = function(t, dim, keepdim)
    local nz = t:ne(0)
    if dim == nil then
      local c = nz:sum()
      return name == "all" and c == t:numel() or name == "any" and c > 0
    end
    dim = dim_of(name, dim, t:dim())
    return test(nz:sum(dim, keepdim), t:size(dim))
  end
end

--- t:norm([p=2][, dim][, keepdim]): the p-norm (p a number > 0, math.huge or
--- "inf", "fro" for 2) over every element (a number) or along dim (a
--- tensor), of a float tensor, as torch's.
function methods.norm(t, p, dim, keepdim)
  if p == nil or p == "fro" then p = 2 elseif p == "inf" then p = math.huge end
  if type(p) ~= "number" or not (p > 0) then O.fail("EINVAL: norm: p must be a number > 0, \"inf\" or \"fro\", got %s", tostring(p)) end
  if not t:dtype():find("float") then O.fail("EINVAL: norm: a float tensor is expected, got %s (convert with :double())", t:dtype()) end
  if dim ~= nil then dim = dim_of("norm", dim, t:dim()) end
  local a = t:abs()
  if p == math.huge then return dim and a:max(dim, keepdim) or a:max() end
  if p == 2 then
    local s = dim and a:square():sum(dim, keepdim) or a:square():sum()
    return dim and s:sqrt() or math.sqrt(s)
  end
  local s = dim and a:pow(p):sum(dim, keepdim) or a:pow(p):sum()
  return dim and s:pow(1 / p) or s ^ (1 / p)
end

--- t:detach(): t itself (crun records no autograd graph to detach from).
function methods.detach(t) return t end

--- t:clamp([min][, max]) or t:clamp{min=, max=} (torch's keywords) / t:clamp_
--- also on integer tensors, as torch's:
--- in their dtype with integer bounds, in float32 with a Lua float bound
--- (clamp_ then refuses, as torch does). min > max or a nan bound is EINVAL,
--- as for float tensors.
local CLAMPS = {"clamp", "clamp_"}
local CLAMP_KW = O.spec{"min", "max"}
for _, name in ipairs(CLAMPS) do
  local f = methods[name]
  methods[name] = function(t, lo, hi)
    if type(lo) == "table" and getmetatable(lo) == nil then -- torch's clamp(min=0)
      local o = O.check(CLAMP_KW, name, lo)
      lo, hi = o.min, o.max
      if lo == nil and hi == nil then O.fail("EINVAL: %s: at least one of min and max is needed", name) end
    end
    if not (T.is_tensor(t) and INT_DTYPES[t:dtype()]) then return f(t, lo, hi) end
    for _, b in ipairs({lo, hi}) do
      if b ~= b then O.fail("EINVAL: clamp: %s is nan", b == lo and "min" or "max") end
    end
    if lo ~= nil and hi ~= nil and lo > hi then O.fail("EINVAL: clamp: min %s > max %s", tostring(lo), tostring(hi)) end
    local r = t
    if lo ~= nil then r = r:maximum(lo) end
    if hi ~= nil then r = r:minimum(hi) end
    if name == "clamp" then return r == t and t:clone() or r end
    if r:dtype() ~= t:dtype() then
      O.fail("EINVAL: clamp_: result type %s can't be cast to %s (the tensor written in place)", r:dtype(), t:dtype())
    end
    return r == t and t or t:copy(r)
  end
end

--- The float math of integer and bool tensors, as torch's: exp, log, tanh,
--- sigmoid, sqrt, sin, cos, reciprocal, log1p, expm1 and rsqrt compute in
--- float32 (their _ forms refuse: the result is not of the tensor's dtype);
--- floor, ceil and round of an integer tensor are a copy, relu and square
--- stay in its dtype (square wraps).
local FLOAT_UNARY = {"exp", "log", "tanh", "sigmoid", "sqrt", "sin", "cos", "reciprocal", "log1p", "expm1", "rsqrt"}
local function int_or_bool(t) return T.is_tensor(t) and (INT_DTYPES[t:dtype()] or t:dtype() == "bool") end
for _, name in ipairs(FLOAT_UNARY) do
  local f, f_ = methods[name], methods[name .. "_"]
  methods[name] = function(t) return f(int_or_bool(t) and t:to("float32") or t) end
  methods[name .. "_"] = function(t)
    if int_or_bool(t) then
      O.fail("EINVAL: %s_: result type float32 can't be cast to %s (the tensor written in place)", name, t:dtype())
    end
    return f_(t)
  end
end
local int_same = {
  floor = function(t) return t:clone() end, ceil = function(t) return t:clone() end,
  relu = function(t) return t:maximum(0) end, square = function(t) return t * t end,
}
for name, g in pairs(int_same) do
  local f, f_ = methods[name], methods[name .. "_"]
  methods[name] = function(t) if T.is_tensor(t) and INT_DTYPES[t:dtype()] then return g(t) end return f(t) end
  methods[name .. "_"] = function(t) if T.is_tensor(t) and INT_DTYPES[t:dtype()] then return t:copy(g(t)) end return f_(t) end
end
for _, name in ipairs({"round", "round_"}) do
  local f = methods[name]
  methods[name] = function(t, d)
    if T.is_tensor(t) and INT_DTYPES[t:dtype()] and (d == nil or d == 0) then return name == "round" and t:clone() or t end
    return f(t, d)
  end
end

--- t:pow(k) / t ^ k / t:pow_(k) of an integer tensor with a Lua integer k
--- >= 0: in its dtype, wrapping, as torch's (by repeated squaring); a
--- negative k is EINVAL, as torch refuses it. (A float k computes in float32.)
local function int_power(t, k)
  if k < 0 then O.fail("EINVAL: pow: integers to negative integer powers are not allowed (got %d)", k) end
  local r, base = T.ones(t:size(), t:dtype(), {device = t:device()}), t
  while k > 0 do
    if k % 2 == 1 then r = r * base end
    k = k // 2
    if k > 0 then base = base * base end
  end
  return r
end
local POWS = {"pow", "pow_"}
for _, name in ipairs(POWS) do
  local f = methods[name]
  methods[name] = function(t, k)
    if T.is_tensor(t) and INT_DTYPES[t:dtype()] and math.type(k) == "integer" then
      return name == "pow" and int_power(t, k) or t:copy(int_power(t, k))
    end
    return f(t, k)
  end
end
mt.__pow = function(a, b) return methods.pow(a, b) end

--- t:var([dim][, unbiased][, keepdim]) / t:std: the variance (its square
--- root) over every element (a number) or along dim (a tensor), divided by
--- n - correction: unbiased (correction 1) unless unbiased is false, as
--- torch's; options {unbiased=, correction=, keepdim=} may stand in the
--- second place. Float tensors only.
local VAR = O.spec{"unbiased", "correction", "keepdim"}
local function variance(name, t, dim, unbiased, keepdim)
  local correction = 1
  if type(unbiased) == "table" and getmetatable(unbiased) == nil then
    local o = O.check(VAR, name, unbiased)
    if o.unbiased ~= nil and o.correction ~= nil then O.fail("EINVAL: %s: give unbiased or correction, not both", name) end
    correction = o.correction or (o.unbiased == false and 0 or 1)
    keepdim = o.keepdim
  elseif unbiased ~= nil then
    if type(unbiased) ~= "boolean" then O.fail("EINVAL: %s: unbiased must be true or false, got %s", name, tostring(unbiased)) end
    correction = unbiased and 1 or 0
  end
  if not T.is_tensor(t) then argerror(1, name, "tensor expected, got %s", type(t)) end
  if not t:dtype():find("float") then O.fail("ENOTSUP: %s needs a float tensor, got %s (convert with :double())", name, t:dtype()) end
  if dim == nil then
    local d = t - t:mean()
    return (d * d):sum(nil, keepdim) / (t:numel() - correction)
  end
  local n = t:dim() == 0 and 1 or t:size(dim)
  local d = t - t:mean(dim, true)
  return (d * d):sum(dim, keepdim) / (n - correction)
end
function methods.var(t, dim, unbiased, keepdim) return variance("var", t, dim, unbiased, keepdim) end
function methods.std(t, dim, unbiased, keepdim)
  local v = variance("std", t, dim, unbiased, keepdim)
  return T.is_tensor(v) and v:sqrt() or math.sqrt(v)
end

-- ------------------------------------------------------------ selection

-- ENOTSUP naming fname when a tensor of the list lives on a device (a
-- host-only op; never a silent copy).
local function host_only(fname, ...)
  for _, t in ipairs({...}) do
    if T.is_tensor(t) and C.device_of(t) >= 0 then
      O.fail("ENOTSUP: %s: not implemented for a tensor on cuda:%d (copy it to the host with :cpu() first)",
        fname, C.device_of(t))
    end
  end
end

-- torch's kind of a dtype or a Lua scalar: 0 bool, 1 integer, 2 float.
local function kind_of(x)
  if type(x) == "boolean" then return 0 elseif math.type(x) == "integer" then return 1 elseif type(x) == "number" then return 2 end
  local dt = x:dtype()
  return dt == "bool" and 0 or INT_DTYPES[dt] and 1 or 2
end
local KIND_DEFAULT = {[0] = "bool", "int64", "float32"}

-- torch.result_type of two operands (tensors or Lua scalars): a 0-d tensor
-- beside one with dims, or a scalar beside a tensor, counts only when of a
-- higher kind (a scalar then brings its kind's default dtype).
local function result_type(a, b)
  local ta, tb = T.is_tensor(a), T.is_tensor(b)
  if not ta and not tb then return KIND_DEFAULT[math.max(kind_of(a), kind_of(b))] end
  if ta and tb and (a:dim() == 0) == (b:dim() == 0) then return promote(a:dtype(), b:dtype()) end
  local main, side = a, b
  if not ta or (tb and a:dim() == 0) then main, side = b, a end
  if kind_of(side) <= kind_of(main) then return main:dtype() end
  return T.is_tensor(side) and promote(main:dtype(), side:dtype()) or KIND_DEFAULT[kind_of(side)]
end

-- x (a tensor or a Lua scalar: argument n of fname) as a tensor of dtype dt.
local function as_tensor(fname, n, x, dt)
  if T.is_tensor(x) then return x:to(dt) end
  if type(x) ~= "number" and type(x) ~= "boolean" then argerror(n, fname, "tensor or number expected, got %s", type(x)) end
  if type(x) == "boolean" then x = x and 1 or 0 end
  return T.full({}, x, dt)
end

--- T.where(cond, a, b): a where cond is true, else b, element by element
--- (torch.where): cond a bool tensor; a and b tensors or numbers, of the
--- dtype torch.result_type gives them; the three broadcast. A select, not
--- arithmetic: inf and nan are taken as they are. Host tensors only
--- (ENOTSUP on a device). t:where(cond, b) is T.where(cond, t, b).
--- T.where(cond) with one argument is cond:nonzero({as_tuple = true}): the
--- 1-BASED indices of cond's non-zero elements, one int64 tensor per dim
--- (as crun's other indices; torch's are 0-based).
function T.where(cond, a, b)
  if not T.is_tensor(cond) then argerror(1, "where", "bool tensor expected, got %s", type(cond)) end
  if a == nil and b == nil then return methods.nonzero(cond, {as_tuple = true}) end
  local values = {a, b} -- (either may be nil: a missing b is named, not skipped)
  for i = 1, 2 do
    local x = values[i]
    if not T.is_tensor(x) and type(x) ~= "number" and type(x) ~= "boolean" then
      argerror(i + 1, "where", "tensor or number expected, got %s", type(x))
    end
  end
  host_only("where", cond, a, b)
  local dt = result_type(a, b)
  return C._where(cond, as_tensor("where", 2, a, dt), as_tensor("where", 3, b, dt))
end
function methods.where(t, cond, b) return T.where(cond, t, b) end

--- t:masked_fill(mask, value) -> a copy of t with value where mask (a bool
--- tensor broadcasting with t) is true; value a number or 0-d tensor,
--- converted to t's dtype (2.5 into an integer tensor is 2, as torch's).
--- t:masked_fill_(mask, value) writes t in place (mask must then broadcast
--- to t's shape). Inf and nan are kept or written as they are. Host tensors
--- only (ENOTSUP on a device).
function methods.masked_fill(t, mask, value)
  if not T.is_tensor(t) then argerror(1, "masked_fill", "tensor expected, got %s", type(t)) end
  if not T.is_tensor(mask) then argerror(2, "masked_fill", "bool tensor expected, got %s", type(mask)) end
  if T.is_tensor(value) and value:dim() ~= 0 then
    argerror(3, "masked_fill", "a number or a 0-d tensor expected, got a %d-d tensor", value:dim())
  end
  host_only("masked_fill", t, mask, value)
  return C._where(mask, as_tensor("masked_fill", 3, value, t:dtype()), t)
end
function methods.masked_fill_(t, mask, value)
  local r = methods.masked_fill(t, mask, value)
  if table.concat(r:size(), "x") ~= table.concat(t:size(), "x") then
    O.fail("EINVAL: masked_fill_: the mask's shape %s does not broadcast to the tensor's %s (the tensor written in place)",
      table.concat(mask:size(), "x"), table.concat(t:size(), "x"))
  end
  return t:copy(r)
end

-- ------------------------------------------------------------ more factories

-- A 1-d tensor of dtype dt holding list (T.new takes no empty list).
local function new_1d(list, dt) return #list == 0 and T.empty({0}, dt) or T.new(list, dt) end

-- x rounded to the nearest float32 (string.pack converts as C's cast does).
local function f32(x) return (string.unpack("f", string.pack("f", x))) end

local LINSPACE = O.spec{"dtype", "device", inert = {requires_grad = "crun tensors record no autograd graph"}}

--- T.linspace(start, stop, steps[, {dtype=, device=}]): steps values from
--- start to stop, evenly spaced, as torch.linspace: float32 by default; the
--- first half counted up from start, the second down from stop (so both
--- ends are exact), in the dtype's precision (integers: in double,
--- truncated toward zero, as torch's); steps = 1 gives {start}, 0 an empty tensor.
function T.linspace(start, stop, steps, opts)
  if type(start) ~= "number" then argerror(1, "linspace", "number expected, got %s", type(start)) end
  if type(stop) ~= "number" then argerror(2, "linspace", "number expected, got %s", type(stop)) end
  if math.type(steps) ~= "integer" or steps < 0 then argerror(3, "linspace", "integer >= 0 expected, got %s", tostring(steps)) end
  local o = O.check(LINSPACE, "tensor.linspace", opts)
  local dt = o.dtype or "float32"
  local r = dt == "float32" and f32 or function(x) return x end
  local step = steps > 1 and r((stop - start) / (steps - 1)) or 0
  local vals, half = {}, steps // 2
  for i = 0, steps - 1 do
    vals[i + 1] = i < half and r(start + r(step * i)) or r(stop - r(step * (steps - 1 - i)))
  end
  if steps == 1 then vals[1] = r(start) end
  if INT_DTYPES[dt] then
    for i, v in ipairs(vals) do vals[i] = v < 0 and math.ceil(v) or math.floor(v) end
  end
  local t = new_1d(vals, dt)
  return place(t, o.device ~= nil and CU().device_index(o.device, "tensor.linspace") or nil)
end

local RANDPERM = O.spec{"seed", "dtype", "generator", "device", inert = {requires_grad = "crun tensors record no autograd graph"}}

--- T.randperm(n[, {seed=, generator=, dtype=, device=}]): a random
--- permutation of 1..n (int64 by default). 1-BASED, unlike torch's 0..n-1:
--- crun's indices are 1-based (index_select, gather, argmax and sort's
--- positions), so x:index_select(1, T.randperm(n)) shuffles rows as torch's
--- x[torch.randperm(n)] does. seed gives the same permutation on every rank
--- (the splitmix64 Fisher-Yates of crun.data's sampler); without one it is
--- drawn from the generator (the default one unless given).
function T.randperm(n, opts)
  if math.type(n) ~= "integer" or n < 0 then argerror(1, "randperm", "integer >= 0 expected, got %s", tostring(n)) end
  local o = O.check(RANDPERM, "tensor.randperm", opts)
  local seed = o.seed
  if seed == nil then
    local g = o.generator
    seed = g and g:random() or T.randint(0, 1 << 53, {1}, "int64"):item()
  end
  local perm = core.permutation(n, seed)
  for i = 1, n do perm[i] = perm[i] + 1 end
  local t = new_1d(perm, o.dtype or "int64")
  return place(t, o.device ~= nil and CU().device_index(o.device, "tensor.randperm") or nil)
end

local UNIQUE = O.spec{"sorted", "return_inverse", "return_counts", "dim"}

-- x < y for one element of two slices: numbers ascending, nan after them.
local function elem_less(x, y) return x < y or (y ~= y and x == x) end

-- unique{dim=d} of t (d checked): the distinct slices along d, sorted
-- lexicographically (ties by position, so the order is a strict one even
-- with nan); slices with a nan never equal another.
local function unique_dim(t, d, o)
  local n = t:size(d)
  local rows = n > 0 and t:transpose(1, d):contiguous():reshape({n, t:numel() // n}):totable() or {}
  local order = {}
  for i = 1, n do order[i] = i end
  table.sort(order, function(a, b)
    local ra, rb = rows[a], rows[b]
    for j = 1, #ra do
      if elem_less(ra[j], rb[j]) then return true elseif elem_less(rb[j], ra[j]) then return false end
    end
    return a < b
  end)
  local function same(a, b)
    for j = 1, #a do if a[j] ~= b[j] then return false end end
    return true
  end
  local firsts, counts, inverse = {}, {}, {}
  for k, i in ipairs(order) do
    if k == 1 or not same(rows[i], rows[order[k - 1]]) then firsts[#firsts + 1], counts[#firsts + 1] = i, 0 end
    counts[#firsts] = counts[#firsts] + 1
    inverse[i] = #firsts
  end
  local out = {t:index_select(d, new_1d(firsts, "int64"))}
  if o.return_inverse then out[#out + 1] = new_1d(inverse, "int64") end
  if o.return_counts then out[#out + 1] = new_1d(counts, "int64") end
  return table.unpack(out)
end

--- t:unique([{sorted=true, return_inverse=, return_counts=}]) -> the
--- distinct values of t, ascending, as a 1-d tensor of t's dtype (torch's
--- default; sorted=false gives the same order); with return_inverse also
--- where each element of t went (1-based positions, t's shape, int64), with
--- return_counts how often each value occurs (int64), in that order, as
--- torch's. nan is unequal to itself: each nan stays, after the numbers.
--- With dim (1-based, negative from the end), the distinct slices along dim
--- (rows for dim 1 of a matrix), sorted lexicographically, as a tensor of
--- t's shape but that dim; the inverse then has one entry per slice of t.
--- Host tensors only.
function methods.unique(t, opts)
  if not T.is_tensor(t) then argerror(1, "unique", "tensor expected, got %s", type(t)) end
  local o = O.check(UNIQUE, "unique", opts)
  host_only("unique", t)
  if o.dim ~= nil then return unique_dim(t, dim_of("unique", o.dim, t:dim()), o) end
  local n = t:numel()
  local sorted, pos = t:reshape({n}):sort(1)
  local v, p = n > 0 and sorted:totable() or {}, n > 0 and pos:totable() or {}
  local vals, counts, inverse = {}, {}, {}
  for i = 1, n do
    if i == 1 or v[i] ~= v[i - 1] then vals[#vals + 1], counts[#vals + 1] = v[i], 0 end
    counts[#vals] = counts[#vals] + 1
    inverse[p[i]] = #vals
  end
  local out = {new_1d(vals, t:dtype())}
  if o.return_inverse then out[#out + 1] = new_1d(inverse, "int64"):reshape(t:size()) end
  if o.return_counts then out[#out + 1] = new_1d(counts, "int64") end
  return table.unpack(out)
end

local NONZERO = O.spec{"as_tuple"}

--- t:nonzero([{as_tuple=}]) -> an [n, dims] int64 tensor of the 1-BASED
--- indices of t's n non-zero elements (nan counts as non-zero), in
--- row-major order, as torch.nonzero but 1-based (crun's indices are, see
--- randperm); {as_tuple = true} gives them as one 1-d int64 tensor per dim
--- (several return values), torch's as_tuple=True and T.where(t). A 0-d
--- tensor counts as one element ({n, 0}; as_tuple: one tensor). Host only.
function methods.nonzero(t, opts)
  if not T.is_tensor(t) then argerror(1, "nonzero", "tensor expected, got %s", type(t)) end
  local o = O.check(NONZERO, "nonzero", opts)
  host_only("nonzero", t)
  local shape, n = t:size(), t:numel()
  local nd = #shape
  local flags = n > 0 and t:ne(0):reshape({n}):totable() or {}
  local cols, k = {}, 0
  for d = 1, math.max(nd, 1) do cols[d] = {} end
  for i = 1, n do
    if flags[i] then
      k = k + 1
      local r = i - 1
      for d = nd, 1, -1 do cols[d][k], r = r % shape[d] + 1, r // shape[d] end
      if nd == 0 then cols[1][k] = 1 end
    end
  end
  if o.as_tuple then
    for d = 1, #cols do cols[d] = new_1d(cols[d], "int64") end
    return table.unpack(cols)
  end
  local out = T.empty({k, nd}, "int64")
  if k > 0 and nd > 0 then
    local rows = {}
    for j = 1, k do
      rows[j] = {}
      for d = 1, nd do rows[j][d] = cols[d][j] end
    end
    out:copy(T.new(rows, "int64"))
  end
  return out
end

-- ------------------------------------------------------------ boolean masks

-- "2x3" for a size list ("" for a 0-d tensor's).
local function shape_of(s) return table.concat(s, "x") end

-- Checks that mask (argument n of fname) is a bool tensor.
local function check_mask(fname, n, mask)
  if not T.is_tensor(mask) then argerror(n, fname, "bool tensor expected, got %s", type(mask)) end
  if mask:dtype() ~= "bool" then O.fail("EINVAL: %s: the mask must be a bool tensor, got %s", fname, mask:dtype()) end
end

-- The shape sizes a and b broadcast to (torch's rule), or EINVAL naming fname.
local function broadcast_shape(fname, a, b)
  local n, out = math.max(#a, #b), {}
  for i = 1, n do
    local x, y = a[#a - n + i] or 1, b[#b - n + i] or 1
    if x ~= y and x ~= 1 and y ~= 1 then
      O.fail("EINVAL: %s: shapes %s and %s cannot be broadcast", fname, shape_of(a), shape_of(b))
    end
    out[i] = x == 1 and y or x
  end
  return out
end

-- The 1-based flat positions of the true elements of bool tensor m, as a 1-d int64 tensor.
local function true_positions(m)
  local n = m:numel()
  local flags, pos = n > 0 and m:reshape({n}):totable() or {}, {}
  for i = 1, n do if flags[i] then pos[#pos + 1] = i end end
  return new_1d(pos, "int64")
end

--- t:masked_select(mask) / T.masked_select(t, mask) -> a 1-d tensor of t's
--- elements where mask (a bool tensor, broadcast with t as torch's) is
--- true, in row-major order. Host tensors only. t[mask] is the same for a
--- mask of t's shape.
function methods.masked_select(t, mask)
  if not T.is_tensor(t) then argerror(1, "masked_select", "tensor expected, got %s", type(t)) end
  check_mask("masked_select", 2, mask)
  host_only("masked_select", t, mask)
  local shape = broadcast_shape("masked_select", t:size(), mask:size())
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return t:expand(shape):reshape({n}):index_select(1, true_positions(mask:expand(shape)))
end

--- t:masked_scatter_(mask, source) -> t: writes source's first k elements
--- (row-major, converted to t's dtype) into the k places where mask (a bool
--- tensor broadcasting to t's shape) is true, in row-major order, as
--- torch's; a source of fewer than k elements is EINVAL. Host tensors only.
function methods.masked_scatter_(t, mask, src)
  if not T.is_tensor(t) then argerror(1, "masked_scatter_", "tensor expected, got %s", type(t)) end
  check_mask("masked_scatter_", 2, mask)
  if not T.is_tensor(src) then argerror(3, "masked_scatter_", "tensor expected, got %s", type(src)) end
  host_only("masked_scatter_", t, mask, src)
  local shape, n = t:size(), t:numel()
  local ok, full = pcall(methods.expand, mask, shape)
  if not ok then
    O.fail("EINVAL: masked_scatter_: the mask's shape %s does not broadcast to the tensor's %s", shape_of(mask:size()),
      shape_of(shape))
  end
  if n == 0 then return t end
  local m = full:reshape({n})
  local rank = m:cumsum(1)                 -- (int64) how many true elements up to each place
  local k = rank[n]
  if src:numel() < k then
    O.fail("EINVAL: masked_scatter_: the source has %d elements, the mask selects %d", src:numel(), k)
  end
  if k == 0 then return t end
  local vals = src:reshape({src:numel()}):narrow(1, 1, k):to(t:dtype()):gather(1, rank:clamp(1, k))
  return t:copy(T.where(m, vals, t:reshape({n})):view(shape))
end

-- The mask of t[mask]: a bool tensor of t's leading dims' shape (torch's
-- rule); returns the number of leading elements and t's other dims.
local function leading_mask(fname, t, mask)
  if mask:dtype() ~= "bool" then
    O.fail("EINVAL: t[index]: indexing by an %s tensor is not supported (a bool mask selects; for positions use " ..
      "t:index_select(dim, idx), whose indices are 1-based)", mask:dtype())
  end
  local ts, ms = t:size(), mask:size()
  local lead, rest = 1, {}
  for d = 1, #ts do
    if d <= #ms then
      if ms[d] ~= ts[d] then ms = nil; break end
      lead = lead * ts[d]
    else rest[#rest + 1] = ts[d] end
  end
  if ms == nil or #mask:size() > #ts then
    O.fail("EINVAL: %s: the mask's shape %s does not match the tensor's leading dims %s", fname, shape_of(mask:size()),
      shape_of(ts))
  end
  return lead, rest
end

-- t[mask]: the elements (or the rows of the trailing dims) where mask, a bool
-- tensor of t's leading dims' shape, is true: [k, trailing dims...], as torch's.
function mt.__crun_index_tensor(t, mask)
  host_only("t[mask]", t, mask)
  local lead, rest = leading_mask("t[mask]", t, mask)
  return t:reshape({lead, table.unpack(rest)}):index_select(1, true_positions(mask))
end

-- t[mask] = v: v (a number, a boolean or a tensor broadcasting to the
-- [k, trailing dims...] selection, torch's index_put_) written where mask is
-- true; lands in t's storage, also when t is a view.
function mt.__crun_newindex_tensor(t, mask, v)
  host_only("t[mask] = v", t, mask, v)
  if not T.is_tensor(v) and type(v) ~= "number" and type(v) ~= "boolean" then
    O.fail("EINVAL: t[mask] = v: v must be a number, a boolean or a tensor, got %s", type(v))
  end
  local _, rest = leading_mask("t[mask] = v", t, mask)
  local ones = {table.unpack(mask:size())}
  for _ = 1, #rest do ones[#ones + 1] = 1 end
  local full = mask:reshape(ones):expand(t:size())
  if not T.is_tensor(v) or v:numel() == 1 and v:dim() == 0 then return methods.masked_fill_(t, full, v) end
  local k = mask:to("int64"):sum()
  local sel = {k, table.unpack(rest)}
  local ok, vb = pcall(methods.expand, v, sel)
  if not ok then
    O.fail("EINVAL: t[mask] = v: v's shape %s does not broadcast to the %s selected elements", shape_of(v:size()),
      shape_of(sel))
  end
  methods.masked_scatter_(t, full, vb)
end

--- Function forms of the math methods: T.exp(t), T.add(a, b), T.softmax(t, dim), ...
--- (t:floor_divide(x) / t // x and t:remainder(x) / t % x round toward -inf,
--- t:fmod(x) toward 0, as torch's; a zero integer divisor is EINVAL.)
local function_forms = {"add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum", "eq", "ne",
  "lt", "le", "gt", "ge", "neg", "exp", "log", "tanh", "sigmoid", "relu", "sqrt", "abs", "sin",
  "cos", "floor", "ceil", "round", "sign", "reciprocal", "square", "log1p", "expm1", "rsqrt",
  "clamp", "sum", "mean", "prod", "cumsum", "cumprod", "var", "std", "sort", "argsort", "topk", "max", "min", "argmax", "argmin", "mm", "softmax",
  "log_softmax", "index_select", "gather", "transpose", "t", "narrow", "select", "view",
  "reshape", "clone", "contiguous", "numel", "equal", "allclose", "unsqueeze", "squeeze", "flatten", "permute",
  "masked_fill", "unique", "nonzero", "masked_select"}
for _, name in ipairs(function_forms) do
  if T[name] == nil then
    local m = methods[name]
    T[name] = function(t, ...)
      if not T.is_tensor(t) then
        argerror(1, name, "tensor expected, got %s", type(t))
      end
      return m(t, ...)
    end
  end
end

-- ------------------------------------------------------------ printing

local MAX_PRINT = 2000

-- Picks one format for all values: integers, fixed or scientific.
local function number_format(vals, is_int)
  if is_int then return "%d" end
  local maxabs, minabs, integral = 0, math.huge, true
  for _, v in ipairs(vals) do
    local a = math.abs(v)
    if a == a and a ~= math.huge then
      if a > maxabs then maxabs = a end
      if a > 0 and a < minabs then minabs = a end
      if v ~= math.floor(v) then integral = false end
    end
  end
  if integral and maxabs < 1e9 then return "%.0f" end
  if maxabs >= 1e5 or minabs < 1e-4 then return "%.4e" end
  return "%.4f"
end

local function fmt_value(f, v)
  if type(v) == "boolean" then return tostring(v) end -- bool tensors
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
  if f == "%d" then return string.format("%d", v) end
  return string.format(f, v)
end

local function size_str(s)
  local parts = {}
  for i, d in ipairs(s) do parts[i] = tostring(d) end
  return table.concat(parts, "x")
end

-- Formats a matrix (list of rows) right-aligned in one width.
local function format_rows(rows, f, out)
  local cells, width = {}, 0
  for i, row in ipairs(rows) do
    cells[i] = {}
    for j, v in ipairs(row) do
      local s = fmt_value(f, v)
      cells[i][j] = s
      if #s > width then width = #s end
    end
  end
  for _, row in ipairs(cells) do
    local line = {}
    for j, s in ipairs(row) do line[j] = string.rep(" ", width - #s + 1) .. s end
    out[#out + 1] = table.concat(line, " ")
  end
end

-- Appends the 2-d slices of an n-d nested table with "(i,j,.,.) =" headers.
local function format_slices(tbl, depth, ndim, prefix, f, out)
  if ndim - depth == 2 then
    out[#out + 1] = "(" .. table.concat(prefix, ",") .. ",.,.) = "
    format_rows(tbl, f, out)
    out[#out + 1] = ""
    return
  end
  for i, sub in ipairs(tbl) do
    prefix[#prefix + 1] = tostring(i)
    format_slices(sub, depth + 1, ndim, prefix, f, out)
    prefix[#prefix] = nil
  end
end

--- tostring(t): the values, then "[crun.Tensor float32 of size 2x3]".
function mt.__tostring(t)
  local ok, dtype = pcall(function() return t:dtype() end)
  if not ok then return "crun.Tensor (closed)" end
  local dev = C.device_of(t)
  if dev >= 0 then -- printed from a host copy; the footer names the device
    local text = mt.__tostring(C.to_device(t, -1))
    return text:sub(1, -2) .. " on cuda:" .. dev .. "]"
  end
  local s, n = t:size(), t:numel()
  local footer = string.format("[crun.Tensor %s of size %s]", dtype, size_str(s))
  if #s == 0 then
    return tostring(t:item()) .. "\n[crun.Tensor " .. dtype .. " with no dimension]"
  end
  if n == 0 then return "[crun.Tensor " .. dtype .. " of size " .. size_str(s) .. " (empty)]" end
  if n > MAX_PRINT then return "... (" .. n .. " elements not shown)\n" .. footer end
  local flat = t:contiguous():view(n):totable()
  local f = number_format(flat, t:dtype():find("int") ~= nil or dtype == "bool")
  local out = {}
  if #s == 1 then
    local rows = {}
    for i, v in ipairs(flat) do rows[i] = {v} end
    format_rows(rows, f, out)
  elseif #s == 2 then
    format_rows(t:totable(), f, out)
  else
    format_slices(t:totable(), 0, #s, {}, f, out)
  end
  out[#out + 1] = footer
  return table.concat(out, "\n")
end

--- Internal (for crun.nn, crun.optim): the crun.core functions `names`,
-- wrapped so that a failure also names this process's rank (from RANK).
function T._rank_kernels(names)
  local rank = os.getenv("RANK")
  local suffix = rank and (" (rank " .. rank .. ")") or ""
  local K = {}
  for _, name in ipairs(names) do
    local f = core[name]
    K[name] = function(...)
      local res = table.pack(pcall(f, ...))
      if not res[1] then error(tostring(res[2]) .. suffix, 0) end
      return table.unpack(res, 2, res.n)
    end
  end
  return K
end

return T

--- crun.nn: neural network modules in the Torch7 style.
--
--   local nn = crun.nn
--   local net = nn.Sequential():add(nn.Linear(16, 64)):add(nn.ReLU()):add(nn.Linear(64, 4))
--   local crit = nn.CrossEntropyCriterion()
--   local out = net:forward(x)                 -- x: [N, 16] float tensor
--   local loss = crit:forward(out, labels)     -- labels: [N] int64, 1-based classes
--   net:zero_grad()
--   net:backward(x, crit:backward(out, labels))
--   local params, grads = net:parameters()
--
-- forward() returns the module's output buffer (reused across calls, as in
-- Torch7): clone it to keep it past the next forward. backward() computes the
-- gradient with respect to the input AND accumulates the parameter gradients
-- (zero_grad() clears them). The hot loops are C kernels (crun/train.h).
-- Leaf modules with parameters call the hooks added by add_grad_hook(fn) as
-- soon as their parameter gradients are final for this backward: DDP uses it
-- to start all-reducing a bucket while backward goes on.

-- The C kernels, wrapped so that a failure also names this process's rank.
local K = require("crun.tensor")._rank_kernels{"nn_act_backward", "nn_act_forward", "nn_cross_entropy", "nn_cross_entropy_rows", "nn_dropout_forward", "nn_linear_backward", "nn_linear_forward", "nn_log_softmax_backward", "nn_log_softmax_forward", "nn_mse", "nn_mul",
  "nn_conv2d_out_size", "nn_conv2d_forward", "nn_conv2d_backward", "nn_pool2d_out_size", "nn_maxpool2d_forward",
  "nn_maxpool2d_backward", "nn_avgpool2d_forward", "nn_avgpool2d_backward", "nn_bn_reduce", "nn_bn_apply",
  "nn_bn_backward_input", "nn_bn_param_grads", "nn_layer_norm_forward", "nn_layer_norm_backward",
  "nn_embedding_forward", "nn_embedding_backward", "nn_nll"}

local nn = {}
local O = require "crun.opts"
local is_tensor = require("crun.tensor").is_tensor

local LINEAR = O.spec{"bias", "dtype", "seed", "device"}
local DROPOUT = O.spec{"p", "seed", "inplace"}
-- The criteria's options: torch's weight, ignore_index and label_smoothing
-- are accepted at their defaults only (crun computes none of them).
local CRITERION = {
  ["nn.CrossEntropyCriterion"] = O.spec{"reduction",
    fixed = {weight = O.NONE, ignore_index = -100, label_smoothing = 0}},
  ["nn.ClassNLLCriterion"] = O.spec{"reduction", fixed = {weight = O.NONE, ignore_index = -100}},
  ["nn.MSECriterion"] = O.spec{"reduction"},
}

local default_dtype = "float32"
local seed_base, seed_count = 0, 0

--- Sets the dtype new modules use ("float32" or "float64").
function nn.set_default_dtype(dt)
  if dt ~= "float32" and dt ~= "float64" then
    O.fail("EINVAL: nn.set_default_dtype: float32 or float64 expected, got %s", tostring(dt))
  end
  default_dtype = dt
end

function nn.get_default_dtype() return default_dtype end

--- Seeds parameter initialisation: the k-th module created after
-- manual_seed(s) draws from seed s * 1000003 + k, so every rank building the
-- same model gets the same initial weights.
function nn.manual_seed(s)
  seed_base, seed_count = O.int("nn.manual_seed", "seed", math.tointeger(s) or s), 0
end

local function next_seed()
  seed_count = seed_count + 1
  return seed_base * 1000003 + seed_count
end

-- crun.tensor.
local function T() return require "crun.tensor" end

-- Returns buf when it already has `shape`, dtype and device ("cpu" when
-- nil), else a new zero tensor there.
local function ensure(buf, shape, dtype, device)
  device = device or "cpu"
  if buf and buf:dtype() == dtype and buf:dim() == #shape and buf:device() == device then
    local same = true
    for i, d in ipairs(shape) do
      if buf:size(i) ~= d then same = false break end
    end
    if same then return buf end
  end
  return T().zeros(shape, dtype, {device = device})
end
nn._ensure = ensure

local function contig(x)
  if not x:is_contiguous() then return x:contiguous() end
  return x
end

-- x, or a copy of it when it shares storage with buf (the module's own output
-- buffer fed back in, h = lin:forward(h)): the kernels that write their output
-- while still reading their input (Linear's GEMM, the pooling windows) gave
-- wrong values in place.
local function unaliased(x, buf)
  if buf and x:is_same_storage(buf) then return x:clone() end
  return x
end

local function check_tensor(x, fname, what)
  if not is_tensor(x) then
    O.fail("EINVAL: %s: %s must be a tensor, got %s", fname, what, type(x))
  end
end

-- ---------------------------------------------------------------- Module

local Module = {}
Module.__index = Module
nn.Module = Module

--- Creates a subclass: `local Foo = nn.class("Foo", parent)`. Its instances
--- are callable, as torch's modules: m(x) is m:forward(x).
function nn.class(name, parent)
  parent = parent or Module
  local c = setmetatable({}, {__index = parent})
  c.__index = c
  c.__name = "crun.nn." .. name
  c.__tostring = function(self) return self:describe() end
  c.__call = function(self, ...) return self:forward(...) end -- torch's model(x), criterion(out, y)
  c._parent = parent
  require("crun.trace")._watch(c, name) -- forward/backward are spans with the timeline on
  return c
end

-- m's class as users write it: "nn.Linear" for crun.nn.Linear.
local function label(m) return ((m.__name or "crun.nn.Module"):gsub("^crun%.nn%.", "nn.")) end

function Module:describe() return label(self) end

function Module:_init()
  self.training = true
  self._hooks = {}
  return self
end

-- True when v is an instance of a class nn.class made (a crun.nn module).
local function is_module(v)
  local mt = type(v) == "table" and getmetatable(v)
  return type(mt) == "table" and type(mt.__name) == "string" and mt.__name:sub(1, 8) == "crun.nn."
end

-- EINVAL when a field of m (a string key not starting with "_") holds a module
-- whose parameters are not all in `seen` (those parameters() found through
-- m.modules): torch finds children in any attribute (self.fc1 = nn.Linear(...)),
-- crun only in the list m.modules, and an optimizer, DDP or state_dict built
-- from m would silently leave that module's parameters out.
local function check_fields(m, seen)
  for k, v in pairs(m) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" and v ~= m and is_module(v) then
      for _, t in ipairs((v:parameters())) do
        if not seen[t] then
          O.fail("EINVAL: %s:parameters: field '%s' holds %s, whose parameters are not among this module's: crun " ..
            "finds a module's children in its list self.modules (as Sequential's), not in other fields as torch does; " ..
            "list it in self.modules", label(m), k,
            (v:describe():match("^[^\n]*")))
        end
      end
    end
  end
end

-- parameter tensor -> {leaf, index}, filled by parameters(), for
-- nn.grads_for (weak keys: a parameter nothing else holds is dropped).
local PARAM_OF = setmetatable({}, {__mode = "k"})

--- nn.grads_for(list) -> the gradient tensors of a list of parameters, as
--- their modules hold them now (a DDP bucket view too), so torch's
--- f(model.parameters(), ...) ports as f(model:parameters(), ...); nil when no
--- entry is a parameter listed by a module's parameters() (a list of
--- gradients, say); EINVAL when only some are.
function nn.grads_for(list)
  local grads, known = {}, 0
  for i, t in ipairs(list) do
    local e = PARAM_OF[t]
    if e and e[1]._params[e[2]] == t then grads[i], known = e[1]._grads[e[2]], known + 1 end
  end
  if known == 0 then return nil end
  if known < #list then
    O.fail("EINVAL: nn.grads_for: %d of the %d tensors are a module's parameters, the others are not: pass a " ..
      "module, model:parameters(), or a list of gradient tensors", known, #list)
  end
  return grads
end

--- Returns (params, grads): two lists of tensors in registration order: a
-- leaf's own, or a container's children's (self.modules, in order), each
-- tensor once, as torch's parameters(): a module added twice (weight tying,
-- Sequential(l, act, l)) listed its weight twice, and an optimizer then
-- stepped it twice with its (already summed) gradient.
function Module:parameters()
  local p, g, seen = {}, {}, {}
  if self.modules then
    for _, m in ipairs(self.modules) do
      local mp, mg = m:parameters()
      for i = 1, #mp do
        if not seen[mp[i]] then
          seen[mp[i]] = true
          p[#p + 1], g[#g + 1] = mp[i], mg[i]
        end
      end
    end
  else
    for i, t in ipairs(self._params or {}) do
      seen[t], p[#p + 1], g[#g + 1] = true, t, self._grads[i]
      PARAM_OF[t] = {self, i}
    end
  end
  check_fields(self, seen)
  return p, g
end

--- Number of parameter elements.
function Module:num_parameters()
  local n = 0
  for _, t in ipairs((self:parameters())) do n = n + t:numel() end
  return n
end

--- zero_grad([set_to_none=false]): sets every parameter gradient to zero
--- (torch's set_to_none = true is ENOTSUP: see opts.zero_grad_arg).
function Module:zero_grad(set_to_none)
  O.zero_grad_arg(label(self) .. ":zero_grad", set_to_none)
  local _, grads = self:parameters()
  for _, g in ipairs(grads) do g:fill(0) end
end

-- train()'s mode: true when nil (torch's default), else a boolean (EINVAL
-- naming the module otherwise).
local function train_mode(m, mode)
  if mode == nil then return true end
  if type(mode) ~= "boolean" then
    O.fail("EINVAL: %s:train: mode must be a boolean, got %s", label(m), tostring(mode))
  end
  return mode
end

--- train([mode=true]): training mode (Dropout drops, BatchNorm uses batch
-- statistics); train(false) is evaluate(), as torch's module.train(False).
-- evaluate() / eval(): evaluation mode. Both return self.
function Module:train(mode)
  mode = train_mode(self, mode)
  self.training = mode
  for _, m in ipairs(self.modules or {}) do
    if mode then m:train() else m:evaluate() end -- (a module of the user's may define only these)
  end
  return self
end

function Module:evaluate()
  self.training = false
  for _, m in ipairs(self.modules or {}) do m:evaluate() end
  return self
end
Module.eval = Module.evaluate

-- The distinct modules of self.modules in order (a module added twice once,
-- as torch's children()), or an empty list for a leaf.
local function distinct_children(self)
  local out, seen = {}, {}
  for _, m in ipairs(self.modules or {}) do
    if not seen[m] then seen[m], out[#out + 1] = true, m end
  end
  return out
end

--- children(): iterates the direct submodules, each once, in order:
-- `for m in net:children() do ... end` (torch's module.children()).
function Module:children()
  local list, i = distinct_children(self), 0
  return function()
    i = i + 1
    return list[i]
  end
end

--- apply(fn): calls fn(m) on every submodule, depth first, then on self
-- (torch's module.apply, as in net:apply(init_weights)); returns self.
function Module:apply(fn)
  if type(fn) ~= "function" then
    O.fail("EINVAL: %s:apply: a function is expected, got %s", label(self),
      type(fn))
  end
  for _, m in ipairs(distinct_children(self)) do m:apply(fn) end
  fn(self)
  return self
end

--- Calls fn(module) after each backward of this module, once its
-- parameter gradients are final. Returns a handle with :remove().
function Module:add_grad_hook(fn)
  local hooks = self._hooks
  hooks[#hooks + 1] = fn
  return {remove = function()
    for i, h in ipairs(hooks) do
      if h == fn then table.remove(hooks, i) return end
    end
  end}
end

function Module:_grads_ready()
  for _, h in ipairs(self._hooks) do h(self) end
end

--- Leaf modules (no children) in registration order, self included if a
-- leaf; a leaf used twice (weight tying) is listed once, as parameters() lists
-- its tensors once. `uses`, when given, gets how many times each leaf appears
-- (DDP: a leaf used k times runs its backward k times per pass).
function Module:leaves(out, uses)
  out, uses = out or {}, uses or {}
  if self.modules then
    for _, m in ipairs(self.modules) do m:leaves(out, uses) end
  else
    uses[self] = (uses[self] or 0) + 1
    if uses[self] == 1 then out[#out + 1] = self end
  end
  return out
end

--- Replaces the gradient tensor of this leaf's i-th parameter (DDP's
-- gradient_as_bucket_view makes gradients views of its bucket buffers).
-- A leaf that names its fields (_gnames = {"gradWeight", ...}) sees the field follow.
function Module:_set_grad(i, t)
  self._grads[i] = t
  if self._gnames then self[self._gnames[i]] = t end
end

--- Replaces this leaf's i-th parameter tensor (FSDP points it at a view of
-- the gathered flat buffer, and at an empty tensor while it is sharded).
function Module:_set_param(i, t)
  self._params[i] = t
  if self._pnames then self[self._pnames[i]] = t end
end

--- Buffers: state that is not trained (BatchNorm's running statistics), in
-- registration order. DDP broadcasts them from rank 0 before each forward
-- (broadcast_buffers), and state_dict() saves them after the parameters.
function Module:buffers()
  local out, seen = {}, {}
  if self.modules then
    for _, m in ipairs(self.modules) do
      for _, b in ipairs(m:buffers()) do
        if not seen[b] then seen[b], out[#out + 1] = true, b end
      end
    end
    return out
  end
  for _, b in ipairs(self._buffers or {}) do out[#out + 1] = self[b] end
  return out
end

--- Moves every parameter and gradient of this module and its children to
-- `device` ("cpu", "cuda", "cuda:N" or N); returns self. The buffers that
-- forward and backward make follow their input's device, and the layers'
-- math runs there (crun.cuda; runtime/cuda/dispatch.c).
function Module:to(device)
  for _, m in ipairs(self:leaves()) do
    for i, p in ipairs(m._params or {}) do m:_set_param(i, p:to(device)) end
    for i, g in ipairs(m._grads or {}) do m:_set_grad(i, g:to(device)) end
  end
  return self
end
function Module:cuda(device) return self:to(device == nil and "cuda" or device) end
function Module:cpu() return self:to("cpu") end

-- ---------------------------------------------------------------- names

-- The name of a leaf's i-th parameter: the string field of the leaf that
-- holds it ("weight", "bias"; the first in sorted order if several do, fields
-- starting with "_" aside), else its position i.
local function param_name(m, i, t)
  local best
  for k, v in pairs(m) do
    if v == t and type(k) == "string" and k:sub(1, 1) ~= "_" and (best == nil or k < best) then best = k end
  end
  return best or tostring(i)
end

-- The name of the i-th child of container m: the string field of m that
-- holds it (torch's self.fc1 = nn.Linear(...) gives "fc1"; the first in
-- sorted order if several do; fields starting with "_" and `modules` aside),
-- else, and always in a Sequential or when `positional`, its 0-based position.
local function child_name(m, i, child, positional)
  local best
  if not (positional or m._positional_names) then
    for k, v in pairs(m) do
      if v == child and type(k) == "string" and k:sub(1, 1) ~= "_" and k ~= "modules" and (best == nil or k < best) then
        best = k
      end
    end
  end
  return best or tostring(i - 1)
end

-- Appends {name, tensor} for every parameter (what = "params") or buffer
-- ("buffers") of m under `prefix`, in parameters()/buffers() order. A
-- container's children are named by child_name: their field, or their
-- 0-based position as in torch's nn.Sequential ("0.weight", "2.bias",
-- "1.running_mean"); `positional` names them all by position. dedup: a tensor
-- reached twice (weight tying) is listed once, under its first name (torch's
-- named_parameters); else under each name (torch's state_dict).
local function collect_named(m, what, prefix, out, seen, dedup, positional)
  if m.modules then
    for i, child in ipairs(m.modules) do
      collect_named(child, what, prefix .. child_name(m, i, child, positional) .. ".", out, seen, dedup, positional)
    end
    return out
  end
  local list = what == "params" and (m._params or {}) or {}
  if what == "buffers" then
    for _, b in ipairs(m._buffers or {}) do list[#list + 1] = m[b] end
  end
  for i, t in ipairs(list) do
    if not (dedup and seen[t]) then
      seen[t] = true
      local name = what == "buffers" and m._buffers[i] or param_name(m, i, t)
      out[#out + 1] = {prefix .. name, t}
    end
  end
  return out
end

local function named_iter(list)
  local i = 0
  return function()
    i = i + 1
    if list[i] then return list[i][1], list[i][2] end
  end
end

--- Iterates (name, tensor) over the parameters in parameters() order, named
-- as torch names them: `for name, p in net:named_parameters() do ... end`
-- gives "0.weight", "0.bias", "2.weight", ... for a Sequential (children by
-- 0-based position, as torch's), "fc1.weight", ... for a module of the user's
-- whose child self.modules lists is also held in field fc1 (by position
-- where no field holds it), "weight"/"bias" for a lone layer. A tied
-- tensor comes once, under its first name. prefix (optional) goes before each name.
function Module:named_parameters(prefix)
  return named_iter(collect_named(self, "params", prefix or "", {}, {}, true))
end

--- Iterates (name, tensor) over the buffers ("1.running_mean", ...), as named_parameters.
function Module:named_buffers(prefix)
  return named_iter(collect_named(self, "buffers", prefix or "", {}, {}, true))
end

-- Name -> tensor (the module's own, not copies) of every parameter and
-- buffer, under each of its names, the names in order, and name -> the
-- positional name of the same tensor where it differs (a child held in a
-- field: "fc1.weight" -> "0.weight", the name crun gave it before fields
-- named children, which load_state_dict still takes).
local function keyed_entries(m, prefix)
  local all = collect_named(m, "params", prefix, {}, {}, false)
  collect_named(m, "buffers", prefix, all, {}, false)
  local pos = collect_named(m, "params", prefix, {}, {}, false, true)
  collect_named(m, "buffers", prefix, pos, {}, false, true)
  local byname, names, alias = {}, {}, {}
  for i, e in ipairs(all) do
    if byname[e[1]] == nil then names[#names + 1] = e[1] end
    byname[e[1]] = e[2]
    if pos[i][1] ~= e[1] then alias[e[1]] = pos[i][1] end
  end
  return byname, names, alias
end

local STATE_DICT = O.spec{"keyed", "prefix", inert = {keep_vars = "crun tensors carry no autograd state"}}

-- opts.prefix of state_dict / load_state_dict: nil or a string.
local function check_prefix(fname, opts)
  if opts.prefix ~= nil and type(opts.prefix) ~= "string" then
    O.fail("EINVAL: %s: prefix must be a string, got %s", fname, type(opts.prefix))
  end
end

--- The model's state for crun.save: by default a plain list of copies of the
-- parameter values then the buffer values. {keyed = true} gives torch's
-- form instead: name -> copy ("0.weight", "1.running_mean", ...; the names of
-- named_parameters and named_buffers, a tied tensor under each of its names),
-- with `prefix` before each name. Both load back with load_state_dict.
function Module:state_dict(opts)
  opts = O.check(STATE_DICT, "state_dict", opts)
  O.bool("state_dict", "keyed", opts.keyed, false)
  check_prefix("state_dict", opts)
  local sd = {}
  if opts.keyed then
    local byname = keyed_entries(self, opts.prefix or "")
    for name, t in pairs(byname) do sd[name] = t:clone() end
    return sd
  end
  for i, p in ipairs((self:parameters())) do sd[i] = p:clone() end
  for _, b in ipairs(self:buffers()) do sd[#sd + 1] = b:clone() end
  return sd
end

-- "2x3" for a tensor's shape ("scalar" for a 0-d one).
local function shape_str(t)
  return t:dim() == 0 and "scalar" or table.concat(t:size(), "x")
end

--- nn.state_dict_key(sd): a name sd is keyed by (its first string key), or
-- nil for a list (or what is no table): tells torch's keyed form from
-- state_dict()'s list (DDP and FSDP ask too).
function nn.state_dict_key(sd)
  if type(sd) ~= "table" then return nil end
  for k in pairs(sd) do
    if type(k) == "string" then return k end
  end
  return nil
end

-- Refuses state dict entry v for the model's tensor p unless it is a tensor
-- of p's shape; entry and what name it in the error ("entry 3" / "tensor 3").
local function check_entry(v, p, entry, what)
  if not is_tensor(v) then
    O.fail("EINVAL: load_state_dict: %s is a %s, a tensor is expected", entry, type(v))
  end
  if shape_str(v) ~= shape_str(p) then
    O.fail("EINVAL: load_state_dict: %s has shape %s, the model's has %s", what, shape_str(v), shape_str(p))
  end
end

-- "a", "b" and "c" -> '"a", "b", "c"' (torch's way of listing keys).
local function quoted(list)
  local q = {}
  for i, k in ipairs(list) do q[i] = '"' .. k .. '"' end
  return table.concat(q, ", ")
end

local LOAD_STATE_DICT = O.spec{"strict", "prefix", inert = {assign = "crun copies values into the model's tensors"}}

-- load_state_dict of a keyed state dict (torch's form).
local function load_keyed(self, sd, strict, prefix)
  local byname, names, alias = keyed_entries(self, prefix)
  local missing, unexpected, key_of, used = {}, {}, {}, {}
  for _, name in ipairs(names) do -- (a checkpoint from before children were named by field: its positional name)
    local k = sd[name] == nil and alias[name] and sd[alias[name]] ~= nil and alias[name] or name
    key_of[name], used[k] = k, true
    if sd[k] == nil then missing[#missing + 1] = name end
  end
  for k in pairs(sd) do
    if type(k) ~= "string" then
      O.fail("EINVAL: load_state_dict: a state dict keyed by names has a key of type %s (%s)", type(k), tostring(k))
    end
    if not used[k] then unexpected[#unexpected + 1] = k end
  end
  table.sort(unexpected)
  if strict and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = "missing key(s) in state_dict: " .. quoted(missing) end
    if #unexpected > 0 then parts[#parts + 1] = "unexpected key(s) in state_dict: " .. quoted(unexpected) end
    O.fail("EINVAL: load_state_dict for %s: %s (strict = false loads the keys that match)",
      (self.__name or "Module"):gsub("^crun%.nn%.", ""),
      table.concat(parts, "; "))
  end
  for _, name in ipairs(names) do
    local k = key_of[name]
    if sd[k] ~= nil then check_entry(sd[k], byname[name], 'entry "' .. k .. '"', '"' .. k .. '"') end
  end
  for _, name in ipairs(names) do
    local v = sd[key_of[name]]
    if v ~= nil then byname[name]:copy(v) end
  end
  return {missing_keys = missing, unexpected_keys = unexpected}
end

--- Copies parameter (and buffer) values from a state dict; nothing is copied
-- when any entry is refused (EINVAL naming it). Two forms:
-- * a state_dict() list: each entry a tensor of the model's shape (any dtype
--   converts, as in torch); a list of the parameters alone leaves the buffers
--   as they are.
-- * keyed by names, as state_dict{keyed = true} and torch give it: with
--   strict (default true), a missing or unexpected key is EINVAL listing them
--   all; strict = false copies the entries that match. Returns
--   {missing_keys = {...}, unexpected_keys = {...}}, as torch does. `prefix`
--   is expected before each of the model's names.
function Module:load_state_dict(sd, opts)
  opts = O.check(LOAD_STATE_DICT, "load_state_dict", opts)
  local strict = O.bool("load_state_dict", "strict", opts.strict, true)
  check_prefix("load_state_dict", opts)
  if nn.state_dict_key(sd) then return load_keyed(self, sd, strict, opts.prefix or "") end
  if opts.prefix ~= nil then
    O.fail("EINVAL: load_state_dict: prefix applies to a state dict keyed by names; this one is a list")
  end
  local params, bufs = self:parameters(), self:buffers()
  local all = {table.unpack(params)}
  if type(sd) == "table" and #sd == #params + #bufs then
    for _, b in ipairs(bufs) do all[#all + 1] = b end
  end
  if type(sd) ~= "table" or #sd ~= #all then
    O.fail("EINVAL: load_state_dict: expected %d tensors, got %s (%d parameters, %d buffers)", #params + #bufs,
      type(sd) == "table" and tostring(#sd) or type(sd), #params, #bufs)
  end
  for i, p in ipairs(all) do check_entry(sd[i], p, "entry " .. i, "tensor " .. i) end
  for i, p in ipairs(all) do p:copy(sd[i]) end
end

-- ---------------------------------------------------------------- Linear

local Linear = nn.class("Linear")
nn.LinearClass = Linear

-- Moves a new layer's parameters and gradients to opts.device ("cpu",
-- "cuda", "cuda:N" or N; nil: stay on the host), as torch's device= does.
local function place_layer(fname, m, device)
  if device == nil then return m end
  local dev = require("crun.cuda").device_index(device, fname)
  if dev >= 0 then m:to(dev) end
  return m
end

--- Linear(in, out, {bias=true, dtype=, seed=, device=}): y = x W^T + b with
-- W [out, in] and b [out] drawn uniformly from +-1/sqrt(in) (torch's default),
-- drawn on the host and moved to device ("cpu", "cuda", "cuda:N" or N).
function nn.Linear(nin, nout, opts)
  opts = O.check(LINEAR, "nn.Linear", opts)
  O.int("nn.Linear", "in_features", nin, 1)
  O.int("nn.Linear", "out_features", nout, 1)
  local self = setmetatable({}, Linear):_init()
  local dt = opts.dtype or default_dtype
  if dt ~= "float32" and dt ~= "float64" then
    O.fail("EINVAL: nn.Linear: dtype must be float32 or float64, got %s", tostring(dt))
  end
  O.bool("nn.Linear", "bias", opts.bias, true)
  if opts.seed ~= nil then O.int("nn.Linear", "seed", opts.seed) end
  self.in_features, self.out_features, self.dtype = nin, nout, dt
  local bound = 1 / math.sqrt(nin)
  local gen = T().Generator(opts.seed or next_seed())
  self.weight = T().zeros({nout, nin}, dt):uniform_(-bound, bound, gen)
  self.gradWeight = T().zeros({nout, nin}, dt)
  self._params, self._grads = {self.weight}, {self.gradWeight}
  if opts.bias ~= false then
    self.bias = T().zeros({nout}, dt):uniform_(-bound, bound, gen)
    self.gradBias = T().zeros({nout}, dt)
    self._params[2], self._grads[2] = self.bias, self.gradBias
  end
  return place_layer("nn.Linear", self, opts.device)
end

function Linear:_set_grad(i, t)
  self._grads[i] = t
  if i == 1 then self.gradWeight = t else self.gradBias = t end
end

function Linear:_set_param(i, t)
  self._params[i] = t
  if i == 1 then self.weight = t else self.bias = t end
end

function Linear:describe()
  return string.format("nn.Linear(%d -> %d%s)", self.in_features, self.out_features,
    self.bias and "" or ", no bias")
end

function Linear:forward(x)
  check_tensor(x, "Linear:forward", "input")
  x = unaliased(contig(x), self.output)
  self.output = ensure(self.output, {x:size(1), self.out_features}, self.dtype, x:device())
  K.nn_linear_forward(x, self.weight, self.bias, self.output)
  return self.output
end

function Linear:backward(x, gy)
  check_tensor(gy, "Linear:backward", "gradOutput")
  x, gy = contig(x), contig(gy)
  self.gradInput = ensure(self.gradInput, x:size(), self.dtype, x:device())
  K.nn_linear_backward(x, self.weight, gy, self.gradInput, self.gradWeight, self.gradBias)
  self:_grads_ready()
  return self.gradInput
end

-- ---------------------------------------------------------------- activations

local Activation = nn.class("Activation")

local INPLACE = O.spec{"inplace"}

-- Checks torch's inplace argument of fname (a boolean, positional, or in an
-- options table {inplace = }): false is what crun does; true is reported
-- once (crun writes the module's own output buffer, the input is left as it
-- was); anything else is EINVAL.
local function inplace_arg(fname, v)
  if type(v) == "table" then v = O.check(INPLACE, fname, v).inplace end
  if v == nil or v == false then return end
  if v ~= true then O.fail("EINVAL: %s: inplace must be true or false, got %s", fname, tostring(v)) end
  O.warn_once(fname .. "\0inplace", "%s: inplace = true has no effect in crun (the module writes its own output " ..
    "buffer; the input is left unchanged)", fname)
end

-- The constructor of an activation: ReLU takes torch's inplace (see
-- inplace_arg), Tanh and Sigmoid nothing (an argument is EINVAL, not dropped).
local function activation(kind, label, takes_inplace)
  return function(...)
    local fname = "nn." .. label
    if takes_inplace then
      if select("#", ...) > 1 then O.fail("EINVAL: %s: one argument (torch's inplace) at most, got %d", fname, select("#", ...)) end
      inplace_arg(fname, (...))
    elseif select("#", ...) > 0 then
      O.fail("EINVAL: %s takes no arguments, got %d", fname, select("#", ...))
    end
    local self = setmetatable({}, Activation):_init()
    self.kind, self.label = kind, label
    return self
  end
end

nn.ReLU = activation("relu", "ReLU", true)
nn.Tanh = activation("tanh", "Tanh")
nn.Sigmoid = activation("sigmoid", "Sigmoid")

function Activation:describe() return "nn." .. self.label .. "()" end

function Activation:forward(x)
  check_tensor(x, self.label .. ":forward", "input")
  x = contig(x)
  self.output = ensure(self.output, x:size(), x:dtype(), x:device())
  K.nn_act_forward(self.kind, x, self.output)
  return self.output
end

function Activation:backward(x, gy)
  check_tensor(gy, self.label .. ":backward", "gradOutput")
  gy = contig(gy)
  self.gradInput = ensure(self.gradInput, gy:size(), gy:dtype(), gy:device())
  K.nn_act_backward(self.kind, self.output, gy, self.gradInput)
  return self.gradInput
end

-- ---------------------------------------------------------------- LogSoftMax

local LogSoftMax = nn.class("LogSoftMax")

local DIM = O.spec{"dim"}

--- LogSoftMax([dim]) or LogSoftMax{dim=}: row-wise log-softmax of [N, C]
-- input. dim (1-based; default and only choice: the last, 2 or -1) is
-- checked at forward, so that torch's LogSoftmax(dim=1) ported as
-- LogSoftMax(1) fails instead of normalizing the rows anyway.
function nn.LogSoftMax(dim)
  if type(dim) == "table" then dim = O.check(DIM, "nn.LogSoftMax", dim).dim end
  if dim ~= nil and math.type(dim) ~= "integer" then
    O.fail("EINVAL: nn.LogSoftMax: dim must be an integer, got %s", tostring(dim))
  end
  local self = setmetatable({}, LogSoftMax):_init()
  self.dim = dim
  return self
end

function LogSoftMax:forward(x)
  check_tensor(x, "LogSoftMax:forward", "input")
  local d = self.dim
  if d ~= nil and (d < 0 and x:dim() + d + 1 or d) ~= x:dim() then
    O.fail("EINVAL: nn.LogSoftMax: dim %d of a %d-d input: crun's LogSoftMax normalizes the last dim " ..
           "(dims are 1-based: torch's dim=1 of [N, C] is dim=2 here)", d, x:dim())
  end
  x = contig(x)
  self.output = ensure(self.output, x:size(), x:dtype(), x:device())
  K.nn_log_softmax_forward(x, self.output)
  return self.output
end

function LogSoftMax:backward(x, gy)
  check_tensor(gy, "LogSoftMax:backward", "gradOutput")
  gy = contig(gy)
  self.gradInput = ensure(self.gradInput, gy:size(), gy:dtype(), gy:device())
  K.nn_log_softmax_backward(self.output, gy, self.gradInput)
  return self.gradInput
end

-- ---------------------------------------------------------------- Dropout

local Dropout = nn.class("Dropout")

--- Dropout(p=0.5, {seed=, inplace=false}): in training, zeroes each element with
-- probability p and scales the rest by 1/(1-p) (p = 1: input * 0, as
-- torch's); identity in evaluate().
-- Also torch's forms: Dropout{p =, inplace =} and Dropout(p, inplace); inplace
-- as ReLU's (true is reported once: crun writes its own output buffer).
function nn.Dropout(p, opts)
  if type(p) == "table" and opts == nil then p, opts = nil, p end
  if type(opts) == "boolean" then opts = {inplace = opts} end
  opts = O.check(DROPOUT, "nn.Dropout", opts)
  if p ~= nil and opts.p ~= nil then O.fail("EINVAL: nn.Dropout: p given twice (%s and p = %s)", tostring(p), tostring(opts.p)) end
  p = p or opts.p or 0.5
  inplace_arg("nn.Dropout", opts.inplace)
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    O.fail("EINVAL: nn.Dropout: p must be in [0, 1], got %s", tostring(p))
  end
  local self = setmetatable({}, Dropout):_init()
  self.p = p
  self.state = opts.seed ~= nil and O.int("nn.Dropout", "seed", opts.seed) or next_seed()
  return self
end

function Dropout:describe() return string.format("nn.Dropout(%g)", self.p) end

function Dropout:forward(x)
  check_tensor(x, "Dropout:forward", "input")
  if not self.training or self.p == 0 then
    self.output = x
    return x
  end
  x = contig(x)
  self.output = ensure(self.output ~= x and self.output or nil, x:size(), x:dtype(), x:device())
  self.mask = ensure(self.mask, x:size(), x:dtype(), x:device())
  if self.p == 1 then -- every element dropped: x * 0 (NaN stays NaN, as torch's), the gradient 0
    self.mask:fill(0)
    K.nn_mul(x, self.mask, self.output)
    return self.output
  end
  self.state = K.nn_dropout_forward(x, self.output, self.mask, self.p, self.state)
  return self.output
end

function Dropout:backward(x, gy)
  check_tensor(gy, "Dropout:backward", "gradOutput")
  if not self.training or self.p == 0 then
    self.gradInput = gy
    return gy
  end
  gy = contig(gy)
  self.gradInput = ensure(self.gradInput, gy:size(), gy:dtype(), gy:device())
  K.nn_mul(gy, self.mask, self.gradInput)
  return self.gradInput
end

-- ---------------------------------------------------------------- Sequential

local Sequential = nn.class("Sequential")
Sequential._positional_names = true -- (its children are named "0", "1", ... even if a field holds one)

--- Sequential(m1, m2, ...): applies its modules in order.
function nn.Sequential(...)
  local self = setmetatable({}, Sequential):_init()
  self.modules = {}
  for _, m in ipairs{...} do self:add(m) end
  return self
end

--- Appends a module; returns self (chainable).
function Sequential:add(m)
  if type(m) ~= "table" or type(m.forward) ~= "function" then
    O.fail("EINVAL: Sequential:add: an nn module is expected, got %s", type(m))
  end
  self.modules[#self.modules + 1] = m
  return self
end

function Sequential:describe()
  local parts = {"nn.Sequential {"}
  for i, m in ipairs(self.modules) do parts[#parts + 1] = string.format("  (%d) %s", i, m:describe()) end
  parts[#parts + 1] = "}"
  return table.concat(parts, "\n")
end

function Sequential:forward(x)
  self._inputs = {}
  for i, m in ipairs(self.modules) do
    self._inputs[i] = x
    x = m:forward(x)
  end
  self.output = x
  return x
end

--- Backward in reverse module order (so the last layer's gradients are
-- ready first, which is the order DDP buckets them in).
function Sequential:backward(x, gy)
  if not self._inputs then O.fail("ESTATE: Sequential:backward called before forward") end
  for i = #self.modules, 1, -1 do
    gy = self.modules[i]:backward(self._inputs[i], gy)
  end
  self.gradInput = gy
  return gy
end


-- ---------------------------------------------------------------- criteria

--- nn.mlp(inputs, hidden, layers, outputs): a Sequential of `layers` hidden
-- Linear+ReLU layers of width `hidden`, then a Linear classifier to `outputs`
-- (layers = 0 gives a linear model). jobs/train.lua and jobs/evaluate.lua
-- both build their model with it, so a checkpoint always fits.
function nn.mlp(inputs, hidden, layers, outputs)
  O.int("nn.mlp", "layers", layers, 0) -- (-1 or 2.5 built some other model)
  local net, width = nn.Sequential(), inputs
  for _ = 1, layers do
    net:add(nn.Linear(width, hidden)):add(nn.ReLU())
    width = hidden
  end
  return net:add(nn.Linear(width, outputs))
end

-- A criterion's reduction from its options: "mean" (torch's default), "sum"
-- or "none" (anything else, and unknown options, EINVAL; torch's other
-- options at a value but their default ENOTSUP).
-- The reduction option's value red: "mean" (torch's default, when nil),
-- "sum" or "none"; EINVAL naming fname otherwise.
local function check_reduction(fname, red)
  red = red or "mean"
  if red ~= "mean" and red ~= "sum" and red ~= "none" then
    O.fail("EINVAL: %s: reduction must be \"mean\", \"sum\" or \"none\", got %s", fname, tostring(red))
  end
  return red
end

local function reduction_of(fname, opts)
  return check_reduction(fname, O.check(CRITERION[fname], fname, opts).reduction)
end

-- Checks backward's grad_loss for reduction "none": a tensor of the shape of
-- the losses forward returned (the gradient of whatever the caller reduced
-- them to); returns it in x's dtype.
local function none_grad(name, self, gy)
  if not self.output then O.fail("ESTATE: %s:backward called before forward", name) end
  if gy == nil then
    O.fail("EINVAL: %s:backward: reduction = \"none\" needs the gradient of the per-element losses: " ..
      "backward(input, target, grad_loss) with grad_loss of shape %s (torch's loss.backward() through your " ..
      "reduction; for (loss * w):sum() / w:sum() pass w / w:sum())", name, shape_str(self.output))
  end
  check_tensor(gy, name .. ":backward", "grad_loss")
  if shape_str(gy) ~= shape_str(self.output) then
    O.fail("EINVAL: %s:backward: grad_loss has shape %s, the losses of the last forward %s", name, shape_str(gy),
      shape_str(self.output))
  end
  return contig(gy:to(self.output:dtype()))
end

-- The per-row picks x[i][labels[i]] of [N, C] x as an [N] tensor.
local function picked(x, labels)
  local n = x:size(1)
  return x:gather(2, contig(labels):view(n, 1)):view(n)
end

local CrossEntropy = nn.class("CrossEntropyCriterion")

--- CrossEntropyCriterion{reduction="mean"|"sum"|"none"}: log-softmax +
-- negative log likelihood of 1-based class labels (int64/int32 tensor [N]),
-- fused. "none" returns the [N] per-row losses (a tensor) and its backward
-- takes their gradient: backward(x, labels, grad_loss). After forward,
-- self.correct holds how many rows' argmax equal their label.
function nn.CrossEntropyCriterion(opts)
  local self = setmetatable({}, CrossEntropy):_init()
  self.reduction = reduction_of("nn.CrossEntropyCriterion", opts)
  self.sum = self.reduction == "sum"
  return self
end
nn.CrossEntropy = nn.CrossEntropyCriterion
nn.CrossEntropyLoss = nn.CrossEntropyCriterion -- (torch's name)

function CrossEntropy:forward(x, labels)
  check_tensor(x, "CrossEntropyCriterion:forward", "input")
  check_tensor(labels, "CrossEntropyCriterion:forward", "labels")
  x = contig(x)
  self.gradInput = ensure(self.gradInput, x:size(), x:dtype(), x:device())
  if self.reduction ~= "none" then
    self.output, self.correct = K.nn_cross_entropy(x, contig(labels), self.gradInput, self.sum)
    return self.output
  end
  self.rows = self.gradInput -- (softmax - onehot: each row's own gradient)
  if x:is_cuda() then        -- (no device kernel for the per-row losses: log_softmax gives them)
    self.correct = select(2, K.nn_cross_entropy(x, contig(labels), self.gradInput, true))
    self.output = picked(x:log_softmax(2), labels):neg()
    return self.output
  end
  self.output = T().empty({x:dim() == 2 and x:size(1) or 0}, x:dtype())
  self.correct = K.nn_cross_entropy_rows(x, contig(labels), self.output, self.gradInput)
  return self.output
end

--- Returns d loss / d input for the last forward (computed there); with
-- reduction "none", the rows' gradients scaled by grad_loss (a new tensor).
function CrossEntropy:backward(x, labels, gy)
  if self.reduction ~= "none" then
    if not self.output then O.fail("ESTATE: CrossEntropyCriterion:backward called before forward") end
    return self.gradInput
  end
  gy = none_grad("CrossEntropyCriterion", self, gy)
  return self.rows:mul(gy:view(gy:numel(), 1))
end

local ClassNLL = nn.class("ClassNLLCriterion")

--- ClassNLLCriterion{reduction="mean"|"sum"|"none"}: mean (or sum, or the
-- [N] tensor) of -input[i][label_i] (use after LogSoftMax); the mean is nan
-- for an empty batch, as torch's (so are the mean losses of CrossEntropy and
-- MSE). "none"'s backward takes the losses' gradient: backward(x, labels, grad_loss).
function nn.ClassNLLCriterion(opts)
  local self = setmetatable({}, ClassNLL):_init()
  self.reduction = reduction_of("nn.ClassNLLCriterion", opts)
  self.sum = self.reduction == "sum"
  return self
end

nn.NLLLoss = nn.ClassNLLCriterion

-- The sum from a mean over n terms (0 for none: the mean is nan there).
local function mean_to_sum(mean, n) return n == 0 and 0 or mean * n end

function ClassNLL:forward(x, labels)
  check_tensor(x, "ClassNLLCriterion:forward", "input")
  check_tensor(labels, "ClassNLLCriterion:forward", "labels")
  if x:dim() ~= 2 or labels:dim() ~= 1 or labels:size(1) ~= x:size(1) then
    O.fail("EINVAL: ClassNLLCriterion:forward: input must be [N, C] and labels [N], got %s and %s",
      table.concat(x:size(), "x"), table.concat(labels:size(), "x"))
  end
  self.output = K.nn_nll(contig(x), contig(labels)) -- (checks the labels)
  if self.sum then self.output = mean_to_sum(self.output, x:size(1)) end
  if self.reduction == "none" then self.output = picked(contig(x), labels):neg() end
  return self.output
end

function ClassNLL:backward(x, labels, gy)
  check_tensor(x, "ClassNLLCriterion:backward", "input")
  check_tensor(labels, "ClassNLLCriterion:backward", "labels")
  x = contig(x)
  if self.reduction == "none" then
    gy = none_grad("ClassNLLCriterion", self, gy)
    local n = gy:numel()
    self.gradInput = T().zeros(x:size(), x:dtype(), {device = x:device()})
    if n > 0 then self.gradInput:scatter_add_(2, contig(labels):view(n, 1), gy:neg():view(n, 1)) end
    return self.gradInput
  end
  self.gradInput = ensure(self.gradInput, x:size(), x:dtype(), x:device())
  K.nn_nll(x, contig(labels), self.gradInput)
  if self.sum and x:size(1) > 0 then self.gradInput:mul_(x:size(1)) end
  return self.gradInput
end

local MSE = nn.class("MSECriterion")

--- MSECriterion{reduction="mean"|"sum"|"none"}: mean (or sum, or the
-- elementwise tensor) of (input - target)^2 over all elements; "none"'s
-- backward takes the losses' gradient: backward(x, t, grad_loss).
function nn.MSECriterion(opts)
  local self = setmetatable({}, MSE):_init()
  self.reduction = reduction_of("nn.MSECriterion", opts)
  self.sum = self.reduction == "sum"
  return self
end
nn.MSE = nn.MSECriterion
nn.MSELoss = nn.MSECriterion

function MSE:forward(x, t)
  check_tensor(x, "MSECriterion:forward", "input")
  check_tensor(t, "MSECriterion:forward", "target")
  if shape_str(x) ~= shape_str(t) then -- torch would broadcast ([N, 1] with [N]: an N x N loss)
    O.fail("EINVAL: MSECriterion:forward: the target's shape %s differs from the input's %s", shape_str(t), shape_str(x))
  end
  x = contig(x)
  if self.reduction == "none" then
    self.diff = x - contig(t):to(x:dtype())
    self.output = self.diff:square()
    return self.output
  end
  self.gradInput = ensure(self.gradInput, x:size(), x:dtype(), x:device())
  self.output = K.nn_mse(x, contig(t), self.gradInput)
  if self.sum then
    self.output = mean_to_sum(self.output, x:numel())
    if x:numel() > 0 then self.gradInput:mul_(x:numel()) end
  end
  return self.output
end

function MSE:backward(x, t, gy)
  if self.reduction ~= "none" then
    if not self.output then O.fail("ESTATE: MSECriterion:backward called before forward") end
    return self.gradInput
  end
  gy = none_grad("MSECriterion", self, gy)
  self.gradInput = self.diff:mul(gy):mul_(2)
  return self.gradInput
end

nn.utils = require "crun.nn_utils"

require("crun.nn_layers")(nn, {K = K, O = O, ensure = ensure, contig = contig, check_tensor = check_tensor,
  unaliased = unaliased, next_seed = next_seed, T = T, place_layer = place_layer})
require("crun.nn_losses")(nn, {O = O, contig = contig, check_tensor = check_tensor, none_grad = none_grad,
  shape_str = shape_str, check_reduction = check_reduction})

return nn

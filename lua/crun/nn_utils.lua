--- crun.nn.utils: torch.nn.utils's gradient clipping.
--
--   local total = nn.utils.clip_grad_norm_(model, 1.0)      -- 2-norm over every gradient
--   nn.utils.clip_grad_norm_(model, 5.0, "inf")            -- or math.huge: the largest |g|
--   nn.utils.clip_grad_value_(model, 0.5)                  -- each element into [-0.5, 0.5]
--
-- `model` is a crun.nn module (a DDP model too), whose gradients are the second
-- result of model:parameters(), or a list of gradient tensors. The norm is
-- computed in float64 whatever the gradients' dtype. Under DDP the gradients
-- are the same on every rank after backward, so each rank clips alike, as in
-- torch. An FSDP model holds a shard of each gradient per rank: given one,
-- clip_grad_norm_ calls model:clip_grad_norm_, which sums the shards' norms
-- over the group (torch's FSDP.clip_grad_norm_); plain torch would clip each
-- shard by its own norm.
local utils = {}
local O = require "crun.opts"

local function is_tensor(v) return require("crun.tensor").is_tensor(v) end

-- The gradient tensors of x (a module, a list of its parameters, torch's
-- model.parameters(), or a list of gradient tensors), checked.
local function grads_of(x, fname)
  local grads
  if type(x) == "table" and type(x.parameters) == "function" then
    grads = select(2, x:parameters())
  elseif type(x) == "table" then
    grads = require("crun.nn").grads_for(x) or x
  else
    O.fail("EINVAL: %s: a crun.nn module or a list of gradient tensors is expected, got %s", fname, type(x))
  end
  for i, g in ipairs(grads or {}) do
    if not is_tensor(g) then
      O.fail("EINVAL: %s: gradient %d is a %s, a tensor is expected", fname, i, type(g))
    end
  end
  return grads or {}
end

-- norm_type: a number > 0, or math.huge / "inf" for the largest magnitude.
local function check_norm_type(fname, p)
  if p == nil then return 2 end
  if p == "inf" then return math.huge end
  if type(p) ~= "number" or p ~= p or p <= 0 then
    O.fail("EINVAL: %s: norm_type must be a number > 0 or \"inf\", got %s", fname, tostring(p))
  end
  return p
end

--- part(grads, p) -> for p = inf the largest |g|, else the sum of |g|^p
-- (float64): the part of a total norm these gradients hold. Sums of parts
-- (maxima for inf) over disjoint sets of gradients make the total's part;
-- utils.total(part, p) turns it into the norm.
function utils.part(grads, p)
  local acc = 0
  for _, g in ipairs(grads) do
    if g:numel() > 0 then
      local a = g:abs()
      if p == math.huge then
        local m = a:max()
        if m ~= m or m > acc then acc = m end -- NaN sticks, as in torch
      elseif acc == acc then
        local d = a:to("float64")
        if p ~= 1 then d = d:pow(p) end
        acc = acc + d:sum()
      end
    end
  end
  return acc
end

function utils.total(part, p)
  if p == math.huge or p == 1 then return part end
  return part ^ (1 / p)
end

-- Scales every gradient by max_norm / (total + 1e-6) when that is below 1
-- (torch's clip coefficient); fails first when total is not finite and
-- error_if_nonfinite is set.
function utils.scale(grads, total, max_norm, p, error_if_nonfinite, fname)
  if error_if_nonfinite and (total ~= total or total == math.huge) then
    O.fail("ERANGE: %s: the total norm of order %s of the gradients is %s, so it cannot be clipped "
      .. "(error_if_nonfinite = false scales the gradients by it anyway, as torch)", fname,
      p == math.huge and "inf" or tostring(p), tostring(total))
  end
  local coef = max_norm / (total + 1e-6)
  if coef ~= coef or coef < 1 then
    for _, g in ipairs(grads) do g:mul_(coef) end
  end
end

local CLIP_OPTS = O.spec{"norm_type", "error_if_nonfinite", inert = {foreach = "crun scales each gradient in place"}}

-- (x, max_norm[, norm_type][, opts]) with norm_type also accepted in opts.
function utils.clip_args(fname, max_norm, a, b)
  local opts = b
  if type(a) == "table" then opts, a = a, nil end
  opts = O.check(CLIP_OPTS, fname, opts)
  if a ~= nil and opts.norm_type ~= nil then
    O.fail("EINVAL: %s: norm_type given twice (argument 3 and the options)", fname)
  end
  local p = check_norm_type(fname, a ~= nil and a or opts.norm_type)
  if type(max_norm) ~= "number" or max_norm ~= max_norm or max_norm < 0 then
    O.fail("EINVAL: %s: max_norm must be a number >= 0, got %s", fname, tostring(max_norm))
  end
  return p, O.bool(fname, "error_if_nonfinite", opts.error_if_nonfinite, false)
end

--- clip_grad_norm_(model | grads, max_norm[, norm_type=2][, {error_if_nonfinite=false}])
-- -> the total norm of the gradients (before clipping), a number. When it is
-- above max_norm every gradient is scaled by max_norm / (norm + 1e-6), in
-- place (torch's torch.nn.utils.clip_grad_norm_). A non-finite norm scales
-- the gradients to NaN, as torch, unless error_if_nonfinite, which raises
-- ERANGE and leaves them as they are.
function utils.clip_grad_norm_(x, max_norm, norm_type, opts)
  if type(x) == "table" and type(x.clip_grad_norm_) == "function" then
    return x:clip_grad_norm_(max_norm, norm_type, opts) -- FSDP: over every rank's shards
  end
  local F = "clip_grad_norm_"
  local grads = grads_of(x, F)
  local p, nonfinite = utils.clip_args(F, max_norm, norm_type, opts)
  local total = utils.total(utils.part(grads, p), p)
  utils.scale(grads, total, max_norm, p, nonfinite, F)
  return total
end

--- clip_grad_value_(model | grads, clip_value): clamps every gradient
-- element into [-clip_value, clip_value], in place (torch's).
function utils.clip_grad_value_(x, clip_value)
  local F = "clip_grad_value_"
  local grads = grads_of(x, F)
  if type(clip_value) ~= "number" or clip_value ~= clip_value or clip_value < 0 then
    O.fail("EINVAL: %s: clip_value must be a number >= 0, got %s", F, tostring(clip_value))
  end
  for _, g in ipairs(grads) do g:clamp_(-clip_value, clip_value) end
end

return utils

--- crun.nn's element-wise losses: L1Loss (AbsCriterion), SmoothL1Loss
-- (SmoothL1Criterion), BCELoss (BCECriterion) and BCEWithLogitsLoss
-- (BCEWithLogitsCriterion). Loaded by crun.nn (which passes its helpers);
-- use them as nn.L1Loss etc.
--
-- Each takes {reduction = "mean"|"sum"|"none"} as torch's: forward(x, t)
-- returns a Lua number ("mean", "sum") or the per-element losses ("none");
-- backward(x, t) the gradient with respect to x, and with "none"
-- backward(x, t, grad_loss) (the gradient of whatever the caller reduced
-- the losses to). The input is a float tensor, the target one of its shape
-- (torch would broadcast a different shape: EINVAL here, as MSECriterion).
-- The math is tensor ops, each with a device kernel, so a tensor on a
-- device should compute there (not yet run on a device: an op without a
-- kernel fails with ENOTSUP naming it, never silently).
return function(nn, H)
  local O, contig, check_tensor, none_grad, shape_str = H.O, H.contig, H.check_tensor, H.none_grad, H.shape_str
  local check_reduction = H.check_reduction -- "mean" (torch's default), "sum" or "none"

  -- x and t checked (tensors of one shape, x float); returns x contiguous
  -- and t in x's dtype.
  local function operands(fname, x, t)
    check_tensor(x, fname, "input")
    check_tensor(t, fname, "target")
    if shape_str(x) ~= shape_str(t) then
      O.fail("EINVAL: %s: the target's shape %s differs from the input's %s", fname, shape_str(t), shape_str(x))
    end
    if not x:dtype():find("float") then
      O.fail("EINVAL: %s: the input must be a float tensor, got %s (convert with :float())", fname, x:dtype())
    end
    return contig(x), contig(t):to(x:dtype())
  end

  -- An optional per-element tensor option (weight, pos_weight), or nil.
  local function tensor_opt(fname, what, v)
    if v == nil or v == O.NONE then return nil end
    check_tensor(v, fname, what)
    return v
  end

  -- v (a weight) in x's dtype and on x's device.
  local function like(v, x) return v:to(x:dtype()):to(x:device()) end

  -- Defines criterion `name` (crun's Criterion spelling) with options spec
  -- (besides reduction), init(self, opts), the per-element losses
  -- loss(self, x, t) and their derivatives grad(self, x, t) (new tensors).
  local function define(name, options, init, loss, grad)
    local cls = nn.class(name)
    local spec = O.spec(options)
    local fname = "nn." .. name
    nn[name] = function(opts)
      local self = setmetatable({}, cls):_init()
      local o = O.check(spec, fname, opts)
      self.reduction = check_reduction(fname, o.reduction)
      if init then init(self, o, fname) end
      return self
    end
    function cls:forward(x, t)
      x, t = operands(name .. ":forward", x, t)
      local l = loss(self, x, t)
      if self.weight then l = l * like(self.weight, x) end
      if self.reduction == "none" then self.output = l
      else
        self.output = l:sum()
        if self.reduction == "mean" then self.output = self.output / l:numel() end -- (nan for no elements, as torch's)
      end
      return self.output
    end
    function cls:backward(x, t, gy)
      x, t = operands(name .. ":backward", x, t)
      local g = grad(self, x, t)
      if self.weight then g = g * like(self.weight, x) end
      if self.reduction == "none" then g = g * none_grad(name, self, gy)
      elseif self.reduction == "mean" and x:numel() > 0 then g = g / x:numel() end
      if shape_str(g) ~= shape_str(x) then -- (a weight broadcasting past the input's shape)
        O.fail("EINVAL: %s:backward: the weight broadcasts the input's shape %s to %s", name, shape_str(x), shape_str(g))
      end
      self.gradInput = g
      return g
    end
    return cls
  end

  -- (Each loss's doc block sits above its torch alias, where LDoc can attach it.)
  define("AbsCriterion", {"reduction"}, nil,
    function(_, x, t) return (x - t):abs() end,
    function(_, x, t) return (x - t):sign() end)
  --- AbsCriterion{reduction=} / nn.L1Loss: |x - t|; its gradient sign(x - t)
  --- (0 where they are equal, as torch's).
  nn.L1Loss = nn.AbsCriterion

  define("SmoothL1Criterion", {"reduction", "beta"},
    function(self, o, fname) self.beta = O.num(fname, "beta", o.beta, 0, 1.0) end,
    function(self, x, t)
      local d = (x - t):abs()
      if self.beta == 0 then return d end
      local q = d:clamp(nil, self.beta) -- |d| below beta, else beta: q (|d| - q / 2) / beta is the loss
      return q * (d - q * 0.5) / self.beta
    end,
    function(self, x, t)
      if self.beta == 0 then return (x - t):sign() end
      return (x - t):clamp(-self.beta, self.beta) / self.beta
    end)
  --- SmoothL1Criterion{reduction=, beta=1} / nn.SmoothL1Loss: 0.5 d^2 / beta
  --- where |d| < beta, else |d| - 0.5 beta, for d = x - t (beta = 0 is the
  --- L1 loss, as torch's; a negative beta EINVAL).
  nn.SmoothL1Loss = nn.SmoothL1Criterion

  define("BCECriterion", {"reduction", "weight"},
    function(self, o, fname) self.weight = tensor_opt(fname, "weight", o.weight) end,
    function(_, x, t)
      if not (x:ge(0):all() and x:le(1):all()) then
        O.fail("EINVAL: BCECriterion:forward: every element of the input must be between 0 and 1 (probabilities; " ..
          "for logits use nn.BCEWithLogitsLoss)")
      end
      return -(t * x:log():clamp(-100) + (1 - t) * (1 - x):log():clamp(-100))
    end,
    function(_, x, t) return (x - t) / (x * (1 - x)):clamp(1e-12) end)
  --- BCECriterion{reduction=, weight=} / nn.BCELoss: -(t log x + (1 - t)
  --- log(1 - x)) of probabilities x in [0, 1] (else EINVAL, as torch's),
  --- each log clamped at -100 as torch's (so x = 0 or 1 gives a finite
  --- loss); the gradient is (x - t) / max(x (1 - x), 1e-12), torch's.
  --- weight (broadcasting with x) scales each element's loss.
  nn.BCELoss = nn.BCECriterion

  define("BCEWithLogitsCriterion", {"reduction", "weight", "pos_weight"},
    function(self, o, fname)
      self.weight = tensor_opt(fname, "weight", o.weight)
      self.pos_weight = tensor_opt(fname, "pos_weight", o.pos_weight)
    end,
    function(self, x, t)
      local softplus = (-x:abs()):exp():log1p() + (-x):clamp(0) -- log(1 + exp(-x))
      if not self.pos_weight then return (1 - t) * x + softplus end
      local l = (like(self.pos_weight, x) - 1) * t + 1
      return (1 - t) * x + l * softplus
    end,
    function(self, x, t)
      if not self.pos_weight then return x:sigmoid() - t end
      local pw = like(self.pos_weight, x)
      return x:sigmoid() * ((pw - 1) * t + 1) - pw * t
    end)
  --- BCEWithLogitsCriterion{reduction=, weight=, pos_weight=} /
  --- nn.BCEWithLogitsLoss: BCE of sigmoid(x), in the stable form
  --- (1 - t) x + l (log(1 + exp(-|x|)) + max(-x, 0)), l = 1 + (pos_weight - 1) t
  --- (finite for any finite x); the gradient sigmoid(x) l - pos_weight t.
  --- pos_weight (broadcasting with x, e.g. one per class) weighs the
  --- positive targets; weight scales each element's loss.
  nn.BCEWithLogitsLoss = nn.BCEWithLogitsCriterion
end

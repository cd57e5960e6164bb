--- crun.nn layers for images and sequences: Conv2d, MaxPool2d, AvgPool2d,
-- Flatten, BatchNorm1d/2d, SyncBatchNorm, LayerNorm, Embedding. Loaded by
-- crun.nn (which passes its helpers); use them as nn.Conv2d etc.
--
-- The work is in C (runtime/train/conv.c, norm.c): convolution by im2col and
-- one GEMM per image through OpenBLAS; batch norm in three steps (per-channel
-- sums, normalise, input gradient) so SyncBatchNorm can all_reduce the sums
-- in between. Batch-norm statistics are float64 whatever the model dtype.
return function(nn, H)
  local K, O, ensure, contig, check_tensor, T = H.K, H.O, H.ensure, H.contig, H.check_tensor, H.T
  local unaliased = H.unaliased

  -- fixed: torch's options that crun computes at their default value only
  -- (accepted at it, ENOTSUP naming option and value otherwise).
  local CONV = O.spec{"stride", "padding", "dilation", "bias", "dtype", "seed", "device",
    fixed = {groups = 1, padding_mode = "zeros"}}
  local MAXPOOL = O.spec{"stride", "padding", fixed = {dilation = 1, return_indices = false, ceil_mode = false}}
  local AVGPOOL = O.spec{"stride", "padding", "count_include_pad", fixed = {ceil_mode = false, divisor_override = O.NONE}}
  local BN = O.spec{"eps", "momentum", "affine", "track_running_stats", "dtype", "device"}
  local SYNC_BN = O.spec{"eps", "momentum", "affine", "track_running_stats", "dtype", "device", "group",
    aliases = {process_group = "group"}}
  local LN = O.spec{"eps", "elementwise_affine", "dtype", "device"}
  local EMB = O.spec{"padding_idx", "dtype", "seed", "device",
    fixed = {max_norm = O.NONE, norm_type = 2, scale_grad_by_freq = false, sparse = false}}

  -- ENOTSUP unless device (a layer's device= option) is nil or the host: the
  -- layers built with it compute on the host only.
  local function host_device(fname, device)
    if device ~= nil and require("crun.cuda").device_index(device, fname) >= 0 then
      O.fail("ENOTSUP: %s: device = %s is not implemented (this layer computes on the host: device = \"cpu\")",
        fname, tostring(device))
    end
  end

  local function dtype_of(fname, dt)
    dt = dt or nn.get_default_dtype()
    if dt ~= "float32" and dt ~= "float64" then
      O.fail("EINVAL: %s: dtype must be float32 or float64, got %s", fname, tostring(dt))
    end
    return dt
  end

  -- An int or {h, w} -> h, w (each >= lo).
  local function pair(fname, what, v, lo)
    local h, w
    if type(v) == "table" then
      if #v ~= 2 then -- {1, 2, 3} used its first two, {3} read nil
        O.fail("EINVAL: %s: %s must be an integer or a pair {h, w}, got a table of %d", fname, what, #v)
      end
      h, w = v[1], v[2]
    else
      h, w = v, v
    end
    return O.int(fname, what, h, lo), O.int(fname, what, w, lo)
  end

  local function check_4d(x, fname)
    check_tensor(x, fname, "input")
    if x:dim() ~= 4 then
      O.fail("EINVAL: %s: input must be 4-d (N, C, H, W), got shape %s", fname, table.concat(x:size(), "x"))
    end
  end

  -- ---------------------------------------------------------------- Conv2d

  -- Conv2d's padding h, w: an int or {h, w}, or torch's "valid" (0) or
  -- "same" (stride 1; dilation * (kernel - 1) / 2 each side: an odd total,
  -- which torch pads one more on the bottom/right, is ENOTSUP).
  local function conv_padding(fn, padding, kh, kw, sh, sw, dh, dw)
    if padding == "valid" then return 0, 0 end
    if padding ~= "same" then return pair(fn, "padding", padding or 0, 0) end
    if sh ~= 1 or sw ~= 1 then
      O.fail("EINVAL: %s: padding = \"same\" needs stride 1, got %d,%d (as torch's)", fn, sh, sw)
    end
    local th, tw = dh * (kh - 1), dw * (kw - 1)
    if th % 2 ~= 0 or tw % 2 ~= 0 then
      O.fail("ENOTSUP: %s: padding = \"same\" with kernel %dx%d and dilation %d,%d needs uneven padding (torch " ..
        "adds the odd one at the bottom/right), which crun does not compute: give padding explicitly", fn, kh, kw, dh, dw)
    end
    return th // 2, tw // 2
  end

  local Conv2d = nn.class("Conv2d")
  nn.Conv2dClass = Conv2d

  --- Conv2d(in, out, kernel, {stride=1, padding=0, dilation=1, bias=true, dtype=, seed=, device=}):
  -- kernel, stride, padding, dilation are an int or {h, w}; padding may be
  -- torch's "valid" or "same" (see conv_padding). torch's groups
  -- and padding_mode are accepted at their defaults (1, "zeros") only. Weight [out, in,
  -- kh, kw] and bias drawn uniformly from +-1/sqrt(in kh kw) (torch's default),
  -- then moved to device as nn.Linear's (its forward has no device kernel yet).
  function nn.Conv2d(cin, cout, kernel, opts)
    local fn = "nn.Conv2d"
    opts = O.check(CONV, fn, opts)
    O.int(fn, "in_channels", cin, 1)
    O.int(fn, "out_channels", cout, 1)
    local self = setmetatable({}, Conv2d):_init()
    self.kh, self.kw = pair(fn, "kernel_size", kernel, 1)
    local sh, sw = pair(fn, "stride", opts.stride or 1, 1)
    local dh, dw = pair(fn, "dilation", opts.dilation or 1, 1)
    local ph, pw = conv_padding(fn, opts.padding, self.kh, self.kw, sh, sw, dh, dw)
    self.geom = {stride_h = sh, stride_w = sw, pad_h = ph, pad_w = pw, dil_h = dh, dil_w = dw}
    O.bool(fn, "bias", opts.bias, true)
    self.in_channels, self.out_channels, self.dtype = cin, cout, dtype_of(fn, opts.dtype)
    local bound = 1 / math.sqrt(cin * self.kh * self.kw)
    local gen = T().Generator(opts.seed ~= nil and O.int(fn, "seed", opts.seed) or H.next_seed())
    self.weight = T().zeros({cout, cin, self.kh, self.kw}, self.dtype):uniform_(-bound, bound, gen)
    self.gradWeight = T().zeros({cout, cin, self.kh, self.kw}, self.dtype)
    self._params, self._grads = {self.weight}, {self.gradWeight}
    self._pnames, self._gnames = {"weight", "bias"}, {"gradWeight", "gradBias"}
    if opts.bias ~= false then
      self.bias = T().zeros({cout}, self.dtype):uniform_(-bound, bound, gen)
      self.gradBias = T().zeros({cout}, self.dtype)
      self._params[2], self._grads[2] = self.bias, self.gradBias
    end
    return H.place_layer(fn, self, opts.device)
  end

  function Conv2d:describe()
    local g = self.geom
    return string.format("nn.Conv2d(%d -> %d, %dx%d, stride %d,%d, pad %d,%d, dil %d,%d%s)", self.in_channels,
      self.out_channels, self.kh, self.kw, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dil_h, g.dil_w,
      self.bias and "" or ", no bias")
  end

  function Conv2d:forward(x)
    check_4d(x, "Conv2d:forward")
    x = contig(x)
    local oh, ow = K.nn_conv2d_out_size(x:size(3), x:size(4), self.kh, self.kw, self.geom)
    self.output = ensure(self.output, {x:size(1), self.out_channels, oh, ow}, self.dtype)
    K.nn_conv2d_forward(x, self.weight, self.bias, self.output, self.geom)
    return self.output
  end

  function Conv2d:backward(x, gy)
    check_tensor(gy, "Conv2d:backward", "gradOutput")
    x, gy = contig(x), unaliased(contig(gy), self.gradInput) -- (gradInput is zeroed first)
    self.gradInput = ensure(self.gradInput, x:size(), self.dtype)
    K.nn_conv2d_backward(x, self.weight, gy, self.gradInput, self.gradWeight, self.gradBias, self.geom)
    self:_grads_ready()
    return self.gradInput
  end

  -- ---------------------------------------------------------------- pooling

  local function pool_geom(fn, kernel, opts)
    local kh, kw = pair(fn, "kernel_size", kernel, 1)
    local sh, sw = pair(fn, "stride", opts.stride or {kh, kw}, 1)
    local ph, pw = pair(fn, "padding", opts.padding or 0, 0)
    return {kh = kh, kw = kw, stride_h = sh, stride_w = sw, pad_h = ph, pad_w = pw}
  end

  -- torch's positional arguments of each pooling layer after the kernel.
  local POSITIONAL = {
    ["nn.MaxPool2d"] = {"stride", "padding", "dilation", "return_indices", "ceil_mode"},
    ["nn.AvgPool2d"] = {"stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"},
  }

  -- The options table of a pooling layer called (kernel, opts) or with
  -- torch's positional arguments (kernel, stride, padding, ...: named by
  -- POSITIONAL, so that the options check sees them); an argument after an
  -- options table, or past torch's last, is EINVAL, not dropped.
  local function pool_opts(fn, opts, ...)
    if type(opts) ~= "number" and type(opts) ~= "table" and opts ~= nil then return opts end -- (O.check says what)
    local names, n = POSITIONAL[fn], select("#", ...)
    if type(opts) == "table" then
      if n > 0 then
        O.fail("EINVAL: %s: a third argument (torch's padding) follows a stride, got it after an options table", fn)
      end
      return opts
    end
    if n + 1 > #names then
      O.fail("EINVAL: %s: %d positional arguments after the kernel, torch's %s has %d (%s)", fn, n + 1, fn:sub(4),
        #names, table.concat(names, ", "))
    end
    local o = {stride = opts} -- (nil: torch's stride=None, the kernel)
    for i = 1, n do o[names[i + 1]] = (select(i, ...)) end
    return o
  end

  local MaxPool2d = nn.class("MaxPool2d")

  --- MaxPool2d(kernel, {stride=kernel, padding=0}) (also torch's positional
  -- MaxPool2d(k, stride, padding, ...)). torch's dilation, return_indices and
  -- ceil_mode are accepted at their defaults (1, false, false) only.
  function nn.MaxPool2d(kernel, opts, ...)
    opts = O.check(MAXPOOL, "nn.MaxPool2d", pool_opts("nn.MaxPool2d", opts, ...))
    local self = setmetatable({}, MaxPool2d):_init()
    self.geom = pool_geom("nn.MaxPool2d", kernel, opts)
    return self
  end

  function MaxPool2d:describe()
    local g = self.geom
    return string.format("nn.MaxPool2d(%dx%d, stride %d,%d, pad %d,%d)", g.kh, g.kw, g.stride_h, g.stride_w,
      g.pad_h, g.pad_w)
  end

  function MaxPool2d:forward(x)
    check_4d(x, "MaxPool2d:forward")
    x = unaliased(contig(x), self.output)
    local oh, ow = K.nn_pool2d_out_size(x:size(3), x:size(4), self.geom)
    local shape = {x:size(1), x:size(2), oh, ow}
    self.output = ensure(self.output, shape, x:dtype())
    self.indices = ensure(self.indices, shape, "int64")
    K.nn_maxpool2d_forward(x, self.output, self.indices, self.geom)
    return self.output
  end

  function MaxPool2d:backward(x, gy)
    check_tensor(x, "MaxPool2d:backward", "input")
    check_tensor(gy, "MaxPool2d:backward", "gradOutput")
    gy = unaliased(contig(gy), self.gradInput) -- (gradInput is zeroed first)
    self.gradInput = ensure(self.gradInput, x:size(), x:dtype())
    K.nn_maxpool2d_backward(gy, self.indices, self.gradInput, self.geom)
    return self.gradInput
  end

  local AvgPool2d = nn.class("AvgPool2d")

  --- AvgPool2d(kernel, {stride=kernel, padding=0, count_include_pad=true})
  -- (also torch's positional AvgPool2d(k, stride, padding, ...)). torch's
  -- ceil_mode is accepted at its default (false) only, divisor_override not at all.
  function nn.AvgPool2d(kernel, opts, ...)
    opts = O.check(AVGPOOL, "nn.AvgPool2d", pool_opts("nn.AvgPool2d", opts, ...))
    local self = setmetatable({}, AvgPool2d):_init()
    self.geom = pool_geom("nn.AvgPool2d", kernel, opts)
    self.count_include_pad = O.bool("nn.AvgPool2d", "count_include_pad", opts.count_include_pad, true) ~= false
    return self
  end

  function AvgPool2d:describe()
    local g = self.geom
    return string.format("nn.AvgPool2d(%dx%d, stride %d,%d, pad %d,%d)", g.kh, g.kw, g.stride_h, g.stride_w,
      g.pad_h, g.pad_w)
  end

  function AvgPool2d:forward(x)
    check_4d(x, "AvgPool2d:forward")
    x = unaliased(contig(x), self.output)
    local oh, ow = K.nn_pool2d_out_size(x:size(3), x:size(4), self.geom)
    self.output = ensure(self.output, {x:size(1), x:size(2), oh, ow}, x:dtype())
    K.nn_avgpool2d_forward(x, self.output, self.geom, self.count_include_pad)
    return self.output
  end

  function AvgPool2d:backward(x, gy)
    check_tensor(x, "AvgPool2d:backward", "input")
    check_tensor(gy, "AvgPool2d:backward", "gradOutput")
    gy = unaliased(contig(gy), self.gradInput) -- (gradInput is zeroed first)
    self.gradInput = ensure(self.gradInput, x:size(), x:dtype())
    K.nn_avgpool2d_backward(gy, self.gradInput, self.geom, self.count_include_pad)
    return self.gradInput
  end

  -- ---------------------------------------------------------------- Flatten

  local Flatten = nn.class("Flatten")

  local FLATTEN = O.spec{"start_dim", "end_dim"}

  --- Flatten([start_dim=2[, end_dim=-1]]) or Flatten{start_dim=, end_dim=}:
  -- [N, ...] -> [N, prod(...)] (a view; backward views back). The dims are
  -- 1-based and only this split is computed: others (torch's Flatten(0),
  -- ported as Flatten(0) or Flatten(1)) fail at forward instead of being
  -- ignored.
  function nn.Flatten(start_dim, end_dim)
    if type(start_dim) == "table" then
      local o = O.check(FLATTEN, "nn.Flatten", start_dim)
      start_dim, end_dim = o.start_dim, o.end_dim
    end
    for _, v in ipairs({start_dim or 2, end_dim or -1}) do
      if math.type(v) ~= "integer" then O.fail("EINVAL: nn.Flatten: dims must be integers, got %s", tostring(v)) end
    end
    local self = setmetatable({}, Flatten):_init()
    self.start_dim, self.end_dim = start_dim or 2, end_dim or -1
    return self
  end

  function Flatten:forward(x)
    check_tensor(x, "Flatten:forward", "input")
    local nd, e = x:dim(), self.end_dim
    if self.start_dim ~= 2 or (e ~= -1 and (e < 0 and nd + e + 1 or e) ~= nd) then
      O.fail("EINVAL: nn.Flatten: start_dim %d, end_dim %d of a %d-d input: crun's Flatten keeps dim 1 and " ..
             "flattens the rest (start_dim=2, end_dim=-1; dims are 1-based: torch's start_dim=1 is 2 here)",
             self.start_dim, e, nd)
    end
    x = contig(x)
    local n, rest = x:dim() > 0 and x:size(1) or 1, 1
    for d = 2, x:dim() do rest = rest * x:size(d) end -- (numel // n: 0 for an empty batch)
    self.output = x:view(n, rest)
    return self.output
  end

  function Flatten:backward(x, gy)
    check_tensor(x, "Flatten:backward", "input")
    check_tensor(gy, "Flatten:backward", "gradOutput")
    self.gradInput = contig(gy):view(x:size())
    return self.gradInput
  end

  -- ---------------------------------------------------------------- BatchNorm

  local BatchNorm = nn.class("BatchNorm")
  nn.BatchNormClass = BatchNorm

  -- Builds a batch-norm module of class cls over `c` channels for inputs of
  -- `dims` (a set of allowed ranks).
  local function batch_norm(cls, fn, c, dims, opts)
    opts = O.check(fn == "nn.SyncBatchNorm" and SYNC_BN or BN, fn, opts) -- (a plain BatchNorm has no group)
    O.int(fn, "num_features", c, 1)
    host_device(fn, opts.device)
    local self = setmetatable({}, cls):_init()
    self.num_features, self.dims, self.fname = c, dims, fn
    self.eps = opts.eps or 1e-5
    if type(self.eps) ~= "number" or not (self.eps >= 0) then O.fail("EINVAL: %s: eps must be >= 0, got %s", fn, tostring(opts.eps)) end
    if opts.momentum ~= nil and opts.momentum ~= false and (type(opts.momentum) ~= "number" or not (opts.momentum >= 0 and opts.momentum <= 1)) then -- NaN too
      O.fail("EINVAL: %s: momentum must be in [0, 1] (or false for a cumulative average), got %s", fn,
        tostring(opts.momentum))
    end
    if opts.momentum == nil then self.momentum = 0.1 elseif opts.momentum == false then self.momentum = nil
    else self.momentum = opts.momentum end
    self.affine = O.bool(fn, "affine", opts.affine, true) ~= false
    self.track_running_stats = O.bool(fn, "track_running_stats", opts.track_running_stats, true) ~= false
    self.dtype = dtype_of(fn, opts.dtype)
    self.group = opts.group
    self._params, self._grads = {}, {}
    if self.affine then
      self.weight, self.bias = T().ones({c}, self.dtype), T().zeros({c}, self.dtype)
      self.gradWeight, self.gradBias = T().zeros({c}, self.dtype), T().zeros({c}, self.dtype)
      self._params, self._grads = {self.weight, self.bias}, {self.gradWeight, self.gradBias}
      self._pnames, self._gnames = {"weight", "bias"}, {"gradWeight", "gradBias"}
    end
    if self.track_running_stats then
      self.running_mean, self.running_var = T().zeros({c}, self.dtype), T().ones({c}, self.dtype)
      self.num_batches_tracked = T().zeros({1}, "int64")
      self._buffers = {"running_mean", "running_var", "num_batches_tracked"}
    end
    return self
  end

  --- BatchNorm1d(C, {eps=1e-5, momentum=0.1 (false: cumulative average), affine=true,
  --- track_running_stats=true, dtype=, device="cpu"}): input [N, C] or [N, C, L].
  function nn.BatchNorm1d(c, opts) return batch_norm(BatchNorm, "nn.BatchNorm1d", c, {[2] = true, [3] = true}, opts) end

  --- BatchNorm2d(C, {...}): input [N, C, H, W]. Same options as BatchNorm1d.
  function nn.BatchNorm2d(c, opts) return batch_norm(BatchNorm, "nn.BatchNorm2d", c, {[4] = true}, opts) end

  function BatchNorm:describe()
    return string.format("%s(%d, eps %g, momentum %s%s)", self.fname, self.num_features, self.eps,
      self.momentum and string.format("%g", self.momentum) or "cumulative", self.affine and "" or ", no affine")
  end

  function BatchNorm:_check_input(x, what)
    check_tensor(x, self.fname .. ":" .. what, "input")
    if not self.dims[x:dim()] or x:size(2) ~= self.num_features then
      O.fail("EINVAL: %s:%s: input of shape %s does not fit %d features", self.fname, what,
        table.concat(x:size(), "x"), self.num_features)
    end
  end

  -- Per-channel sums of x (and the element count), all_reduced over the
  -- group when this is a SyncBatchNorm in training with world > 1.
  function BatchNorm:_sum(t, n) return t, n end

  local function stat(c) return T().zeros({c}, "float64") end

  -- self.mean and self.invstd from the per-channel sums of x over n > 0
  -- values (the group's, for SyncBatchNorm), and in training with running
  -- statistics their update.
  function BatchNorm:_batch_stats(x, sums, n)
    local c, mean, invstd = self.num_features, self.mean, self.invstd
    if n == 1 then -- (also in evaluation without running statistics, as torch: the batch's are used)
      O.fail("EINVAL: %s:forward: expected more than 1 value per channel when using batch statistics, got input " ..
        "of shape %s", self.fname, table.concat(x:size(), "x"))
    end
    for i = 1, c do mean[i] = sums[i] / n end
    local sq = stat(c)
    K.nn_bn_reduce(x, mean, x, mean, sq)
    sq = self:_sum(sq, 0)
    for i = 1, c do invstd[i] = 1 / math.sqrt(sq[i] / n + self.eps) end
    if self.training and self.track_running_stats then
      self.num_batches_tracked[1] = self.num_batches_tracked[1] + 1
      local m = self.momentum or 1 / self.num_batches_tracked[1]
      local rm, rv = self.running_mean, self.running_var
      for i = 1, c do
        rm[i] = (1 - m) * rm[i] + m * mean[i]
        rv[i] = (1 - m) * rv[i] + m * sq[i] / (n - 1)
      end
    end
  end

  function BatchNorm:forward(x)
    self:_check_input(x, "forward")
    x = contig(x)
    local c = self.num_features
    self.output = ensure(self.output, x:size(), self.dtype)
    local batch_stats = self.training or not self.track_running_stats
    self.mean, self.invstd = ensure(self.mean, {c}, "float64"), ensure(self.invstd, {c}, "float64")
    local mean, invstd = self.mean, self.invstd
    if batch_stats then
      local per = x:numel() // c
      local sums = stat(c)
      K.nn_bn_reduce(x, nil, nil, nil, sums)
      local n
      sums, n = self:_sum(sums, per)
      self.count = n
      if n == 0 then -- an empty batch (the whole group's): torch gives an empty output, counts the batch in
        mean:fill(0) -- num_batches_tracked and leaves the running statistics as they are
        invstd:fill(1)
        if self.training and self.track_running_stats then self.num_batches_tracked[1] = self.num_batches_tracked[1] + 1 end
      else
        self:_batch_stats(x, sums, n)
      end
    else
      for i = 1, c do
        mean[i] = self.running_mean[i]
        invstd[i] = 1 / math.sqrt(self.running_var[i] + self.eps)
      end
    end
    self.used_batch_stats = batch_stats
    K.nn_bn_apply(x, mean, invstd, self.weight, self.bias, self.output)
    return self.output
  end

  function BatchNorm:backward(x, gy)
    check_tensor(gy, self.fname .. ":backward", "gradOutput")
    if not self.mean then O.fail("ESTATE: %s:backward called before forward", self.fname) end
    x, gy = contig(x), contig(gy)
    local c = self.num_features
    self.gradInput = ensure(self.gradInput, x:size(), self.dtype)
    local sdy, sdx = stat(c), stat(c)
    K.nn_bn_reduce(gy, nil, nil, nil, sdy)
    K.nn_bn_reduce(gy, nil, x, self.mean, sdx)
    if self.affine then K.nn_bn_param_grads(sdy, sdx, self.invstd, self.gradWeight, self.gradBias) end
    if self.used_batch_stats and self.count > 0 then -- (an empty batch's gradInput is empty)
      local both = T().zeros({2 * c}, "float64")
      for i = 1, c do both[i], both[c + i] = sdy[i], sdx[i] end
      both = self:_sum(both, 0)
      local mdy, mdx = stat(c), stat(c)
      for i = 1, c do mdy[i], mdx[i] = both[i] / self.count, both[c + i] / self.count end
      K.nn_bn_backward_input(gy, x, self.mean, self.invstd, self.weight, mdy, mdx, self.gradInput)
    elseif not self.used_batch_stats then
      K.nn_bn_backward_input(gy, x, self.mean, self.invstd, self.weight, nil, nil, self.gradInput)
    end
    self:_grads_ready()
    return self.gradInput
  end

  -- ---------------------------------------------------------------- SyncBatchNorm

  local SyncBatchNorm = nn.class("SyncBatchNorm", BatchNorm)
  nn.SyncBatchNormClass = SyncBatchNorm

  -- The group to reduce over, or nil when no synchronisation is needed
  -- (evaluation, crun.dist not initialised, or a group of one).
  function SyncBatchNorm:_sync_group()
    local ok, dist = pcall(require, "crun.dist")
    if not ok or not dist.is_initialized() then return nil end
    local world = dist.get_world_size(self.group)
    if world <= 1 then return nil end
    return dist
  end

  function SyncBatchNorm:_sum(t, n)
    local dist = self.training and self:_sync_group() -- (torch syncs in training only)
    if not dist then return t, n end
    local c = t:numel()
    local buf = T().zeros({c + 1}, "float64")
    buf:narrow(1, 1, c):copy(t)
    buf[c + 1] = n
    local opts = self.group and {group = self.group} or nil
    if opts then dist.all_reduce(buf, "sum", opts) else dist.all_reduce(buf, "sum") end
    return buf:narrow(1, 1, c):clone(), math.tointeger(buf[c + 1]) or buf[c + 1]
  end

  --- SyncBatchNorm(C, {eps, momentum, affine, track_running_stats, group=, dtype=}):
  -- BatchNorm over the whole group's batch: in training the per-channel sums
  -- (forward) and the gradient sums (backward) are all_reduced over `group`
  -- (default: the world), so every rank normalises with the global batch's
  -- statistics. Any input of at least 2 dims. Falls back to BatchNorm when
  -- crun.dist is not initialised or the group has one rank.
  nn.SyncBatchNorm = setmetatable({}, {__call = function(_, c, opts)
    local self = batch_norm(SyncBatchNorm, "nn.SyncBatchNorm", c,
      setmetatable({}, {__index = function(_, k) return k >= 2 end}), opts)
    return self
  end})

  --- nn.SyncBatchNorm.convert(module[, group]): replaces every BatchNorm1d/2d
  -- inside module (Sequential trees; the module itself too) by a
  -- SyncBatchNorm that shares its parameters, gradients and running
  -- statistics; returns the converted module.
  function nn.SyncBatchNorm.convert(m, group)
    if type(m) ~= "table" or type(m.forward) ~= "function" then
      O.fail("EINVAL: nn.SyncBatchNorm.convert: an nn module is expected, got %s", type(m))
    end
    if getmetatable(m) == BatchNorm then
      local s = setmetatable({}, SyncBatchNorm)
      for k, v in pairs(m) do s[k] = v end
      s.fname = "nn.SyncBatchNorm"
      s.dims = setmetatable({}, {__index = function(_, k) return k >= 2 end})
      if group ~= nil then s.group = group end
      return s
    end
    if m.modules then
      for i, child in ipairs(m.modules) do m.modules[i] = nn.SyncBatchNorm.convert(child, group) end
    end
    return m
  end

  -- ---------------------------------------------------------------- LayerNorm

  local LayerNorm = nn.class("LayerNorm")

  --- LayerNorm(normalized_shape, {eps=1e-5, elementwise_affine=true, dtype=, device="cpu"}):
  -- normalises over the last dims (an int or a list of sizes); weight 1, bias 0.
  function nn.LayerNorm(shape, opts)
    local fn = "nn.LayerNorm"
    opts = O.check(LN, fn, opts)
    host_device(fn, opts.device)
    if type(shape) ~= "table" then shape = {shape} end
    local d = 1
    for i, v in ipairs(shape) do d = d * O.int(fn, "normalized_shape[" .. i .. "]", v, 1) end
    if #shape == 0 then O.fail("EINVAL: %s: normalized_shape is empty", fn) end
    local self = setmetatable({}, LayerNorm):_init()
    self.shape, self.d, self.eps, self.dtype = shape, d, O.num(fn, "eps", opts.eps, 0, 1e-5), dtype_of(fn, opts.dtype)
    self._params, self._grads = {}, {}
    if O.bool(fn, "elementwise_affine", opts.elementwise_affine, true) ~= false then
      self.weight, self.bias = T().ones(shape, self.dtype), T().zeros(shape, self.dtype)
      self.gradWeight, self.gradBias = T().zeros(shape, self.dtype), T().zeros(shape, self.dtype)
      self._params, self._grads = {self.weight, self.bias}, {self.gradWeight, self.gradBias}
      self._pnames, self._gnames = {"weight", "bias"}, {"gradWeight", "gradBias"}
    end
    return self
  end

  function LayerNorm:describe() return string.format("nn.LayerNorm(%s)", table.concat(self.shape, "x")) end

  function LayerNorm:forward(x)
    check_tensor(x, "LayerNorm:forward", "input")
    x = contig(x)
    local nd, ns = x:dim(), #self.shape
    for i = 1, ns do
      if nd < ns or x:size(nd - ns + i) ~= self.shape[i] then
        O.fail("EINVAL: LayerNorm:forward: input of shape %s does not end in %s", table.concat(x:size(), "x"),
          table.concat(self.shape, "x"))
      end
    end
    local rows = x:numel() // self.d
    self.output = ensure(self.output, x:size(), self.dtype)
    self.mean, self.rstd = ensure(self.mean, {rows}, "float64"), ensure(self.rstd, {rows}, "float64")
    K.nn_layer_norm_forward(x, self.d, self.weight, self.bias, self.eps, self.output, self.mean, self.rstd)
    return self.output
  end

  function LayerNorm:backward(x, gy)
    check_tensor(gy, "LayerNorm:backward", "gradOutput")
    x, gy = contig(x), contig(gy)
    self.gradInput = ensure(self.gradInput, x:size(), self.dtype)
    K.nn_layer_norm_backward(gy, x, self.d, self.mean, self.rstd, self.weight, self.gradInput, self.gradWeight,
      self.gradBias)
    self:_grads_ready()
    return self.gradInput
  end

  -- ---------------------------------------------------------------- Embedding

  local Embedding = nn.class("Embedding")

  --- Embedding(num, dim, {padding_idx=, dtype=, seed=, device="cpu"}): a table of `num`
  -- vectors drawn from N(0, 1); forward(idx) looks up 1-based int64/int32
  -- indices of any shape -> [idx..., dim]. The padding_idx row (1-based) is
  -- zero and gets no gradient. backward returns nil (indices have none).
  -- torch's max_norm, norm_type, scale_grad_by_freq and sparse are accepted
  -- at their defaults (none, 2, false, false) only.
  function nn.Embedding(num, dim, opts)
    local fn = "nn.Embedding"
    opts = O.check(EMB, fn, opts)
    host_device(fn, opts.device)
    O.int(fn, "num_embeddings", num, 1)
    O.int(fn, "embedding_dim", dim, 1)
    local self = setmetatable({}, Embedding):_init()
    self.num, self.dim, self.dtype = num, dim, dtype_of(fn, opts.dtype)
    self.padding_idx = opts.padding_idx ~= nil and O.int(fn, "padding_idx", opts.padding_idx, 1) or 0
    if self.padding_idx > num then O.fail("EINVAL: %s: padding_idx %d is past num_embeddings %d", fn, self.padding_idx, num) end
    local gen = T().Generator(opts.seed ~= nil and O.int(fn, "seed", opts.seed) or H.next_seed())
    self.weight = T().zeros({num, dim}, self.dtype):normal_(0, 1, gen)
    if self.padding_idx > 0 then self.weight:select(1, self.padding_idx):fill(0) end
    self.gradWeight = T().zeros({num, dim}, self.dtype)
    self._params, self._grads = {self.weight}, {self.gradWeight}
    self._pnames, self._gnames = {"weight"}, {"gradWeight"}
    return self
  end

  function Embedding:describe() return string.format("nn.Embedding(%d, %d)", self.num, self.dim) end

  function Embedding:forward(idx)
    check_tensor(idx, "Embedding:forward", "indices")
    idx = contig(idx)
    local shape = idx:size()
    shape[#shape + 1] = self.dim
    self.output = ensure(self.output, shape, self.dtype)
    K.nn_embedding_forward(idx, self.weight, self.output)
    return self.output
  end

  function Embedding:backward(idx, gy)
    check_tensor(idx, "Embedding:backward", "indices")
    check_tensor(gy, "Embedding:backward", "gradOutput")
    K.nn_embedding_backward(contig(idx), contig(gy), self.gradWeight, self.padding_idx)
    self:_grads_ready()
    self.gradInput = nil
    return nil
  end
end

--- crun.serialize: crun.save(path, value) / crun.load(path) for plain Lua
-- values (nil, booleans, numbers, strings, tables, nested) holding tensors.
--
-- File format (little-endian): "CRUNSAV1", then one encoded value, then
-- "END!" and the byte length of everything before it (<I8), so a truncated
-- or foreign file is refused by load(). Values: 'n' nil, 'T'/'F' booleans,
-- 'i' <i8 integer, 'd' <d float, 's' <s4 string, 't' <I4 count + key/value
-- pairs (keys sorted: the same value always gives the same bytes), 'X' tensor:
-- <s1 dtype, <I1 ndim, ndim x <i8 dims, <s8 raw contiguous element bytes.
-- save() writes "<path>.tmp.<pid>", flushes and fsyncs it, renames it over
-- <path> and fsyncs the directory: a crash never leaves a torn file at <path>;
-- a <path> that is not a regular file is refused, never replaced.
local serialize = {}
local O = require "crun.opts"

-- torch.save / torch.load options, accepted for a porting user's sake.
local SAVE_OPTS = O.spec{inert = {
  pickle_module = "crun save files are not pickles",
  pickle_protocol = "crun save files are not pickles",
  _use_new_zipfile_serialization = "crun has one file format"}}
local LOAD_OPTS = O.spec{inert = {
  map_location = "crun.load makes host tensors (move them with :to() or :cuda())",
  weights_only = "a crun save file holds only data, never code",
  mmap = "crun.load reads the whole file",
  pickle_module = "crun save files are not pickles"}}

local MAGIC, TRAILER = "CRUNSAV1", "END!"

local PACK = {float32 = "<f", float64 = "<d", int32 = "<i4", int64 = "<i8", uint8 = "B",
  int8 = "<i1", int16 = "<i2"}

local function core() return require "crun.core" end
local function tensor_mod()
  local ok, t = pcall(require, "crun.tensor")
  return ok and t or require("crun.core").tensor
end

--- Returns true when v is a crun tensor.
function serialize.is_tensor(v)
  if type(v) ~= "userdata" then return false end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__name == "crun.Tensor"
end

-- Raw little-endian bytes of a tensor's elements in row-major order.
local function tensor_bytes(t)
  local c = core()
  if c.tensor_bytes then return c.tensor_bytes(t) end
  local fmt = PACK[t:dtype()]
  if not fmt then O.fail("ENOTSUP: crun.save: no Lua fallback for dtype %s", t:dtype()) end
  local flat = t:contiguous():view(t:numel()):totable()
  local parts = {}
  for i = 1, #flat do parts[i] = string.pack(fmt, flat[i]) end
  return table.concat(parts)
end

-- Builds a tensor of dtype/shape from raw bytes.
local function tensor_from_bytes(dtype, shape, bytes)
  local c = core()
  if c.tensor_from_bytes then return c.tensor_from_bytes(dtype, shape, bytes) end
  local fmt = PACK[dtype]
  if not fmt then O.fail("ENOTSUP: crun.load: no Lua fallback for dtype %s", tostring(dtype)) end
  local T = tensor_mod()
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  local t = T.zeros(shape, dtype)
  if n == 0 then return t end
  local flat, pos = t:view(n), 1
  for i = 1, n do flat[i], pos = string.unpack(fmt, bytes, pos) end
  return t
end

local encode

-- How deep tables may nest in a saved value (a state dict nests 3 deep).
local MAX_DEPTH = 10000

-- `at` names the value being encoded: nil for the value saved, else
-- {up = the parent's at, key = its key there, depth = n}. where(at) spells
-- it ("value.model.1") only for an error: a string built at every level took
-- memory quadratic in the depth (0.9 GB to save 30000 nested tables).
local function where(at)
  local keys = {}
  for _ = 1, at and at.depth or 0 do
    keys[#keys + 1] = tostring(at.key)
    at = at.up
  end
  local path = {"value"}
  for i = #keys, 1, -1 do path[#path + 1] = keys[i] end
  return table.concat(path, ".")
end

local function sorted_keys(tbl, at)
  local keys = {}
  for k in pairs(tbl) do
    local tk = type(k)
    if tk ~= "string" and tk ~= "number" and tk ~= "boolean" then
      O.fail("EINVAL: crun.save: table key of type %s at %s cannot be saved", tk, where(at))
    end
    keys[#keys + 1] = k
  end
  table.sort(keys, function(a, b)
    local ta, tb = type(a), type(b)
    if ta ~= tb then return ta < tb end
    if ta == "boolean" then return (not a) and b end
    return a < b
  end)
  return keys
end

-- Raises EINVAL for a table with a metatable (a module, a sampler, an
-- object of the user's): it would load as a plain table without its methods,
-- where torch.load gives back the object torch.save pickled.
local function refuse_metatable(v, at)
  local mt = getmetatable(v)
  if mt == nil then return end
  local name = type(mt) == "table" and rawget(mt, "__name")
  O.fail("EINVAL: crun.save: cannot save the table with a metatable%s at %s: it would load as a plain table "
         .. "without its methods; save a plain table such as its state_dict()",
         type(name) == "string" and " (" .. name .. ")" or "", where(at))
end

local function encode_table(v, out, at, seen)
  if seen[v] then O.fail("EINVAL: crun.save: cycle in the value at %s", where(at)) end
  refuse_metatable(v, at)
  local depth = at and at.depth or 0
  if depth >= MAX_DEPTH then
    O.fail("EINVAL: crun.save: tables nest deeper than %d levels", MAX_DEPTH)
  end
  seen[v] = true
  local keys = sorted_keys(v, at)
  out[#out + 1] = "t" .. string.pack("<I4", #keys)
  for _, k in ipairs(keys) do
    encode(k, out, at, seen)
    encode(v[k], out, {up = at, key = k, depth = depth + 1}, seen)
  end
  seen[v] = nil
end

local function encode_tensor(v, out)
  local shape = v:size()
  local parts = {"X", string.pack("<s1<I1", v:dtype(), #shape)}
  for _, d in ipairs(shape) do parts[#parts + 1] = string.pack("<i8", d) end
  parts[#parts + 1] = string.pack("<s8", tensor_bytes(v))
  out[#out + 1] = table.concat(parts)
end

-- Appends the encoding of v to the list out; `at` names v for errors (where()).
encode = function(v, out, at, seen)
  local tv = type(v)
  if tv == "nil" then out[#out + 1] = "n"
  elseif tv == "boolean" then out[#out + 1] = v and "T" or "F"
  elseif math.type(v) == "integer" then out[#out + 1] = "i" .. string.pack("<i8", v)
  elseif tv == "number" then out[#out + 1] = "d" .. string.pack("<d", v)
  elseif tv == "string" then out[#out + 1] = "s" .. string.pack("<s4", v)
  elseif serialize.is_tensor(v) then encode_tensor(v, out)
  elseif tv == "table" then encode_table(v, out, at, seen)
  else O.fail("EINVAL: crun.save: cannot save a %s at %s", tv, where(at)) end
end

--- Returns the bytes of v in the format above (no file involved).
function serialize.dumps(v)
  local out = {MAGIC}
  encode(v, out, nil, {})
  local body = table.concat(out)
  return body .. TRAILER .. string.pack("<I8", #body)
end

local decode

local function decode_tensor(s, pos)
  local dtype, ndim
  dtype, ndim, pos = string.unpack("<s1<I1", s, pos)
  local shape = {}
  for i = 1, ndim do shape[i], pos = string.unpack("<i8", s, pos) end
  local bytes
  bytes, pos = string.unpack("<s8", s, pos)
  return tensor_from_bytes(dtype, shape, bytes), pos
end

-- Decodes one value of s at pos, nested `depth` tables deep; returns value,
-- next position.
decode = function(s, pos, depth)
  local tag = s:sub(pos, pos)
  pos = pos + 1
  if tag == "n" then return nil, pos
  elseif tag == "T" then return true, pos
  elseif tag == "F" then return false, pos
  elseif tag == "i" then return string.unpack("<i8", s, pos)
  elseif tag == "d" then return string.unpack("<d", s, pos)
  elseif tag == "s" then return string.unpack("<s4", s, pos)
  elseif tag == "X" then return decode_tensor(s, pos)
  elseif tag == "t" then
    if depth >= MAX_DEPTH then error(string.format("tables nest deeper than %d levels at byte %d", MAX_DEPTH, pos - 1), 0) end
    local n
    n, pos = string.unpack("<I4", s, pos)
    local t = {}
    for _ = 1, n do
      local k, v
      local at = pos
      k, pos = decode(s, pos, depth + 1)
      local tk = type(k) -- what save() writes as keys; nothing else loads as one
      if tk ~= "string" and tk ~= "number" and tk ~= "boolean" then
        error(string.format("table key of type %s at byte %d", tk, at), 0)
      end
      v, pos = decode(s, pos, depth + 1)
      t[k] = v
    end
    return t, pos
  end
  error(string.format("bad tag %q at byte %d", tag, pos - 1), 0)
end

--- Decodes bytes made by dumps(); `name` names the source in errors.
function serialize.loads(s, name)
  name = name or "string"
  if s:sub(1, #MAGIC) ~= MAGIC then
    error(string.format("EPROTO: crun.load: %s is not a crun save file (bad magic)", name), 0)
  end
  local tl = #TRAILER + 8
  if #s < #MAGIC + tl or s:sub(-tl, -9) ~= TRAILER
      or string.unpack("<I8", s, #s - 7) ~= #s - tl then
    error(string.format("EPROTO: crun.load: %s is truncated or corrupt (bad trailer)", name), 0)
  end
  local ok, v, pos = pcall(decode, s, #MAGIC + 1, 0)
  if not ok then error(string.format("EPROTO: crun.load: %s is corrupt: %s", name, tostring(v)), 0) end
  if pos ~= #s - tl + 1 then
    error(string.format("EPROTO: crun.load: %s has %d stray bytes", name, #s - tl + 1 - pos), 0)
  end
  return v
end

-- Raises EINVAL unless path is a non-empty string without a NUL byte: the C
-- calls under io.open and save_file end a path at its first NUL, so
-- crun.save("ckpt\0.crun", v) wrote "ckpt" and reported success.
local function check_path(fname, path)
  if type(path) ~= "string" then O.fail("EINVAL: %s: the path must be a string, got %s", fname, type(path)) end
  if path == "" then O.fail("EINVAL: %s: the path is empty", fname) end
  if path:find("\0", 1, true) then O.fail("EINVAL: %s: the path %q holds a NUL byte", fname, path) end
end

--- Saves v to path atomically (temp file + fsync + rename). Raises on failure:
-- EINVAL when path exists and is not a regular file (a symbolic link, a
-- device, a fifo, a directory: never replaced), EACCES or EIO naming the path.
-- The temp file is opened O_EXCL|O_NOFOLLOW next to path (core.save_file).
-- opts takes torch.save's pickle_module/pickle_protocol (no effect in crun).
function serialize.save(path, v, opts)
  check_path("crun.save", path)
  O.check(SAVE_OPTS, "crun.save", opts)
  local bytes = serialize.dumps(v)
  local ok, err = pcall(core().save_file, path, bytes)
  if not ok then error(tostring(err), 0) end -- starts with the status name
  return path
end

-- The status name for an errno from io.open / read.
local function errno_status(code)
  if code == 2 or code == 20 then return "ENOTFOUND" end   -- ENOENT, ENOTDIR
  if code == 13 or code == 1 then return "EACCES" end      -- EACCES, EPERM
  if code == 21 then return "EINVAL" end                   -- EISDIR
  return "EIO"
end

--- Loads a value saved by save(). Raises ENOTFOUND when path is missing,
-- EACCES when it cannot be read, EINVAL for a directory or a named fifo
-- (mkfifo: its open would wait for a writer; a pipe is read), EIO for other read
-- failures, EPROTO when the file is not a complete crun save file. opts takes
-- torch.load's map_location/weights_only/mmap (no effect in crun).
function serialize.load(path, opts)
  check_path("crun.load", path)
  O.check(LOAD_OPTS, "crun.load", opts)
  if core().named_fifo(path) then -- its open would wait for a writer, maybe forever
    O.fail("EINVAL: crun.load: %s is a fifo, not a save file (opening it waits until some process writes it; "
           .. "a pipe such as /dev/stdin is read)", path)
  end
  local f, msg, code = io.open(path, "rb")
  if not f then O.fail("%s: crun.load: cannot open %s (%s)", errno_status(code), path, tostring(msg)) end
  -- the magic first: /dev/zero, or a big file that is no save file, is
  -- refused after 8 bytes instead of being read whole into memory
  local s, rmsg, rcode = f:read(#MAGIC)
  if s == MAGIC then
    if f:seek("set", 0) then
      s, rmsg, rcode = f:read("a")
    else -- a pipe: no second copy of a file that can be seek'ed
      local rest
      rest, rmsg, rcode = f:read("a")
      s = rest and s .. rest
    end
  elseif s == nil and rmsg == nil then
    s = "" -- an empty file: loads names it
  end
  f:close()
  if not s then O.fail("%s: crun.load: cannot read %s (%s)", errno_status(rcode), path, tostring(rmsg)) end
  return serialize.loads(s, path)
end

--- Returns true when path holds a file (for "resume if a checkpoint exists").
function serialize.exists(path)
  if type(path) ~= "string" or path:find("\0", 1, true) then return false end -- (io.open would cut it)
  if core().named_fifo(path) then return false end -- (io.open would wait for a writer)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

return serialize

-- dist_errors.lua MODE OUTDIR — one failure scenario on 3 ranks; each rank
-- writes what it saw to OUTDIR/rank<r>.txt ("error <text>", "ok", timings).
--   mismatch  rank 2 calls all_gather where ranks 0-1 call all_reduce
--   count     rank 2 calls all_reduce with 512 elements, the others 1024
--   countlater  five all_reduces of 4 elements that pass, then rank 2 calls
--             all_reduce with 3 elements, the others 4; then one more of 4
--   timeout   rank 2 arrives 3 s late; the others use timeout=1
--   kill      rank 2 kills itself (SIGKILL) while the others run large all_reduces
--   root      every rank broadcasts with itself as src (each only sends), then
--             destroys the group
--   object    rank 1's all_gather_object value does not serialize, then src
--             rank 0's scatter_object_list input is short; then an all_reduce
--   objlist   rank 1 passes a string where all_gather_object,
--             broadcast_object_list and scatter_object_list take a list, then
--             src rank 0 does for broadcast_object_list; then an all_reduce
--   ngslow    rank 1 reaches new_group({0, 1}, {timeout = 0.2}) 1 s after the
--             others; then an all_reduce on the default group
--   mblate    rank 0 reaches monitored_barrier{timeout = 0.5} after the others
--             gave up on it (0.5 + 5 s)
--   left      rank 0 destroys the group after one all_reduce (and stays up
--             a while); ranks 1-2 all_reduce again
--   a2akind   rank 1 calls all_to_all (blocks of 4) where the others all_reduce
--   a2apeek:M:C:Z  rank M calls all_to_all (blocks of 4 to every rank; 4
--             elements from every rank but 0 from rank Z) where the others
--             call C: all_reduce (16 elements), broadcast (16 from rank 0),
--             bcastlast (from the last rank), scatterlast (4 each from the
--             last rank) or barrier; then they stay up 1 s
--   subcount  in new_group{1, 2}, rank 1 all_reduces 3 elements, rank 2 five
--   rootgather / rootscatter  the root's (rank 0's) buffers overlap, which
--             only it can see; then an all_reduce
--   subref    in new_group{1, 2}, rank 2 (its group rank 1) alone gives
--             all_reduce an unknown option key; rank 1 a good call
--   subrank:K in new_group{1, 2} (global rank 1 is its group rank 0, rank 2
--             its group rank 1), over which rank 0 records "ok": K: arg
--             (rank 2 alone all_reduces a bool tensor with avg, then both a
--             good all_reduce), count (rank 1 all_reduces 3 elements, rank 2
--             five), timeout (rank 1 all_reduces with timeout 1 s while rank
--             2 sleeps 3 s, calling nothing), died (rank 2 exits at once
--             without destroying anything; rank 1 all_reduces; rank 0
--             stays 2 s), root (each
--             broadcasts 4 elements with itself as src: rank 1 src 1, rank 2
--             src 2; then both all_reduce)
--   rootlistgather / rootlistscatter  the root's list holds 1 tensor, not n;
--             then an all_reduce
--   a2asplit_K  rank 1 gives all_to_all_single bad input split sizes, K: len
--             (one entry short), sum (one row too many), neg (a -1, sum right),
--             wrap (sizes near 2^63 whose sum wraps to the right one; 4 ranks),
--             dtype (a float64 output for a float32 input); the others good
--             ones; then an all_reduce
--   listbad:C:K  rank 1 gives list-form collective C (all_gather,
--             reduce_scatter, all_to_all, or all_to_all_single, or the tensor
--             forms all_gather_into_tensor, reduce_scatter_tensor) a bad argument,
--             fault K (see the spec), which only rank 1 can see; the others
--             good ones; then an all_reduce
--   localref:K  the last rank alone gives all_reduce a tensor that it
--             refuses, K: boolavg (a bool tensor with avg; the others float32),
--             noncontig (a transposed 2x2 view); then every rank all_reduces
--   destroyedref  every rank gives all_reduce an unknown option beside the
--             group = g it destroyed; then every rank all_reduces
--   mbref     the last rank alone passes monitored_barrier an unknown option
--             (timeout 3 s on every rank); then every rank all_reduces
--   refusep2p  rank 0 gives all_reduce a bool tensor with avg, then sends to
--             rank 1; rank 1 receives, then makes the same call
--   allref:K  every rank gives all_reduce the argument localref:K gives on
--             the last rank; then every rank all_reduces
--   luaref:C:K  the last rank alone makes an argument mistake that the Lua
--             layer (dist.lua) catches in collective C (all_reduce,
--             all_gather_object, all_gather_into_tensor, barrier), K: badkey (an unknown option key),
--             badop (an unknown op name; all_reduce), extra (an argument past
--             torch's positional ones), subkey (an unknown key beside group =
--             g, g = new_group(every rank)), badtime (a timeout that is no
--             number: the binding's check), typogroup (group misspelled
--             grop = g: the call is g's); the others a good C; then every
--             rank all_reduces (on g for subkey and typogroup); asyncpos
--             (all_reduce's positional async_op 3)
--   nonrootgather / nonrootscatter  non-root rank 1 passes a list (root 0);
--             then an all_reduce
--   roots_K   rank 1 calls K (broadcast, reduce, gather, scatter) with root 1,
--             the others with root 0 (works on any world size >= 2)
--   rootarg:C:K  rank 1 alone gives rooted collective C (broadcast, reduce,
--             gather, scatter) a bad root, K: range (group rank n), type (the
--             string "x"), outside (on new_group(all ranks), global rank n + 3,
--             not in it); the others root 0; then an all_reduce on that group
--   objroot:C  rank 1 alone gives object collective C (broadcast_object_list,
--             gather_object, scatter_object_list, broadcast_object) a bad
--             root: on new_group(all ranks) global rank n + 3 (not in it), then
--             an all_reduce on that group; then on the default group rank n
--             (out of range), then an all_reduce; the others root 0
--   objcallK  rank 0 broadcasts an int64[K] tensor of -5s where the others
--             call broadcast_object_list (K = 1, 2: the size word, or more)
--   p2p:K:H   2 ranks: rank 0 waits on a point-to-point operation with rank 1
--             while rank 1 goes away 0.3 s in; K: recv (a blocking recv
--             from it), irecv (an irecv's wait), held (a recv of tag 2 while
--             rank 1's 1 MiB tag-1 isend waits unread behind
--             CRUN_TCP_UNEXPECTED_MAX=65536), anyheld (the same with a recv
--             from any source), isend (a 64 MiB isend it never
--             receives); H: kill (SIGKILL), left (destroy_process_group, then
--             stays up 3 s), exit (os.exit without destroying the group) or
--             fail (its recv of tag 9 from rank 0 times out after 0.5 s,
--             which ends its group; then it stays up 3 s).
--             Rank 0 writes what its wait raised and "elapsed <s>".
--   p2pcut    2 ranks: rank 1 isends 64 MiB to rank 0, which reads none
--             of it yet; 0.3 s later rank 0 stops rank 1 (SIGSTOP) for 2.5 s,
--             posts an irecv of it (timeout 1 s), which takes what arrived,
--             and starts an all_reduce 0.1 s later, which must read from
--             rank 1 past that half-read frame; then each rank waits on its
--             p2p work. Each rank writes what its all_reduce raised, what its
--             wait raised, and "elapsed <s>"; rank 0 then stays up until
--             rank 1 resumed.
--   destroypending:K  2 ranks: rank 0 starts K (an isend of 64 MiB to rank 1
--             with tag 3, which rank 1 never receives; or an irecv of tag 3
--             from rank 1, which never sends), then destroys the group,
--             waits on that Work and stays up 3 s; rank 1 waits in a recv of
--             tag 2 from rank 0. Rank 0 writes what destroy and the wait
--             raised, rank 1 what its recv raised; each "elapsed <s>".
--   p2panymid 3 ranks: rank 1 isends 16 MiB to rank 0 and is killed 0.3 s
--             later; rank 0 posts a recv from any source 1 s in, which takes
--             the part of that frame that arrived; rank 2 stays up
--   unreadabort  3 ranks: rank 1 fails the group (its recv of tag 9 from
--             rank 2 times out after 0.5 s) and stays up 3 s; rank 2 enters
--             a barrier (its frame to rank 0 goes out, then it reads rank
--             1's abort); rank 0 calls nothing for 2 s, then destroys the
--             group. Each rank writes what its call raised ("ok" on rank 0).
local crun = require "crun"
local dist, T = crun.dist, crun.tensor
local mode, outdir = arg[1], arg[2]

dist.init_process_group{timeout = 30}
local rank = dist.get_rank()
local out = assert(io.open(outdir .. "/rank" .. rank .. ".txt", "w"))
local function record(ok, err) out:write(ok and "ok" or ("error " .. tostring(err)), "\n"); out:flush() end

if mode == "mismatch" then
  local ok, err
  if rank == 2 then
    local list = {T.zeros({512}), T.zeros({512}), T.zeros({512})}
    ok, err = pcall(dist.all_gather, list, T.ones({512}))
  else
    ok, err = pcall(dist.all_reduce, T.ones({1024}), "sum")
  end
  record(ok, err)
elseif mode == "count" then
  record(pcall(dist.all_reduce, T.ones({rank == 2 and 512 or 1024}), "sum"))
elseif mode == "countlater" then
  local t = T.ones({4})
  for _ = 1, 5 do dist.all_reduce(t) end
  out:write(string.format("sum %g\n", t[1]))
  record(pcall(dist.all_reduce, T.ones({rank == 2 and 3 or 4})))
  record(pcall(dist.all_reduce, T.ones({4})))
elseif mode == "timeout" then
  dist.barrier()
  if rank == 2 then
    -- longer than the spec's bound on the others' report (5 s), so that a
    -- report slowed by a loaded machine still finds this rank at barrier #1
    os.execute("sleep 6")
    local ok, err = pcall(dist.all_reduce, T.ones({1}), "sum")
    if ok then ok, err = pcall(dist.barrier) end
    record(ok, err)
  else
    local t0 = crun.clock()
    local ok, err = pcall(dist.all_reduce, T.ones({1}), "sum", {timeout = 1})
    record(ok, err)
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
    -- started without crun-lua, rank 0 hosts the store: keep it up while
    -- the others still read the progress board for their reports
    if rank == 0 then os.execute("sleep 1") end
  end
elseif mode == "root" then
  local ok, err = pcall(dist.broadcast, T.full({4}, rank, "float32"), rank)
  if ok then ok, err = pcall(dist.destroy_process_group) end
  record(ok, err)
elseif mode == "object" then
  record(pcall(dist.all_gather_object, rank == 1 and print or rank))
  record(pcall(dist.scatter_object_list, {}, rank == 0 and {1} or nil, 0))
  local t = T.ones({2})
  record(pcall(dist.all_reduce, t))
  out:write("sum ", t[1], "\n")
elseif mode == "objlist" then
  local bad = "notalist"
  local mine = {}
  record(pcall(dist.all_gather_object, rank == 1 and bad or mine, -7 * rank - 1))
  out:write("gathered ", table.concat(mine, ","), "\n")
  local bl = {false, false}
  if rank == 0 then bl = {"x", -3} end
  record(pcall(dist.broadcast_object_list, rank == 1 and bad or bl, 0))
  out:write("broadcast ", tostring(bl[1]), ",", tostring(bl[2]), "\n")
  local so = {}
  record(pcall(dist.scatter_object_list, rank == 1 and bad or so, rank == 0 and {-10, -20, -30} or nil, 0))
  out:write("scattered ", tostring(so[1]), "\n")
  record(pcall(dist.broadcast_object_list, rank == 0 and bad or {0}, 0))
  local t = T.ones({2})
  record(pcall(dist.all_reduce, t))
  out:write("sum ", t[1], "\n")
elseif mode == "ngslow" then
  if rank == 1 then os.execute("sleep 1") end
  local ok, err = pcall(dist.new_group, {0, 1}, {timeout = 0.2})
  if ok then ok, err = pcall(dist.all_reduce, T.ones({2})) end
  record(ok, err)
elseif mode == "mblate" then
  if rank == 0 then os.execute("sleep 6.5") end
  record(pcall(dist.monitored_barrier, {timeout = 0.5}))
elseif mode == "left" then
  dist.all_reduce(T.ones({4}))
  if rank == 0 then
    dist.destroy_process_group()
    record(true)
    os.execute("sleep 4")
  else
    local t0 = crun.clock()
    record(pcall(dist.all_reduce, T.ones({4})))
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
  end
elseif mode == "a2akind" then
  if rank == 1 then
    local outs, ins = {}, {}
    for j = 1, 3 do outs[j], ins[j] = T.zeros({4}), T.ones({4}) end
    record(pcall(dist.all_to_all, outs, ins))
  else
    record(pcall(dist.all_reduce, T.ones({16}), "sum"))
  end
elseif mode:match("^a2apeek:") then
  local m, c, z = mode:match("^a2apeek:(%d+):([%w_]+):(%d+)$")
  m, z = tonumber(m), tonumber(z)
  local n = dist.get_world_size()
  if rank == m then
    local outs, ins = {}, {}
    for j = 1, n do outs[j], ins[j] = T.zeros({j - 1 == z and 0 or 4}), T.ones({4}) end
    record(pcall(dist.all_to_all, outs, ins))
  elseif c == "all_reduce" then record(pcall(dist.all_reduce, T.ones({16}), "sum"))
  elseif c == "broadcast" or c == "bcastlast" then record(pcall(dist.broadcast, T.ones({16}), c == "broadcast" and 0 or n - 1))
  elseif c == "scatterlast" then
    local ins = nil
    if rank == n - 1 then ins = {} for j = 1, n do ins[j] = T.full({4}, j, "float32") end end
    record(pcall(dist.scatter, T.zeros({4}), ins, n - 1))
  else record(pcall(dist.barrier)) end
  if rank ~= m then os.execute("sleep 1") end  -- up while rank m looks at what they sent
elseif mode == "subcount" then
  local g = dist.new_group({1, 2})
  if rank == 0 then record(true) else record(pcall(dist.all_reduce, T.ones({rank == 1 and 3 or 5}), "sum", {group = g})) end
elseif mode == "subref" then
  local g = dist.new_group({1, 2})
  local o = rank == 2 and {group = g, timeot = 1} or {group = g}
  if rank == 0 then record(true) else record(pcall(dist.all_reduce, T.ones({4}), "sum", o)) end
elseif mode:match("^subrank:") then
  local k = mode:match("^subrank:(%w+)$")
  local g = dist.new_group({1, 2})
  if rank == 0 then
    record(true)
    -- it holds the store without the launcher (died): stay while the group opens
    if k == "died" then os.execute("sleep 2") end
  elseif k == "arg" then
    local t = rank == 2 and T.zeros({4}, "bool") or T.ones({4})
    record(pcall(dist.all_reduce, t, dist.ReduceOp.AVG, {group = g}))
    record(pcall(dist.all_reduce, T.ones({4}), "sum", {group = g}))
  elseif k == "count" then
    record(pcall(dist.all_reduce, T.ones({rank == 1 and 3 or 5}), "sum", {group = g}))
  elseif k == "timeout" and rank == 2 then
    os.execute("sleep 3")
    record(true)
  elseif k == "timeout" then
    record(pcall(dist.all_reduce, T.ones({4}), "sum", {group = g, timeout = 1}))
  elseif k == "died" and rank == 2 then
    record(true)
    out:close()
    os.exit(0, false)
  elseif k == "died" then
    record(pcall(dist.all_reduce, T.ones({4}), "sum", {group = g}))
  elseif k == "root" then
    record(pcall(dist.broadcast, T.ones({4}), rank, {group = g}))
    record(pcall(dist.all_reduce, T.ones({4}), "sum", {group = g}))
  end
elseif mode == "rootlistgather" or mode == "rootlistscatter" then
  local f = mode == "rootlistgather" and dist.gather or dist.scatter
  record(pcall(f, T.ones({4}), rank == 0 and {T.zeros({4})} or nil, 0))
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode == "rootgather" or mode == "rootscatter" then
  local big = T.ones({5})
  local a, b = big:narrow(1, 1, 4), big:narrow(1, 2, 4)
  local list = rank == 0 and {a} or nil
  for j = 2, rank == 0 and dist.get_world_size() or 0 do list[j] = T.zeros({4}) end
  local f = mode == "rootgather" and dist.gather or dist.scatter
  record(pcall(f, rank == 0 and b or T.ones({4}), list, 0))
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode:match("^a2asplit_") then
  local n, k = dist.get_world_size(), mode:sub(10)
  local splits = {}
  for j = 1, n do splits[j] = 2 end
  if rank == 1 and k == "len" then splits[n] = nil end
  if rank == 1 and k == "sum" then splits[1] = 3 end
  if rank == 1 and k == "neg" then splits[1], splits[2] = -1, 5 end
  if rank == 1 and k == "wrap" then  -- 4 ranks: its own block right, the sum right modulo 2^64
    splits[1], splits[3], splits[4] = math.maxinteger, math.maxinteger, 2 * n
  end
  local input = T.full({2 * n}, rank - 3, "float32")
  local output = T.zeros({2 * n}, rank == 1 and k == "dtype" and "float64" or "float32")
  record(pcall(dist.all_to_all_single, output, input, nil, splits))
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode:match("^listbad:") then
  local n, c, k = dist.get_world_size(), mode:match("^listbad:([%w_]+):(%w+)$")
  local bad = rank == 1
  local function list(make) local l = {} for j = 1, n do l[j] = make(j) end return l end
  local outs = list(function() return T.zeros({4}) end)
  local ins = list(function(j) return T.full({4}, -7 * rank - j, "float32") end)
  local big = T.zeros({5})  -- two overlapping 4-element views of it: big[1..4] and big[2..5]
  local one = T.full({4}, rank - 3, "float32")
  if bad and k == "len" then (c == "all_gather" and outs or ins)[n] = nil end
  if bad and k == "dtype" then (c == "all_gather" and outs or ins)[2] = T.zeros({4}, "float64") end
  if bad and k == "size" then ins[2] = T.zeros({3}) end
  if bad and k == "notensor" then (c == "reduce_scatter" and ins or outs)[2] = c == "all_to_all" and "x" or 7 end
  if bad and k == "noncontig" then ins[2] = T.zeros({2, 2}):t() end
  if bad and k == "mixed" then outs = list(function() return T.zeros({4}, "float64") end) end
  if bad and k == "input" then one = "x" end
  if bad and k == "overlap" then
    if c == "all_gather" then outs[1], one = big:narrow(1, 1, 4), big:narrow(1, 2, 4)
    else ins[1], one = big:narrow(1, 1, 4), big:narrow(1, 2, 4) end
  end
  if bad and k == "self" then outs[rank + 1] = T.zeros({3}) end
  if c == "all_gather_into_tensor" then  -- rank 1's output: one element too many ("size"), closed ("closed")
    local o = T.zeros({4 * n + (bad and k == "size" and 1 or 0)})
    if bad and k == "closed" then o:close() end
    record(pcall(dist.all_gather_into_tensor, o, one))
  elseif c == "reduce_scatter_tensor" then  -- rank 1's input one element too few ("size"), its output closed
    local o = T.zeros({4})
    if bad and k == "closed" then o:close() end
    record(pcall(dist.reduce_scatter_tensor, o, T.full({4 * n - (bad and k == "size" and 1 or 0)}, rank - 2, "float32")))
  elseif c == "all_gather" then record(pcall(dist.all_gather, outs, one))
  elseif c == "reduce_scatter" then record(pcall(dist.reduce_scatter, one, ins))
  elseif c == "all_to_all" then record(pcall(dist.all_to_all, outs, ins))
  else  -- all_to_all_single, 2 rows per rank; rank 1 sends 3 to rank 0 and 1 to itself (k == "self")
    local splits = {}
    for j = 1, n do splits[j] = 2 end
    local insplits = {table.unpack(splits)}
    if bad then insplits[1], insplits[2] = 3, 1 end
    record(pcall(dist.all_to_all_single, T.zeros({2 * n}), T.full({2 * n}, rank - 3, "float32"), splits, insplits))
  end
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode:match("^badop:") then  -- rank 1 alone gives an unknown op ("name") or a NaN premul_sum factor ("nan")
  local n, c, k = dist.get_world_size(), mode:match("^badop:([%w_]+):(%w+)$")
  local op = rank ~= 1 and "sum" or k == "name" and "nosuchop" or "premul_sum:nan"
  if c == "all_reduce" then record(pcall(dist.all_reduce, T.full({4}, rank - 3, "float32"), op))
  elseif c == "reduce" then record(pcall(dist.reduce, T.full({4}, rank - 3, "float32"), 0, op))
  elseif c == "reduce_scatter" then
    local ins = {}
    for j = 1, n do ins[j] = T.full({4}, -7 * rank - j, "float32") end
    record(pcall(dist.reduce_scatter, T.zeros({4}), ins, op))
  else record(pcall(dist.reduce_scatter_tensor, T.zeros({4}), T.full({4 * n}, rank - 2, "float32"), op)) end
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode:match("^localref:") then  -- the last rank alone gives all_reduce an argument only it refuses
  local k, last = mode:match("^localref:(%w+)$"), dist.get_world_size() - 1
  local t0 = crun.clock()
  local t = T.full({4}, -2.5 * rank - 1, "float32")
  if rank == last and k == "boolavg" then t = T.zeros({4}, "bool") end
  if rank == last and k == "noncontig" then t = T.full({2, 2}, -1.5, "float32"):t() end
  record(pcall(dist.all_reduce, t, k == "boolavg" and dist.ReduceOp.AVG or nil))
  record(pcall(dist.all_reduce, T.full({4}, rank - 3.5, "float32")))
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode == "destroyedref" then
  local g = dist.new_group()
  dist.destroy_process_group(g)
  record(pcall(dist.all_reduce, T.full({4}, rank - 1.5, "float32"), "sum", {group = g, asyncop = true}))
  record(pcall(dist.all_reduce, T.full({4}, rank - 3.5, "float32")))
elseif mode == "mbref" then
  local t0, o = crun.clock(), {timeout = 3}
  if rank == dist.get_world_size() - 1 then o.timeot = 5 end
  record(pcall(dist.monitored_barrier, o))
  local u = T.full({4}, rank - 3.5, "float32")
  local ok, err = pcall(dist.all_reduce, u)
  out:write(ok and string.format("ok %.2f", u[1]) or ("error " .. tostring(err)), "\n")
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode == "refusep2p" then  -- rank 0 refuses, then sends to rank 1, which receives before the same refusal
  local t0 = crun.clock()
  local bad, msg = T.zeros({4}, "bool"), T.full({4}, -0.75, "float32")
  if rank == 0 then
    record(pcall(dist.all_reduce, bad, dist.ReduceOp.AVG))
    record(pcall(dist.send, msg, 1))
  else
    record(pcall(dist.recv, msg, 0))
    record(pcall(dist.all_reduce, bad, dist.ReduceOp.AVG))
  end
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode:match("^allref:") then  -- every rank gives all_reduce the argument it refuses, as a REPL line does
  local k = mode:match("^allref:(%w+)$")
  local t0 = crun.clock()
  local t = k == "boolavg" and T.zeros({4}, "bool") or T.full({2, 2}, -1.5 * rank, "float32"):t()
  record(pcall(dist.all_reduce, t, k == "boolavg" and dist.ReduceOp.AVG or nil))
  local u = T.full({4}, rank - 3.5, "float32")
  local ok, err = pcall(dist.all_reduce, u)
  out:write(ok and string.format("ok %.2f %.2f", u[1], u[4]) or ("error " .. tostring(err)), "\n")
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode:match("^luaref:") then  -- the last rank alone makes a mistake dist.lua catches
  local c, k = mode:match("^luaref:([%w_]+):(%w+)$")
  local g = (k == "subkey" or k == "typogroup") and dist.new_group() or nil
  local bad, t0 = rank == dist.get_world_size() - 1, crun.clock()
  local t, v = T.full({4}, -2.5 * rank - 1, "float32"), -1.5 * rank - 0.25
  local o = bad and {group = g, asyncop = true, timeot = 5} or {group = g}
  if bad and k == "badtime" then o = {timeout = "soon"} end
  if bad and k == "typogroup" then o = {grop = g} end
  if c == "all_reduce" then
    if not bad then record(pcall(dist.all_reduce, t, "sum", {group = g}))
    elseif k == "badop" then record(pcall(dist.all_reduce, t, "summ"))
    elseif k == "extra" then record(pcall(dist.all_reduce, t, "sum", nil, false, 5))
    elseif k == "asyncpos" then record(pcall(dist.all_reduce, t, "sum", nil, 3))
    else o.timeot = nil; record(pcall(dist.all_reduce, t, o)) end
  elseif c == "all_gather_object" then
    if k == "extra" and bad then record(pcall(dist.all_gather_object, {}, v, nil, 7))
    else o.asyncop = nil; record(pcall(dist.all_gather_object, {}, v, o)) end
  elseif c == "all_gather_into_tensor" then
    record(pcall(dist.all_gather_into_tensor, T.zeros({4 * dist.get_world_size()}), t, o))
  elseif c == "barrier" then
    if k == "extra" and bad then record(pcall(dist.barrier, nil, nil, nil, 3))
    else o.timeot = nil; record(pcall(dist.barrier, o)) end
  end
  record(pcall(dist.all_reduce, T.full({4}, rank - 3.5, "float32"), "sum", g))
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode == "nonrootgather" or mode == "nonrootscatter" then
  local list = {}
  for j = 1, dist.get_world_size() do list[j] = T.zeros({4}) end
  local f = mode == "nonrootgather" and dist.gather or dist.scatter
  record(pcall(f, T.full({4}, rank - 5, "float32"), (rank == 0 or rank == 1) and list or nil, 0))
  record(pcall(dist.all_reduce, T.ones({2})))
elseif mode:match("^roots_") then
  local k, n = mode:sub(7), dist.get_world_size()
  local root = rank == 1 and 1 or 0
  local t0 = crun.clock()
  local list = {}
  for j = 1, n do list[j] = T.full({4}, -j, "float32") end
  if k == "broadcast" then record(pcall(dist.broadcast, T.full({4}, rank, "float32"), root))
  elseif k == "reduce" then record(pcall(dist.reduce, T.full({4}, rank, "float32"), root))
  elseif k == "gather" then record(pcall(dist.gather, T.full({4}, rank, "float32"), rank == root and list or nil, root))
  else record(pcall(dist.scatter, T.zeros({4}), rank == root and list or nil, root)) end
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode:match("^rootarg:") then
  local n, c, k = dist.get_world_size(), mode:match("^rootarg:(%w+):(%w+)$")
  local all = {}
  for j = 0, n - 1 do all[#all + 1] = j end
  local g = k == "outside" and dist.new_group(all) or nil
  local root = rank ~= 1 and 0 or k == "range" and n or k == "type" and "x" or n + 3
  local list
  if rank == 0 then list = {} for j = 1, n do list[j] = T.full({4}, -j - 10 * rank, "float32") end end
  local t = T.full({4}, -rank - 1, "float32")
  if c == "broadcast" then record(pcall(dist.broadcast, t, root, g))
  elseif c == "reduce" then record(pcall(dist.reduce, t, root, "sum", g))
  elseif c == "gather" then record(pcall(dist.gather, t, list, root, g))
  else record(pcall(dist.scatter, t, list, root, g)) end
  record(pcall(dist.all_reduce, T.ones({2}), "sum", g))
elseif mode:match("^objroot:") then
  local n, c = dist.get_world_size(), mode:match("^objroot:([%w_]+)$")
  local all = {}
  for j = 0, n - 1 do all[#all + 1] = j end
  for _, g in ipairs{dist.new_group(all), dist.group.WORLD} do
    local root = rank ~= 1 and 0 or g == dist.group.WORLD and n or n + 3
    if c == "broadcast_object_list" then record(pcall(dist.broadcast_object_list, {-rank - 1}, root, g))
    elseif c == "gather_object" then record(pcall(dist.gather_object, -rank - 1, rank == 0 and {} or nil, root, g))
    elseif c == "scatter_object_list" then
      record(pcall(dist.scatter_object_list, {}, rank == 0 and all or nil, root, g))
    else record(pcall(dist.broadcast_object, -rank - 1, root, {group = g})) end
    record(pcall(dist.all_reduce, T.ones({2}), "sum", g))
  end
elseif mode:match("^objcall%d$") then
  if rank == 0 then
    record(pcall(dist.broadcast, T.full({tonumber(mode:sub(-1))}, -5, "int64"), 0))
  else
    record(pcall(dist.broadcast_object_list, {1}, 0))
  end
elseif mode == "kill" then
  local t = T.ones({1 << 22})
  dist.barrier()
  if rank == 2 then
    os.execute("sleep 0.3")
    local pid = io.open("/proc/self/stat"):read("n")
    os.execute("kill -9 " .. pid)
  end
  local t0, ok, err = crun.clock(), true, nil
  for _ = 1, 200 do
    ok, err = pcall(dist.all_reduce, t, "sum")
    if not ok then break end
  end
  record(ok, err)
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
elseif mode == "p2pcut" then
  dist.barrier()
  local n, w = 16 << 20, nil
  local pidfile = outdir .. "/pid1"
  if rank == 1 then
    w = dist.isend(T.full({n}, -3, "int32"), 0, {tag = 2})
    os.execute("sleep 0.3") -- the socket took what it could: the frame is half sent
    local f = assert(io.open(pidfile .. ".tmp", "w"))
    f:write(io.open("/proc/self/stat"):read("n"), "\n")
    f:close()
    os.rename(pidfile .. ".tmp", pidfile)
    os.execute("sleep 1") -- stopped by rank 0 meanwhile
  else
    local pid
    for _ = 1, 1000 do  -- at most about 10 s
      local f = io.open(pidfile)
      if f then pid = f:read("n"); f:close() end
      if pid then break end
      os.execute("sleep 0.01")
    end
    os.execute("kill -STOP " .. pid .. "; (sleep 2.5; kill -CONT " .. pid .. ") &")
    w = dist.irecv(T.zeros({n}, "int32"), 1, {tag = 2, timeout = 1})
    os.execute("sleep 0.1")
  end
  local t0 = crun.clock()
  record(pcall(dist.all_reduce, T.full({4}, rank - 2, "float32")))
  record(pcall(w.wait, w))
  out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
  if rank == 0 then os.execute("sleep 3") end -- up until rank 1 resumed and read why
elseif mode:match("^destroypending:") then
  local kind = mode:match(":(%w+)$")
  dist.barrier()
  local t0 = crun.clock()
  if rank == 0 then
    local w = kind == "isend" and dist.isend(T.full({16 << 20}, -7, "int32"), 1, {tag = 3})
              or dist.irecv(T.zeros({4}, "int32"), 1, {tag = 3})
    os.execute("sleep 0.3")
    record(pcall(dist.destroy_process_group))
    record(pcall(w.wait, w))
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
    os.execute("sleep 3")
  else
    record(pcall(dist.recv, T.zeros({4}, "int32"), 0, {tag = 2}))
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
  end
elseif mode == "p2panymid" then
  dist.barrier()
  if rank == 1 then
    dist.isend(T.full({4 << 20}, -3, "int32"), 0, {tag = 2})
    os.execute("sleep 0.3")
    os.execute("kill -9 " .. io.open("/proc/self/stat"):read("n"))
  elseif rank == 0 then
    os.execute("sleep 1")
    local t0 = crun.clock()
    record(pcall(dist.recv, T.zeros({4 << 20}, "int32"), {tag = 2}))
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
  else
    record(true)
    os.execute("sleep 3")
  end
elseif mode == "unreadabort" then
  dist.barrier()
  if rank == 1 then
    record(pcall(dist.recv, T.zeros({2}, "int32"), 2, {tag = 9, timeout = 0.5}))
    os.execute("sleep 3")
  elseif rank == 2 then
    os.execute("sleep 0.1")
    record(pcall(dist.barrier))
  else
    os.execute("sleep 2")
    record(true)
    dist.destroy_process_group()
  end
elseif mode:match("^p2p:") then
  local kind, how = mode:match("^p2p:(%w+):(%w+)$")
  if rank == 1 then
    dist.barrier()
    if kind == "held" or kind == "anyheld" then dist.isend(T.full({262144}, -3, "int32"), 0, {tag = 1}) end
    os.execute("sleep 0.3")
    if how == "kill" then
      os.execute("kill -9 " .. io.open("/proc/self/stat"):read("n"))
    elseif how == "exit" then
      record(true)
      os.exit(0)
    elseif how == "fail" then
      record(pcall(dist.recv, T.zeros({2}, "int32"), 0, {tag = 9, timeout = 0.5}))
      os.execute("sleep 3")
      os.exit(0)
    end
    dist.destroy_process_group()
    record(true)
    os.execute("sleep 3")
  else
    dist.barrier()
    local big = kind == "isend" and T.full({16 << 20}, 11, "int32") or nil
    local w = kind == "isend" and dist.isend(big, 1, {tag = 2}) or nil
    local t0 = crun.clock()
    local ok, err
    if kind == "recv" or kind == "held" then
      ok, err = pcall(dist.recv, T.zeros({2}, "int32"), 1, {tag = 2})
    elseif kind == "anyheld" then
      ok, err = pcall(dist.recv, T.zeros({2}, "int32"), {tag = 2})
    elseif kind == "irecv" then
      local got = T.zeros({4}, "int32")
      local wr = dist.irecv(got, 1, {tag = 2})
      ok, err = pcall(wr.wait, wr)
    else
      ok, err = pcall(w.wait, w)
    end
    record(ok, err)
    out:write(string.format("elapsed %.3f\n", crun.clock() - t0))
  end
end
out:close()

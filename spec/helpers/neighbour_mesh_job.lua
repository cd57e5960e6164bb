-- neighbour_mesh_job.lua <rank> <store port> <delay s>: one rank of a 2-rank cpu job on an open
-- store (token ""), as under mpirun without CRUN_TOKEN; prints its all_reduce of a signed vector.
local crun = require "crun"
local d = crun.dist
local r, port, delay = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3] or 0)
os.execute("sleep " .. delay)
local st = crun.store.tcp{host = "127.0.0.1", port = port, token = "", timeout = 20}
local ok, err = pcall(d.init_process_group, {backend = "cpu", store = st, rank = r, world_size = 2, timeout = 6})
if not ok then print("rank " .. r .. " init: " .. tostring(err)) return end
local t = crun.tensor.tensor({-3.5 + r, 7.25, -11 - r}, {dtype = "float32"})
local ok2, e2 = pcall(d.all_reduce, t)
print("rank " .. r .. " all_reduce: " .. tostring(ok2) .. " " .. (ok2 and table.concat(t:totable(), ",") or tostring(e2)))

-- collectives_tcp_spec.lua — the collective cases over TCP alone
-- (CRUN_TRANSPORT=tcp, and its older spelling CRUN_SHM=0) at 2-4 ranks:
-- every collective, every dtype once, every op once, counts 0/1/7/100003
-- (dist_cases.lua "subset"), plus the cases that are not dtype x op. The ring
-- slice is cut to 40000 bytes (CRUN_RING_SLICE, not a multiple of a page or
-- of any element count here) so that 100003 elements cross several slices.
local matrix = require "helpers.dist_matrix"

describe("collectives over TCP alone", function()
  for n = 2, 4 do
    it("pass the representative cases on a " .. n .. "-rank job with CRUN_TRANSPORT=tcp", function()
      matrix.check(n, "CRUN_TRANSPORT=tcp CRUN_RING_SLICE=40000", {subset = true})
    end)
  end
  it("pass them with CRUN_SHM=0 (alias of CRUN_TRANSPORT=tcp) at 3 ranks", function()
    matrix.check(3, "CRUN_SHM=0 CRUN_RING_SLICE=40000", {subset = true})
  end)
end)

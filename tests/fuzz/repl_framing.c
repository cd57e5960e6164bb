/* repl_framing.c — fuzzes the interactive mode's framing (lua/crun/repl.lua):
 * the chunk message "<targets>\n<source>" a worker takes apart
 * (parse_chunk, is_target), the result message "<kind>\n<text>" the front
 * end takes apart and shows grouped (parse_result, group, render), the rank
 * lists of ":on" (parse_ranks, format_ranks) and the line compiler that
 * decides whether a chunk is complete (compile). Input: a byte choosing the
 * world size and rank, then text. Contract checks: none of these raises on
 * any string; parse_ranks returns sorted distinct ranks below the world
 * size that format_ranks prints back to the same list. */
#include "fuzz_lua.h"

static const char *check = "local M, s, world, rank = ...\n"
  "local t, src = M.parse_chunk(s)\n"
  "if t then assert(type(src) == 'string'); assert(type(M.is_target(t, rank)) == 'boolean') end\n"
  "local a, b = M.parse_result(s), M.parse_result('ok\\n' .. s)\n"
  "assert(type(a.kind) == 'string' and type(a.text) == 'string')\n"
  "local out, err = M.render(M.group({[0] = a, [1] = b, [2] = a}, {0, 1, 2}))\n"
  "assert(type(out) == 'string' and type(err) == 'string')\n"
  "local list, msg = M.parse_ranks(s, world)\n"
  "if list then\n"
  "  for i, r in ipairs(list) do\n"
  "    assert(math.type(r) == 'integer' and r >= 0 and r < world, 'rank out of range')\n"
  "    assert(i == 1 or list[i - 1] < r, 'ranks not sorted or repeated')\n"
  "  end\n"
  "  if #list > 0 then\n"
  "    local again = assert(M.parse_ranks(M.format_ranks(list):sub(2, -2), world))\n"
  "    assert(#again == #list, 'format_ranks does not round-trip')\n"
  "    for i = 1, #list do assert(again[i] == list[i], 'format_ranks does not round-trip') end\n"
  "  end\n"
  "else assert(type(msg) == 'string') end\n"
  "local c, why = M.compile(s, rank % 2 == 0)\n"
  "assert(type(c) == 'string' or type(why) == 'string')\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_State *L = fuzz_lua_state("crun.repl");
  static int ref = LUA_NOREF;
  if (ref == LUA_NOREF) {
    if (luaL_loadstring(L, check) != LUA_OK) FUZZ_FAIL("harness chunk: %s", lua_tostring(L, -1));
    ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  fuzz_in_t in = {data, size};
  uint8_t b = fuzz_u8(&in);
  int world = 1 + (b & 63), rank = (b >> 6) % world;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_getfield(L, LUA_REGISTRYINDEX, "fuzz.module");
  lua_pushlstring(L, (const char *)in.p, in.left);
  lua_pushinteger(L, world);
  lua_pushinteger(L, rank);
  if (lua_pcall(L, 4, 0, 0) != LUA_OK) FUZZ_FAIL("%s", lua_tostring(L, -1));
  fuzz_lua_step(L);
  return 0;
}

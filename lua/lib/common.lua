-- lib/common: helpers every script shares (included once by the loader).
--
-- Reply convention: every script returns a table whose first element is a code:
--   {'OK'} | {'OK', detail} | {'EXISTS'} | {'CONFLICT', actual_version_or_''} |
--   {'NOTFOUND'} | {'MISMATCH', recorded} | {'AHEAD', head} |
--   {'CORRUPT', key, field, detail} | {'BADARG', detail}
-- An 'OK' may carry a second code saying how it succeeded ({'OK', 'APPLIED'}: a retry), and
-- commit_tasks gives one code per item. Each script's header lists every code it returns;
-- Python maps them to exceptions in one table (stores/_redis/replies.py), checked against the
-- headers by tests/test_lua_scripts.py.
-- Numbers arrive as canonical decimal strings and are checked with is_uint before use:
-- tonumber() would also accept '0x10', '1e3' and ' 5'.

local rcall = redis.call

local STATUSES = {
  waiting = true, pending = true, running = true, paused = true,
  succeeded = true, failed = true, stopped = true, lost = true,
}
local TERMINAL = { succeeded = true, failed = true, stopped = true, lost = true }
local MAX_UINT = 9007199254740991 -- 2^53 - 1: exact as a Lua double and a zset score

-- A canonical unsigned integer (digits, no leading zero, at most 2^53 - 1). string.find, not
-- string.match: it makes no copy of the string (every task read checks several of these).
local find = string.find
local function is_uint(s)
  if type(s) ~= 'string' then return false end
  local n = #s
  if n == 0 or n > 16 then return false end
  if s == '0' then return true end
  if not find(s, '^[1-9]%d*$') then return false end
  return n < 16 or tonumber(s) <= MAX_UINT -- 15 digits are always below 2^53
end

local function corrupt(key, field, detail) return { 'CORRUPT', key, field, detail } end
local function badarg(detail) return { 'BADARG', detail } end

local function key_type(key) return rcall('TYPE', key)['ok'] end

-- A read that also checks the key's type: the reply, or (nil, the key's type) when the key
-- holds another kind of value (WRONGTYPE). One command where TYPE + the read would be two.
-- Any other error (an ACL denial, ...) is raised as redis.call would raise it.
local function try_read(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    -- Not ours to judge (an ACL denial, ...): fail as redis.call fails, on every version.
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then return rcall(command, key, ...) end
    return nil, key_type(key)
  end
  return reply
end

-- Byte-wise string order (memcmp), the order Redis uses for equal scores. Lua's own '<' uses
-- strcoll, which depends on the server's locale.
local function bytes_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Read a counted list from ARGV: ARGV[pos] is the count, the items follow.
-- Returns the list and the position after it, or nil when the count is not a number.
local function read_list(pos)
  local n = ARGV[pos]
  if not is_uint(n) then return nil, pos end
  local items = {}
  for i = 1, tonumber(n) do items[i] = ARGV[pos + i] end
  return items, pos + tonumber(n) + 1
end

-- A counted list of field/value pairs: ARGV[pos] is the number of pairs. Returns the flat
-- list, a lookup table and the position after them, or nil when malformed.
local function read_counted_pairs(pos)
  local n = ARGV[pos]
  if not is_uint(n) or pos + 2 * tonumber(n) > #ARGV then return nil, nil, pos end
  local flat, map = {}, {}
  for i = pos + 1, pos + 2 * tonumber(n), 2 do
    flat[#flat + 1] = ARGV[i]
    flat[#flat + 1] = ARGV[i + 1]
    map[ARGV[i]] = ARGV[i + 1]
  end
  return flat, map, pos + 2 * tonumber(n) + 1
end

-- Field/value pairs from ARGV[pos] to the end, as a flat list and as a lookup table.
local function read_pairs(pos)
  local flat, map = {}, {}
  if (#ARGV - pos + 1) % 2 ~= 0 then return nil, nil end
  for i = pos, #ARGV, 2 do
    flat[#flat + 1] = ARGV[i]
    flat[#flat + 1] = ARGV[i + 1]
    map[ARGV[i]] = ARGV[i + 1]
  end
  return flat, map
end

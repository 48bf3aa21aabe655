-- lib/msgpack_entry: the msgpack bytes of one history entry, built in Lua (fakeredis has no
-- cmsgpack), in layout 2 of stores/_redis/rows.py: the array [version, statuses, at_us] or
-- [version, statuses, at_us, reason], statuses = 8 * from + to (both numbered P=1 R=2 Z=3 S=4
-- F=5 X=6 L=7, from 0 when there is none), one byte where layout 1 spent four. Callers pass
-- the statuses as their one-letter codes. Integers are below 2^53, so Lua doubles hold them
-- exactly.

local STATUS_NUMBERS = { P = 1, R = 2, Z = 3, S = 4, F = 5, X = 6, L = 7 }

local function mp_uint(n)
  if n < 128 then return string.char(n) end
  local bytes = {}
  for i = 7, 0, -1 do bytes[#bytes + 1] = math.floor(n / 256 ^ i) % 256 end
  return string.char(0xcf, unpack(bytes))
end

local function mp_str(s)
  local n = #s
  if n < 32 then return string.char(0xa0 + n) .. s end
  if n < 256 then return string.char(0xd9, n) .. s end
  if n < 65536 then return string.char(0xda, math.floor(n / 256), n % 256) .. s end
  return string.char(0xdb, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256) .. s
end

-- Layout 1 ([version, from, to, at_us, reason], one-letter statuses, nil for none): the
-- entries that name WAITING ('W'), which has no number in layout 2's three bits.
local function history_entry_v1(version, from_status, to_status, at, reason)
  local from = from_status and mp_str(from_status) or string.char(0xc0)
  local why = reason and mp_str(reason) or string.char(0xc0)
  return string.char(0x95) .. mp_uint(version) .. from .. mp_str(to_status) .. mp_uint(at) .. why
end

local function history_entry(version, from_status, to_status, at, reason)
  if from_status == 'W' or to_status == 'W' then
    return history_entry_v1(version, from_status, to_status, at, reason)
  end
  local statuses = 8 * (from_status and STATUS_NUMBERS[from_status] or 0)
    + STATUS_NUMBERS[to_status]
  local entry = mp_uint(version) .. string.char(statuses) .. mp_uint(at)
  if reason == nil then return string.char(0x93) .. entry end
  return string.char(0x94) .. entry .. mp_str(reason)
end

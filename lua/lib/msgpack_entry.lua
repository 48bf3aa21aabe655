-- lib/msgpack_entry: the msgpack bytes of one history entry, built in Lua (fakeredis has no
-- cmsgpack): the array [version, from_status | nil, to_status, at_us, reason | nil], the shape
-- stores/redis.py reads back, statuses as its one-letter codes (P R Z S F X L). Integers are
-- below 2^53, so Lua doubles hold them exactly.

local function mp_uint(n)
  if n < 128 then return string.char(n) end
  local bytes = {}
  for i = 7, 0, -1 do bytes[#bytes + 1] = math.floor(n / 256 ^ i) % 256 end
  return string.char(0xcf, unpack(bytes))
end

local function mp_str(s)
  if s == nil then return string.char(0xc0) end
  local n = #s
  if n < 32 then return string.char(0xa0 + n) .. s end
  if n < 256 then return string.char(0xd9, n) .. s end
  if n < 65536 then return string.char(0xda, math.floor(n / 256), n % 256) .. s end
  return string.char(0xdb, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256) .. s
end

local function history_entry(version, from_status, to_status, at, reason)
  return string.char(0x95) .. mp_uint(version) .. mp_str(from_status) .. mp_str(to_status)
    .. mp_uint(at) .. mp_str(reason)
end

#!lua
--[[ append: add one history entry, idempotent on (task_id, version).

KEYS[1]  {ns}:h:<id>   the task's history (zset: score = version, member = msgpack entry)
ARGV[1]  version (canonical integer)
ARGV[2]  the encoded entry

Replies
  {'OK'}            appended
  {'OK', 'EXISTS'}  an entry for this version is already there; kept as it was (first wins)
  {'CORRUPT', key, field, detail}   the key is not a sorted set; nothing written
  {'BADARG', detail}

Bound: one ZCOUNT and one ZADD.
]]
--- @include "lib/common"

local history_key, version, entry = KEYS[1], ARGV[1], ARGV[2]
if not is_uint(version) then return badarg('version is not a canonical integer') end
if not entry or entry == '' then return badarg('entry missing') end
local kind = key_type(history_key)
if kind ~= 'none' and kind ~= 'zset' then
  return corrupt(history_key, '', 'key holds a ' .. kind .. ', not a sorted set')
end
if rcall('ZCOUNT', history_key, version, version) > 0 then return { 'OK', 'EXISTS' } end
rcall('ZADD', history_key, version, entry)
return { 'OK' }

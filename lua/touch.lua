#!lua
--[[ touch: write progress / heartbeat / lease fields of a task, nothing else.

KEYS[1]  {ns}:t:<id>   the task hash
ARGV[1]  fence: '' for the protocol's unconditional touch, or the status_version the caller
         holds (touch_fenced: a holder that lost the task must not overwrite the new holder)
ARGV[2]  number of fields to delete, then their names (progress total/message set to None)
next     field/value pairs to write

Fields allowed: pc pt pm (progress), hb (heartbeat_at), lo lu (lease_owner, lease_until).

Replies
  {'OK'}             written
  {'OK', 'MISSING'}  no such task: silently ignored, nothing created
  {'OK', 'FENCED', actual}   the fence did not match the stored version; nothing written
  {'CORRUPT', key, field, detail}   the key is not a hash; nothing written
  {'BADARG', detail}

Invariants: never bumps status_version (reads it only for the fence); never touches an index.
Bound: one HDEL and one HSET.
]]
--- @include "lib/common"

local TOUCHABLE = { pc = true, pt = true, pm = true, hb = true, lo = true, lu = true }
local task_key, fence = KEYS[1], ARGV[1]
if fence ~= '' and not is_uint(fence) then return badarg('fence is not a canonical integer') end
local dels, pos = read_list(2)
if not dels then return badarg('delete list malformed') end
local writes, map = read_pairs(pos)
if not writes then return badarg('field/value pairs malformed') end
for i = 1, #dels do
  if not TOUCHABLE[dels[i]] then return badarg('touch may not delete ' .. dels[i]) end
end
for field in next, map do
  if not TOUCHABLE[field] then return badarg('touch may not write ' .. field) end
end
for _, field in ipairs({ 'hb', 'lu' }) do
  if map[field] and not is_uint(map[field]) then return badarg(field .. ' is not an integer') end
end

local kind = key_type(task_key)
if kind == 'none' then return { 'OK', 'MISSING' } end
if kind ~= 'hash' then return corrupt(task_key, '', 'key holds a ' .. kind .. ', not a hash') end
if fence ~= '' then
  local stored = rcall('HGET', task_key, 'v')
  if stored ~= fence then return { 'OK', 'FENCED', stored or '' } end
end
if #dels > 0 then rcall('HDEL', task_key, unpack(dels)) end
if #writes > 0 then rcall('HSET', task_key, unpack(writes)) end
return { 'OK' }

#!lua
--[[ delete_schedule: remove a schedule's state, keeping its version (SchedulesStore).

KEYS[1]  {ns}:schedules   the hash of every schedule (lua/write_schedule.lua)
ARGV[1]  schedule id
ARGV[2]  write token (random per call; a retry of the same call repeats it)

Replies
  {'OK', deleted}   '1' when the schedule existed (or this very call deleted it before: a
                    retry), '0' when there was none
  {'CORRUPT', key, field, detail}  the key is not a hash; nothing written
  {'BADARG', detail}

Invariants: the version moves on by one, never back (a writer that read the schedule before
the delete is refused, also after the id is made again); the tasks of its ticks stay.
Bound: one HMGET and one HSET/HDEL.
]]
--- @include "lib/common"

local schedules, id, token = KEYS[1], ARGV[1], ARGV[2]
if not id or id == '' then return badarg('schedule id missing') end
if not token or token == '' then return badarg('write token missing') end
local kind = key_type(schedules)
if kind == 'none' then return { 'OK', '0' } end
if kind ~= 'hash' then return corrupt(schedules, '', 'key holds a ' .. kind .. ', not a hash') end
local f = rcall('HMGET', schedules, 'v:' .. id, 's:' .. id, 'w:' .. id)
if f[2] == false then return { 'OK', f[3] == token and '1' or '0' } end
if not is_uint(f[1]) then return corrupt(schedules, 'v:' .. id, 'version is not an integer') end
rcall('HSET', schedules, 'v:' .. id, tostring(tonumber(f[1]) + 1), 'w:' .. id, token)
rcall('HDEL', schedules, 's:' .. id)
return { 'OK', '1' }

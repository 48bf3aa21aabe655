#!lua
--[[ submit_command: store a control command, list it under its task and queue it for claiming.

KEYS[1]  {ns}:c:<cid>  the command hash
KEYS[2]  {ns}:cq       unleased unfinished commands, score = created_at
KEYS[3]  {ns}:cl       leased unfinished commands, score = lease_until
KEYS[4]  {ns}:tc:<id>  the commands of the command's task, score = created_at
ARGV[1]  command id
ARGV[2]  write token (a retry of the same call repeats it)
ARGV[3]  created_at (us)
ARGV[4]  lease_until (us) or ''
ARGV[5]  '1' if the command is already finished, else '0'
ARGV[6..] field/value pairs (stores/_redis/keys.py COMMAND_FIELDS)

Replies
  {'OK'} | {'OK', 'APPLIED'} (retry of this call) | {'EXISTS'} | {'CORRUPT', ...} | {'BADARG', d}

Invariants: the store never interprets a command; an unfinished command is in exactly one of
cq / cl; every stored command is listed under its task (finished ones too) until prune drops
the task's list. A retry of this call finds its token and writes nothing, so the command is
listed once. Bound: five commands.
]]
--- @include "lib/common"

local command_key, queue, leases, listed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token, created, lease_until, finished = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not is_uint(created) then return badarg('created_at is not a canonical integer') end
if lease_until ~= '' and not is_uint(lease_until) then return badarg('lease_until malformed') end
if not token or token == '' then return badarg('write token missing') end
local writes = read_pairs(6)
if not writes then return badarg('field/value pairs malformed') end

local kind = key_type(command_key)
if kind ~= 'none' then
  if kind ~= 'hash' then return corrupt(command_key, '', 'key holds a ' .. kind .. ', not a hash') end
  if rcall('HGET', command_key, 'w') == token then return { 'OK', 'APPLIED' } end
  return { 'EXISTS' }
end
local list_kind = key_type(listed)
if list_kind ~= 'none' and list_kind ~= 'zset' then
  return corrupt(listed, '', 'key holds a ' .. list_kind .. ', not a sorted set')
end
rcall('HSET', command_key, 'w', token, unpack(writes))
rcall('ZADD', listed, created, id)
if finished == '1' then return { 'OK' } end
if lease_until ~= '' then
  rcall('ZADD', leases, lease_until, id)
else
  rcall('ZADD', queue, created, id)
end
return { 'OK' }

#!lua
--[[ release_command: hand a claimed command back without finishing it.

The claimer does not hold the command's task, so the true holder must be able to claim it at
once: the lease is cleared and the command goes back to the queue at its original age.
Completing it instead would lose it; waiting for the lease would starve the holder.

KEYS[1]  {ns}:c:<cid>  the command hash
KEYS[2]  {ns}:cq
KEYS[3]  {ns}:cl
ARGV[1]  command id

Replies
  {'OK'}                released (or was not leased: nothing to do)
  {'OK', 'FINISHED'}    the command is finished and stays finished
  {'NOTFOUND'} | {'CORRUPT', ...}

Invariants: never sets 'f' (finished_at). Bound: four commands.
]]
--- @include "lib/common"

local command_key, queue, leases = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local kind = key_type(command_key)
if kind == 'none' then return { 'NOTFOUND' } end
if kind ~= 'hash' then return corrupt(command_key, '', 'key holds a ' .. kind .. ', not a hash') end
local stored = rcall('HMGET', command_key, 'f', 'c')
if stored[1] then return { 'OK', 'FINISHED' } end
if not is_uint(stored[2]) then return corrupt(command_key, 'c', 'created_at malformed') end
rcall('HDEL', command_key, 'lu')
rcall('ZREM', leases, id)
rcall('ZADD', queue, stored[2], id)
return { 'OK' }

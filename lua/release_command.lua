#!lua
--[[ release_command: hand a claimed command back without finishing it.

The claimer does not hold the command's task, so the true holder must be able to claim it at
once: the lease is cleared and the command goes back to the queue at its original age.
Completing it instead would lose it; waiting for the lease would starve the holder.

KEYS[1]  {ns}:c:<cid>  the command hash
KEYS[2]  {ns}:cq
KEYS[3]  {ns}:cl
KEYS[4]  {ns}:audit    the lease audit stream (written only when ARGV[2] is '1')
ARGV[1]  command id
ARGV[2]  '1' to audit: when this call clears a lease ('lu' was set), XADD {ns}:audit
         op release cid <id> until '' now <ARGV[3]> lu <the cleared lease_until>
         owner <ARGV[4]>; '0' (or absent): off
ARGV[3]  now (us), recorded in the audit entry (checked only when auditing)
ARGV[4]  the releaser's name, recorded in the audit (read only when auditing)

Replies
  {'OK'}                released (or was not leased: nothing to do)
  {'OK', 'FINISHED'}    the command is finished and stays finished
  {'NOTFOUND'}           no such command
  {'CORRUPT', key, field, detail}   the key is not a command hash; nothing written
  {'BADARG', detail}    auditing, and ARGV[3] is not a canonical integer

Invariants: never sets 'f' (finished_at). Bound: five commands.
]]
--- @include "lib/common"

local command_key, queue, leases, audit = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local auditing = ARGV[2] == '1'
if auditing and not is_uint(ARGV[3]) then return badarg('now malformed') end
local kind = key_type(command_key)
if kind == 'none' then return { 'NOTFOUND' } end
if kind ~= 'hash' then return corrupt(command_key, '', 'key holds a ' .. kind .. ', not a hash') end
local stored = rcall('HMGET', command_key, 'f', 'c', 'lu')
if stored[1] then return { 'OK', 'FINISHED' } end
if not is_uint(stored[2]) then return corrupt(command_key, 'c', 'created_at malformed') end
rcall('HDEL', command_key, 'lu')
rcall('ZREM', leases, id)
rcall('ZADD', queue, stored[2], id)
if auditing and stored[3] then
  rcall('XADD', audit, 'MAXLEN', '~', 1000000, '*',
    'op', 'release', 'cid', id, 'until', '', 'now', ARGV[3], 'lu', stored[3],
    'owner', ARGV[4] or '')
end
return { 'OK' }

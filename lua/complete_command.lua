#!lua
--[[ complete_command: mark a command finished; it is never claimed again.

KEYS[1]  {ns}:c:<cid>  the command hash
KEYS[2]  {ns}:cq
KEYS[3]  {ns}:cl
KEYS[4]  {ns}:audit    the lease audit stream (written only when ARGV[5] is '1')
ARGV[1]  command id
ARGV[2]  finished_at (us)
ARGV[3]  '1' if an outcome is given, else '0'
ARGV[4]  the outcome (ignored when ARGV[3] is '0')
ARGV[5]  '1' to audit: when this call finishes the command (not ALREADY), XADD {ns}:audit
         op complete cid <id> until '' now <finished_at> lu <the stored lease_until or ''>
         owner <ARGV[6]>; '0' (or absent): off
ARGV[6]  the completer's name, recorded in the audit (read only when auditing)

Replies
  {'OK'}             finished now
  {'OK', 'ALREADY'}  it was finished before; the first outcome stays (retries are harmless)
  {'NOTFOUND'}       no such command
  {'CORRUPT', ...} | {'BADARG', detail}

Bound: five commands.
]]
--- @include "lib/common"

local command_key, queue, leases, audit = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, finished_at, has_outcome, outcome = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local auditing = ARGV[5] == '1'
if not is_uint(finished_at) then return badarg('finished_at malformed') end
local kind = key_type(command_key)
if kind == 'none' then return { 'NOTFOUND' } end
if kind ~= 'hash' then return corrupt(command_key, '', 'key holds a ' .. kind .. ', not a hash') end
if rcall('HEXISTS', command_key, 'f') == 1 then return { 'OK', 'ALREADY' } end
if has_outcome == '1' then
  rcall('HSET', command_key, 'f', finished_at, 'o', outcome)
else
  rcall('HSET', command_key, 'f', finished_at)
end
rcall('ZREM', queue, id)
rcall('ZREM', leases, id)
if auditing then
  local held = rcall('HGET', command_key, 'lu') or ''
  rcall('XADD', audit, 'MAXLEN', '~', 1000000, '*',
    'op', 'complete', 'cid', id, 'until', '', 'now', finished_at, 'lu', held,
    'owner', ARGV[6] or '')
end
return { 'OK' }

#!lua flags=no-writes
--[[ task_commands: the newest commands of one task, with their hashes, read-only.

submit_command lists every command under its task (score = created_at, member = command id),
so the newest `limit` are the last entries of one sorted set, already in (created_at, command
id) order: Redis orders equal scores by member bytes.

KEYS[1]  {ns}:tc:<id>  the task's commands (dropped by prune with the task)
KEYS[2]  {ns}:         the namespace root; the command hashes {ns}:c:<cid> are derived from it
ARGV[1]  limit (1..1000)

Replies
  {'OK', cid1, fields1, cid2, fields2, ...}   the newest `limit`, oldest first; fields as
        HGETALL gives them
  {'CORRUPT', key, field, detail}   the list is not a sorted set, or a listed command's hash
        is missing or not a hash
  {'BADARG', detail}

Bound: one ZRANGE of at most `limit` entries, then one TYPE and one HGETALL per entry.
]]
--- @include "lib/common"

local listed, root, limit = KEYS[1], KEYS[2], ARGV[1]
if not is_uint(limit) or tonumber(limit) < 1 or tonumber(limit) > 1000 then
  return badarg('limit must be 1..1000')
end
local ids, kind = try_read('ZRANGE', listed, -tonumber(limit), -1)
if not ids then return corrupt(listed, '', 'key holds a ' .. kind .. ', not a sorted set') end

local reply = { 'OK' }
for i = 1, #ids do
  local key = root .. 'c:' .. ids[i]
  local command_kind = key_type(key)
  if command_kind ~= 'hash' then
    return corrupt(key, '', 'listed under ' .. listed .. ' but holds ' .. command_kind)
  end
  reply[#reply + 1] = ids[i]
  reply[#reply + 1] = rcall('HGETALL', key)
end
return reply

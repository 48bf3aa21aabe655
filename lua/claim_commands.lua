#!lua
--[[ claim_commands: atomically pick the oldest claimable commands and lease them.

Claimable: unfinished, and no lease or an expired one (lease_until <= now).

KEYS[1]  {ns}:cq        unleased unfinished commands, score = created_at
KEYS[2]  {ns}:cl        leased unfinished commands, score = lease_until
KEYS[3]  {ns}:cr:<tok>  memo of the ids this call leased (a list with a TTL)
KEYS[4]  {ns}:          the namespace root; command keys {ns}:c:<cid> are derived from it
KEYS[5]  {ns}:audit     the lease audit stream (written only when ARGV[5] is '1')
ARGV[1]  now (us)
ARGV[2]  lease_until = now + lease (us)
ARGV[3]  limit (1..1000)
ARGV[4]  memo TTL in milliseconds (the lease length: after it, the memo is of no use)
ARGV[5]  '1' to audit: XADD {ns}:audit op claim cid <id> until <lease_until> now <now>
         owner <ARGV[6]> for each command leased (not on a memo retry, which leases nothing);
         '0' (or absent): off
ARGV[6]  the claimer's name, recorded as the lease holder in the audit (read only when auditing)

Replies
  {'OK', cid1, fields1, cid2, fields2, ...}   fields = the command hash as HGETALL gives it
  {'CORRUPT', key, field, detail}   a candidate command does not decode; nothing written
  {'BADARG', detail}

Idempotency: if the memo exists, this is a retry of a call whose reply was lost; the same
commands are returned and nothing new is leased (redis-py re-sends a command whose reply is lost).
Invariants: a command is in exactly one of cq / cl while unfinished; two claims never both
hold a valid lease on one command; a command is claimable only by a now at or after its
lease_until (an ended lease not taken stays in cl, claimable by the next now that ended it).
Bound: at most 1000 expired leases are read per call, at most `limit` commands leased (and as
many audit entries).
]]
--- @include "lib/common"

local queue, leases, memo, root = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local audit = KEYS[5]
local now, lease_until, limit, memo_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local auditing = ARGV[5] == '1'
local claimer = ARGV[6] or ''
for _, v in ipairs({ now, lease_until, limit, memo_ttl }) do
  if not is_uint(v) then return badarg('numeric argument malformed') end
end
limit = tonumber(limit)
if limit < 1 or limit > 1000 then return badarg('limit out of range') end

local function reply_for(ids)
  local reply = { 'OK' }
  for i = 1, #ids do
    reply[#reply + 1] = ids[i]
    reply[#reply + 1] = rcall('HGETALL', root .. 'c:' .. ids[i])
  end
  return reply
end

if rcall('EXISTS', memo) == 1 then return reply_for(rcall('LRANGE', memo, 0, -1)) end

-- Candidates: the oldest unleased commands, plus commands whose lease has expired.
local candidates = {}
local queued = rcall('ZRANGE', queue, 0, limit - 1, 'WITHSCORES')
for i = 1, #queued, 2 do
  candidates[#candidates + 1] = { id = queued[i], created = queued[i + 1] }
end
local expired = rcall('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, 1000)
for i = 1, #expired do
  local key = root .. 'c:' .. expired[i]
  if key_type(key) ~= 'hash' then return corrupt(key, '', 'leased command is not a hash') end
  local created = rcall('HGET', key, 'c')
  if not is_uint(created) then return corrupt(key, 'c', 'created_at malformed') end
  candidates[#candidates + 1] = { id = expired[i], created = created }
end
table.sort(candidates, function(a, b)
  local x, y = tonumber(a.created), tonumber(b.created)
  if x ~= y then return x < y end
  return bytes_less(a.id, b.id)
end)
local KINDS = { stop = true, pause = true, resume = true }
for i = 1, math.min(limit, #candidates) do
  local key = root .. 'c:' .. candidates[i].id
  if key_type(key) ~= 'hash' then return corrupt(key, '', 'queued command is not a hash') end
  -- The fields the reply is decoded from: a command that would not decode is not leased.
  local f = rcall('HMGET', key, 'id', 't', 'k', 'c', 'f')
  if f[1] ~= candidates[i].id then return corrupt(key, 'id', 'command id missing or wrong') end
  if not f[2] or f[2] == '' then return corrupt(key, 't', 'task id missing') end
  if not KINDS[f[3]] then return corrupt(key, 'k', 'unknown or missing command kind') end
  if not is_uint(f[4]) then return corrupt(key, 'c', 'created_at malformed') end
  if f[5] and not is_uint(f[5]) then return corrupt(key, 'f', 'finished_at malformed') end
end

-- All checks passed; from here on only writes. An ended lease this call does not take stays
-- in the lease set: moved to the queue, it would be taken by a later claim passing an earlier
-- now (a claimer whose clock is behind) while lease_until > that now, which the protocol
-- refuses; the next claim whose now ended it finds it among the expired candidates.
local claimed = {}
for i = 1, math.min(limit, #candidates) do
  local c = candidates[i]
  rcall('HSET', root .. 'c:' .. c.id, 'lu', lease_until)
  rcall('ZREM', queue, c.id)
  rcall('ZADD', leases, lease_until, c.id)
  claimed[#claimed + 1] = c.id
  if auditing then
    rcall('XADD', audit, 'MAXLEN', '~', 1000000, '*',
      'op', 'claim', 'cid', c.id, 'until', lease_until, 'now', now, 'owner', claimer)
  end
end
if #claimed > 0 then
  rcall('RPUSH', memo, unpack(claimed))
  rcall('PEXPIRE', memo, memo_ttl)
end
return reply_for(claimed)

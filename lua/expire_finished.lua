#!lua
--[[ expire_finished: remove finished tasks whose retention ran out, earliest expiry first.

A finished task with a retention is in {ns}:expiry at updated_at + retention (us), written by
the script that finished it (lib/policies). Each expired one is removed as prune removes a
task: its index entries and counters, its hash, history and command list ({ns}:tc:<id>; the
command hashes stay, readable by id), its expiry entry and its unique record (if it still names
the task); its change-feed item becomes a tombstone at the next position, stamped `now`.

KEYS[1]  {ns}:         the namespace root; task, history, command list, index, counter,
                       unique record and change-feed keys are derived from it
KEYS[2]  {ns}:expiry   the expiry queue; declared beside the root (a key that never exists) so
                       that Redis Cluster refuses the call (TRYAGAIN) while the namespace's slot
                       migrates, never runs it on a half-moved slot (docs/redis-layout.md)
ARGV[1]  now (us): a task expires when its expiry is <= now
ARGV[2]  limit: the most tasks this call removes (1..1000; the caller loops)

Replies
  {'OK', id1, id2, ...}   the removed tasks, earliest expiry first (ties by id, byte order)
  {'CORRUPT', key, field, detail}   a candidate or a key the removal touches does not decode;
                                    nothing written
  {'BADARG', detail}

Invariants: every candidate is checked inside this script to be final, to have a retention and
to have expired by its own fields before it is removed, so an unfinished or unexpired task is
never removed, whatever the queue says. An entry that does not match its task (the task is
gone, unfinished, or expires at another time: only another client leaves one) is derived data:
put right or dropped, never removed from, and not counted against `limit`.
Bound: at most `limit` tasks removed (each O(tags) commands) and at most 100 entries put right;
ZRANGEBYSCORE reads in chunks of at most `limit` entries.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"

local root, queue = KEYS[1], KEYS[2]
if queue ~= root .. 'expiry' then return badarg('KEYS[2] is not {ns}:expiry of KEYS[1]') end
local now, limit = ARGV[1], ARGV[2]
if not is_uint(now) or not is_uint(limit) then return badarg('now/limit malformed') end
limit = tonumber(limit)
if limit < 1 or limit > 1000 then return badarg('limit out of range') end
local STALE_MAX = 100

-- One queue entry: a task to remove (appended to `doomed`), an entry to put right (`stale`),
-- or a CORRUPT reply.
local doomed, stale = {}, 0
local function consider(id)
  local key = root .. 't:' .. id
  local v, kind = try_read('HMGET', key, 's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr', 'fs', 'u',
                           'rn', 'uq')
  if not v then return corrupt(key, '', 'key holds a ' .. kind .. ', not a hash') end
  if not v[1] and key_type(key) == 'none' then -- the task is gone: drop the entry
    stale = stale + 1
    zrem(queue, id)
    return nil
  end
  if rcall('SISMEMBER', root .. 'dpin', id) == 1 then -- kept for an unfinished child
    stale = stale + 1                                  -- (lib/dependencies restores it)
    zrem(queue, id)
    return nil
  end
  local view, bad = index_view_of(key, v)
  if not view then return bad end
  local p, field, detail = policy_view(view.s, v[10], v[11], v[12])
  if not p then return corrupt(key, field, detail) end
  local expires = expiry_of(p)
  if expires and tonumber(expires) <= tonumber(now) then
    doomed[#doomed + 1] = { id = id, key = key, view = view, position = v[9], uq = p.uq }
    return nil
  end
  stale = stale + 1 -- not expired by its own fields: its entry is put right
  if expires then zadd(queue, expires, id) else zrem(queue, id) end
  return nil
end

local offset = 0
while #doomed < limit and stale < STALE_MAX do
  local want = limit - #doomed
  local due, kind = try_read('ZRANGEBYSCORE', queue, '-inf', now, 'LIMIT', offset, want)
  if not due then return corrupt(queue, '', 'key holds a ' .. kind .. ', not a sorted set') end
  for i = 1, #due do
    if #doomed >= limit or stale >= STALE_MAX then break end
    local bad = consider(due[i])
    if bad then return bad end
  end
  if #due < want then break end
  offset = offset + #due
end

-- Plan the tombstones, the index, counter, expiry and unique record changes, and check every
-- key they touch.
for _, d in ipairs(doomed) do
  feed_tombstone(root, d.position, d.id, d.view, now)
  index_remove(root, d.id, d.view)
  local bad = policy_remove(root, d.id, d.uq)
  if bad then return bad end
end
local broken = index_check() or feed_check(root)
if broken then return broken end

-- All checks passed; from here on only writes.
local reply = { 'OK' }
for _, d in ipairs(doomed) do
  rcall('DEL', d.key, root .. 'h:' .. d.id, root .. 'tc:' .. d.id)
  reply[#reply + 1] = d.id
end
index_flush()
unique_flush()
feed_flush(root)
return reply

-- lib/feed: the change feed, kept in step with the tasks. Every script that creates, saves,
-- starts, commits or prunes a task calls feed_move / feed_tombstone in the same script as the
-- write, so a task's feed position can never disagree with its state; touch never does.
--
-- Layout (stores/_keys.py), derived from `root` (the namespace's '{ns}:' prefix, a KEY):
--   {ns}:feed      hash   head = the last position issued (never reused, never reset),
--                         tombs = tombstones kept
--   {ns}:fc:<n>    hash   chunk n: position -> 't' .. task_id (a live task, at its latest
--                         position) or 'r' .. tombstone (see feed_tombstone); positions
--                         n*128 .. n*128+127. Small hashes are listpacks: ~30 bytes an item
--   {ns}:fcs       zset   the chunks that hold items (score = member = n)
--   task hash field 'fs'  the task's current position
--
-- Requires lib/common.
--- @include "lib/common"

local FEED_CHUNK = 128

local function feed_drop(root, position)
  local n = string.format('%d', math.floor(tonumber(position) / FEED_CHUNK))
  local chunk = root .. 'fc:' .. n
  rcall('HDEL', chunk, position)
  if rcall('EXISTS', chunk) == 0 then rcall('ZREM', root .. 'fcs', n) end
end

-- Issue the next position and put `value` there.
local function feed_put(root, value)
  local position = rcall('HINCRBY', root .. 'feed', 'head', 1)
  local text = string.format('%d', position)
  local n = string.format('%d', math.floor(position / FEED_CHUNK))
  rcall('HSET', root .. 'fc:' .. n, text, value)
  rcall('ZADD', root .. 'fcs', n, n)
  return text
end

-- The task at `key` (id `id`) was created or changed: move it to the next position.
local function feed_move(root, key, id)
  local old = rcall('HGET', key, 'fs')
  if old then feed_drop(root, old) end
  rcall('HSET', key, 'fs', feed_put(root, 't' .. id))
end

-- The task at `key` is being pruned (its index view `view`): replace its item with a tombstone
-- at the next position, kept forever. Encoding: 'r' removed_at(us) ' ' bucket ' ' #name ' '
-- name id (the name's byte length makes the split unambiguous whatever the name holds).
local function feed_tombstone(root, key, id, view, removed_at)
  local old = rcall('HGET', key, 'fs')
  if old then feed_drop(root, old) end
  feed_put(root, 'r' .. removed_at .. ' ' .. view.b .. ' ' .. #view.n .. ' ' .. view.n .. id)
  rcall('HINCRBY', root .. 'feed', 'tombs', 1)
end

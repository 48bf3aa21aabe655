-- lib/feed: the change feed, kept in step with the tasks. Every script that creates, saves,
-- starts, commits or prunes a task calls feed_next / feed_tombstone in the same script as the
-- write, so a task's feed position can never disagree with its state; touch never does.
--
-- Every writer passes the task's stored position (its 'fs' field, read with the fields it
-- checks anyway) and writes the new one in its own HSET: the feed costs a write 4 commands.
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

-- Issue the next position and put `value` there. The chunk of the head position always holds
-- the head item (callers put before they drop), so only a put that opens a chunk lists it.
local function feed_put(root, value)
  local position = rcall('HINCRBY', root .. 'feed', 'head', 1)
  local text = string.format('%d', position)
  local n = string.format('%d', math.floor(position / FEED_CHUNK))
  rcall('HSET', root .. 'fc:' .. n, text, value)
  if position % FEED_CHUNK == 0 or position == 1 then rcall('ZADD', root .. 'fcs', n, n) end
  return text
end

-- The task `id`, whose stored position is `old` (nil or false for a new task), was created or
-- changed: put it at the next position, drop the old one. Returns the new position, which the
-- caller writes to the task hash's 'fs' field in the same HSET as the change.
local function feed_next(root, old, id)
  local position = feed_put(root, 't' .. id)
  if old then feed_drop(root, old) end
  return position
end

-- The task `id` (stored position `old`, index view `view`) is being pruned: a tombstone at the
-- next position replaces its item, kept forever. Encoding: 'r' removed_at(us) ' ' bucket ' '
-- #name ' ' name id (the name's byte length makes the split unambiguous whatever it holds).
local function feed_tombstone(root, old, id, view, removed_at)
  feed_put(root, 'r' .. removed_at .. ' ' .. view.b .. ' ' .. #view.n .. ' ' .. view.n .. id)
  if old then feed_drop(root, old) end
  rcall('HINCRBY', root .. 'feed', 'tombs', 1)
end

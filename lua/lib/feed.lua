-- lib/feed: the change feed, kept in step with the tasks. Every script that creates, saves,
-- starts, commits or prunes a task calls feed_next / feed_tombstone in the same script as the
-- write, so a task's feed position can never disagree with its state; touch never does.
--
-- Every writer passes the task's stored position (its 'fs' field, read with the fields it
-- checks anyway) and writes the new one in its own HSET; the feed's own writes are grouped
-- per call (feed_flush): a batch of 100 costs about six commands, a single write four.
--
-- Layout (stores/_redis/keys.py), derived from `root` (the namespace's '{ns}:' prefix, a KEY):
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

-- The feed writes of one script are planned in its read pass and written by feed_flush, once
-- per chunk rather than once per task: positions are issued from the head read once (the
-- script is atomic, so nobody else issues meanwhile), puts are grouped by chunk, drops too.
-- A script calls feed_next / feed_tombstone while it reads, feed_check before its first write
-- and feed_flush with its writes.
local FEED = { head = nil, issued = 0, tombs = 0, puts = {}, put_chunks = {}, opened = {},
               drops = {}, drop_chunks = {} }

local function chunk_of(position)
  return string.format('%d', math.floor(position / FEED_CHUNK))
end

local function feed_put(root, value)
  if not FEED.head then
    local head = redis.pcall('HGET', root .. 'feed', 'head')
    FEED.raw_head = type(head) == 'string' and head or nil -- feed_check judges it
    FEED.head = tonumber(FEED.raw_head or '0') or 0
  end
  FEED.issued = FEED.issued + 1
  local position = FEED.head + FEED.issued
  local text = string.format('%d', position)
  local n = chunk_of(position)
  local items = FEED.puts[n]
  if not items then
    items = {}
    FEED.puts[n] = items
    FEED.put_chunks[#FEED.put_chunks + 1] = n
  end
  items[#items + 1] = text
  items[#items + 1] = value
  -- The chunk's first position (1 for chunk 0) opens it: only then is it listed in fcs.
  if position % FEED_CHUNK == 0 or position == 1 then FEED.opened[n] = true end
  return text
end

local function feed_drop(position)
  local n = chunk_of(tonumber(position))
  local list = FEED.drops[n]
  if not list then
    list = {}
    FEED.drops[n] = list
    FEED.drop_chunks[#FEED.drop_chunks + 1] = n
  end
  list[#list + 1] = position
end

-- The task `id`, whose stored position is `old` (nil or false for a new task), was created or
-- changed: put it at the next position, drop the old one. Returns the new position, which the
-- caller writes to the task hash's 'fs' field in the same HSET as the change.
local function feed_next(root, old, id)
  local position = feed_put(root, 't' .. id)
  if old and not is_uint(old) then
    FEED.bad = FEED.bad or id -- feed_check reports it; nothing is written
  elseif old then
    feed_drop(old)
  end
  return position
end

-- The task `id` (stored position `old`, index view `view`) is being pruned: a tombstone at the
-- next position replaces its item, kept forever. Encoding: 'r' removed_at(us) ' ' bucket ' '
-- #name ' ' name id (the name's byte length makes the split unambiguous whatever it holds).
local function feed_tombstone(root, old, id, view, removed_at)
  feed_put(root, 'r' .. removed_at .. ' ' .. view.b .. ' ' .. #view.n .. ' ' .. view.n .. id)
  if old then feed_drop(old) end
  FEED.tombs = FEED.tombs + 1
end

-- CORRUPT if a key the collected writes touch was broken by another client (the head hash,
-- a chunk, the chunk list), else nil. Reads only: scripts call it before their first write.
local function feed_check(root)
  if FEED.bad then
    return corrupt(root .. 't:' .. FEED.bad, 'fs', 'feed position is not a canonical integer')
  end
  if FEED.issued == 0 and FEED.tombs == 0 and #FEED.drop_chunks == 0 then return nil end
  local kinds = { [root .. 'feed'] = 'hash', [root .. 'fcs'] = 'zset' }
  for _, n in ipairs(FEED.put_chunks) do kinds[root .. 'fc:' .. n] = 'hash' end
  for _, n in ipairs(FEED.drop_chunks) do kinds[root .. 'fc:' .. n] = 'hash' end
  for key, want in pairs(kinds) do
    local kind = key_type(key)
    if kind ~= 'none' and kind ~= want then
      return corrupt(key, '', 'feed key holds a ' .. kind .. ', not a ' .. want)
    end
  end
  local head = FEED.raw_head -- read once, by the first feed_put
  if head and not is_uint(head) then return corrupt(root .. 'feed', 'head', 'not an integer') end
  local tombs = FEED.tombs > 0 and rcall('HGET', root .. 'feed', 'tombs')
  if tombs and not is_uint(tombs) then
    return corrupt(root .. 'feed', 'tombs', 'not an integer')
  end
  return nil
end

-- Write what feed_next / feed_tombstone collected: the head, the puts (before the drops, so
-- the chunk of the head always holds the head item), then the drops; a chunk left empty leaves
-- the chunk list.
local function feed_flush(root)
  if FEED.issued > 0 then rcall('HINCRBY', root .. 'feed', 'head', FEED.issued) end
  if FEED.tombs > 0 then rcall('HINCRBY', root .. 'feed', 'tombs', FEED.tombs) end
  for _, n in ipairs(FEED.put_chunks) do
    rcall('HSET', root .. 'fc:' .. n, unpack(FEED.puts[n])) -- at most 2 * 128 arguments
    if FEED.opened[n] then rcall('ZADD', root .. 'fcs', n, n) end
  end
  for _, n in ipairs(FEED.drop_chunks) do
    local chunk = root .. 'fc:' .. n
    rcall('HDEL', chunk, unpack(FEED.drops[n])) -- at most 128 positions
    if rcall('EXISTS', chunk) == 0 then rcall('ZREM', root .. 'fcs', n) end
  end
  FEED = { head = nil, issued = 0, tombs = 0, puts = {}, put_chunks = {}, opened = {},
           drops = {}, drop_chunks = {} }
end

--[[ relay_append (prototype, bench/scale_out_feed.py): append a batch of one shard's feed items
to the namespace's global feed, in one step with that shard's relay cursor.

Every key lives in the directory slot, under the root KEYS[1]:
  {ns}:gfeed      hash   head = the last global position issued (never reused)
  {ns}:gfc:<n>    hash   global chunk n: position -> '<shard>:t<id>' or '<shard>:r<tombstone>';
                         positions 128n .. 128n+127
  {ns}:gfcs       zset   the chunks that hold items (score = member = n)
  {ns}:gpos       hash   task id -> its global position (live tasks only)
  {ns}:relay      hash   shard -> the shard feed position relayed so far

KEYS[1]  {ns}:   the directory's root
ARGV[1]  shard index
ARGV[2]  the relay cursor of the shard this batch was read after (compare-and-set)
ARGV[3]  the new relay cursor: the shard position the batch was read up to
ARGV[4..] pairs (task id, shard item value 't<id>' or 'r<tombstone>'), in shard position order

Replies
  {'OK', head}      appended; head = the global head after the batch
  {'MOVED', cursor} the stored cursor is not ARGV[2] (another relay, or a retry that landed):
                    nothing written
Invariants: a task is in the global feed once, at its latest global position (the old item is
dropped in the same step); positions are issued from the head in one atomic step, so a reader
of the global feed never skips (the same argument as lib/feed.lua); the shard cursor moves
with the items, so a batch is appended exactly once.
Bound: the caller sends at most 256 items.
]]
local rcall = redis.call
local root, shard, expect, new = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local cursor = rcall('HGET', root .. 'relay', shard) or '0'
if cursor ~= expect then return { 'MOVED', cursor } end

-- Plan (as lib/feed.lua does): one HMGET finds the old positions, then the writes are grouped
-- per chunk, so a batch costs a few commands whatever its size.
local ids = {}
for i = 4, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
local head = tonumber(rcall('HGET', root .. 'gfeed', 'head') or '0')
local old = #ids > 0 and rcall('HMGET', root .. 'gpos', unpack(ids)) or {}
local puts, put_order, drops, drop_order, live, gone = {}, {}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  local value = ARGV[3 + 2 * i]
  local text = string.format('%d', head + i)
  local n = string.format('%d', math.floor((head + i) / 128))
  if not puts[n] then puts[n] = {}; put_order[#put_order + 1] = n end
  local list = puts[n]
  list[#list + 1] = text
  list[#list + 1] = shard .. ':' .. value
  if old[i] then
    local m = string.format('%d', math.floor(tonumber(old[i]) / 128))
    if not drops[m] then drops[m] = {}; drop_order[#drop_order + 1] = m end
    drops[m][#drops[m] + 1] = old[i]
  end
  if string.sub(value, 1, 1) == 't' then
    live[#live + 1] = id
    live[#live + 1] = text
  else
    gone[#gone + 1] = id
  end
end
for _, n in ipairs(put_order) do
  rcall('HSET', root .. 'gfc:' .. n, unpack(puts[n]))
  rcall('ZADD', root .. 'gfcs', n, n)
end
for _, m in ipairs(drop_order) do
  local chunk = root .. 'gfc:' .. m
  rcall('HDEL', chunk, unpack(drops[m]))
  if rcall('EXISTS', chunk) == 0 then rcall('ZREM', root .. 'gfcs', m) end
end
if #live > 0 then rcall('HSET', root .. 'gpos', unpack(live)) end
if #gone > 0 then rcall('HDEL', root .. 'gpos', unpack(gone)) end
local new_head = string.format('%d', head + #ids)
if #ids > 0 then rcall('HSET', root .. 'gfeed', 'head', new_head) end
rcall('HSET', root .. 'relay', shard, new)
return { 'OK', new_head }

#!lua flags=no-writes
--[[ relay_read (prototype, bench/scale_out_feed.py): the items of one shard's feed after the
relay's cursor, without the task hashes (lua/changes.lua without its HGETALLs).

KEYS[1]  {ns}:   the shard's root: {ns}:feed (head), {ns}:fc:<n> (chunks), {ns}:fcs
ARGV[1]  after: the relay's cursor for this shard
ARGV[2]  limit (1..256)

Replies
  {'OK', cursor, position1, value1, position2, value2, ...}
        in position order; cursor = the last position returned when the page is full, else
        the head read in the same script (every position up to it that is not returned was
        superseded by a later one), never below `after`
Bound: at most `limit` items; chunks read at most limit + 1 (each <= 128 fields).
]]
local rcall = redis.call
local root, after, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local head = tonumber(rcall('HGET', root .. 'feed', 'head') or '0')
if head <= after then return { 'OK', string.format('%d', after) } end -- nothing new: no chunk read
local reply, found = { 'OK', '' }, 0
local from = math.floor(after / 128)
while found < limit do
  local chunks = rcall('ZRANGEBYSCORE', root .. 'fcs', from, '+inf', 'LIMIT', 0, 16)
  if #chunks == 0 then break end
  for _, n in ipairs(chunks) do
    local flat = rcall('HGETALL', root .. 'fc:' .. n)
    local items = {}
    for i = 1, #flat, 2 do
      local position = tonumber(flat[i])
      if position > after then items[#items + 1] = { position, flat[i], flat[i + 1] } end
    end
    table.sort(items, function(a, b) return a[1] < b[1] end)
    for _, item in ipairs(items) do
      if found >= limit then break end
      reply[#reply + 1] = item[2]
      reply[#reply + 1] = item[3]
      found = found + 1
    end
    from = tonumber(n) + 1
    if found >= limit then break end
  end
end
if found >= limit then
  reply[2] = reply[#reply - 1]
else
  reply[2] = string.format('%d', math.max(after, head))
end
return reply

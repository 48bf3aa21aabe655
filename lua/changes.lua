#!lua flags=no-writes
--[[ changes: one page of the change feed (lib/feed), read-only.

Items are read chunk by chunk from the first chunk that can hold a position above `after`, in
position order, until `limit` items: a live task with its hash as it is now, a tombstone as
stored. A task changed while a reader pages moved to a later position, so it is read again
later, never skipped.

KEYS[1]  {ns}:   the namespace root; feed and task keys are derived from it
KEYS[2]  {ns}:feed  the feed hash; declared beside the root (a key that never exists) so that
                    Redis Cluster refuses the call (TRYAGAIN) while the namespace's slot
                    migrates, never runs it on a half-moved slot (docs/redis-layout.md)
ARGV[1]  after: the cursor (canonical decimal)
ARGV[2]  limit (1..256)

Replies
  {'OK', head, position1, value1, fields1, position2, ...}   value 't' .. id with the task
        hash's HGETALL, or 'r' .. tombstone with an empty table; head = the last position
        issued
  {'AHEAD', head}                  the cursor is beyond the last position ever issued
  {'CORRUPT', key, field, detail}  a live item whose task hash is missing
  {'BADARG', detail}

Bound: at most `limit` items; chunks read at most limit + 1 (each <= 128 fields).
]]
--- @include "lib/common"

local root = KEYS[1]
if KEYS[2] ~= root .. 'feed' then return badarg('KEYS[2] is not {ns}:feed of KEYS[1]') end
local after, limit = ARGV[1], ARGV[2]
if not is_uint(after) then return badarg('cursor is not a canonical integer') end
if not is_uint(limit) or tonumber(limit) < 1 or tonumber(limit) > 256 then
  return badarg('limit must be 1..256')
end
after, limit = tonumber(after), tonumber(limit)
local head = rcall('HGET', root .. 'feed', 'head') or '0'
if not is_uint(head) then return corrupt(root .. 'feed', 'head', 'not a canonical integer') end
if after > tonumber(head) then return { 'AHEAD', head } end

local reply, found = { 'OK', head }, 0
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
      local fields = {}
      if string.sub(item[3], 1, 1) == 't' then
        local key = root .. 't:' .. string.sub(item[3], 2)
        fields = rcall('HGETALL', key)
        if #fields == 0 then return corrupt(key, '', 'in the change feed but missing') end
      end
      reply[#reply + 1] = item[2]
      reply[#reply + 1] = item[3]
      reply[#reply + 1] = fields
      found = found + 1
    end
    from = tonumber(n) + 1
    if found >= limit then break end
  end
end
return reply

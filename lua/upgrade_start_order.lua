#!lua
--[[ upgrade_start_order: put the PENDING tasks of one pending index key into the start queues.

Namespaces written before the start queues (lib/indexes: rq/dq) have PENDING tasks in their
query index only; start_tasks reads the queues alone. The store runs this once per namespace
(RedisTaskStore, before its first start), one slice of one index key per call; the call that
finishes the last key records `so` in {ns}:meta (a namespace with no PENDING task: one call). Idempotent: a task already queued (in rq or dq) is left where it is, so a
run cut short is simply run again.

KEYS[1]  {ns}:       the namespace root
KEYS[2]  {ns}:meta  where `so` records that the queues hold every PENDING task
ARGV[1]  bucket ('' with ARGV[2] '': nothing to queue, only record `so`)
ARGV[2]  task name
ARGV[3]  offset into {ns}:ix:pending:<bucket>:<name> (0-based)
ARGV[4]  count (1..1000)
ARGV[5]  '1': this is the last index key: once this slice finishes it, check every key
ARGV[6]  number of (bucket, name) pairs to check, then the pairs: `so` is recorded only if
         each pair's PENDING index holds as many tasks as its two queues together and its
         parked tasks ({ns}:lpc, lib/limits)

Replies
  {'OK', read, recorded}   read: entries of the index slice looked at (< count: the key is
                           done); recorded: 1 if `so` was recorded (else the caller walks again:
                           a task that left the index between slices shifted the rest)
  {'CORRUPT', key, field, detail}   a listed task does not decode; nothing written
  {'BADARG', detail}
Bound: `count` index entries read, as many tasks read and queued; the check, three ZCARDs
per listed pair.
Invariants: writes only start queue entries of PENDING tasks, each at the place lib/indexes
gives it, and the queues' heads (rh/dh); never a task hash, count or feed position.
]]
--- @include "lib/common"
--- @include "lib/indexes"

local root, meta = KEYS[1], KEYS[2]
local bucket, name, offset, count, last = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if last ~= '0' and last ~= '1' then return badarg('last flag malformed') end
local pairs_n = ARGV[6]
if not is_uint(pairs_n) or #ARGV ~= 6 + 2 * tonumber(pairs_n) then
  return badarg('pair list malformed')
end
-- Record `so` if every listed pair's index and queues hold as many tasks; 1 if recorded.
local function record_if_even()
  for i = 7, #ARGV, 2 do
    local b, n = ARGV[i], ARGV[i + 1]
    local indexed = rcall('ZCARD', root .. 'ix:pending:' .. b .. ':' .. n)
    local queued = rcall('ZCARD', root .. 'rq:' .. b .. ':' .. n)
      + rcall('ZCARD', root .. 'dq:' .. b .. ':' .. n)
      + (tonumber((try_read('HGET', root .. 'lpc', b .. ':' .. n))) or 0) -- parked (lib/limits)
    if indexed ~= queued then return 0 end
  end
  rcall('HSET', meta, 'so', '1')
  return 1
end
local meta_kind = key_type(meta)
if meta_kind ~= 'none' and meta_kind ~= 'hash' then
  return corrupt(meta, '', 'meta holds a ' .. meta_kind .. ', not a hash')
end
if bucket == '' and name == '' then return { 'OK', 0, record_if_even() } end
if not is_uint(bucket) or not name or name == '' then return badarg('bucket/name malformed') end
if not is_uint(offset) or not is_uint(count) then return badarg('offset/count malformed') end
count = tonumber(count)
if count < 1 or count > 1000 then return badarg('count out of range') end
local index = root .. 'ix:pending:' .. bucket .. ':' .. name
local ids, kind = try_read('ZRANGE', index, offset, tonumber(offset) + count - 1)
if not ids then return corrupt(index, '', 'index holds a ' .. kind .. ', not a sorted set') end
local rq, dq = root .. 'rq:' .. bucket .. ':' .. name, root .. 'dq:' .. bucket .. ':' .. name
for _, id in ipairs(ids) do
  local key = root .. 't:' .. id
  local view, bad = read_index_view(key)
  if not view then return bad end
  local queued = try_read('ZSCORE', rq, id) or try_read('ZSCORE', dq, id)
    or is_parked(root, id, view)
  if view.s == 'pending' and not queued then queue_add(root, id, view) end
end
local broken = index_check()
if broken then return broken end
for _, key in ipairs({ root .. 'rh:' .. name, root .. 'dh:' .. name }) do
  local heads_kind = key_type(key)
  if heads_kind ~= 'none' and heads_kind ~= 'zset' then
    return corrupt(key, '', 'queue heads hold a ' .. heads_kind .. ', not a sorted set')
  end
end
index_flush()
queue_sync(rq, root .. 'rh:' .. name, bucket) -- the heads, even of queues written before them
queue_sync(dq, root .. 'dh:' .. name, bucket)
local recorded = 0
if last == '1' and #ids < count then recorded = record_if_even() end
return { 'OK', #ids, recorded }

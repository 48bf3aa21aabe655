-- lib/indexes: the secondary indexes and counters of a task, kept in step with its hash.
-- Every script that writes a task (create, save, prune) goes through these functions, so the
-- indexes can never disagree with the task. Index keys are derived from `root` (the
-- namespace's '{ns}:' prefix, passed by the caller as a KEY), in the same spelling as
-- stores/_redis/keys.py, so they share the namespace's slot.
--
-- `t` is a task's index view (lib/task_view).
--- @include "lib/common"
--- @include "lib/task_view"
--- @include "lib/limits"

-- One composite index entry per task, {ns}:ix:<status>:<bucket>:<name>, serves the status,
-- bucket, name and name-prefix filters together (queries union the combinations they need);
-- a separate index per field would cost a sorted-set entry (~120 bytes) per task each.
-- {ns}:nm:<status>:<bucket> (name -> count) lists the names present in each combination, so
-- a query finds the index keys it must merge without any scan. There is no separate list of
-- terminal tasks: prune merges the composite index keys of the four terminal statuses.

-- The start order is kept apart from the query index (which is by created_at): every PENDING
-- task is in exactly one of {ns}:rq:<bucket>:<name> (due: score start_score, lowest starts
-- first) or {ns}:dq:<bucket>:<name> (has a not_before: score not_before in us). start_tasks
-- moves the dq entries that came due into rq (promote_due), so a task that is not yet due
-- never stands in front of a due one, however many there are.

-- The functions below only *plan*: index_add / index_move / index_remove record the sorted-set
-- changes (INDEX_OPS) and sum the counter changes per (key, field) (COUNT_DELTAS); nothing is
-- written until index_flush. A script plans every task's changes in its read pass, then calls
-- index_check, which reports a key of the wrong type or a counter that is not an integer
-- (written by another client) as CORRUPT before the first write — a Lua script is not rolled
-- back, so a failure halfway would leave tasks without their indexes or counters — and only
-- then writes, index_flush included. Counters are written once per (key, field): a batch of
-- 100 starts moves four counters 100 times each but writes each once.
local COUNT_DELTAS, COUNT_KEYS, INDEX_OPS = {}, {}, {}
-- The start queues written (key -> { heads = its heads key, bucket }), in first-written order.
local QUEUES, QUEUE_KEYS = {}, {}

local function count_add(key, field, delta)
  local fields = COUNT_DELTAS[key]
  if not fields then
    fields = {}
    COUNT_DELTAS[key] = fields
    COUNT_KEYS[#COUNT_KEYS + 1] = key
  end
  fields[field] = (fields[field] or 0) + delta
end

local function count_up(key, field) count_add(key, field, 1) end
local function count_down(key, field) count_add(key, field, -1) end

local ZADD, ZREM = 'ZADD', 'ZREM'
local function zadd(key, score, id) INDEX_OPS[#INDEX_OPS + 1] = { ZADD, key, score, id } end
local function zrem(key, id) INDEX_OPS[#INDEX_OPS + 1] = { ZREM, key, id } end

-- CORRUPT for the first planned key or counter another client broke, else nil. Reads only.
local function index_check()
  local seen = {}
  for _, op in ipairs(INDEX_OPS) do
    local key = op[2]
    if not seen[key] then
      seen[key] = true
      local kind = key_type(key)
      if kind ~= 'none' and kind ~= 'zset' then
        return corrupt(key, '', 'index holds a ' .. kind .. ', not a sorted set')
      end
    end
  end
  for _, key in ipairs(QUEUE_KEYS) do
    local heads = QUEUES[key].heads
    local kind = key_type(heads)
    if kind ~= 'none' and kind ~= 'zset' then
      return corrupt(heads, '', 'queue heads hold a ' .. kind .. ', not a sorted set')
    end
  end
  for _, key in ipairs(COUNT_KEYS) do
    local fields, names = COUNT_DELTAS[key], {}
    for field in pairs(fields) do names[#names + 1] = field end
    local values, kind = try_read('HMGET', key, unpack(names))
    if not values then return corrupt(key, '', 'counters hold a ' .. kind .. ', not a hash') end
    for i, value in ipairs(names) do
      local v = values[i]
      -- What HINCRBY takes: an integer without leading zeros or '-0'.
      if v and v ~= '0' and not (#v <= 18 and string.match(v, '^%-?[1-9]%d*$')) then
        return corrupt(key, value, 'counter is not an integer')
      end
    end
  end
  return limits_check()
end

-- Per task name, the head of each bucket's start queue: {ns}:rh:<name> (member bucket, score
-- the lowest score of rq:<bucket>:<name>) and {ns}:dh:<name> (the earliest not_before of
-- dq:<bucket>:<name>). A start call reads one of each per name instead of two queues per
-- bucket, and then only the `limit` buckets with the best heads: the first `limit` tasks of
-- the merge come from them. Brought up to date for every queue written (index_flush).
local function queue_sync(key, heads, bucket)
  local head = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if #head == 0 then rcall('ZREM', heads, bucket) else rcall('ZADD', heads, head[2], bucket) end
end

-- Write what was planned: the sorted-set changes in order, then each summed counter once (a
-- counter that reaches 0 is deleted, so a hash of counts lists only what exists; keys in
-- first-planned order: the same call writes the same way).
local function index_flush()
  for _, op in ipairs(INDEX_OPS) do rcall(unpack(op)) end
  for _, key in ipairs(QUEUE_KEYS) do queue_sync(key, QUEUES[key].heads, QUEUES[key].bucket) end
  for _, key in ipairs(COUNT_KEYS) do
    for field, delta in pairs(COUNT_DELTAS[key]) do
      if delta ~= 0 and rcall('HINCRBY', key, field, delta) <= 0 then rcall('HDEL', key, field) end
    end
  end
  limits_flush()
  COUNT_DELTAS, COUNT_KEYS, INDEX_OPS, QUEUES, QUEUE_KEYS = {}, {}, {}, {}, {}
end

-- 2^43 ms (278 years) per priority point: a band holds every ready time, and the highest
-- score, 200 bands, stays below 2^53 (exact as a double and as a zset score).
local PRIORITY_BAND = 8796093022208

-- A due task's rq score: priority bands (higher priority, lower score), within a band the
-- time it became due, max(created_at, not_before), in ms. Equal scores: by task id (Redis).
local function start_score(t)
  local ready = tonumber(t.c)
  if t.nb and tonumber(t.nb) > ready then ready = tonumber(t.nb) end
  return string.format('%.0f', (100 - (tonumber(t.pr) or 0)) * PRIORITY_BAND
    + math.floor(ready / 1000))
end

local function start_queue(root, kind, t) return root .. kind .. ':' .. t.b .. ':' .. t.n end

local function queue_heads(root, kind, name) return root .. (kind == 'rq' and 'rh:' or 'dh:') .. name end

-- The start queue `kind` ('rq' or 'dq') of t's bucket and name, noted for index_flush.
local function written_queue(root, kind, t)
  local key = start_queue(root, kind, t)
  if not QUEUES[key] then
    QUEUES[key] = { heads = queue_heads(root, kind, t.n), bucket = t.b }
    QUEUE_KEYS[#QUEUE_KEYS + 1] = key
  end
  return key
end

-- A PENDING task joins the start order: delayed if it has a not_before (promote_due moves it
-- once due), ready otherwise.
local function queue_add(root, id, t)
  if t.s ~= 'pending' then return end
  local park = t.lm and not t.nb and limits_park_ref(root, t)
  if t.nb then
    zadd(written_queue(root, 'dq', t), t.nb, id)
  elseif park then -- its concurrency ref is full: parked (lib/limits), not ready
    zadd(root .. 'lp:' .. park, start_score(t), id)
    zadd(root .. 'ln:' .. park, 0, id)
    count_up(root .. 'lpc', t.b .. ':' .. t.n)
  else
    zadd(written_queue(root, 'rq', t), start_score(t), id)
  end
end

-- `t.in_rq`: the caller read the entry from its ready queue this call (start_tasks), so the
-- delayed queue is not touched (a stray entry there would be dropped by the promotion, which
-- never starts from an entry that no longer matches its task).
local function queue_remove(root, id, t)
  if t.s ~= 'pending' then return end
  zrem(written_queue(root, 'rq', t), id)
  if not t.in_rq then zrem(written_queue(root, 'dq', t), id) end
  if t.lm then
    if is_parked(root, id, t) then count_down(root .. 'lpc', t.b .. ':' .. t.n) end
    for _, key in ipairs(parked_keys(root, t)) do zrem(key, id) end
  end
end

local function index_add(root, id, t)
  zadd(root .. 'ix:' .. t.s .. ':' .. t.b .. ':' .. t.n, t.c, id)
  count_up(root .. 'nm:' .. t.s .. ':' .. t.b, t.n)
  count_up(root .. 'counts', t.s)
  count_up(root .. 'counts', t.s .. ':' .. t.b)
  if t.p then zadd(root .. 'p:' .. t.p, t.c, id) end
  for i = 1, #t.tags do zadd(root .. 'tag:' .. t.tags[i], t.c, id) end
  queue_add(root, id, t)
  limits_move(root, id, nil, t)
end

local function index_remove(root, id, t)
  zrem(root .. 'ix:' .. t.s .. ':' .. t.b .. ':' .. t.n, id)
  count_down(root .. 'nm:' .. t.s .. ':' .. t.b, t.n)
  count_down(root .. 'counts', t.s)
  count_down(root .. 'counts', t.s .. ':' .. t.b)
  if t.p then zrem(root .. 'p:' .. t.p, id) end
  for i = 1, #t.tags do zrem(root .. 'tag:' .. t.tags[i], id) end
  queue_remove(root, id, t)
  limits_move(root, id, t, nil)
end

local function tag_set(t)
  local set = {}
  for i = 1, #t.tags do set[t.tags[i]] = true end
  return set
end

-- Move a task's index entries from view `old` to view `new`, touching only what differs: a
-- status change moves one composite entry and four counters, not every tag entry.
local function index_move(root, id, old, new)
  limits_move(root, id, old, new)
  local moved_time = old.c ~= new.c
  if old.s ~= new.s or old.b ~= new.b or old.n ~= new.n or moved_time or old.nb ~= new.nb
    or old.pr ~= new.pr then
    queue_remove(root, id, old)
    queue_add(root, id, new)
  end
  if old.s ~= new.s or old.b ~= new.b or old.n ~= new.n or moved_time then
    zrem(root .. 'ix:' .. old.s .. ':' .. old.b .. ':' .. old.n, id)
    count_down(root .. 'nm:' .. old.s .. ':' .. old.b, old.n)
    zadd(root .. 'ix:' .. new.s .. ':' .. new.b .. ':' .. new.n, new.c, id)
    count_up(root .. 'nm:' .. new.s .. ':' .. new.b, new.n)
  end
  if old.s ~= new.s then
    count_down(root .. 'counts', old.s)
    count_up(root .. 'counts', new.s)
  end
  if old.s ~= new.s or old.b ~= new.b then
    count_down(root .. 'counts', old.s .. ':' .. old.b)
    count_up(root .. 'counts', new.s .. ':' .. new.b)
  end
  if old.p ~= new.p or moved_time then
    if old.p then zrem(root .. 'p:' .. old.p, id) end
    if new.p then zadd(root .. 'p:' .. new.p, new.c, id) end
  end
  if old.g ~= new.g or moved_time then
    local keep, had = tag_set(new), tag_set(old)
    for tag in next, had do
      if not keep[tag] or moved_time then zrem(root .. 'tag:' .. tag, id) end
    end
    for tag in next, keep do
      if not had[tag] or moved_time then zadd(root .. 'tag:' .. tag, new.c, id) end
    end
  end
end

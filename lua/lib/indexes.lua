-- lib/indexes: the secondary indexes and counters of a task, kept in step with its hash.
-- Every script that writes a task (create, save, prune) goes through these functions, so the
-- indexes can never disagree with the task. Index keys are derived from `root` (the
-- namespace's '{ns}:' prefix, passed by the caller as a KEY), in the same spelling as
-- stores/_keys.py, so they share the namespace's slot.
--
-- A task's index view `t` is { s = status, b = bucket, c = created_at (us), n = name,
-- p = pipeline id or nil, g = tags JSON, tags = { tag, ... } }.
--
-- Requires lib/common.

local function decode_tags(text)
  local ok, tags = pcall(cjson.decode, text)
  if not ok or type(tags) ~= 'table' then return nil end
  for i = 1, #tags do
    if type(tags[i]) ~= 'string' or tags[i] == '' then return nil end
  end
  return tags
end

-- The index view of a stored task hash, or (nil, corrupt reply) if it does not decode.
local function read_index_view(key)
  local v = rcall('HMGET', key, 's', 'b', 'c', 'n', 'p', 'g')
  local t = { s = v[1], b = v[2], c = v[3], n = v[4], p = v[5] or nil, g = v[6] }
  if not t.s or not STATUSES[t.s] then return nil, corrupt(key, 's', 'unknown or missing status') end
  if not is_uint(t.b) then return nil, corrupt(key, 'b', 'bucket is not a canonical integer') end
  if not is_uint(t.c) then return nil, corrupt(key, 'c', 'created_at is not a canonical integer') end
  if not t.n or t.n == '' then return nil, corrupt(key, 'n', 'name is missing') end
  if t.p == false then t.p = nil end
  t.tags = decode_tags(t.g or '[]')
  if not t.tags then return nil, corrupt(key, 'g', 'tags are not a JSON array of strings') end
  return t, nil
end

local function index_add(root, id, t)
  rcall('ZADD', root .. 'sb:' .. t.s .. ':' .. t.b, t.c, id)
  rcall('HINCRBY', root .. 'counts', t.s, 1)
  rcall('HINCRBY', root .. 'counts', t.s .. ':' .. t.b, 1)
  rcall('ZADD', root .. 'n:' .. t.n, t.c, id)
  rcall('ZADD', root .. 'names', 0, t.n)
  if t.p then rcall('ZADD', root .. 'p:' .. t.p, t.c, id) end
  for i = 1, #t.tags do rcall('ZADD', root .. 'tag:' .. t.tags[i], t.c, id) end
  if TERMINAL[t.s] then rcall('ZADD', root .. 'term', t.c, id) end
end

local function counter_down(root, field)
  if rcall('HINCRBY', root .. 'counts', field, -1) <= 0 then
    rcall('HDEL', root .. 'counts', field)
  end
end

local function index_remove(root, id, t)
  rcall('ZREM', root .. 'sb:' .. t.s .. ':' .. t.b, id)
  counter_down(root, t.s)
  counter_down(root, t.s .. ':' .. t.b)
  local name_key = root .. 'n:' .. t.n
  rcall('ZREM', name_key, id)
  if rcall('ZCARD', name_key) == 0 then rcall('ZREM', root .. 'names', t.n) end
  if t.p then rcall('ZREM', root .. 'p:' .. t.p, id) end
  for i = 1, #t.tags do rcall('ZREM', root .. 'tag:' .. t.tags[i], id) end
  if TERMINAL[t.s] then rcall('ZREM', root .. 'term', id) end
end

-- True when the two views index the task differently (so the entries must move).
local function index_view_changed(a, b)
  return a.s ~= b.s or a.b ~= b.b or a.c ~= b.c or a.n ~= b.n or a.p ~= b.p or a.g ~= b.g
end

-- lib/indexes: the secondary indexes and counters of a task, kept in step with its hash.
-- Every script that writes a task (create, save, prune) goes through these functions, so the
-- indexes can never disagree with the task. Index keys are derived from `root` (the
-- namespace's '{ns}:' prefix, passed by the caller as a KEY), in the same spelling as
-- stores/_keys.py, so they share the namespace's slot.
--
-- `t` is a task's index view (lib/task_view).
--- @include "lib/common"
--- @include "lib/task_view"

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

-- lib/create_task: a new task written whole with everything derived from it (its index
-- entries and counters, its unique record, its expiry entry, its change-feed position):
-- create's write, shared with write_schedule (a tick's task, created with the schedule's
-- compare-and-set in one script).
--
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/task_args"
--- @include "lib/dependencies"

-- Plan the create of `args` (lib/task_args, read with allow_lease) at `task_key` and check
-- every key it touches; nothing is written. Returns nil when create_task_write may follow;
-- 'applied' when the key holds this very call's create (a retry), 'exists' when another task
-- has the id; or the refusal that ends the call: {'UNIQUE', holder}, {'MISSING', parent} (a
-- WAITING task's parent does not exist), {'CORRUPT', ...}.
local function create_task_plan(root, task_key, args)
  local kind = key_type(task_key)
  if kind ~= 'none' then
    if kind ~= 'hash' then return corrupt(task_key, '', 'key holds a ' .. kind .. ', not a hash') end
    if created_by(task_key, args.token) then return 'applied' end
    return 'exists'
  end
  local waiting -- the policy view it is created with, when a release follows at once
  if args.view.s == 'waiting' then -- its parents must exist; ended ones may release it now
    local refused, judged, missing = dep_wait_judge(root, args.id, args.dp, args.df)
    if refused then return refused end
    if missing then
      local holder, bad = dep_unique_holder(root, args.id, args.policy)
      if bad then return bad end
      if holder then return { 'UNIQUE', holder } end
      return { 'MISSING', missing }
    end
    args.judged = judged
    if judged.to then
      waiting = { s = 'waiting', u = args.policy.u, uq = args.policy.uq, rn = args.policy.rn }
      args.released = dep_released_create(judged, args.version)
      args.view.s, args.policy.s, args.policy.u = judged.to, judged.to, args.released.u
    end
  end
  local holder, bad
  if waiting then
    holder, bad = dep_released_unique(root, args.id, waiting, args.policy)
  else
    holder, bad = unique_plan(root, args.id, nil, args.policy)
  end
  if bad then return bad end
  if holder then return { 'UNIQUE', holder } end
  index_add(root, args.id, args.view)
  expiry_move(root, args.id, nil, args.policy)
  if args.judged then dep_wait_link(root, args.id, args.judged, args.policy) end
  args.position = feed_next(root, nil, args.id)
  return dep_check() or index_check() or feed_check(root)
end

-- Write what create_task_plan planned; publishes '1' on {ns}:nudge:work (idle workers wake;
-- best effort: an ACL that denies the channel leaves the write as it is).
local function create_task_write(root, task_key, args)
  rcall('HSET', task_key, 'w', args.token, 'ct', args.token, 'fs', args.position,
    unpack(ARGV, args.from, args.to))
  local r = args.released
  if r then
    rcall('HSET', task_key, 's', r.s, 'v', r.v, 'u', r.u)
    rcall('ZADD', root .. 'h:' .. args.id, r.v, r.entry)
  end
  index_flush()
  unique_flush()
  feed_flush(root)
  dep_flush()
  redis.pcall('PUBLISH', root .. 'nudge:work', '1')
end

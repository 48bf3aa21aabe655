#!lua
--[[ create: write a new task, with its indexes and counters, unless the id exists.

KEYS[1]  {ns}:t:<id>   the task hash
KEYS[2]  {ns}:         the namespace root; index keys are derived from it (lib/indexes)
ARGV     lib/task_args layout; ARGV[3] (expected version) is ''

Replies
  {'OK'}             created
  {'OK', 'APPLIED'}  the key holds this very call's token (in 'w', or in 'ct', which keeps the
                     creating call's token after later writes change 'w'): a retried create
                     that already ran
  {'EXISTS'}         another task has the id; nothing written
  {'UNIQUE', holder}  an unfinished task with another id holds the snapshot's unique id
                     (lib/policies); nothing written
  {'CORRUPT', key, field, detail}  the key exists but is not a task hash; nothing written
  {'BADARG', detail}

Publishes '1' on the channel {ns}:nudge:work when it created the task (idle workers wake;
best effort: an ACL that denies the channel leaves the write as it is).
Invariants: never overwrites; every index entry, the task's change-feed position (lib/feed),
its unique record and its expiry entry (lib/policies) are written with the hash, or nothing
is. A retry of this very create finds its token first, so its own unique record is never a
conflict.
Bound: O(number of tags) commands.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/task_args"

local task_key, root = KEYS[1], KEYS[2]
local args, err = read_task_args(true) -- a new task carries its lease, if any
if not args then return err end
if task_key ~= root .. 't:' .. args.id then return badarg('KEYS[1] is not the key of ARGV[1]') end

local kind = key_type(task_key)
if kind ~= 'none' then
  if kind ~= 'hash' then return corrupt(task_key, '', 'key holds a ' .. kind .. ', not a hash') end
  if created_by(task_key, args.token) then return { 'OK', 'APPLIED' } end
  return { 'EXISTS' }
end

-- Plan the unique record, index, counter, expiry and feed changes and check every key they
-- touch; then write.
local holder, bad = unique_plan(root, args.id, nil, args.policy)
if bad then return bad end
if holder then return { 'UNIQUE', holder } end
index_add(root, args.id, args.view)
expiry_move(root, args.id, nil, args.policy)
local position = feed_next(root, nil, args.id)
bad = index_check() or feed_check(root)
if bad then return bad end

rcall('HSET', task_key, 'w', args.token, 'ct', args.token, 'fs', position,
  unpack(ARGV, args.from, args.to))
index_flush()
unique_flush()
feed_flush(root)
redis.pcall('PUBLISH', root .. 'nudge:work', '1') -- idle workers wake (best effort: ACL)
return { 'OK' }

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
  {'MISSING', parent}  a WAITING task names a parent that does not exist; nothing written
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
--- @include "lib/create_task"

local task_key, root = KEYS[1], KEYS[2]
local args, err = read_task_args(true) -- a new task carries its lease, if any
if not args then return err end
if task_key ~= root .. 't:' .. args.id then return badarg('KEYS[1] is not the key of ARGV[1]') end

local found = create_task_plan(root, task_key, args)
if found == 'applied' then return { 'OK', 'APPLIED' } end
if found == 'exists' then return { 'EXISTS' } end
if found then return found end
create_task_write(root, task_key, args)
return { 'OK' }

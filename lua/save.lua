#!lua
--[[ save: compare-and-set a task on status_version, moving its index entries if needed.

KEYS[1]  {ns}:t:<id>   the task hash
KEYS[2]  {ns}:         the namespace root; index keys are derived from it (lib/indexes)
ARGV     lib/task_args layout; ARGV[3] is the expected status_version

Replies
  {'OK'}                    written
  {'OK', 'APPLIED'}         the task already holds this call's version and token: a retry of
                            a save that ran (its reply was lost), not a conflict
  {'CONFLICT', actual}      stored version differs ('' when the task does not exist);
                            nothing written
  {'UNIQUE', holder}        the save moves a finished task back to an unfinished status (a
                            retry by hand) and another unfinished task holds its unique id
                            meanwhile; nothing written
  {'WAITINGMOVE', stored}   the save would move the task into WAITING, or out of it to an
                            unfinished status (lib/dependencies); nothing written
  {'CORRUPT', key, field, detail}   the stored task does not decode; nothing written
  {'BADARG', detail}

Invariants: only equality with the expected version is checked (versions may jump); a write
moves the task to the next change-feed position (lib/feed), a retry that finds it applied does
not; never
writes or deletes lease_owner/lease_until ('lo'/'lu'); validates everything before the first
write, because a script is not rolled back on error. The unique record and the expiry entry
(lib/policies) follow the write: a final status lets the unique id go (if the record still
names this task), a move back to an unfinished status takes it again, a final task with a
retention is in {ns}:expiry at updated_at + retention.
A save that ends the task applies that end to its waiting children (lib/dependencies: at most
100, the rest noted for release_dependents), each moved in this script; a save never writes
the parents fields (dp, df: fixed at creation).
Bound: O(number of old + new tags + parents) commands, and at most 100 children judged.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/task_args"
--- @include "lib/dependencies"
--- @include "lib/releases"

local task_key, root = KEYS[1], KEYS[2]
local args, err = read_task_args()
if not args then return err end
if task_key ~= root .. 't:' .. args.id then return badarg('KEYS[1] is not the key of ARGV[1]') end
if not is_uint(args.expect) then return badarg('expected version is not a canonical integer') end

local kind = key_type(task_key)
if kind == 'none' then return { 'CONFLICT', '' } end
if kind ~= 'hash' then return corrupt(task_key, '', 'key holds a ' .. kind .. ', not a hash') end

local stored = rcall('HMGET', task_key, 'v', 'w', 'fs', 'u', 'rn', 'uq', 'dp')
if not is_uint(stored[1]) then
  return corrupt(task_key, 'v', 'status_version is missing or not a canonical integer')
end
if stored[1] ~= args.expect then
  if stored[1] == args.version and stored[2] == args.token then return { 'OK', 'APPLIED' } end
  return { 'CONFLICT', stored[1] }
end
local old, bad = read_index_view(task_key)
if not old then return bad end
local was, field, detail = policy_view(old.s, stored[4], stored[5], stored[6])
if not was then return corrupt(task_key, field, detail) end
if dep_move_refused(old.s, args.view.s) then -- a held unique id is reported first
  local holder, held_bad = dep_unique_holder(root, args.id, args.policy, was)
  if held_bad then return held_bad end
  if holder then return { 'UNIQUE', holder } end
  return { 'WAITINGMOVE', old.s, args.view.s }
end
-- Plan the unique record, index, counter, expiry and feed changes and check every key they
-- touch.
local holder
holder, bad = unique_plan(root, args.id, was, args.policy)
if bad then return bad end
if holder then return { 'UNIQUE', holder } end
expiry_move(root, args.id, was, args.policy)
dep_plan_move(root, args.id, old.s, args.policy, stored[7] or nil)
if index_view_changed(old, args.view) then
  index_move(root, args.id, old, args.view)
end
local position = feed_next(root, stored[3], args.id)
dep_release_queue(root, RELEASE_STEP) -- the waiting children of a task this save ends
bad = dep_check() or index_check() or feed_check(root)
if bad then return bad end

-- All checks passed; from here on only writes.
if #args.dels > 0 then rcall('HDEL', task_key, unpack(args.dels)) end
rcall('HSET', task_key, 'w', args.token, 'fs', position, unpack(ARGV, args.from, args.to))
index_flush()
unique_flush()
feed_flush(root)
dep_flush()
return { 'OK' }

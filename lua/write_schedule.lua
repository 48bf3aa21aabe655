#!lua
--[[ write_schedule: a schedule's compare-and-set, and the task of the tick it fires, in one
step (SchedulesStore.write_schedule).

KEYS[1]  {ns}:schedules   the hash of every schedule: 'v:<id>' its version, 's:<id>' its state
                          (none: deleted, or never made; the version stays, so a writer that
                          read the schedule before a delete cannot write over its successor),
                          'w:<id>' the token of its last write
KEYS[2]  {ns}:t:<task id> the tick's task hash (without a task: {ns}:schedules again)
KEYS[3]  {ns}:            the namespace root (lib/indexes derives the index keys from it)
ARGV[1]  schedule id
ARGV[2]  the new state text (stored as given)
ARGV[3]  the expected version ('0': the schedule must not exist, or be deleted)
ARGV[4]  write token (random per call; a retry of the same call repeats it)
ARGV[5]  '1' when a task follows, else '0'
ARGV[6.. ] the task: lib/task_args layout from position 6 (a create: ARGV[8] is '')

Replies
  {'OK', version, created}  written: the new version; created '1' when the task was
                            created, '0' without a task or when its id existed already (the
                            tick fired before: no second task, the state is written all the same).
                            A retry of this very call (its token is the last write's) answers
                            what the call did, writing nothing
  {'CONFLICT', actual}      the stored version is another ('' when there is no such
                            schedule); nothing written
  {'UNIQUE', holder}        an unfinished task holds the task's unique id; nothing written
  {'MISSING', parent}       the task is WAITING and a parent of it does not exist; nothing
                            written
  {'CORRUPT', key, field, detail}  a stored record does not decode; nothing written
  {'BADARG', detail}

Invariants: the version moves by one per write (and per delete) and only from the expected
one, never back; the task is created in this script or not at all (lib/create_task), so two
callers that fire one tick from one version make one task, and a retried call never a second.
Bound: O(number of tags of the task).
]]
--- @include "lib/create_task"

local schedules, task_key, root = KEYS[1], KEYS[2], KEYS[3]
local id, state, expect, token, has_task = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not id or id == '' then return badarg('schedule id missing') end
if not state then return badarg('state missing') end
if not is_uint(expect) then return badarg('expected version is not a canonical integer') end
if not token or token == '' then return badarg('write token missing') end
if has_task ~= '0' and has_task ~= '1' then return badarg('task flag is not 0 or 1') end
local kind = key_type(schedules)
if kind ~= 'none' and kind ~= 'hash' then
  return corrupt(schedules, '', 'key holds a ' .. kind .. ', not a hash')
end
local args, err
if has_task == '1' then
  args, err = read_task_args(true, 6)
  if not args then return err end
  if task_key ~= root .. 't:' .. args.id then return badarg('KEYS[2] is not the key of the task') end
elseif #ARGV ~= 5 then
  return badarg('arguments after the task flag without a task')
end

local f = rcall('HMGET', schedules, 'v:' .. id, 's:' .. id, 'w:' .. id)
local actual = f[1] or '0'
if not is_uint(actual) then return corrupt(schedules, 'v:' .. id, 'version is not an integer') end
if f[3] == token then -- this very call ran before (its reply was lost): say what it did
  local made = args and key_type(task_key) == 'hash' and created_by(task_key, args.token)
  return { 'OK', actual, made and '1' or '0' }
end
local live = f[2] ~= false
if (expect == '0' and live) or (expect ~= '0' and (not live or actual ~= expect)) then
  return { 'CONFLICT', live and actual or '' }
end

local created = '0'
if args then
  local found = create_task_plan(root, task_key, args)
  if type(found) == 'table' then return found end -- refused: nothing written
  if not found then -- else 'exists' or 'applied': the tick's task is there already
    create_task_write(root, task_key, args)
    created = '1'
  end
end

local version = tostring(tonumber(actual) + 1)
rcall('HSET', schedules, 'v:' .. id, version, 's:' .. id, state, 'w:' .. id, token)
return { 'OK', version, created }

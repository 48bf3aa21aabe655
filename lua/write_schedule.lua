#!lua
--[[ write_schedule: a schedule's compare-and-set, and the task of the tick it fires, in one
step (SchedulesStore.write_schedule).

KEYS[1]  {ns}:schedules   the hash of every schedule: 'v:<id>' its version, 's:<id>' its state
KEYS[2]  {ns}:t:<task id> the tick's task hash (without a task: {ns}:schedules again)
KEYS[3]  {ns}:            the namespace root (lib/indexes derives the index keys from it)
ARGV[1]  schedule id
ARGV[2]  the new state text (stored as given)
ARGV[3]  the expected version ('0': the schedule must not exist)
ARGV[4]  '1' when a task follows, else '0'
ARGV[5.. ] the task: lib/task_args layout from position 5 (a create: ARGV[7] is '')

Replies
  {'OK', version, created}  written: the new version; created '1' when the task was
                            created, '0' without a task or when its id existed already (the
                            tick fired before: no second task, the state is written all the same)
  {'CONFLICT', actual}      the stored version is another ('' when there is no such
                            schedule); nothing written
  {'UNIQUE', holder}        an unfinished task holds the task's unique id; nothing written
  {'CORRUPT', key, field, detail}  a stored record does not decode; nothing written
  {'BADARG', detail}

Invariants: the version moves by one per write and only from the expected one; the task is
created in this script or not at all (lib/create_task), so two callers that fire one tick from
one version make one task.
Bound: O(number of tags of the task).
]]
--- @include "lib/create_task"

local schedules, task_key, root = KEYS[1], KEYS[2], KEYS[3]
local id, state, expect, has_task = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not id or id == '' then return badarg('schedule id missing') end
if not state then return badarg('state missing') end
if not is_uint(expect) then return badarg('expected version is not a canonical integer') end
if has_task ~= '0' and has_task ~= '1' then return badarg('task flag is not 0 or 1') end
local kind = key_type(schedules)
if kind ~= 'none' and kind ~= 'hash' then
  return corrupt(schedules, '', 'key holds a ' .. kind .. ', not a hash')
end

local stored = rcall('HGET', schedules, 'v:' .. id)
local actual = stored or '0'
if not is_uint(actual) then return corrupt(schedules, 'v:' .. id, 'version is not an integer') end
if actual ~= expect then return { 'CONFLICT', stored or '' } end

local created = '0'
if has_task == '1' then
  local args, err = read_task_args(true, 5)
  if not args then return err end
  if task_key ~= root .. 't:' .. args.id then return badarg('KEYS[2] is not the key of the task') end
  local found = create_task_plan(root, task_key, args)
  if type(found) == 'table' then return found end -- refused: nothing written
  if not found then -- else 'exists' or 'applied': the tick's task is there already
    create_task_write(root, task_key, args)
    created = '1'
  end
elseif #ARGV ~= 4 then
  return badarg('arguments after the task flag without a task')
end

local version = tostring(tonumber(actual) + 1)
rcall('HSET', schedules, 'v:' .. id, version, 's:' .. id, state)
return { 'OK', version, created }

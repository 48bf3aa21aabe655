-- lib/task_args: the ARGV layout shared by create, save and commit_tasks, parsed and validated
-- in one place. From position `pos` (1 for create and save):
--
--   ARGV[pos]        task id
--   ARGV[pos + 1]    write token (random per call; a retry of the same call repeats it)
--   ARGV[pos + 2]    expected status_version ('' for create)
--   ARGV[pos + 3]    number of fields to delete, then their names
--   next             field/value pairs to write (short field names of stores/_redis/keys.py): to the
--                    end of ARGV, or (`counted`) preceded by their number
--
--- @include "lib/common"
--- @include "lib/task_view"
--- @include "lib/policies"

local LEASE_FIELDS = { lo = true, lu = true }
-- The fields the script itself needs to see (the index view, the version and the policy
-- view, lib/policies); the others go to HSET straight from ARGV (unpack(ARGV, args.from,
-- args.to)), never copied.
local VIEW_ARGS = { s = true, b = true, c = true, n = true, p = true, g = true, v = true,
                    nb = true, pr = true, u = true, rn = true, uq = true, to = true,
                    lm = true, dp = true, df = true }
-- Fixed at creation (lib/dependencies): a save neither writes nor deletes them.
local PARENT_FIELDS = { dp = true, df = true }

-- Returns (args = { id, token, expect, dels, from, to, view, version, policy, dp, df }, nil,
-- next position)
-- or (nil, badarg reply). The pairs to write are ARGV[from .. to]. Only create passes
-- allow_lease: a new task is written whole, lease included; save never writes or deletes the
-- lease columns.
local function read_task_args(allow_lease, pos, counted)
  pos = pos or 1
  local args = { id = ARGV[pos], token = ARGV[pos + 1], expect = ARGV[pos + 2] }
  if not args.id or args.id == '' then return nil, badarg('task id missing') end
  if not args.token or args.token == '' then return nil, badarg('write token missing') end
  local dels, at = read_list(pos + 3)
  if not dels then return nil, badarg('delete list malformed') end
  local from, to
  if counted then
    local n = ARGV[at]
    if not is_uint(n) or at + 2 * tonumber(n) > #ARGV then
      return nil, badarg('field/value pairs malformed')
    end
    from, to = at + 1, at + 2 * tonumber(n)
  else
    if (#ARGV - at + 1) % 2 ~= 0 then return nil, badarg('field/value pairs malformed') end
    from, to = at, #ARGV
  end
  for i = 1, #dels do
    if LEASE_FIELDS[dels[i]] and not allow_lease then
      return nil, badarg('may not delete lease field ' .. dels[i])
    elseif PARENT_FIELDS[dels[i]] and not allow_lease then
      return nil, badarg('a save may not delete the parents field ' .. dels[i])
    elseif dels[i] == 'w' or dels[i] == 'ct' then -- 'ct' deleted would end the retry check
      return nil, badarg('may not delete the token field ' .. dels[i])
    end
  end
  local map = {}
  for i = from, to, 2 do
    local field = ARGV[i]
    if VIEW_ARGS[field] then
      map[field] = ARGV[i + 1]
    elseif field == 'w' or field == 'ct' then
      return nil, badarg('may not write the token field directly')
    elseif LEASE_FIELDS[field] and not allow_lease then
      return nil, badarg('may not write lease field ' .. field)
    elseif PARENT_FIELDS[field] and not allow_lease then
      return nil, badarg('a save may not write the parents field ' .. field)
    end
  end
  local view = { s = map.s, b = map.b, c = map.c, n = map.n, p = map.p, g = map.g or '[]',
                 nb = map.nb, pr = map.pr, lm = map.lm }
  if not view.s or not STATUSES[view.s] then return nil, badarg('unknown status') end
  if not is_uint(view.b) then return nil, badarg('bucket is not a canonical integer') end
  if not is_uint(view.c) then return nil, badarg('created_at is not a canonical integer') end
  if not is_uint(map.v) then return nil, badarg('status_version is not a canonical integer') end
  if not view.n or view.n == '' then return nil, badarg('name missing') end
  if view.nb and not is_uint(view.nb) then return nil, badarg('not_before malformed') end
  if view.pr == '0' then view.pr = nil end -- 0 is the default, stored as no field
  if not is_priority(view.pr) then return nil, badarg('priority malformed') end
  view.tags = decode_tags(view.g)
  if not view.tags then return nil, badarg('tags are not a JSON array of strings') end
  if map.to and not seconds_of(map.to) then return nil, badarg('timeout malformed') end
  -- The whole task is written (a save deletes the fields that became None), so the policy
  -- view of the arguments is the task's once written.
  local policy = policy_view(view.s, map.u, map.rn, map.uq)
  if not policy then return nil, badarg('retention or updated_at malformed') end
  args.dels, args.from, args.to, args.view, args.version = dels, from, to, view, map.v
  args.policy, args.dp, args.df = policy, map.dp, map.df
  return args, nil, to + 1
end

-- True when the existing task at `key` was written by the call of `token`: its last write
-- ('w'), or its creation ('ct', kept for the task's life). A create whose reply was lost is
-- retried with its token; by then a worker may have started the task and changed 'w', and
-- the retry must still be judged the same create, not a second one (TaskAlreadyExists).
local function created_by(key, token)
  local f = rcall('HMGET', key, 'w', 'ct')
  return f[1] == token or f[2] == token
end

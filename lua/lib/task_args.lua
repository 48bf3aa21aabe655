-- lib/task_args: the ARGV layout shared by create and save, parsed and validated in one place.
--
--   ARGV[1]          task id
--   ARGV[2]          write token (random per call; a retry of the same call repeats it)
--   ARGV[3]          expected status_version ('' for create)
--   ARGV[4]          number of fields to delete, then their names
--   next             field/value pairs to write (short field names of stores/_keys.py)
--
--- @include "lib/common"
--- @include "lib/task_view"

local LEASE_FIELDS = { lo = true, lu = true }

-- Returns args = { id, token, expect, dels, writes, view, version } or (nil, badarg reply).
-- Only create passes allow_lease: a new task is written whole, lease included; save never
-- writes or deletes the lease columns.
local function read_task_args(allow_lease)
  local args = { id = ARGV[1], token = ARGV[2], expect = ARGV[3] }
  if not args.id or args.id == '' then return nil, badarg('task id missing') end
  if not args.token or args.token == '' then return nil, badarg('write token missing') end
  local dels, pos = read_list(4)
  if not dels then return nil, badarg('delete list malformed') end
  local writes, map = read_pairs(pos)
  if not writes then return nil, badarg('field/value pairs malformed') end
  for i = 1, #dels do
    if LEASE_FIELDS[dels[i]] and not allow_lease then
      return nil, badarg('may not delete lease field ' .. dels[i])
    end
  end
  for field in next, map do
    if LEASE_FIELDS[field] and not allow_lease then
      return nil, badarg('may not write lease field ' .. field)
    end
    if field == 'w' then return nil, badarg('may not write the token field directly') end
  end
  local view = { s = map.s, b = map.b, c = map.c, n = map.n, p = map.p, g = map.g or '[]' }
  if not view.s or not STATUSES[view.s] then return nil, badarg('unknown status') end
  if not is_uint(view.b) then return nil, badarg('bucket is not a canonical integer') end
  if not is_uint(view.c) then return nil, badarg('created_at is not a canonical integer') end
  if not is_uint(map.v) then return nil, badarg('status_version is not a canonical integer') end
  if not view.n or view.n == '' then return nil, badarg('name missing') end
  view.tags = decode_tags(view.g)
  if not view.tags then return nil, badarg('tags are not a JSON array of strings') end
  args.dels, args.writes, args.view, args.version = dels, writes, view, map.v
  return args, nil
end

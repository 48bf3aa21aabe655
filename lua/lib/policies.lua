-- lib/policies: the derived state of the task policies (chongming_redis.policy), kept in step
-- with the task hash by the script that moves the task (create, save, commit_tasks, prune,
-- expire_finished), so a unique id can never outlive its holder and an expiry never disagree
-- with the task:
--
--   {ns}:uq:<unique>  string  the id of the unfinished task holding the unique id
--   {ns}:expiry       zset    finished tasks with a retention; score = updated_at + retention
--                             (us), the moment expire_finished may remove them
--
-- A task's policy view `p` is { s = status, u = updated_at (us), rn = retention (seconds, a
-- number) or nil, uq = unique id or nil }, built by policy_view from the hash fields s, u, rn,
-- uq. The reference is stores/_memory_policies.py: the holder of a unique id is the unfinished
-- task whose hash names it, an expiry is updated_at + round(retention * 1e6) of a final task.
--
-- Like lib/indexes, the functions only plan. The expiry entries go through its zadd/zrem, so
-- index_check type-checks {ns}:expiry and index_flush writes it; the unique records go to
-- UNIQUE_OPS, written by unique_flush. Each record is read (and type-checked) while planning,
-- so a record another client broke is CORRUPT before the first write.
--- @include "lib/common"
--- @include "lib/indexes"

local UNIQUE_OPS = {}
-- Named, not quoted in the tables: a quoted capital word opening a table reads as a reply code.
local SET, DEL = 'SET', 'DEL'
-- unique id -> the task its record names once the writes planned so far are made (false: no
-- record). commit_tasks judges each item's unique id after the items before it, as if they
-- were written one by one (the contract: of two creates with one id, the first holds it).
local UNIQUE_NOW = {}

-- Python's round() (half to even): the memory store's rounding of seconds to microseconds,
-- so a deadline or an expiry is the same microsecond on every store.
local function round_even(x)
  local f = math.floor(x)
  local d = x - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
  return f
end

-- A timeout or retention as stored (Python's repr of a float, or an integer): the number of
-- seconds (> 0), or nil when it is not one. tonumber alone would take '0x10' and ' 5'.
local function seconds_of(s)
  if type(s) ~= 'string' then return nil end
  if not (string.match(s, '^%d+%.?%d*$') or string.match(s, '^%d+%.?%d*e[-+]?%d+$')) then
    return nil
  end
  local x = tonumber(s)
  if not x or x <= 0 or x == math.huge then return nil end
  return x
end

-- `us` (a canonical integer string) plus `seconds`, in us: a deadline, an expiry.
local function after_seconds(us, seconds)
  return string.format('%.0f', tonumber(us) + round_even(seconds * 1000000))
end

-- The policy view from the raw field values (nil or false when absent), or (nil, field,
-- detail) when the retention or the updated_at it needs does not decode.
local function policy_view(s, u, rn, uq)
  local p = { s = s, u = u or nil, uq = (uq and uq ~= '') and uq or nil }
  if rn then
    p.rn = seconds_of(rn)
    if not p.rn then return nil, 'rn', 'retention is not a number of seconds' end
    if not is_uint(u) then return nil, 'u', 'updated_at is not a canonical integer' end
  end
  return p
end

local function holds_unique(p) return p ~= nil and p.uq ~= nil and not TERMINAL[p.s] end

-- When a task of view `p` expires (us, as text), or nil: unfinished, or no retention.
local function expiry_of(p)
  if p == nil or p.rn == nil or not TERMINAL[p.s] then return nil end
  return after_seconds(p.u, p.rn)
end

-- Plan the expiry entry of a task written from view `old` (nil: a new task) to `new`.
local function expiry_move(root, id, old, new)
  local before, after = expiry_of(old), expiry_of(new)
  if before == after then return end
  if after then zadd(root .. 'expiry', after, id) else zrem(root .. 'expiry', id) end
end

-- The record of `unique`: (the task it names if that task holds it, the id it names), or
-- (nil, nil, corrupt reply), as the writes planned so far leave it. A record naming a task
-- that is gone, finished or names another unique id holds nothing (only another client leaves
-- one): it is taken over like a free one. A record this call plans names its holder.
local function unique_record(root, unique)
  local planned = UNIQUE_NOW[unique]
  if planned ~= nil then return planned or nil, planned or nil end
  local key = root .. 'uq:' .. unique
  local named, kind = try_read('GET', key)
  if named == nil then
    return nil, nil, corrupt(key, '', 'unique record holds a ' .. kind .. ', not a string')
  end
  if not named then return nil, nil end -- no record
  local f = try_read('HMGET', root .. 't:' .. named, 's', 'uq')
  if f and f[2] == unique and STATUSES[f[1]] and not TERMINAL[f[1]] then return named, named end
  return nil, named
end

-- Plan the record of `unique` to name `id` (false: no record).
local function unique_write(root, unique, id)
  UNIQUE_NOW[unique] = id
  local key = root .. 'uq:' .. unique
  UNIQUE_OPS[#UNIQUE_OPS + 1] = id and { SET, key, id } or { DEL, key }
end

-- Plan the unique records of a write of task `id` from view `old` (nil: a create) to `new`.
-- A create, or a move from a final status back to an unfinished one (a retry by hand), that
-- would give the unique id a second unfinished holder is refused: returns that holder, and
-- nothing is planned. Otherwise the task takes the id when it holds it now (if nobody else
-- does: a save that only renames an unfinished task's unique id never takes another's), and
-- lets go of the one it held when it stops holding it (a final status, another id), if the
-- record still names it. Returns nil, or (nil, corrupt reply).
local function unique_plan(root, id, old, new)
  local take, named = false, nil
  if holds_unique(new) then
    local holder, bad
    holder, named, bad = unique_record(root, new.uq)
    if bad then return nil, bad end
    if holder and holder ~= id then
      if old == nil or TERMINAL[old.s] then return holder end
    else
      take = true
    end
  end
  if holds_unique(old) and not (holds_unique(new) and new.uq == old.uq) then
    local _, was, bad = unique_record(root, old.uq)
    if bad then return nil, bad end
    if was == id then unique_write(root, old.uq, false) end
  end
  if take and named ~= id then
    unique_write(root, new.uq, id)
  elseif take then
    UNIQUE_NOW[new.uq] = id -- its record names it already: the items after it see it held
  end
  return nil
end

-- Plan what goes with a task that is removed (prune, expire_finished): its expiry entry, and
-- the record of its unique id `uq` (nil: none) if that still names it. A CORRUPT reply or nil.
local function policy_remove(root, id, uq)
  zrem(root .. 'expiry', id)
  if not uq then return nil end
  local _, named, bad = unique_record(root, uq)
  if bad then return bad end
  if named == id then unique_write(root, uq, false) end
  return nil
end

-- Write the planned unique records, in order (after every check passed).
local function unique_flush()
  for _, op in ipairs(UNIQUE_OPS) do rcall(unpack(op)) end
  UNIQUE_OPS, UNIQUE_NOW = {}, {}
end

-- lib/dependencies: the derived state of dependencies between tasks (DependenciesStore,
-- chongming_redis/stores/dependency_store.py), kept in step with the task hashes by the
-- script that moves the task (create, save, commit_tasks, release_dependents; prune and
-- expire_finished read it; lib/releases applies the ends). The reference is
-- stores/_memory_dependencies.py; the rule that judges a child is chongming_redis/parents.py
-- release(), mirrored by dep_release below.
--
--   {ns}:dw:<c>  set   the parents of WAITING child c whose end is not applied to it yet
--   {ns}:dd:<p>  set   the WAITING children of p its end is not applied to yet (dw's dual)
--   {ns}:dc:<p>  set   the unfinished children created WAITING with p as a parent: a final
--                      p with any is kept (retention)
--   {ns}:dpin    set   the final tasks whose dc is not empty: prune passes over them, and
--                      they have no {ns}:expiry entry until the last child ends
--   {ns}:drel    zset  ended parents whose end is still to be applied to waiting children
--                      (score: the end, server time in us), oldest first
--   {ns}:dro     hash  parent -> the final status it ended in (beside drel)
--   task hash 'dp'     the parents as a JSON list, 'df' 'run' (absent: 'stop')
--
-- Sets, never counters: SADD/SREM are idempotent, so an edge applied twice cannot count
-- twice. Like lib/indexes, the functions plan: reads go through an overlay of this call's
-- planned set changes (so the items of one call see each other), writes wait for
-- dep_flush; a key of the wrong type is noted (dep_check reports it as CORRUPT before the
-- first write). Task moves made here go through lib/indexes, lib/policies and lib/feed like
-- any write.
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/msgpack_entry"

-- At most this many children are judged by one call (stores/dependency_store.py).
local RELEASE_STEP = 100

local DEP = { ops = {}, sets = {}, cards = {}, bad = nil, writes = {}, moved = {}, items = {},
              queue = {}, at = 1, now = nil, judged = 0, ended = {} }

-- A write planned for dep_flush (a call, not a reply table).
local function dep_op(...) DEP.ops[#DEP.ops + 1] = { ... } end

local function dep_fail(reply) if not DEP.bad then DEP.bad = reply end end

local function dep_now()
  if not DEP.now then
    local t = rcall('TIME')
    DEP.now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  end
  return DEP.now
end

-- The overlay of one set: member -> true/false as planned (nil: as stored).
local function overlay(key)
  local o = DEP.sets[key]
  if not o then
    o = {}
    DEP.sets[key] = o
  end
  return o
end

local function s_has(key, member)
  local planned = overlay(key)[member]
  if planned ~= nil then return planned end
  local found, kind = try_read('SISMEMBER', key, member)
  if found == nil then
    dep_fail(corrupt(key, '', 'key holds a ' .. kind .. ', not a set'))
    return false
  end
  return found == 1
end

local function s_card(key)
  if DEP.cards[key] == nil then
    local n, kind = try_read('SCARD', key)
    if n == nil then
      dep_fail(corrupt(key, '', 'key holds a ' .. kind .. ', not a set'))
      n = 0
    end
    DEP.cards[key] = n
  end
  return DEP.cards[key]
end

local function s_add(key, member)
  if s_has(key, member) then return end
  DEP.cards[key] = s_card(key) + 1
  overlay(key)[member] = true
  dep_op('SADD', key, member)
end

local function s_rem(key, member)
  if not s_has(key, member) then return end
  DEP.cards[key] = s_card(key) - 1
  overlay(key)[member] = false
  dep_op('SREM', key, member)
end

-- Up to `n` members of the set `key` as planned now (stored ones by SSCAN, planned adds).
local function s_some(key, n)
  local found, seen = {}, {}
  for member, present in pairs(overlay(key)) do
    if present and #found < n then
      found[#found + 1] = member
      seen[member] = true
    end
  end
  local cursor = '0'
  repeat
    local reply, kind = try_read('SSCAN', key, cursor, 'COUNT', n)
    if reply == nil then
      dep_fail(corrupt(key, '', 'key holds a ' .. kind .. ', not a set'))
      return found
    end
    cursor = reply[1]
    for _, member in ipairs(reply[2]) do
      if #found >= n then return found end
      if not seen[member] and s_has(key, member) then
        found[#found + 1] = member
        seen[member] = true
      end
    end
  until cursor == '0' or #found >= n
  return found
end

local function parents_of(dp)
  if not dp then return {} end
  local ok, list = pcall(cjson.decode, dp)
  if not ok or type(list) ~= 'table' then return nil end
  return list
end

-- parents.release(): 'pending', 'stopped' or nil (it waits on).
local function dep_release(policy, outcome, unmet)
  if outcome ~= 'succeeded' and policy ~= 'run' then return 'stopped' end
  if unmet == 0 then return 'pending' end
  return nil
end

-- parents.release_reason()
local function dep_reason(to, parent, outcome)
  if to == 'stopped' then return 'parent ' .. parent .. ' ended ' .. outcome end
  return 'parents ended (last: ' .. parent .. ' ' .. outcome .. ')'
end

-- A final task's pin follows its dc set: pinned while it has unfinished children, with no
-- expiry entry meanwhile; `p` is its policy view as it will be written.
local function dep_pin(root, id, p)
  if not TERMINAL[p.s] then
    s_rem(root .. 'dpin', id)
  elseif s_card(root .. 'dc:' .. id) > 0 then
    s_add(root .. 'dpin', id)
    zrem(root .. 'expiry', id)
  elseif s_has(root .. 'dpin', id) then
    s_rem(root .. 'dpin', id)
    local expires = expiry_of(p)
    if expires then zadd(root .. 'expiry', expires, id) end
  end
end

-- The policy view of task `id` as this call leaves it (planned or stored), or nil.
local function planned_policy(root, id)
  local planned = DEP.moved[id] or DEP.items[id]
  if planned then return planned.policy end
  local f = try_read('HMGET', root .. 't:' .. id, 's', 'u', 'rn', 'uq')
  if not f or not f[1] then return nil end
  return policy_view(f[1], f[2], f[3], f[4])
end

-- Task `id` (parents `parents`) stops waiting: its edges go, and a final parent it was the
-- last unfinished child of is unpinned.
local function dep_unlink(root, id, parents)
  dep_op('DEL', root .. 'dw:' .. id)
  DEP.cards[root .. 'dw:' .. id] = 0
  DEP.sets[root .. 'dw:' .. id] = {}
  for _, parent in ipairs(parents) do
    s_rem(root .. 'dd:' .. parent, id)
    s_rem(root .. 'dc:' .. parent, id)
    if s_card(root .. 'dc:' .. parent) == 0 and s_has(root .. 'dpin', parent) then
      local p = planned_policy(root, parent)
      if p then dep_pin(root, parent, p) end
    end
  end
end

-- Task `id` ended (`status`, a final status): noted for its waiting children.
local function dep_note_end(root, id, status)
  if s_card(root .. 'dd:' .. id) == 0 then return end
  dep_op('ZADD', root .. 'drel', dep_now(), id)
  dep_op('HSET', root .. 'dro', id, status)
  DEP.ended[id] = status
  DEP.queue[#DEP.queue + 1] = id
end

-- Whether a save from status `old_s` to `new_s` may not be written (the caller refuses it
-- as WAITINGMOVE): a task enters WAITING only when created, and leaves it for an unfinished
-- status only by a release.
local function dep_move_refused(old_s, new_s)
  local entering = new_s == 'waiting' and old_s ~= 'waiting'
  local leaving = old_s == 'waiting' and new_s ~= 'waiting' and not TERMINAL[new_s]
  return entering or leaving
end

-- Plan what an accepted save of task `id` from status `old_s` to the policy view `policy`
-- does to the edges; `dp` its stored parents field. Plan it after the write's expiry entry.
local function dep_plan_move(root, id, old_s, policy, dp)
  DEP.items[id] = { policy = policy }
  if not TERMINAL[old_s] and TERMINAL[policy.s] then
    if dp then
      local parents = parents_of(dp)
      if parents == nil then
        return dep_fail(corrupt(root .. 't:' .. id, 'dp', 'parents are not a JSON list'))
      end
      dep_unlink(root, id, parents)
    end
    dep_note_end(root, id, policy.s)
  end
  if TERMINAL[old_s] ~= TERMINAL[policy.s] then dep_pin(root, id, policy) end
end

-- The status of task `id` as this call leaves it, or nil if it does not exist.
local function planned_status(root, id)
  local planned = DEP.moved[id] or DEP.items[id]
  if planned then return planned.policy.s end
  local s, kind = try_read('HGET', root .. 't:' .. id, 's')
  if s == nil then
    dep_fail(corrupt(root .. 't:' .. id, '', 'key holds a ' .. kind .. ', not a hash'))
    return nil
  end
  return s or nil
end

-- Judge a WAITING task to be created with the parents `dp` (its JSON field) and the policy
-- `df`; reads only. Returns a refusal (BADARG, CORRUPT), or (nil, nil, a parent that does
-- not exist: the caller refuses the create as MISSING), or (nil, judgement):
-- { parents, statuses, to = the release its ended parents make at once ('pending',
-- 'stopped' or nil: it waits), parent = the one that decided it, outcome = its status }.
local function dep_wait_judge(root, id, dp, df)
  local parents = parents_of(dp)
  if parents == nil or #parents == 0 then
    return badarg('a waiting task needs its parents (dp) as a JSON list')
  end
  local statuses = {}
  for i, parent in ipairs(parents) do
    local s = planned_status(root, parent)
    if not s then return nil, nil, parent end
    statuses[i] = s
  end
  -- Applied in order, as the reference does: each ended parent judged with the parents not
  -- applied yet (the unfinished ones and the ended ones after it) still unmet.
  local j = { parents = parents, statuses = statuses }
  local left = #parents
  for i, parent in ipairs(parents) do
    if TERMINAL[statuses[i]] then
      left = left - 1
      local to = dep_release(df, statuses[i], left)
      if to then
        j.to, j.parent, j.outcome = to, parent, statuses[i]
        break
      end
    end
  end
  return nil, j
end

-- Plan the edges of an accepted create judged `j` (a child stopped at once has none).
local function dep_wait_link(root, id, j, policy)
  DEP.items[id] = { policy = policy }
  if j.to == 'stopped' then return end
  for i, parent in ipairs(j.parents) do
    s_add(root .. 'dc:' .. parent, id)
    if TERMINAL[j.statuses[i]] then
      local p = planned_policy(root, parent)
      if p then dep_pin(root, parent, p) end
    else
      s_add(root .. 'dw:' .. id, parent)
      s_add(root .. 'dd:' .. parent, id)
    end
  end
end

-- The unfinished task other than `id` holding the unique id of the policy view `p` (written
-- over `old`, nil for a create, which holds it already if unfinished with the same id), as
-- the writes planned so far leave it; reads only. A write refused for a missing parent or a
-- move into or out of WAITING reports a held unique id first, as every store judges them.
-- nil, or (nil, corrupt reply).
local function dep_unique_holder(root, id, p, old)
  if not holds_unique(p) or (holds_unique(old) and old.uq == p.uq) then return nil end
  local holder, _, bad = unique_record(root, p.uq)
  if bad then return nil, bad end
  if holder and holder ~= id then return holder end
  return nil
end

-- The unique records of a create released at once from WAITING (policy view `waiting`) to
-- `released`: its unique id is judged as created WAITING (refused if another holds it, as
-- the reference judges it), then let go by the release if it ends the task. Returns the
-- holder that refuses it, or nil, or (nil, corrupt reply).
local function dep_released_unique(root, id, waiting, released)
  local holder, bad = unique_plan(root, id, nil, waiting)
  if holder or bad then return holder, bad end
  return unique_plan(root, id, waiting, released)
end

-- The history entry and the fields of a create released at once (judged `j`): the task is
-- written at `version` + 1 in status j.to, updated now.
local function dep_released_create(j, version)
  local now = dep_now()
  local next_version = string.format('%d', tonumber(version) + 1)
  local entry = history_entry(tonumber(next_version), 'W', j.to == 'pending' and 'P' or 'X',
                              tonumber(now), dep_reason(j.to, j.parent, j.outcome))
  return { s = j.to, v = next_version, u = now, entry = entry }
end

-- CORRUPT for the first dependency key another client broke, else nil.
local function dep_check() return DEP.bad end

-- Write what was planned: the children's hashes and history entries, then the set changes.
-- (The index, expiry, unique and feed changes are flushed by their own libraries.)
local function dep_flush()
  for _, w in ipairs(DEP.writes) do
    rcall('HSET', w.key, 's', w.s, 'v', w.version, 'u', w.u, 'fs', w.position, 'w', 'release')
    rcall('ZADD', w.history, w.version, w.entry)
  end
  for _, op in ipairs(DEP.ops) do rcall(unpack(op)) end
  DEP = { ops = {}, sets = {}, cards = {}, bad = nil, writes = {}, moved = {}, items = {},
          queue = {}, at = 1, now = nil, judged = 0, ended = {} }
end

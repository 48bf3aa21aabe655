-- lib/releases: applying a parent's end to its waiting children (DependenciesStore,
-- chongming_redis/stores/dependency_store.py), planned like every change of lib/dependencies
-- (whose sets, overlay and dep_flush it uses): commit_tasks and save after each write that ends
-- a task, release_dependents for the ends left over. The reference is
-- stores/_memory_dependencies.py (_apply, _release_from); a child moved here is a write of its
-- own: version one up, history entry, feed position, indexes, expiry, unique record.
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/msgpack_entry"
--- @include "lib/task_view"
--- @include "lib/dependencies"

-- Item `id` of this call is written WAITING: its index view, version, feed position, parents
-- and policy fields as written, so that a later item's end releases it in this same call (as
-- the reference does: the items apply in order).
local function dep_item_waiting(id, view, version, position, dp, df)
  DEP.items[id].waiting = { view = view, v = version, fs = position, dp = dp or nil,
                            df = df or nil }
end

-- Child `id` as this call has it so far: { view, v, fs, dp, df, was } (an item of this call
-- written WAITING, else the stored hash), false if it is gone, or (nil, corrupt reply).
local function dep_child(root, id)
  local item = DEP.items[id]
  if item then
    local w = item.waiting
    if not w then return { view = { s = item.policy.s } } end -- written, not WAITING
    return { view = w.view, v = w.v, fs = w.fs, dp = w.dp, df = w.df, was = item.policy }
  end
  local key = root .. 't:' .. id
  local f, kind = try_read('HMGET', key, 'v', 'fs', 'dp', 'df', 'u', 'rn', 'uq', 'lm',
                           's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr')
  if not f then return nil, corrupt(key, '', 'key holds a ' .. kind .. ', not a hash') end
  if not f[9] then return false end -- gone (another client)
  local view, bad = index_view_of(key, f, 9, f[8])
  if not view then return nil, bad end
  if view.s ~= 'waiting' then return { view = view } end
  if not is_uint(f[1]) then
    return nil, corrupt(key, 'v', 'status_version is missing or not a canonical integer')
  end
  local was, field, detail = policy_view(view.s, f[5], f[6], f[7])
  if not was then return nil, corrupt(key, field, detail) end
  return { view = view, v = f[1], fs = f[2], dp = f[3] or nil, df = f[4] or nil, was = was }
end

-- Apply `parent`'s end (`outcome`) to child `id`; plans the child's move when it is released
-- (a write of its own: version one up, history entry, feed position, indexes, expiry, unique
-- record). The child may be an item of this very call, written before this end.
local function dep_apply(root, parent, outcome, id)
  local key = root .. 't:' .. id
  s_rem(root .. 'dd:' .. parent, id)
  if DEP.moved[id] then -- moved by this call already: only the edge goes
    s_rem(root .. 'dw:' .. id, parent)
    return
  end
  local child, bad = dep_child(root, id)
  if bad then return dep_fail(bad) end
  if not child then return end
  s_rem(root .. 'dw:' .. id, parent)
  if child.view.s ~= 'waiting' then return end
  local to = dep_release(child.df, outcome, s_card(root .. 'dw:' .. id))
  if not to then return end
  local now = dep_now()
  local new = {}
  for k, v in pairs(child.view) do new[k] = v end
  new.s = to
  local policy = {}
  for k, v in pairs(child.was) do policy[k] = v end
  policy.s, policy.u = to, now
  local _, unique_bad = unique_plan(root, id, child.was, policy)
  if unique_bad then return dep_fail(unique_bad) end
  expiry_move(root, id, child.was, policy)
  index_move(root, id, child.view, new)
  local version = string.format('%d', tonumber(child.v) + 1)
  local position = feed_next(root, child.fs, id)
  local code = to == 'pending' and 'P' or 'X'
  local entry = history_entry(tonumber(version), 'W', code, tonumber(now),
                              dep_reason(to, parent, outcome))
  DEP.writes[#DEP.writes + 1] = { key = key, history = root .. 'h:' .. id, version = version,
                                  s = to, u = now, position = position, entry = entry }
  DEP.moved[id] = { policy = policy, version = version }
  if to == 'stopped' then
    local parents = parents_of(child.dp)
    if parents == nil then return dep_fail(corrupt(key, 'dp', 'parents are not a JSON list')) end
    dep_unlink(root, id, parents)
    dep_note_end(root, id, to)
    dep_pin(root, id, policy)
  end
end

-- The version a task moved by this call's releases is written at, or nil: a later item of
-- the call that names it conflicts (its version was judged before the release).
local function dep_moved_version(id)
  local moved = DEP.moved[id]
  return moved and moved.version
end

-- Apply the noted ends in DEP.queue (this call's; release_dependents queues drel's first),
-- judging at most `budget` children per call in all; a parent whose every child is judged
-- leaves drel. Called after each item of a call (the items apply in order), it goes on where
-- the previous call stopped.
local function dep_release_queue(root, budget)
  while DEP.at <= #DEP.queue and DEP.judged < budget and not DEP.bad do
    local parent = DEP.queue[DEP.at]
    local outcome = DEP.ended[parent]
    local dd = root .. 'dd:' .. parent
    local before = DEP.judged
    for _, child in ipairs(s_some(dd, budget - DEP.judged)) do
      dep_apply(root, parent, outcome, child)
      DEP.judged = DEP.judged + 1
      if DEP.judged >= budget or DEP.bad then break end
    end
    if s_card(dd) == 0 then
      dep_op('ZREM', root .. 'drel', parent)
      dep_op('HDEL', root .. 'dro', parent)
      DEP.at = DEP.at + 1
    elseif DEP.judged == before then
      DEP.at = DEP.at + 1 -- a count the scan does not find (another client): left in drel
    end
  end
end

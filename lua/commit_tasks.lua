#!lua
--[[ commit_tasks: save several tasks and append their history, in one round trip.

The runtime's write-through: each item is a `save` (compare-and-set on status_version, never
the lease columns) plus the history entries of the transitions it makes — or, when its expected
version is '', a `create` (refused if the id exists) plus its entries, so a submitted task and
its first history entry land together. Items are independent: one item's conflict does not stop
the others.

KEYS[1]  {ns}:   the namespace root; task, history and index keys are derived from it
KEYS[2]  {ns}:counts  the counters; declared beside the root (a key that never exists) so that
                      Redis Cluster refuses the call (TRYAGAIN) while the namespace's slot
                      migrates, never runs it on a half-moved slot (docs/redis-layout.md)
ARGV[1]  number of items; then per item:
         the lib/task_args layout (counted pairs), then the number of history entries, then
         (version, encoded entry) per entry

Replies
  {'OK', code1, actual1, code2, actual2, ...}   one (code, actual) pair per item, in order;
        actual is '' but for a CONFLICT
  {'CORRUPT', key, field, detail}   an item's stored task or history does not decode; nothing
        written for any item
  {'BADARG', detail}
  item 'OK'         written
  item 'APPLIED'    this call's token is already there ('w', or 'ct' for a create, which a
                    worker's later write does not change): a retry (history entries still
                    missing are added)
  item 'CONFLICT'   actual = the stored version ('' if the task does not exist), or the
                    version an end earlier in the call released the task at; nothing
                    written for the item
  item 'EXISTS'     a create whose id is taken; nothing written for the item
  item 'MISSING'    actual = a parent of the item (a WAITING create) that does not exist,
                    stored or created by an item before it; nothing written for the item
  item 'WAITINGMOVE'  actual = the stored status: the item would move the task into
                    WAITING, or out of it to an unfinished status (lib/dependencies);
                    nothing written for the item
  item 'UNIQUE'     actual = the id of the unfinished task holding the item's unique id: a
                    create, or a move from a final status back to an unfinished one, that
                    would give the id a second holder, judged after the items before it (an
                    earlier item may take the id, or let it go); nothing written for the item

Publishes '1' on the channel {ns}:nudge:work when the call created a task (idle workers wake;
best effort: an ACL that denies the channel leaves the writes as they are).
Every key the writes touch (task, history, index, counter and feed keys) is checked in the read
pass, so a key another client broke is CORRUPT with nothing written, never a half-done call.
Invariants: a task appears at most once per call (each item's version is judged against the
state before the call, its unique id after the items before it, in order); as save and append; each written item moves to the next change-feed position
(lib/feed), in item order; the unique records and the expiry entries (lib/policies) follow
each written item, as in create and save; all validation happens before the first write.
Dependencies (lib/dependencies): an item that ends a task applies that end to its waiting
children before the next item is judged (a child written by an earlier item included; a later
item naming a child so moved conflicts), at most 100 children per call (each moved as a write of its own: version, history
entry, feed position, indexes), the rest noted in {ns}:drel for release_dependents; a WAITING
create is released at once when the parents that ended already allow it (written one version
up, with its entry).
Bound: at most 100 items per call (the caller batches), each O(tags + entries + parents)
commands, and at most 100 children judged.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/task_args"
--- @include "lib/dependencies"
--- @include "lib/releases"

local root = KEYS[1]
if KEYS[2] ~= root .. 'counts' then return badarg('KEYS[2] is not {ns}:counts of KEYS[1]') end
local count = ARGV[1]
if not is_uint(count) or tonumber(count) > 100 then return badarg('item count malformed') end

-- Pass 1: parse and classify every item; no writes.
local items, pos, seen = {}, 2, {}
for i = 1, tonumber(count) do
  local creating = ARGV[pos + 2] == ''
  local args, err, after = read_task_args(creating, pos, true)
  if not args then return err end
  if not creating and not is_uint(args.expect) then return badarg('expected version malformed') end
  local entries, p = {}, after
  local n = ARGV[p]
  if not is_uint(n) then return badarg('entry count malformed') end
  for e = 1, tonumber(n) do
    local version, entry = ARGV[p + 2 * e - 1], ARGV[p + 2 * e]
    if not is_uint(version) or not entry or entry == '' then return badarg('entry malformed') end
    entries[e] = { version = version, entry = entry }
  end
  pos = p + 2 * tonumber(n) + 1
  if seen[args.id] then return badarg('a task appears twice in one call') end
  seen[args.id] = true
  local key = root .. 't:' .. args.id
  local item = { args = args, key = key, entries = entries, code = 'OK', actual = '' }
  if creating then
    item.create = true
    local kind = key_type(key)
    if kind ~= 'none' and kind ~= 'hash' then
      return corrupt(key, '', 'key holds a ' .. kind .. ', not a hash')
    elseif kind == 'hash' then
      item.code = created_by(key, args.token) and 'APPLIED' or 'EXISTS'
    end
  else
    -- One HMGET reads and type-checks the version, the token, the feed position, the index
    -- view and the policy view.
    local f, kind = try_read('HMGET', key, 'v', 'w', 'fs', 's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr',
                             'u', 'rn', 'uq', 'lm', 'dp', 'df')
    if not f then return corrupt(key, '', 'key holds a ' .. kind .. ', not a hash') end
    local released = dep_moved_version(args.id) -- by an end earlier in this call
    if released then
      item.code, item.actual = 'CONFLICT', released
    elseif not f[1] and rcall('EXISTS', key) == 0 then
      item.code = 'CONFLICT'
    elseif not is_uint(f[1]) then
      return corrupt(key, 'v', 'status_version is missing or not a canonical integer')
    elseif f[1] ~= args.expect then
      if f[1] == args.version and f[2] == args.token then
        item.code = 'APPLIED'
      else
        item.code, item.actual = 'CONFLICT', f[1]
      end
    else
      local old, bad = index_view_of(key, f, 4, f[15])
      if not old then return bad end
      local was, field, detail = policy_view(old.s, f[12], f[13], f[14])
      if not was then return corrupt(key, field, detail) end
      item.old, item.was, item.position, item.dp, item.df = old, was, f[3], f[16] or nil,
        f[17] or nil
      if dep_move_refused(old.s, args.view.s) then -- a held unique id is reported first
        local holder, held_bad = dep_unique_holder(root, args.id, args.policy, was)
        if held_bad then return held_bad end
        item.code, item.actual = 'WAITINGMOVE', old.s
        if holder then item.code, item.actual = 'UNIQUE', holder end
      end
    end
  end
  -- A WAITING create: its parents must exist (stored, or created by an item before it);
  -- parents that ended already may release it at once (lib/dependencies). Reads only.
  if item.code == 'OK' and item.create and args.view.s == 'waiting' then
    local refused, judged, missing = dep_wait_judge(root, args.id, args.dp, args.df)
    local holder, bad
    if missing then holder, bad = dep_unique_holder(root, args.id, args.policy) end
    if bad then
      return bad
    elseif holder then
      item.code, item.actual = 'UNIQUE', holder
    elseif missing then
      item.code, item.actual = 'MISSING', missing
    elseif refused then
      return refused
    else
      item.judged = judged
      if judged.to then
        local p = args.policy
        item.waiting = { s = 'waiting', u = p.u, uq = p.uq, rn = p.rn }
        item.released = dep_released_create(judged, args.version)
        args.view.s, args.policy.s, args.policy.u = judged.to, judged.to, item.released.u
      end
    end
  end
  -- Its unique record, judged after the items before it (lib/policies plans them in order).
  if item.code == 'OK' then
    local holder, bad
    if item.waiting then -- created WAITING, released at once (lib/dependencies)
      holder, bad = dep_released_unique(root, args.id, item.waiting, args.policy)
    else
      holder, bad = unique_plan(root, args.id, item.was, args.policy)
    end
    if bad then return bad end
    if holder then item.code, item.actual = 'UNIQUE', holder end
  end
  -- Which entries the history lacks (one ZCOUNT each, which also type-checks the key).
  -- The first entry of a version wins, as if they were added one by one.
  local history, versions = root .. 'h:' .. args.id, {}
  for _, e in ipairs(entries) do
    local logged, hkind = try_read('ZCOUNT', history, e.version, e.version)
    if not logged then
      return corrupt(history, '', 'key holds a ' .. hkind .. ', not a sorted set')
    end
    e.missing = logged == 0 and not versions[e.version]
    versions[e.version] = true
  end
  item.history = history
  -- Plan its index, counter and feed changes (written after every check, in pass 2).
  if item.code == 'OK' then
    expiry_move(root, args.id, item.was, args.policy)
    if item.create and item.judged then
      dep_wait_link(root, args.id, item.judged, args.policy)
    elseif item.create then
      DEP.items[args.id] = { policy = args.policy }
    else
      dep_plan_move(root, args.id, item.old.s, args.policy, item.dp)
    end
  end
  if item.code == 'OK' and item.create then
    index_add(root, args.id, args.view)
    item.new_position = feed_next(root, nil, args.id)
  elseif item.code == 'OK' then
    if index_view_changed(item.old, args.view) then
      index_move(root, args.id, item.old, args.view)
    end
    item.new_position = feed_next(root, item.position, args.id)
  end
  if item.code == 'OK' and args.view.s == 'waiting' then -- an end after it may release it
    dep_item_waiting(args.id, args.view, args.version, item.new_position,
                     item.create and args.dp or item.dp, item.create and args.df or item.df)
  end
  -- The ends this item made: their waiting children, before the next item is judged (as the
  -- reference applies items in order), up to RELEASE_STEP in the whole call.
  dep_release_queue(root, RELEASE_STEP)
  items[i] = item
end
if pos ~= #ARGV + 1 then return badarg('trailing arguments') end
local broken = dep_check() or index_check() or feed_check(root)
if broken then return broken end

-- Pass 2: writes.
local reply = { 'OK' }
for _, item in ipairs(items) do
  local args = item.args
  if item.code == 'OK' then
    if not item.create and #args.dels > 0 then rcall('HDEL', item.key, unpack(args.dels)) end
    rcall('HSET', item.key, 'w', args.token, 'fs', item.new_position,
      unpack(ARGV, args.from, args.to))
    -- A create keeps its token for the task's life (lib/task_args created_by).
    if item.create then rcall('HSET', item.key, 'ct', args.token) end
    local r = item.released -- released at once by parents that had ended (lib/dependencies)
    if r then
      rcall('HSET', item.key, 's', r.s, 'v', r.v, 'u', r.u)
      rcall('ZADD', item.history, r.v, r.entry)
    end
  end
  if item.code == 'OK' or item.code == 'APPLIED' then
    local missing = {}
    for _, e in ipairs(item.entries) do
      if e.missing then
        missing[#missing + 1] = e.version
        missing[#missing + 1] = e.entry
      end
    end
    if #missing > 0 then rcall('ZADD', item.history, unpack(missing)) end
  end
  reply[#reply + 1] = item.code
  reply[#reply + 1] = item.actual
end
index_flush()
unique_flush()
feed_flush(root)
dep_flush()
-- New tasks wake idle workers in the same round trip (the runtime's work nudge). pcall: a user
-- not granted the channel (ACL) still creates; its workers find the task at their next poll.
for _, item in ipairs(items) do
  if item.create and item.code == 'OK' then
    redis.pcall('PUBLISH', root .. 'nudge:work', '1')
    break
  end
end
return reply

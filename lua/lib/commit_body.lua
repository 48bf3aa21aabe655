-- lib/commit_body: the commit of several tasks (commit_tasks.lua's header says what it does,
-- its arguments and replies), as a function, so that commit_start can start tasks after it in
-- the same call. `A`: the index in ARGV of the item count; `stop`: the index of the last
-- argument of the commit. Returns the reply and the number of items that moved a task out of
-- RUNNING (written now, or by the call this one retries).
-- Needs lib/common, lib/indexes, lib/feed, lib/policies, lib/task_args, lib/dependencies,
-- lib/releases.
local function commit_body(root, A, stop)
  local count = ARGV[A]
  if not is_uint(count) or tonumber(count) > 100 then return badarg('item count malformed') end

  -- Pass 1: parse and classify every item; no writes.
  local items, pos, seen = {}, A + 1, {}
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
  if pos ~= stop + 1 then return badarg('trailing arguments') end
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
  -- The slots this call freed: tasks it moved out of RUNNING (commit_start starts as many).
  local freed = 0
  for _, item in ipairs(items) do
    if item.code == 'APPLIED' and not item.create then
      freed = freed + 1
    elseif item.code == 'OK' and item.old and item.old.s == 'running' and item.args.view.s ~= 'running' then
      freed = freed + 1
    end
  end
  return reply, freed
end

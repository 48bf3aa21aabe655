-- lib/start_body: the start of up to `limit` PENDING tasks (start_tasks.lua's header says what
-- it does, its arguments and replies), as a function, so that commit_start can run it after a
-- commit in the same call. `A`: the index in ARGV of its first argument (the owner); `cap`
-- (nil: none): at most that many starts, whatever the limit argument says (0: none).
-- Needs lib/common, lib/indexes, lib/feed, lib/policies, lib/msgpack_entry, lib/limits.
local function start_body(root, memo, A, cap)
  local owner, now, lease_until, limit, token = ARGV[A], ARGV[A + 1], ARGV[A + 2], ARGV[A + 3],
    ARGV[A + 4]
  local memo_ttl = ARGV[A + 5]
  if not owner or owner == '' or not token or token == '' then return badarg('owner/token') end
  for _, v in ipairs({ now, lease_until, limit, memo_ttl }) do
    if not is_uint(v) then return badarg('numeric argument malformed') end
  end
  limit = tonumber(limit)
  if limit < 1 or limit > 100 then return badarg('limit out of range') end
  local buckets, after = read_list(A + 6)
  if not buckets then return badarg('bucket list malformed') end
  local names_wanted = read_list(after)
  if not names_wanted then return badarg('name list malformed') end

  if rcall('EXISTS', memo) == 1 then
    local reply = { 'OK' }
    for _, id in ipairs(rcall('LRANGE', memo, 0, -1)) do
      reply[#reply + 1] = id
      reply[#reply + 1] = rcall('HGETALL', root .. 't:' .. id)
    end
    return reply
  end
  if cap then
    if cap < 1 then return { 'OK' } end
    if cap < limit then limit = cap end
  end

  -- Names: the caller's, or every name with PENDING tasks in these buckets (each once).
  local wanted, names, named = {}, {}, {}
  local function add_name(name)
    if not named[name] then
      named[name] = true
      names[#names + 1] = name
    end
  end
  for _, b in ipairs(buckets) do
    if not is_uint(b) then return badarg('bucket malformed') end
    wanted[b] = true
  end
  for _, name in ipairs(names_wanted) do add_name(name) end
  if #names_wanted == 0 then
    for _, b in ipairs(buckets) do
      for _, name in ipairs(rcall('HKEYS', root .. 'nm:pending:' .. b)) do add_name(name) end
    end
  end

  local function zset_or_none(key)
    local kind = key_type(key)
    if kind ~= 'none' and kind ~= 'zset' then
      return corrupt(key, '', 'start queue holds a ' .. kind .. ', not a sorted set')
    end
  end

  -- Promote: in each bucket whose delayed queue has come due (dh, lib/indexes), its due entries
  -- (up to PROMOTE_MAX, in not_before order; past that many due at once in one queue the rest
  -- wait for the next call) move to rq at their start score. Only derived entries move, each in
  -- step with its task hash; an entry that no longer matches its task (written by an older
  -- version of the store, say) is put right or dropped, never started from.
  -- Due means due by the server's clock and by the caller's (the earlier of the two): a worker
  -- whose clock runs ahead never starts a task early, and the start it records (at `now`) is
  -- never before the task's not_before either.
  local PROMOTE_MAX = 1000
  local server = rcall('TIME')
  local now_us = math.min(tonumber(now), tonumber(server[1]) * 1000000 + tonumber(server[2]))
  local due_by = string.format('%.0f', now_us)
  local function promote(b, name, rh, dh)
    local dq, rq = root .. 'dq:' .. b .. ':' .. name, root .. 'rq:' .. b .. ':' .. name
    local due, kind = try_read('ZRANGEBYSCORE', dq, '-inf', due_by, 'LIMIT', 0, PROMOTE_MAX)
    if not due then return corrupt(dq, '', 'start queue holds a ' .. kind .. ', not a sorted set') end
    local bad = zset_or_none(rq)
    if bad then return bad end
    for _, id in ipairs(due) do
      local view, broken = read_index_view(root .. 't:' .. id)
      if not view and rcall('EXISTS', root .. 't:' .. id) == 1 then return broken end
      rcall('ZREM', dq, id)
      if view and view.s == 'pending' and view.b == b and view.n == name then
        if view.nb and tonumber(view.nb) > now_us then
          rcall('ZADD', dq, view.nb, id) -- its score was not its not_before: put right
        else
          rcall('ZADD', rq, start_score(view), id)
        end
      end
    end
    queue_sync(dq, dh, b)
    queue_sync(rq, rh, b)
  end
  -- Parked tasks (lib/limits): each ref a holder left since the last call gets its oldest parked
  -- tasks back into their ready queue, as many as it has free slots; the ones left behind are
  -- passed over (waiters: ln emptied). Derived entries only, each in step with its task hash.
  local function unpark()
    local freed_key = root .. 'lf'
    local freed, kind = try_read('SMEMBERS', freed_key)
    if not freed then return corrupt(freed_key, '', 'freed refs hold a ' .. kind .. ', not a set') end
    if #freed == 0 then return nil end
    for _, ref in ipairs(freed) do
      local def, bad = limit_def(root, (string.match(ref, '^([^=]*)')))
      if bad then return bad end
      local lp, ln = root .. 'lp:' .. ref, root .. 'ln:' .. ref
      bad = zset_or_none(lp) or zset_or_none(ln)
      if bad then return bad end
      -- an unrecorded (or no longer concurrency) ref parks nothing: all of it goes back
      local room = math.huge
      if def and def.kind == 'concurrency' then
        room = tonumber(def.max) - (tonumber((try_read('SCARD', root .. 'lh:' .. ref))) or 0)
      end
      while room > 0 do
        local head = rcall('ZRANGE', lp, 0, 0)
        if #head == 0 then break end
        local id = head[1]
        rcall('ZREM', lp, id)
        rcall('ZREM', ln, id)
        local view = read_index_view(root .. 't:' .. id)
        if view then parked_count(root, view.b, view.n, -1) end
        if view and view.s == 'pending' then
          local kind_q = (view.nb and tonumber(view.nb) > now_us) and 'dq' or 'rq'
          local q = root .. kind_q .. ':' .. view.b .. ':' .. view.n
          rcall('ZADD', q, kind_q == 'dq' and view.nb or start_score(view), id)
          queue_sync(q, root .. (kind_q == 'dq' and 'dh:' or 'rh:') .. view.n, view.b)
          room = room - 1
        end
      end
      if rcall('EXISTS', lp) == 1 then rcall('DEL', ln) end
    end
    rcall('DEL', freed_key)
    return nil
  end
  do
    local bad = unpark()
    if bad then return bad end
  end
  -- Heads: per name, its queues' heads in score order (ZRANGE pages), the wanted ones kept up to
  -- the cut: the `EXAMINE`-th wanted head's score, ties at the cut included. Pass 1 looks at no
  -- more than EXAMINE candidates of the merge (a candidate its limits refuse is passed over,
  -- and the merge goes on), and the first EXAMINE tasks of the whole merge are in those queues
  -- (a queue whose head is not among the EXAMINE best has EXAMINE better tasks in front of it),
  -- so a call reads a few queues and builds a few entries whatever the number of buckets (a
  -- sort over every bucket's head cost more than the rest of a small call). A cut at `limit`
  -- would be exact only while every candidate starts: a refused head would let a worse task
  -- of its own queue start before a better one in a queue the cut left out.
  local EXAMINE = 2 * limit
  local HEADS_PAGE = 2 * limit + 16
  local heads = {}
  local function wanted_heads(rh, name)
    local kept, cut, from = 0, nil, 0
    while true do
      local raw = rcall('ZRANGE', rh, from, from + HEADS_PAGE - 1, 'WITHSCORES')
      for i = 1, #raw, 2 do
        local score = tonumber(raw[i + 1])
        if cut and score > cut then return end
        if wanted[raw[i]] then
          heads[#heads + 1] = { b = raw[i], n = name, score = score }
          kept = kept + 1
          if kept == EXAMINE then cut = score end
        end
      end
      if #raw < 2 * HEADS_PAGE then return end
      from = from + HEADS_PAGE
    end
  end
  for _, name in ipairs(names) do
    local rh, dh = root .. 'rh:' .. name, root .. 'dh:' .. name
    local bad = zset_or_none(rh)
    if bad then return bad end
    local due, kind = try_read('ZRANGEBYSCORE', dh, '-inf', due_by)
    if not due then return corrupt(dh, '', 'queue heads hold a ' .. kind .. ', not a sorted set') end
    for _, b in ipairs(due) do
      if wanted[b] then
        bad = promote(b, name, rh, dh)
        if bad then return bad end
      end
    end
    wanted_heads(rh, name)
  end
  -- Sources: the queues whose heads are among the EXAMINE best over every name (ties at the
  -- cut included). One name (the common call) needs no sort: its heads came in score order.
  local cut = math.huge
  if #names > 1 and #heads > EXAMINE then
    local scores = {}
    for i, head in ipairs(heads) do scores[i] = head.score end
    table.sort(scores)
    cut = scores[EXAMINE]
  end
  local sources = {}
  for _, head in ipairs(heads) do
    if head.score <= cut then
      sources[#sources + 1] = { rq = root .. 'rq:' .. head.b .. ':' .. head.n, b = head.b,
                                n = head.n, head = head.score, read = false, buf = {}, at = 1,
                                next = 0, done = false }
    end
  end

  -- Candidates: a k-way merge of the sources in start order (score, then id), each read in
  -- chunks when the merge reaches it (a source is read once its head, known from rh, is the
  -- lowest score left: a call reads the queues it takes from, and the ones tied with them),
  -- taken one by one by pass 1: the work per call follows the batch, not the backlog, and one
  -- key's backlog (one queue) can fill the whole batch.
  local chunk = math.max(2, math.ceil(2 * limit / math.max(1, #sources)))
  local function refill(src)
    local raw, kind = try_read('ZRANGE', src.rq, src.next, src.next + chunk - 1, 'WITHSCORES')
    if not raw then return corrupt(src.rq, '', 'start queue holds a ' .. kind .. ', not a sorted set') end
    src.buf, src.at, src.next, src.read = raw, 1, src.next + #raw / 2, true
    src.done = #raw / 2 < chunk
  end
  -- A source's next score: its buffered entry's, its head's while unread; nil once exhausted.
  local function next_score(src)
    if not src.read then return src.head end
    if src.at <= #src.buf then return tonumber(src.buf[src.at + 1]) end
    return nil
  end
  -- Reads every unread source whose head is the lowest score left; true if it read one (the
  -- merge looks again: a head read may differ from rh's, which is derived). Exact while rh is
  -- never above a queue's real head: every write of an rq key syncs its head (queue_sync), so
  -- only a client writing the keys by hand can make an unread queue hide a better task.
  local function read_lowest()
    local low
    for _, src in ipairs(sources) do
      local score = next_score(src)
      if score and (not low or score < low) then low = score end
    end
    local read = false
    for _, src in ipairs(sources) do
      if not src.read and src.head == low then
        local bad = refill(src)
        if bad then return nil, bad end
        read = true
      end
    end
    return read
  end

  local listed = {}
  -- The next candidate of the merge ({ id, source }), or nil when the sources are exhausted;
  -- a CORRUPT reply as the second value.
  local function next_candidate()
    while true do
      local again, bad = read_lowest()
      while again do again, bad = read_lowest() end
      if bad then return nil, bad end
      local best, best_id, best_score
      for _, src in ipairs(sources) do
        if src.read and src.at <= #src.buf then
          local id, score = src.buf[src.at], tonumber(src.buf[src.at + 1])
          if not best or score < best_score or (score == best_score and bytes_less(id, best_id)) then
            best, best_id, best_score = src, id, score
          end
        end
      end
      if not best then return nil end
      best.at = best.at + 2
      if best.at > #best.buf and not best.done then
        local bad = refill(best)
        if bad then return nil, bad end
      end
      if not listed[best_id] then -- a stale entry in a second queue: start a task once
        listed[best_id] = true
        return { id = best_id, source = best }
      end
    end
  end

  -- Pass 1: read and validate the candidates in merge order; pick the ones that may start now.
  -- One HMGET per candidate reads and type-checks the task, one ZCOUNT the history (is the
  -- entry of the new version there?).
  local chosen, stale, parked = {}, {}, {}
  -- Candidate c: chosen, passed over (not due by `now`), or stale; a CORRUPT reply, else nil.
  local function consider(c)
    local key = root .. 't:' .. c.id
    local f = try_read('HMGET', key, 's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr', 'v', 'at', 'fs',
                       'to', 'lm')
    if not f then return corrupt(key, '', 'indexed task is not a hash') end
    local view, bad
    if f[1] or rcall('EXISTS', key) == 1 then view, bad = index_view_of(key, f, 1, f[13]) end
    if bad then return bad end
    local src = c.source
    if not view or view.s ~= 'pending' or view.b ~= src.b or view.n ~= src.n then
      -- An entry that no longer matches its task (left by an older version of the store, say):
      -- derived data, dropped in pass 2, never started from.
      stale[#stale + 1] = c
      return nil
    end
    if not is_uint(f[9]) then return corrupt(key, 'v', 'status_version malformed') end
    if f[10] and not is_uint(f[10]) then return corrupt(key, 'at', 'attempt malformed') end
    local timeout = f[12] and seconds_of(f[12])
    if f[12] and not timeout then return corrupt(key, 'to', 'timeout malformed') end
    local version = tonumber(f[9]) + 1
    local history = root .. 'h:' .. c.id
    local logged = try_read('ZCOUNT', history, version, version)
    if not logged then return corrupt(history, '', 'history is not a sorted set') end
    if view.nb and tonumber(view.nb) > now_us then return nil end
    if view.lm then -- its limits (lib/limits): refused, it stays PENDING as it is
      local admitted, broken, park = limits_admit(root, view.lm, now_us, c.id, f[9])
      if broken then return broken end
      if admitted == nil then return corrupt(key, 'lm', 'limit refs are not a JSON list of strings') end
      if not admitted then
        if park then
          local bad = zset_or_none(root .. 'lp:' .. park) or zset_or_none(root .. 'ln:' .. park)
          if bad then return bad end
          parked[#parked + 1] = { c = c, ref = park, score = start_score(view) }
        end
        return nil
      end
    end
    do
      chosen[#chosen + 1] = { id = c.id, key = key, view = view, version = version,
                              attempt = f[10] or '1', position = f[11], history = history,
                              logged = logged > 0, timeout = timeout }
    end
    return nil
  end
  -- Up to EXAMINE candidates examined (passed over when not due by `now` or refused by their
  -- limits), plus the stale entries met on the way (up to 100 a call; they are dropped, so they
  -- cost a call once; a call that meets some may leave out a queue the cut would have kept,
  -- once: the next call's merge is exact again).
  local examined = 0
  while #chosen < limit and examined < EXAMINE and #stale < 100 do
    local c, broken = next_candidate()
    if broken then return broken end
    if not c then break end
    local before = #stale
    local bad = consider(c)
    if bad then return bad end
    if #stale == before then examined = examined + 1 end
  end

  -- Plan the index, counter and feed changes of the chosen tasks, in start order, and check every
  -- key they touch: a key another client broke is CORRUPT before anything is written.
  for _, c in ipairs(chosen) do
    local running = {}
    for k, v in pairs(c.view) do running[k] = v end
    running.s = 'running'
    c.view.in_rq = true -- it came from its source's ready queue (queue_remove)
    index_move(root, c.id, c.view, running)
    c.new_position = feed_next(root, c.position, c.id)
  end
  local broken = index_check() or feed_check(root)
  if broken then return broken end

  -- Pass 2: writes. Counters and feed chunks are written once for the batch (the flushes).
  local reply, started = { 'OK' }, {}
  for _, c in ipairs(chosen) do
    local fields = { 's', 'running', 'v', string.format('%d', c.version), 'u', now, 'hb', now,
                    'fs', c.new_position, 'lo', owner, 'lu', lease_until, 'w', token }
    if c.timeout then -- this attempt's deadline
      fields[#fields + 1] = 'dl'
      fields[#fields + 1] = after_seconds(now, c.timeout)
    end
    rcall('HSET', c.key, unpack(fields))
    if not c.logged then
      local reason = 'started by ' .. owner .. ' (attempt ' .. c.attempt .. ')'
      rcall('ZADD', c.history, c.version,
        history_entry(c.version, 'P', 'R', tonumber(now), reason))
    end
    started[#started + 1] = c.id
    reply[#reply + 1] = c.id
    reply[#reply + 1] = rcall('HGETALL', c.key)
  end
  index_flush()
  limits_spend_flush(root)
  feed_flush(root)
  for _, c in ipairs(stale) do
    rcall('ZREM', c.source.rq, c.id)
    queue_sync(c.source.rq, root .. 'rh:' .. c.source.n, c.source.b)
  end
  -- Refused by a full concurrency ref: out of the ready queue, parked until a slot frees (and
  -- passed over, so every parked task of the ref is a waiter now).
  for _, p in ipairs(parked) do
    local src = p.c.source
    rcall('ZREM', src.rq, p.c.id)
    rcall('ZADD', root .. 'lp:' .. p.ref, p.score, p.c.id)
    rcall('DEL', root .. 'ln:' .. p.ref)
    parked_count(root, src.b, src.n, 1)
    queue_sync(src.rq, root .. 'rh:' .. src.n, src.b)
  end
  if #started > 0 then
    rcall('RPUSH', memo, unpack(started))
    rcall('PEXPIRE', memo, memo_ttl)
  end
  return reply
end

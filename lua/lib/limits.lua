-- lib/limits: the concurrency holders and token buckets of the limits (chongming_redis.limits),
-- kept in step with the task hash by the script that moves the task (lib/indexes' index_move
-- calls limits_move), and the start-time check start_tasks makes (limits_admit). The
-- reference is stores/_memory_limits.py.
--
--   {ns}:limits       hash  limit id -> definition JSON (limits.to_json), record_limits
--   {ns}:limit-types  hash  task type -> JSON list of its limit ids
--   {ns}:lh:<ref>     set   the ids of the tasks RUNNING or PAUSED whose refs name <ref>
--   {ns}:tb:<ref>     hash  a rate ref's token bucket: tokens, at (us); expires once full
--   {ns}:lw:<ref>     zset  the tasks a start passed over because of <ref>; score = the
--                           version it saw (a later write means the task waits no more:
--                           limit_usage counts only members still PENDING at that version)
--   {ns}:lp:<ref>     zset  a concurrency ref's parked tasks: PENDING, out of their ready queue
--                           while the ref is full (score = their rq score), so a flood of one
--                           ref costs a start call nothing; parked by a write that makes a
--                           task ready while the ref is full or has parked tasks (FIFO), and
--                           by a start that refuses it; start_tasks puts heads back
--   {ns}:ln:<ref>     zset  the parked tasks no start has passed over yet (not waiters yet)
--   {ns}:lf           set   the refs a holder left since the last start (whose parked heads
--                           the next start puts back while there is room)
--   {ns}:lpc          hash  '<bucket>:<name>' -> its parked tasks (upgrade_start_order counts)
--   {ns}:lrefs        set   the refs that may have a holder or a waiter (limit_usage's list;
--                           it drops the empty ones)
--
-- A view's `lm` is the task's refs as stored (a JSON list of strings), nil for none. Only
-- plans, like lib/indexes: LIMIT_OPS is type-checked by limits_check (called by index_check)
-- and written by limits_flush (called by index_flush), so a set another client broke is
-- CORRUPT before the first write.
--- @include "lib/common"

local HOLDING = { running = true, paused = true }
local LIMIT_OPS = {}
local SADD, SREM, ZADD_OP, ZREM_OP = 'SADD', 'SREM', 'ZADD', 'ZREM'

-- The refs of an `lm` value: a list of strings, or nil when it does not decode.
local function refs_of(lm)
  if lm == nil or lm == false then return {} end
  if type(lm) ~= 'string' or not string.match(lm, '^%s*%[') then return nil end
  local ok, refs = pcall(cjson.decode, lm)
  if not ok or type(refs) ~= 'table' then return nil end
  for i = 1, #refs do
    if type(refs[i]) ~= 'string' or refs[i] == '' then return nil end
  end
  return refs
end

local function held_refs(t)
  if not HOLDING[t.s] or not t.lm then return {} end
  return refs_of(t.lm) or {}
end

-- Plan the holder changes of a task moving from view `old` (nil: new) to `new` (nil: gone):
-- a task holds a slot of each of its refs while RUNNING or PAUSED, so leaving those frees it
-- and entering them takes one (never refused: a save or a create is not a start).
local function limits_move(root, id, old, new)
  local had, has = old and held_refs(old) or {}, new and held_refs(new) or {}
  if #had == 0 and #has == 0 then return end
  local keep, was = {}, {}
  for _, ref in ipairs(has) do keep[ref] = true end
  for _, ref in ipairs(had) do
    was[ref] = true
    if not keep[ref] then
      LIMIT_OPS[#LIMIT_OPS + 1] = { SREM, root .. 'lh:' .. ref, id, freed = ref, root = root }
      LIMIT_OPS[#LIMIT_OPS + 1] = { SADD, root .. 'lf', ref }
    end
  end
  for _, ref in ipairs(has) do
    if not was[ref] then
      LIMIT_OPS[#LIMIT_OPS + 1] = { SADD, root .. 'lh:' .. ref, id }
      LIMIT_OPS[#LIMIT_OPS + 1] = { SADD, root .. 'lrefs', ref }
    end
  end
end

local function limits_check()
  local seen = {}
  -- every op's key: holders and the refs registry are sets
  for _, op in ipairs(LIMIT_OPS) do
    local key = op[2]
    if not seen[key] then
      seen[key] = true
      local kind = key_type(key)
      if kind ~= 'none' and kind ~= 'set' then
        return corrupt(key, '', 'limit holders hold a ' .. kind .. ', not a set')
      end
    end
  end
  return nil
end

local function limits_flush()
  for _, op in ipairs(LIMIT_OPS) do rcall(unpack(op)) end
  -- a ref left with no holder, parked task or waiter leaves the registry (limit_usage)
  for _, op in ipairs(LIMIT_OPS) do
    if op.freed then
      local r, ref = op.root, op.freed
      if rcall('EXISTS', op[2], r .. 'lp:' .. ref, r .. 'lw:' .. ref) == 0 then
        rcall('SREM', r .. 'lrefs', ref)
      end
    end
  end
  LIMIT_OPS = {}
end

-- The start-time check (start_tasks). Per call: each limit's definition read once, each ref's
-- holders and bucket once; `taken` counts what this call's admissions took. WAIT_OPS: the
-- waiter changes planned (written by limits_spend_flush, after every check passed).
local LIMIT_DEFS, REF_STATE, BUCKETS, WAIT_OPS, WAIT_CHECKED = {}, {}, {}, {}, {}

-- The waiters key of `ref`, type-checked once per call; or (nil, corrupt reply).
local function waiters_key(root, ref)
  local key = root .. 'lw:' .. ref
  if not WAIT_CHECKED[key] then
    local kind = key_type(key)
    if kind ~= 'none' and kind ~= 'zset' then
      return nil, corrupt(key, '', 'limit waiters hold a ' .. kind .. ', not a sorted set')
    end
    local refs_kind = key_type(root .. 'lrefs')
    if refs_kind ~= 'none' and refs_kind ~= 'set' then
      return nil, corrupt(root .. 'lrefs', '', 'limit refs hold a ' .. refs_kind .. ', not a set')
    end
    WAIT_CHECKED[key] = true
  end
  return key
end

-- The recorded definition of a limit id (a decoded table), false when not recorded; or
-- (nil, corrupt reply).
local function limit_def(root, limit_id)
  local known = LIMIT_DEFS[limit_id]
  if known ~= nil then return known end
  local key = root .. 'limits'
  local text, kind = try_read('HGET', key, limit_id)
  if not text and kind then return nil, corrupt(key, '', 'limits hold a ' .. kind .. ', not a hash') end
  local def = false
  if text then
    local ok, decoded = pcall(cjson.decode, text)
    if not ok or type(decoded) ~= 'table' then return nil, corrupt(key, limit_id, 'definition malformed') end
    def = decoded
  end
  LIMIT_DEFS[limit_id] = def
  return def
end

-- The ref a task made ready must park on (the first concurrency ref that is full or has
-- parked tasks), or nil. Reads only; PARK_PLANNED: the refs this script parks on already.
local PARK_PLANNED = {}
local function limits_park_ref(root, t)
  local refs = t.lm and refs_of(t.lm)
  if not refs then return nil end
  for _, ref in ipairs(refs) do
    local def = limit_def(root, (string.match(ref, '^([^=]*)')))
    if def and def.kind == 'concurrency' then
      if PARK_PLANNED[ref] then return ref end
      local parked = tonumber((try_read('ZCARD', root .. 'lp:' .. ref))) or 0
      local held = tonumber((try_read('SCARD', root .. 'lh:' .. ref))) or 0
      if parked > 0 or held >= tonumber(def.max) then
        PARK_PLANNED[ref] = true
        return ref
      end
    end
  end
  return nil
end

-- The entries a PENDING task with view `t` may have while it waits (lp, ln, lw of each of its
-- refs): dropped when it leaves the start order.
local function parked_keys(root, t)
  local refs, keys = t.lm and refs_of(t.lm) or {}, {}
  for _, ref in ipairs(refs) do
    keys[#keys + 1] = root .. 'lp:' .. ref
    keys[#keys + 1] = root .. 'ln:' .. ref
    keys[#keys + 1] = root .. 'lw:' .. ref
  end
  return keys
end

-- Whether the task is parked on one of its refs (as stored before this script's writes).
local function is_parked(root, id, t)
  local refs = t.lm and refs_of(t.lm) or {}
  for _, ref in ipairs(refs) do
    if try_read('ZSCORE', root .. 'lp:' .. ref, id) then return true end
  end
  return false
end

-- Count a parked task in or out of its (bucket, name) in {ns}:lpc (upgrade_start_order's
-- check that the queues and the parked tasks hold every PENDING task); for the scripts that
-- write lp directly (start_tasks).
local function parked_count(root, b, n, delta)
  local key, field = root .. 'lpc', b .. ':' .. n
  if rcall('HINCRBY', key, field, delta) <= 0 then rcall('HDEL', key, field) end
end

-- A rate ref's tokens at `now_us` and the moment they are counted to (limits.refill: a clock
-- behind the last start refills nothing and never moves that moment back).
local function bucket_now(root, ref, def, now_us)
  local b = BUCKETS[ref]
  if not b then
    local key = root .. 'tb:' .. ref
    local v, kind = try_read('HMGET', key, 'tokens', 'at')
    if not v then return nil, corrupt(key, '', 'token bucket is a ' .. kind .. ', not a hash') end
    b = { key = key, tokens = tonumber(v[1]) or tonumber(def.burst), at = tonumber(v[2]) or now_us,
          dirty = false }
    BUCKETS[ref] = b
  end
  if now_us > b.at then
    local elapsed = (now_us - b.at) / 1e6
    b.tokens = math.min(tonumber(def.burst), b.tokens + elapsed * tonumber(def.rate) / tonumber(def.per))
    b.at = now_us
  end
  return b
end

-- May a task with refs `lm` start now? true (its slots and tokens taken), false and the
-- concurrency ref it parks on (if one refused it) (refused: the
-- refs that refused it are refused for the rest of the call, first come first served), or
-- (nil, corrupt reply). A ref whose limit id is not recorded limits nothing. A refused task
-- (`id` at `version`) becomes a waiter of each ref that refused it; a started one is a waiter
-- of none (limit_usage).
local function limits_admit(root, lm, now_us, id, version)
  local refs = refs_of(lm)
  if not refs then return nil, nil end
  local limited, blocked, park = {}, false, nil
  for _, ref in ipairs(refs) do
    local def, bad = limit_def(root, (string.match(ref, '^([^=]*)')))
    if bad then return nil, bad end
    if def then
      local st = REF_STATE[ref]
      if not st then
        st = { refused = false, taken = 0 }
        if def.kind == 'concurrency' then
          local key = root .. 'lh:' .. ref
          local n, kind = try_read('SCARD', key)
          if not n then return nil, corrupt(key, '', 'limit holders hold a ' .. kind .. ', not a set') end
          st.held = n
        end
        REF_STATE[ref] = st
      end
      local room
      if st.refused then
        room = false
      elseif def.kind == 'concurrency' then
        room = st.held + st.taken < tonumber(def.max)
      else
        local b, broken = bucket_now(root, ref, def, now_us)
        if broken then return nil, broken end
        room = b.tokens >= 1.0
      end
      if not room then
        st.refused, blocked = true, true
        if not park and def.kind == 'concurrency' then park = ref end
        local wkey, broken = waiters_key(root, ref)
        if broken then return nil, broken end
        WAIT_OPS[#WAIT_OPS + 1] = { ZADD_OP, wkey, version, id }
        WAIT_OPS[#WAIT_OPS + 1] = { SADD, root .. 'lrefs', ref }
      end
      limited[#limited + 1] = { ref = ref, def = def, st = st }
    end
  end
  if blocked then return false, nil, park end
  for _, ref in ipairs(refs) do
    local wkey, broken = waiters_key(root, ref)
    if broken then return nil, broken end
    WAIT_OPS[#WAIT_OPS + 1] = { ZREM_OP, wkey, id }
  end
  for _, l in ipairs(limited) do
    if l.def.kind == 'concurrency' then
      l.st.taken = l.st.taken + 1
    else
      local b = BUCKETS[l.ref]
      b.tokens, b.dirty = b.tokens - 1.0, true
    end
  end
  return true
end

-- Write the buckets this call spent from; each expires once it would be full again anyway
-- (a missing bucket is a full one), a second late.
local function limits_spend_flush(root)
  for _, op in ipairs(WAIT_OPS) do rcall(unpack(op)) end
  WAIT_OPS = {}
  for ref, b in pairs(BUCKETS) do
    if b.dirty then
      local def = LIMIT_DEFS[(string.match(ref, '^([^=]*)'))]
      rcall('HSET', b.key, 'tokens', string.format('%.17g', b.tokens), 'at', string.format('%.0f', b.at))
      local full_ms = (tonumber(def.burst) - b.tokens) * tonumber(def.per) / tonumber(def.rate) * 1000
      rcall('PEXPIRE', b.key, string.format('%.0f', math.ceil(full_ms) + 1000))
    end
  end
end

-- lib/limits: the concurrency holders and token buckets of the limits (chongming_redis.limits),
-- kept in step with the task hash by the script that moves the task (lib/indexes' index_move
-- calls limits_move), and the start-time check start_tasks makes (limits_admit). The
-- reference is stores/_memory_limits.py.
--
--   {ns}:limits       hash  limit id -> definition JSON (limits.to_json), record_limits
--   {ns}:limit-types  hash  task type -> JSON list of its limit ids
--   {ns}:lh:<ref>     set   the ids of the tasks RUNNING or PAUSED whose refs name <ref>
--   {ns}:tb:<ref>     hash  a rate ref's token bucket: tokens, at (us); expires once full
--
-- A view's `lm` is the task's refs as stored (a JSON list of strings), nil for none. Only
-- plans, like lib/indexes: LIMIT_OPS is type-checked by limits_check (called by index_check)
-- and written by limits_flush (called by index_flush), so a set another client broke is
-- CORRUPT before the first write.
--- @include "lib/common"

local HOLDING = { running = true, paused = true }
local LIMIT_OPS = {}
local SADD, SREM = 'SADD', 'SREM'

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
    if not keep[ref] then LIMIT_OPS[#LIMIT_OPS + 1] = { SREM, root .. 'lh:' .. ref, id } end
  end
  for _, ref in ipairs(has) do
    if not was[ref] then LIMIT_OPS[#LIMIT_OPS + 1] = { SADD, root .. 'lh:' .. ref, id } end
  end
end

local function limits_check()
  local seen = {}
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
  LIMIT_OPS = {}
end

-- The start-time check (start_tasks). Per call: each limit's definition read once, each ref's
-- holders and bucket once; `taken` counts what this call's admissions took.
local LIMIT_DEFS, REF_STATE, BUCKETS = {}, {}, {}

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

-- May a task with refs `lm` start now? true (its slots and tokens taken), false (refused: the
-- refs that refused it are refused for the rest of the call, first come first served), or
-- (nil, corrupt reply). A ref whose limit id is not recorded limits nothing.
local function limits_admit(root, lm, now_us)
  local refs = refs_of(lm)
  if not refs then return nil, nil end
  local limited, blocked = {}, false
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
      end
      limited[#limited + 1] = { ref = ref, def = def, st = st }
    end
  end
  if blocked then return false end
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
  for ref, b in pairs(BUCKETS) do
    if b.dirty then
      local def = LIMIT_DEFS[(string.match(ref, '^([^=]*)'))]
      rcall('HSET', b.key, 'tokens', string.format('%.17g', b.tokens), 'at', string.format('%.0f', b.at))
      local full_ms = (tonumber(def.burst) - b.tokens) * tonumber(def.per) / tonumber(def.rate) * 1000
      rcall('PEXPIRE', b.key, string.format('%.0f', math.ceil(full_ms) + 1000))
    end
  end
end

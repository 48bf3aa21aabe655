#!lua
--[[ prune: drop the oldest terminal tasks beyond the newest `keep`, with their history, their
command lists ({ns}:tc:<id>; the command hashes themselves stay, readable by id), their expiry
entries and their unique records (lib/policies: a record still naming the task).

KEYS[1]  {ns}:       the namespace root; every key is derived from it: {ns}:counts (the terminal
                     total, and the buckets of each terminal status), {ns}:nm:<st>:<b> (the
                     names), the composite index {ns}:ix:<st>:<b>:<name>, the task, history,
                     command list, change-feed, expiry and unique record keys
KEYS[2]  {ns}:counts  the counters; declared beside the root (a key that never exists) so that
                      Redis Cluster refuses the call (TRYAGAIN) while the namespace's slot
                      migrates, never runs it on a half-moved slot (docs/redis-layout.md)
ARGV[1]  keep: how many of the newest terminal tasks to keep
ARGV[2]  batch: the most tasks this call may drop (the caller loops)

Replies
  {'OK', dropped, still_to_drop}
  {'CORRUPT', key, field, detail}   a candidate or an index key does not decode; nothing written
  {'BADARG', detail}

Order: the terminal tasks are the entries of the composite index keys of succeeded, failed,
stopped and lost; their number is the sum of those four {ns}:counts fields. The keys are merged
oldest first by (created_at, task id in byte order): the order a sorted set keeps ties in, the
order the contract asks for. Each key is read from its start, in chunks (the first
ceil(batch / S) entries, each further chunk twice the last) only as far as the merge takes it.
A final task in {ns}:dpin (an unfinished child depends on it, lib/dependencies) is passed
over and not counted among the terminal tasks.
Invariants: each task is checked to be terminal, and indexed where it was found, inside this
script before it is dropped, so a task saved back to a live status is never dropped; all of a
task's keys go in one call, and its change-feed item becomes a tombstone (lib/feed) at the next
position, stamped with the server's TIME. An index entry whose task hash is gone is dropped with
its counters (and counted as dropped).
Bound: with S the terminal (status, bucket, name) combinations present (at most 4 x buckets x
names): one HGETALL of {ns}:counts, at most 4 x buckets HKEYS, S + log2(batch) x (keys the merge
drains) ZRANGEs fetching at most S + 3 x batch index entries, a heap merge of O(batch x log S),
and at most `batch` tasks dropped (each O(tags) commands).
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"

local root = KEYS[1]
if KEYS[2] ~= root .. 'counts' then return badarg('KEYS[2] is not {ns}:counts of KEYS[1]') end
local keep, batch = ARGV[1], ARGV[2]
if not is_uint(keep) or not is_uint(batch) then return badarg('keep/batch malformed') end
keep, batch = tonumber(keep), tonumber(batch)
if batch < 1 then return badarg('batch must be positive') end

-- The terminal total, and the buckets of each terminal status, from the counters.
local counts_key = root .. 'counts'
local counted, kind = try_read('HGETALL', counts_key)
if not counted then return corrupt(counts_key, '', 'key holds a ' .. kind .. ', not a hash') end
local total, combos = 0, {}
for i = 1, #counted, 2 do
  local field, value = counted[i], counted[i + 1]
  local s, b = string.match(field, '^(%l+):(%d+)$')
  if TERMINAL[field] or (s and TERMINAL[s]) then
    if not is_uint(value) then return corrupt(counts_key, field, 'count is not a canonical integer') end
    if TERMINAL[field] then total = total + tonumber(value) else combos[#combos + 1] = { s, b } end
  end
end

-- A final task an unfinished child depends on ({ns}:dpin, lib/dependencies) is neither
-- dropped nor counted: the newest `keep` are kept among the others.
local pins_key = root .. 'dpin'
local pinned, pkind = try_read('SCARD', pins_key)
if not pinned then return corrupt(pins_key, '', 'key holds a ' .. pkind .. ', not a set') end
total = total - pinned
local excess = total - keep
if excess <= 0 then return { 'OK', 0, 0 } end
local take = math.min(excess, batch)

-- The source keys: every terminal (status, bucket, name) combination.
local sources = {}
for _, combo in ipairs(combos) do
  local s, b = combo[1], combo[2]
  local names_key = root .. 'nm:' .. s .. ':' .. b
  local names, names_kind = try_read('HKEYS', names_key)
  if not names then return corrupt(names_key, '', 'key holds a ' .. names_kind .. ', not a hash') end
  for i = 1, #names do
    sources[#sources + 1] = { key = root .. 'ix:' .. s .. ':' .. b .. ':' .. names[i],
                              s = s, b = b, n = names[i], fetched = 0, size = 0, done = false }
  end
end
if #sources == 0 then return { 'OK', 0, excess } end

-- Read the next chunk of a source (its entries from `fetched` on); false + reply if the key
-- is not a sorted set.
local first_chunk = math.max(1, math.ceil(take / #sources))
local function refill(src)
  src.size = src.size == 0 and first_chunk or math.min(2 * src.size, take)
  local raw, raw_kind = try_read('ZRANGE', src.key, src.fetched, src.fetched + src.size - 1,
                                 'WITHSCORES')
  if not raw then return false, corrupt(src.key, '', 'index holds a ' .. raw_kind .. ', not a sorted set') end
  src.buf, src.at = raw, 1
  src.fetched = src.fetched + #raw / 2
  if #raw / 2 < src.size then src.done = true end
  if #raw > 0 then src.score = tonumber(raw[2]) end
  return #raw > 0
end

-- A binary min-heap of the sources that still have entries, by their current entry.
local function before(x, y)
  if x.score ~= y.score then return x.score < y.score end
  return bytes_less(x.buf[x.at], y.buf[y.at])
end
local heap = {}
local function sift_down(i)
  local n = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and before(heap[l], heap[m]) then m = l end
    if r <= n and before(heap[r], heap[m]) then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]
    i = m
  end
end
for _, src in ipairs(sources) do
  local has, bad = refill(src)
  if bad then return bad end
  if has then heap[#heap + 1] = src end
end
for i = math.floor(#heap / 2), 1, -1 do sift_down(i) end

-- The oldest `take` entries of the merge, each checked before anything is written.
local doomed = {}
while #doomed < take and #heap > 0 do
  local src = heap[1]
  local id = src.buf[src.at]
  local key = root .. 't:' .. id
  local v, task_kind = try_read('HMGET', key, 's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr', 'fs',
                                'uq')
  if not v then return corrupt(key, '', 'key holds a ' .. task_kind .. ', not a hash') end
  if pinned > 0 and rcall('SISMEMBER', pins_key, id) == 1 then
    -- kept for an unfinished child: passed over
  elseif not v[1] and key_type(key) == 'none' then
    -- a dangling index entry: drop it and what it counted, nothing else to remove
    doomed[#doomed + 1] = { id = id, view = { s = src.s, b = src.b, n = src.n, tags = {} } }
  else
    local view, bad = index_view_of(key, v)
    if not view then return bad end
    if not TERMINAL[view.s] then return corrupt(key, 's', 'listed as terminal but is ' .. view.s) end
    for _, f in ipairs({ 's', 'b', 'n' }) do
      if view[f] ~= src[f] then return corrupt(key, f, 'does not match its index ' .. src.key) end
    end
    doomed[#doomed + 1] = { id = id, key = key, view = view, position = v[9], uq = v[10] or nil }
  end
  src.at = src.at + 2
  if src.at <= #src.buf then
    src.score = tonumber(src.buf[src.at + 1])
  else
    local has, bad = false, nil
    if not src.done and #doomed < take then has, bad = refill(src) end
    if bad then return bad end
    if not has then
      heap[1] = heap[#heap]
      heap[#heap] = nil
    end
  end
  if #heap > 0 then sift_down(1) end
end

-- Plan the tombstones and the index and counter changes, and check every key they touch.
local clock = rcall('TIME')
local removed_at = clock[1] .. string.format('%06d', tonumber(clock[2]))
for i = 1, #doomed do
  local d = doomed[i]
  if d.key then feed_tombstone(root, d.position, d.id, d.view, removed_at) end
  index_remove(root, d.id, d.view)
  local bad = policy_remove(root, d.id, d.uq)
  if bad then return bad end
end
local broken = index_check() or feed_check(root)
if broken then return broken end

-- All checks passed; from here on only writes.
for i = 1, #doomed do
  local d = doomed[i]
  if d.key then rcall('DEL', d.key, root .. 'h:' .. d.id, root .. 'tc:' .. d.id) end
end
index_flush()
unique_flush()
feed_flush(root)
return { 'OK', #doomed, excess - #doomed }

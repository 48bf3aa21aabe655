#!lua flags=no-writes
--[[ query: one page of tasks matching a TaskQuery, in created_at order, read-only.

The caller picks the source indexes (the most selective the query names); this script merges
them in (created_at, task_id) order from a cursor, checks every other filter against the task
hash, and returns up to `want` matches. The caller loops on the cursor while the page is full
and the sources are not exhausted, so no single call does unbounded work.

KEYS[1]  {ns}:         the namespace root; index and task keys are derived from it
ARGV[1]  'asc' | 'desc'
ARGV[2]  want: matches to return at most (1..1000)
ARGV[3]  budget: index entries to examine at most (>= want)
ARGV[4]  cursor score ('' to start) -- the last examined entry of the previous page
ARGV[5]  cursor member
ARGV[6]  source kind: 'ix' | 'tag' | 'p'
ARGV[7]  source argument: the tag / pipeline id ('' for 'ix')
ARGV[8]  statuses filter, space-separated ('' = any)
ARGV[9]  buckets filter, space-separated ('' = any)
ARGV[10] name filter ('' = any)
ARGV[11] name_prefix filter ('' = any)
ARGV[12] tag filter ('' = any)
ARGV[13] pipeline filter ('' = any)
ARGV[14] '1' when the sources already imply every filter (skip the per-task check), else '0'

Replies
  {'OK', exhausted (0|1), cursor_score, cursor_member, id1, fields1, id2, fields2, ...}
  {'CORRUPT', key, field, detail} | {'BADARG', detail}

Sources: 'ix' merges the composite index {ns}:ix:<status>:<bucket>:<name> for the filtered
statuses (all seven if none), the filtered buckets (if none: those {ns}:counts lists for the
status) and the filtered name (if none: the names {ns}:nm:<status>:<bucket> lists, narrowed
by the name prefix); 'tag' and 'p' walk one index.
Bound: at most `budget` entries examined per call; ~4000 index entries read up front (one chunk
per source), then one chunk of 32 more for each source the walk uses up.
]]
--- @include "lib/common"
--- @include "lib/task_view"

local root = KEYS[1]
local direction, want, budget = ARGV[1], ARGV[2], ARGV[3]
local cursor_score, cursor_member = ARGV[4], ARGV[5]
local source_kind, source_arg = ARGV[6], ARGV[7]
if direction ~= 'asc' and direction ~= 'desc' then return badarg('direction') end
if not is_uint(want) or not is_uint(budget) then return badarg('want/budget malformed') end
want, budget = tonumber(want), tonumber(budget)
if want < 1 or want > 1000 or budget < want then return badarg('want/budget out of range') end
if cursor_score ~= '' and not is_uint(cursor_score) then return badarg('cursor malformed') end

local function split(text)
  local items = {}
  for item in string.gmatch(text, '%S+') do items[#items + 1] = item end
  return items
end
local function set_of(items)
  if #items == 0 then return nil end
  local set = {}
  for i = 1, #items do set[items[i]] = true end
  return set
end
local status_list, bucket_list = split(ARGV[8]), split(ARGV[9])
local want_status, want_bucket = set_of(status_list), set_of(bucket_list)
local want_name, want_prefix, want_tag, want_pipeline = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local sources_are_exact = ARGV[14] == '1'

-- Source keys.
local sources = {}
if source_kind == 'ix' then
  -- The composite index: every (status, bucket, name) combination the filters allow.
  local statuses = status_list
  if #statuses == 0 then
    statuses = { 'pending', 'running', 'paused', 'succeeded', 'failed', 'stopped', 'lost' }
  end
  local buckets_by_status = {}
  if #bucket_list == 0 then
    local fields = rcall('HKEYS', root .. 'counts')
    for i = 1, #fields do
      local s, b = string.match(fields[i], '^(%l+):(%d+)$')
      if s then
        buckets_by_status[s] = buckets_by_status[s] or {}
        table.insert(buckets_by_status[s], b)
      end
    end
  end
  for _, s in ipairs(statuses) do
    if not STATUSES[s] then return badarg('unknown status ' .. s) end
    for _, b in ipairs(#bucket_list > 0 and bucket_list or (buckets_by_status[s] or {})) do
      local combo = s .. ':' .. b
      if want_name ~= '' then
        -- the sources are exact, so the name must pass the prefix filter here too
        if want_prefix == '' or string.sub(want_name, 1, #want_prefix) == want_prefix then
          sources[#sources + 1] = root .. 'ix:' .. combo .. ':' .. want_name
        end
      else
        local names = rcall('HKEYS', root .. 'nm:' .. combo)
        for i = 1, #names do
          if want_prefix == '' or string.sub(names[i], 1, #want_prefix) == want_prefix then
            sources[#sources + 1] = root .. 'ix:' .. combo .. ':' .. names[i]
          end
        end
      end
    end
  end
elseif source_kind == 'tag' or source_kind == 'p' then
  sources[1] = root .. source_kind .. ':' .. source_arg
else
  return badarg('unknown source kind')
end

-- Is (score, member) after the cursor in the walking direction?
local desc = direction == 'desc'
local function after_cursor(score, member)
  if cursor_score == '' then return true end
  local cs = tonumber(cursor_score)
  if score ~= cs then
    if desc then return score < cs end
    return score > cs
  end
  if desc then return bytes_less(member, cursor_member) end
  return bytes_less(cursor_member, member)
end

-- A k-way merge of the sources in (score, member) order: each source is read in chunks, the
-- first from the cursor and the next only when the merge has used up the one before (ZRANK
-- of its last entry: nothing changes during a script). With many sources (the composite index
-- of an unfiltered query has statuses x buckets x names keys) the first chunk shrinks so that
-- at most ~FETCH_CAP entries are read up front; a page then costs one read per source plus one
-- per source the page's entries come from, never a call per entry per source.
local FETCH_CAP = 4000
local first_take = math.max(1, math.min(budget, math.floor(FETCH_CAP / math.max(1, #sources))))
local more_take = math.max(first_take, 32)

local function first_chunk(key)
  local lo, hi = '-inf', '+inf'
  if cursor_score ~= '' then
    if desc then hi = cursor_score else lo = cursor_score end
  end
  local skip = 0
  if cursor_score ~= '' then -- entries sharing the cursor's score that were already examined
    local ties = rcall('ZRANGEBYSCORE', key, cursor_score, cursor_score)
    for i = 1, #ties do
      if not after_cursor(tonumber(cursor_score), ties[i]) then skip = skip + 1 end
    end
  end
  if desc then
    return rcall('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', skip, first_take)
  end
  return rcall('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', skip, first_take)
end

local function next_chunk(source)
  local key, last = source.key, source.last
  if desc then
    local rank = rcall('ZREVRANK', key, last)
    if not rank then return {} end
    return rcall('ZREVRANGE', key, rank + 1, rank + more_take, 'WITHSCORES')
  end
  local rank = rcall('ZRANK', key, last)
  if not rank then return {} end
  return rcall('ZRANGE', key, rank + 1, rank + more_take, 'WITHSCORES')
end

local function load(source, raw, take)
  source.entries, source.pos = {}, 1
  for i = 1, #raw, 2 do
    source.entries[#source.entries + 1] = { member = raw[i], score = tonumber(raw[i + 1]) }
  end
  source.more = #source.entries >= take -- a full chunk: the source may hold more
  if #source.entries > 0 then source.last = source.entries[#source.entries].member end
end

local function earlier(a, b) -- is entry a before entry b in the walking order?
  if a.score ~= b.score then
    if desc then return a.score > b.score end
    return a.score < b.score
  end
  if desc then return bytes_less(b.member, a.member) end
  return bytes_less(a.member, b.member)
end

-- A binary heap of the sources, ordered by their current entry.
local heap = {}
local function head(source) return source.entries[source.pos] end
local function before(i, j) return earlier(head(heap[i]), head(heap[j])) end
local function swap(i, j) heap[i], heap[j] = heap[j], heap[i] end
local function push(source)
  heap[#heap + 1] = source
  local i = #heap
  while i > 1 and before(i, math.floor(i / 2)) do
    swap(i, math.floor(i / 2)); i = math.floor(i / 2)
  end
end
local function sift_down(i)
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= #heap and before(l, m) then m = l end
    if r <= #heap and before(r, m) then m = r end
    if m == i then return end
    swap(i, m); i = m
  end
end
local function pop() -- the earliest entry of all sources; refills or drops its source
  local source = heap[1]
  local entry = head(source)
  source.pos = source.pos + 1
  if source.pos > #source.entries and source.more then load(source, next_chunk(source), more_take) end
  if source.pos > #source.entries then
    heap[1] = heap[#heap]; heap[#heap] = nil
  end
  if #heap > 0 then sift_down(1) end
  return entry
end

for _, key in ipairs(sources) do
  local kind = key_type(key)
  if kind ~= 'none' and kind ~= 'zset' then return corrupt(key, '', 'index is not a sorted set') end
  local source = { key = key }
  load(source, first_chunk(key), first_take)
  if #source.entries > 0 then push(source) end
end

-- Walk the merge, examining at most `budget` entries.
local reply = { 'OK', 0, cursor_score, cursor_member }
local found, examined = 0, 0
while #heap > 0 and examined < budget do
  local entry = pop()
  local id = entry.member
  local key = root .. 't:' .. id
  examined = examined + 1
  reply[3], reply[4] = string.format('%d', entry.score), id
  local ok = true
  if not sources_are_exact then
    local kind = key_type(key)
    if kind ~= 'hash' then return corrupt(key, '', 'indexed task is missing or not a hash') end
    local view, bad = read_index_view(key)
    if not view then return bad end
    ok = (not want_status or want_status[view.s]) and (not want_bucket or want_bucket[view.b])
    if ok and want_name ~= '' then ok = view.n == want_name end
    if ok and want_prefix ~= '' then ok = string.sub(view.n, 1, #want_prefix) == want_prefix end
    if ok and want_pipeline ~= '' then ok = view.p == want_pipeline end
    if ok and want_tag ~= '' then
      local has = false
      for t = 1, #view.tags do if view.tags[t] == want_tag then has = true end end
      ok = has
    end
  end
  if ok then
    reply[#reply + 1] = id
    reply[#reply + 1] = rcall('HGETALL', key)
    found = found + 1
    if found >= want then break end
  end
end
if #heap == 0 then reply[2] = 1 end
return reply

#!lua flags=no-writes
--[[ query: one page of tasks matching a TaskQuery, in created_at order, read-only.

The script picks the source indexes from the filters (below), merges them in (created_at,
task_id) order from a cursor, checks every filter the sources do not imply against the task
hash, and returns up to `want` matches. The caller loops on the cursor while the page is full
and the sources are not exhausted, so no single call does unbounded work.

KEYS[1]  {ns}:         the namespace root; index and task keys are derived from it
KEYS[2]  {ns}:counts   the counters; declared beside the root (a key that never exists) so that
                       Redis Cluster refuses the call (TRYAGAIN) while the namespace's slot
                       migrates, never runs it on a half-moved slot (docs/redis-layout.md)
ARGV[1]  'asc' | 'desc'
ARGV[2]  want: matches to return at most (1..1000)
ARGV[3]  budget: index entries to examine at most (>= want; `want` when the sources are exact)
ARGV[4]  cursor score ('' to start) -- the last examined entry of the previous page
ARGV[5]  cursor member
ARGV[6]  statuses filter, space-separated ('' = any)
ARGV[7]  buckets filter, space-separated ('' = any)
ARGV[8]  name filter ('' = any)
ARGV[9]  name_prefix filter ('' = any)
ARGV[10] tag filter ('' = any)
ARGV[11] pipeline filter ('' = any)

Replies
  {'OK', exhausted (0|1), cursor_score, cursor_member, source ('ix'|'tag'|'p'), id1, fields1,
   id2, fields2, ...}
  {'CORRUPT', key, field, detail} | {'BADARG', detail}

Sources. 'ix' merges the composite index {ns}:ix:<status>:<bucket>:<name> for the filtered
statuses (all eight if none) and the filtered buckets ((status, bucket) pairs {ns}:counts lists)
and the filtered name (if none: the names {ns}:nm:<status>:<bucket> lists, narrowed by the name
prefix); 'tag' and 'p' walk {ns}:tag:<tag> / {ns}:p:<pid>. Without a tag or pipeline filter
the source is 'ix', exact (no per-task check). With one (or both) the smaller of their indexes
(ZCARD) is walked, unless the query also filters on status, bucket, name or name prefix and
the composite keys hold fewer tasks: that is decided from the counters alone, {ns}:counts
`<status>:<bucket>` (an upper bound when a name or prefix narrows it), refined with the counts
of {ns}:nm:<status>:<bucket> (largest pairs first, stopping as soon as the answer is known, at
most DECIDE_READS of them; undecided: the tag/pipeline index). Every source is ordered by
(created_at, id) and every filter is checked on a non-exact source, so the cursor means the
same whichever is walked: calls of one query may walk different sources as the counts change.
Bound: at most `budget` entries examined per call; the choice reads two ZCARDs, {ns}:counts and
at most DECIDE_READS name-count hashes; ~4000 index entries read up front (one chunk per
source), then one chunk of 32 more for each source the walk uses up.
]]
--- @include "lib/common"
--- @include "lib/task_view"

local root = KEYS[1]
if KEYS[2] ~= root .. 'counts' then return badarg('KEYS[2] is not {ns}:counts of KEYS[1]') end
local direction, want, budget = ARGV[1], ARGV[2], ARGV[3]
local cursor_score, cursor_member = ARGV[4], ARGV[5]
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
local status_list, bucket_list = split(ARGV[6]), split(ARGV[7])
local want_status, want_bucket = set_of(status_list), set_of(bucket_list)
local want_name, want_prefix, want_tag, want_pipeline = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
for _, s in ipairs(status_list) do
  if not STATUSES[s] then return badarg('unknown status ' .. s) end
end
for _, b in ipairs(bucket_list) do
  if not is_uint(b) then return badarg('bucket malformed') end
end
local function name_passes(name) -- the name prefix filter
  return want_prefix == '' or string.sub(name, 1, #want_prefix) == want_prefix
end

-- The single-index candidates: the pipeline's and the tag's index; the smaller one (the
-- pipeline's on a tie) is the one to beat.
local single, single_kind, single_size = nil, nil, nil
for _, candidate in ipairs({ { 'p', want_pipeline }, { 'tag', want_tag } }) do
  if candidate[2] ~= '' then
    local key = root .. candidate[1] .. ':' .. candidate[2]
    local kind = key_type(key)
    if kind ~= 'none' and kind ~= 'zset' then return corrupt(key, '', 'index is not a sorted set') end
    local size = rcall('ZCARD', key)
    if not single_size or size < single_size then
      single, single_kind, single_size = key, candidate[1], size
    end
  end
end

-- The (status, bucket) pairs the filters allow that hold tasks, from {ns}:counts (a counter
-- that reaches 0 is deleted), with their task counts: { { combo = '<status>:<bucket>', n }, ... }
-- or (nil, corrupt reply).
local ALL_STATUSES = {
  'waiting', 'pending', 'running', 'paused', 'succeeded', 'failed', 'stopped', 'lost',
}
local function status_buckets()
  local counts_key = root .. 'counts'
  local counted = rcall('HGETALL', counts_key)
  local listed = {}
  local found = {}
  for i = 1, #counted, 2 do
    local field = counted[i]
    local s, b = string.match(field, '^(%l+):(%d+)$')
    if s then
      if not is_uint(counted[i + 1]) then
        return nil, corrupt(counts_key, field, 'counter is not a canonical integer')
      end
      listed[field] = tonumber(counted[i + 1])
      if not want_bucket and (not want_status or want_status[s]) then
        found[#found + 1] = { combo = field, n = listed[field] }
      end
    end
  end
  if want_bucket then
    for _, s in ipairs(#status_list > 0 and status_list or ALL_STATUSES) do
      for _, b in ipairs(bucket_list) do
        local combo = s .. ':' .. b
        if listed[combo] then found[#found + 1] = { combo = combo, n = listed[combo] } end
      end
    end
  end
  return found
end

-- The number of tasks of one pair's name counts that pass the name filters; the names are
-- kept on the pair (p.names) for the sources. Or (nil, corrupt reply).
local function named_tasks(p)
  local names_key = root .. 'nm:' .. p.combo
  local total = 0
  p.names = {}
  if want_name ~= '' then
    local counted = rcall('HMGET', names_key, want_name)[1]
    if counted then
      if not is_uint(counted) then
        return nil, corrupt(names_key, want_name, 'name count is not a canonical integer')
      end
      total = tonumber(counted)
      if total > 0 then p.names[1] = want_name end
    end
    return total
  end
  local counted = rcall('HGETALL', names_key)
  for i = 1, #counted, 2 do
    if name_passes(counted[i]) then
      if not is_uint(counted[i + 1]) then
        return nil, corrupt(names_key, counted[i], 'name count is not a canonical integer')
      end
      total = total + tonumber(counted[i + 1])
      p.names[#p.names + 1] = counted[i]
    end
  end
  return total
end

-- Which source to walk: without a tag or pipeline filter the composite index (exact); with
-- one, its index, or the composite index when the query also narrows that and its keys hold
-- fewer tasks. Decided from the counters alone (see the header), at most DECIDE_READS name
-- count hashes per call.
local DECIDE_READS = 64
local combos, use_composite = nil, single == nil
local narrowed = #status_list > 0 or #bucket_list > 0 or want_name ~= '' or want_prefix ~= ''
if single and narrowed then
  local bad
  combos, bad = status_buckets()
  if not combos then return bad end
  local upper = 0 -- the tasks of the pairs: exact without a name filter, else an upper bound
  for _, p in ipairs(combos) do upper = upper + p.n end
  if upper < single_size or (want_name ~= '' and not name_passes(want_name)) then
    use_composite = true
  elseif want_name ~= '' or want_prefix ~= '' then
    table.sort(combos, function(a, b) return a.n > b.n end) -- the bound shrinks fastest
    local known, rest = 0, upper
    for i = 1, math.min(#combos, DECIDE_READS) do
      local n
      n, bad = named_tasks(combos[i])
      if not n then return bad end
      known, rest = known + n, rest - combos[i].n
      if known >= single_size then break end
      if known + rest < single_size then
        use_composite = true
        break
      end
    end
  end
end

local sources = {}
if use_composite then
  if not combos then
    local bad
    combos, bad = status_buckets()
    if not combos then return bad end
  end
  for _, p in ipairs(combos) do
    local names = p.names -- read while deciding, or:
    if not names then
      names = want_name ~= '' and { want_name } or rcall('HKEYS', root .. 'nm:' .. p.combo)
    end
    for _, name in ipairs(names) do
      if name_passes(name) then sources[#sources + 1] = root .. 'ix:' .. p.combo .. ':' .. name end
    end
  end
else
  sources[1] = single
end
-- The composite index implies every filter but tag and pipeline: then no per-task check, and
-- every entry examined is a match.
local sources_are_exact = use_composite and single == nil
if sources_are_exact then budget = want end
local source_kind = use_composite and 'ix' or single_kind

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
local reply = { 'OK', 0, cursor_score, cursor_member, source_kind }
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

#!lua
--[[ prune: drop the oldest terminal tasks beyond the newest `keep`, with their history.

KEYS[1]  {ns}:term   terminal tasks, score = created_at
KEYS[2]  {ns}:       the namespace root; task, history and index keys are derived from it
ARGV[1]  keep: how many of the newest terminal tasks to keep
ARGV[2]  batch: the most tasks this call may drop (the caller loops)

Replies
  {'OK', dropped, still_to_drop}
  {'CORRUPT', key, field, detail}   a candidate does not decode; nothing written
  {'BADARG', detail}

Invariants: each task is checked to be terminal inside this script before it is dropped, so a
task saved back to a live status is never dropped; all of a task's keys go in one call, and its
change-feed item becomes a tombstone (lib/feed) at the next position, stamped with the server's
TIME.
Bound: at most `batch` tasks (each O(tags) commands) per call.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"

local term, root = KEYS[1], KEYS[2]
local keep, batch = ARGV[1], ARGV[2]
if not is_uint(keep) or not is_uint(batch) then return badarg('keep/batch malformed') end
keep, batch = tonumber(keep), tonumber(batch)
if batch < 1 then return badarg('batch must be positive') end

local excess = rcall('ZCARD', term) - keep
if excess <= 0 then return { 'OK', 0, 0 } end
local take = math.min(excess, batch)
local ids = rcall('ZRANGE', term, 0, take - 1)

local doomed = {}
for i = 1, #ids do
  local key = root .. 't:' .. ids[i]
  local kind = key_type(key)
  if kind ~= 'hash' and kind ~= 'none' then
    return corrupt(key, '', 'key holds a ' .. kind .. ', not a hash')
  end
  if kind == 'hash' then
    local view, bad = read_index_view(key)
    if not view then return bad end
    if not TERMINAL[view.s] then return corrupt(key, 's', 'listed as terminal but is ' .. view.s) end
    doomed[#doomed + 1] = { id = ids[i], key = key, view = view,
                            position = rcall('HGET', key, 'fs') }
  else
    doomed[#doomed + 1] = { id = ids[i], key = nil }
  end
end

-- All checks passed; from here on only writes.
local clock = rcall('TIME')
local removed_at = clock[1] .. string.format('%06d', tonumber(clock[2]))
for i = 1, #doomed do
  local d = doomed[i]
  if d.key then
    feed_tombstone(root, d.position, d.id, d.view, removed_at)
    index_remove(root, d.id, d.view)
    rcall('DEL', d.key, root .. 'h:' .. d.id)
  else
    rcall('ZREM', term, d.id) -- a dangling index entry: drop it, nothing else to remove
  end
end
counts_flush()
feed_flush(root)
return { 'OK', #doomed, excess - #doomed }

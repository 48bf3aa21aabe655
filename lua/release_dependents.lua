#!lua
--[[ release_dependents: apply ended parents' outcomes to the waiting children that the write
ending them left over (it judges at most 100), oldest end first (lib/dependencies).

KEYS[1]  {ns}:       the namespace root; every key is derived from it
KEYS[2]  {ns}:drel   the ended parents still to apply (a zset); declared beside the root so
                     that Redis Cluster refuses the call (TRYAGAIN) while the namespace's
                     slot migrates, never runs it on a half-moved slot
ARGV[1]  limit: the most children to judge (1..1000)

Replies
  {'OK', judged, parents_left}   judged: children this call judged (each moved at most once:
        a child released or stopped, or left waiting on its other parents); parents_left:
        the ended parents still in {ns}:drel
  {'CORRUPT', key, field, detail}   a parent's outcome, a child or a dependency key does not
        decode; nothing written
  {'BADARG', detail}

Invariants: each child moved here is written as any write writes it (version one up, history
entry, feed position, indexes, counts, expiry, unique record; lib/dependencies dep_apply); a
child stopped ends in turn and its own waiting children follow in the same call, within the
limit; a parent leaves drel once its every waiting child is judged.
Bound: at most `limit` children judged, each O(tags + its parents) commands, plus one ZRANGE
of drel.
]]
--- @include "lib/common"
--- @include "lib/dependencies"
--- @include "lib/releases"

local root, drel = KEYS[1], KEYS[2]
if drel ~= root .. 'drel' then return badarg('KEYS[2] is not {ns}:drel of KEYS[1]') end
local limit = ARGV[1]
if not is_uint(limit) or tonumber(limit) < 1 or tonumber(limit) > 1000 then
  return badarg('limit must be 1..1000')
end
limit = tonumber(limit)

local parents, kind = try_read('ZRANGE', drel, 0, limit - 1)
if not parents then return corrupt(drel, '', 'key holds a ' .. kind .. ', not a sorted set') end
for _, parent in ipairs(parents) do
  local outcome, okind = try_read('HGET', root .. 'dro', parent)
  if outcome == nil then return corrupt(root .. 'dro', '', 'key holds a ' .. okind .. ', not a hash') end
  if not outcome or not TERMINAL[outcome] then
    return corrupt(root .. 'dro', parent, 'the outcome of an ended parent is not a final status')
  end
  DEP.ended[parent] = outcome
  DEP.queue[#DEP.queue + 1] = parent
end
dep_release_queue(root, limit)
local broken = dep_check() or index_check() or feed_check(root)
if broken then return broken end

local judged = DEP.judged
index_flush()
unique_flush()
feed_flush(root)
dep_flush()
return { 'OK', judged, rcall('ZCARD', drel) }

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
--- @include "lib/commit_body"

if KEYS[2] ~= KEYS[1] .. 'counts' then return badarg('KEYS[2] is not {ns}:counts of KEYS[1]') end
local reply = commit_body(KEYS[1], 1, #ARGV) -- its first value only (the freed count stays here)
return reply

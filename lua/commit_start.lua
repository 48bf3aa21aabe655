#!lua
--[[ commit_start: commit_tasks, then start_tasks into the slots that commit freed, in one call.

The group committer's call: the ends of the tasks a worker's slots finished (commit_tasks,
exactly as that script does it: lib/commit_body) and then the start of as many PENDING tasks
as those ends moved out of RUNNING (start_tasks, exactly as that script does it, its limit
capped at that number: lib/start_body). A slot's next task is recorded RUNNING only once its
last task's end is written, in the same atomic step: the store never shows more tasks RUNNING
for the worker than before the call, and a slot waits for one round trip between two tasks
instead of two.

KEYS[1]  {ns}:          the namespace root
KEYS[2]  {ns}:counts    as commit_tasks' KEYS[2] (a key that never exists; Redis Cluster)
KEYS[3]  {ns}:sr:<tok>  the start's memo, as start_tasks' KEYS[2]
ARGV[1]  n: the number of commit_tasks arguments; ARGV[2..n+1] are commit_tasks' ARGV and the
         rest start_tasks' ARGV (owner first)

Replies
  {'OK', commit_reply, start_reply}   commit_reply: commit_tasks' reply; start_reply:
        start_tasks' reply ('OK' and the started tasks, or its CORRUPT/BADARG: then nothing
        was started and the commit stands)
  {'CORRUPT', key, field, detail}   the commit's: nothing written, nothing started
  {'BADARG', detail}

Invariants: those of commit_tasks, then those of start_tasks; the start counts no more starts
than the commit's items moved out of RUNNING ('OK', or 'APPLIED' by a retry of this call: its
memo then answers what the first attempt started).
Bound: commit_tasks' and start_tasks' bounds.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/task_args"
--- @include "lib/dependencies"
--- @include "lib/releases"
--- @include "lib/msgpack_entry"
--- @include "lib/limits"
--- @include "lib/commit_body"
--- @include "lib/start_body"

local root = KEYS[1]
if KEYS[2] ~= root .. 'counts' then return badarg('KEYS[2] is not {ns}:counts of KEYS[1]') end
local n = ARGV[1]
if not is_uint(n) or tonumber(n) + 1 > #ARGV then return badarg('commit argument count malformed') end
local committed, freed = commit_body(root, 2, tonumber(n) + 1)
if committed[1] ~= 'OK' then return committed end
return { 'OK', committed, start_body(root, KEYS[3], tonumber(n) + 2, freed) }

#!lua
--[[ start_tasks: start up to `limit` PENDING tasks of the given buckets, in one round trip.

For each due task (not_before passed by the server's clock and by `now`), in start order (higher priority first, then the one due earliest, then by
id; lib/indexes keeps the queues), whose not_before has passed: the compare-and-set
PENDING -> RUNNING (version + 1), the lease (owner, until) and heartbeat, the index move, and
the history entry "started by <owner> (attempt N)", and for a task with a timeout ('to') its
deadline 'dl' = now + timeout (lib/policies; kept as it is otherwise). Atomic as a whole, so a
task is started by exactly one caller; the batch replaces one query, one save, one append and one touch per task.

KEYS[1]  {ns}:          the namespace root; index, task and history keys are derived from it
KEYS[2]  {ns}:sr:<tok>  memo of the ids this call started (a list with a TTL)
ARGV[1]  owner
ARGV[2]  now (us)
ARGV[3]  lease_until (us)
ARGV[4]  limit (1..100)
ARGV[5]  write token
ARGV[6]  memo TTL in milliseconds
ARGV[7]  number of buckets, then the buckets
next     number of task names this caller can run, then the names (0: any name)

Replies
  {'OK', id1, fields1, id2, fields2, ...}   the started tasks as HGETALL gives them
  {'CORRUPT', key, field, detail}   a candidate does not decode; nothing written
  {'BADARG', detail}

Limits (lib/limits): a candidate whose refs name a recorded limit starts only while each
concurrency ref has fewer than `max` holders ({ns}:lh:<ref>, counting this call's starts) and
each rate ref's bucket ({ns}:tb:<ref>) a token, on now_us (the earlier clock); a refused one
stays PENDING as it is, and every later candidate naming a ref that refused is refused too in
this call (first come, first served within a ref). Refused candidates count as examined.
One refused by a full concurrency ref is parked ({ns}:lp:<ref>, out of its rq) so it costs
later calls nothing; first, every ref a holder left since the last call ({ns}:lf) gets its
oldest parked tasks back into their rq, as many as it has free slots (like the dq promotion,
derived entries written before the checks). Passed-over tasks are noted in {ns}:lw:<ref> (at
their version) for limit_usage.

Idempotency: if the memo exists, this is a retry of a call whose reply was lost; the tasks it
started are returned again and nothing new is started.
Invariants: only PENDING tasks move, each by one version; never touches another status; each
started task moves to the next change-feed position (lib/feed).
Bound: per task name its queue heads read in score order as far as the cut (pages of
2 * limit + 64 entries: one for a worker that owns most buckets) and one read of its delayed
heads; at most `limit` entries promoted per bucket come due; at most `limit` queues read,
about 2 * limit candidates examined (the queues that hold more than their share fill the rest
of the 2 * limit), `limit` started. Tasks not yet due cost nothing: they wait in dq.
]]
--- @include "lib/common"
--- @include "lib/indexes"
--- @include "lib/feed"
--- @include "lib/policies"
--- @include "lib/msgpack_entry"
--- @include "lib/limits"
--- @include "lib/start_body"

return start_body(KEYS[1], KEYS[2], 1, nil)

#!lua
--[[ pool_tick: one worker's heartbeat and bucket leases, in one step.

Every worker of a pool calls this every worker_lease / 3 seconds. It records the worker as
live, drops workers whose heartbeat expired, and for each bucket: renews the lease this worker
holds if it still wants the bucket, releases it if not, and takes a bucket it wants when the
bucket is free or its lease expired. Which buckets a worker wants is computed by the caller
(bounded-load rendezvous over the live workers and current owners it read just before), so all
workers converge on the same assignment within a few ticks.

KEYS[1]  {ns}:workers        zset: worker -> heartbeat expiry (ms, store clock)
KEYS[2]  {ns}:bucket-owner   hash: bucket -> worker
KEYS[3]  {ns}:bucket-until   hash: bucket -> lease expiry (ms)
KEYS[4]  {ns}:meta           hash: num_buckets (recorded by the first worker)
KEYS[5]  {ns}:worker-beat    hash: worker -> `now` of its last tick (ms): the same workers as
                             KEYS[1], so a reader sees each heartbeat's age
ARGV[1]  worker id
ARGV[2]  now (ms, from the store clock)
ARGV[3]  lease (ms)
ARGV[4]  num_buckets of this worker
ARGV[5]  '1' if the worker is leaving (release everything, unregister), else '0'
ARGV[6]  number of wanted buckets, then the buckets

Replies
  {'OK', held_buckets (array), live_workers (array)}
  {'MISMATCH', recorded_num_buckets}   this worker's num_buckets differs; nothing written
  {'BADARG', detail}

Invariants: a bucket has at most one owner whose lease is valid at `now`; a worker only ever
renews or releases its own leases; worker-beat lists exactly the workers of KEYS[1] (a worker
dropped as expired, or leaving, leaves both here). Bound: O(num_buckets + expired workers)
commands (num_buckets <= 65536).
]]
--- @include "lib/common"

local workers, owners, untils, meta, beats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, now, lease, num_buckets, leaving = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not me or me == '' then return badarg('worker id missing') end
for _, v in ipairs({ now, lease, num_buckets }) do
  if not is_uint(v) then return badarg('numeric argument malformed') end
end
local wanted_list = read_list(6)
if not wanted_list then return badarg('wanted buckets malformed') end
local wanted = {}
for i = 1, #wanted_list do wanted[wanted_list[i]] = true end

local recorded = rcall('HGET', meta, 'num_buckets')
if recorded and recorded ~= num_buckets then return { 'MISMATCH', recorded } end
if not recorded then rcall('HSET', meta, 'num_buckets', num_buckets) end

local now_n, until_n = tonumber(now), tonumber(now) + tonumber(lease)
local until_s = string.format('%d', until_n)
-- The expired workers leave the beats too (one HDEL each: no unpack limit to worry about).
local expired = rcall('ZRANGEBYSCORE', workers, '-inf', now)
for i = 1, #expired do rcall('HDEL', beats, expired[i]) end
rcall('ZREMRANGEBYSCORE', workers, '-inf', now)
if leaving == '1' then
  rcall('ZREM', workers, me)
  rcall('HDEL', beats, me)
else
  rcall('ZADD', workers, until_s, me)
  rcall('HSET', beats, me, now)
end

local held = {}
for b = 0, tonumber(num_buckets) - 1 do
  local bucket = tostring(b)
  local owner = rcall('HGET', owners, bucket)
  local expiry = tonumber(rcall('HGET', untils, bucket) or '0') or 0
  local want = wanted[bucket] and leaving ~= '1'
  if owner == me then
    if want then
      rcall('HSET', untils, bucket, until_s)
      held[#held + 1] = b
    else
      rcall('HDEL', owners, bucket)
      rcall('HDEL', untils, bucket)
    end
  elseif want and (not owner or expiry <= now_n) then
    rcall('HSET', owners, bucket, me)
    rcall('HSET', untils, bucket, until_s)
    held[#held + 1] = b
  end
end
return { 'OK', held, rcall('ZRANGE', workers, 0, -1) }

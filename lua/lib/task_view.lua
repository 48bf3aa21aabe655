-- lib/task_view: how a stored task hash is read for indexing and filtering (read-only).
--
-- A task's index view `t` is { s = status, b = bucket, c = created_at (us), n = name,
-- p = pipeline id or nil, g = tags JSON, tags = { tag, ... }, nb = not_before (us) or nil,
-- pr = priority (-100..100) or nil for 0, lm = the limit refs as stored (a JSON list) or nil;
-- read only by the callers that pass it: lib/limits }.
--
-- Requires lib/common.
--- @include "lib/common"

local NO_TAGS = {}

local function decode_tags(text)
  if text == '[]' then return NO_TAGS end -- most tasks have none: no JSON decode (read-only)
  -- cjson decodes a JSON object to a table too ('{}' even equals '[]'): only an array is tags.
  if type(text) ~= 'string' or not string.match(text, '^%s*%[') then return nil end
  local ok, tags = pcall(cjson.decode, text)
  if not ok or type(tags) ~= 'table' then return nil end
  for i = 1, #tags do
    if type(tags[i]) ~= 'string' or tags[i] == '' then return nil end
  end
  return tags
end

-- A priority as stored: nil (0) or a canonical integer in -100..100.
local function is_priority(s)
  if s == nil then return true end
  if type(s) ~= 'string' or not (s == '0' or string.match(s, '^%-?[1-9]%d?%d?$')) then
    return false
  end
  return math.abs(tonumber(s)) <= 100
end

-- The hash fields of an index view, in the order index_view_of takes their values.
local VIEW_FIELDS = { 's', 'b', 'c', 'n', 'p', 'g', 'nb', 'pr' }

-- The index view from the values of VIEW_FIELDS read from `key` (starting at v[first], 1 by
-- default), or (nil, corrupt reply) if they do not decode. `lm`: the task's 'lm' field, for a
-- caller whose write may move a limit holder (lib/limits).
local function index_view_of(key, v, first, lm)
  local o = (first or 1) - 1
  local t = { s = v[o + 1], b = v[o + 2], c = v[o + 3], n = v[o + 4], p = v[o + 5] or nil,
              g = v[o + 6], nb = v[o + 7] or nil, pr = v[o + 8] or nil, lm = lm or nil }
  if not t.s or not STATUSES[t.s] then return nil, corrupt(key, 's', 'unknown or missing status') end
  if not is_uint(t.b) then return nil, corrupt(key, 'b', 'bucket is not a canonical integer') end
  if not is_uint(t.c) then return nil, corrupt(key, 'c', 'created_at is not a canonical integer') end
  if not t.n or t.n == '' then return nil, corrupt(key, 'n', 'name is missing') end
  if t.p == false then t.p = nil end
  if t.nb == false then t.nb = nil end
  if t.pr == false or t.pr == '0' then t.pr = nil end
  if t.nb and not is_uint(t.nb) then return nil, corrupt(key, 'nb', 'not_before malformed') end
  if not is_priority(t.pr) then return nil, corrupt(key, 'pr', 'priority malformed') end
  t.tags = decode_tags(t.g or '[]')
  if not t.tags then return nil, corrupt(key, 'g', 'tags are not a JSON array of strings') end
  return t, nil
end

-- The index view of a stored task hash, or (nil, corrupt reply) if it does not decode.
local function read_index_view(key)
  local v = rcall('HMGET', key, 'lm', unpack(VIEW_FIELDS))
  return index_view_of(key, v, 2, v[1])
end

-- True when the two views index the task differently (so the entries must move).
local function index_view_changed(a, b)
  return a.s ~= b.s or a.b ~= b.b or a.c ~= b.c or a.n ~= b.n or a.p ~= b.p or a.g ~= b.g
    or a.nb ~= b.nb or a.pr ~= b.pr or a.lm ~= b.lm
end

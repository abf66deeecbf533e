"""Lua scripts: every change to an entity that must be atomic is one script.

Each script touches the keys of a single partition only. Each binds its KEYS and
ARGV to named locals at the top (with a comment saying what they are), so the
body reads by name, never by position.

Wake pointers: an entity has at most one unacknowledged pointer in its
partition inbox, marked by ``meta.woke``. Every script that gives an entity
work adds a pointer through the one helper ``ensure_pointer`` (a pointer only if
there is none); the commit that acknowledges pointers clears the mark and adds a
fresh pointer if the entity still has work (input after the cursor, or
undelivered effects). So a burst of messages to one entity costs one wake, and
no input is ever left without a pointer.
"""

# Stream ids compare as (ms, seq) number pairs.
_ID_GT = """
local function id_gt(a, b)
  if not a then return false end
  if not b then return true end
  -- a malformed id (a corrupted field) counts as 0-0: never a Lua error mid-script
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am) or 0, tonumber(bm) or 0
  as, bs = as or 0, bs or 0
  if am ~= bm then return am > bm end
  return tonumber(as) > tonumber(bs)
end
"""

# The wake-pointer rule: add a pointer to the entity's partition inbox unless it has
# one already (meta.woke marks it; the commit that acknowledges it clears the mark).
_ENSURE_POINTER = """
local function ensure_pointer(meta_key, inbox_key, entity_url)
  if redis.call('HSETNX', meta_key, 'woke', '1') == 1 then
    redis.call('XADD', inbox_key, '*', 'u', entity_url)
  end
end
"""

# mode: 'send' creates the entity if missing; 'create' is get-or-create with args
#       (an existing entity with other args is a conflict; with the same args it
#       gets the events, like 'send'); 'existing' never creates.
# -> {1, id, created_id} appended | {0, id, created_id} deduplicated or existing
#    | {-1, 'args', created_id} other args | {-2, '', ''} missing ('existing')
SEND = (
    _ENSURE_POINTER
    + """
local log = KEYS[1]          -- the entity's log
local meta = KEYS[2]         -- the entity's metadata hash
local inbox = KEYS[3]        -- the partition inbox (wake pointers)
local idem = KEYS[4]         -- idempotency key -> event id
local typeset = KEYS[5]      -- urls of the entity's type in the partition
local url = ARGV[1]
local etype = ARGV[2]        -- entity type name
local idem_ttl = ARGV[3]     -- ms to remember the idempotency key ('' = no dedupe)
local mode = ARGV[4]         -- 'send' | 'create' | 'existing' (see above)
local args = ARGV[5]         -- packed creation args
local created = ARGV[6]      -- the Created event, appended if the entity is new
local parent = ARGV[7]       -- parent url ('' = none)
local n = tonumber(ARGV[8])  -- then n pairs (flag, event): flag 'i' input (moves last_in)
local first_pair = 9
if idem_ttl ~= '' then
  local prior = redis.call('GET', idem)
  if prior then return {0, prior, redis.call('HGET', meta, 'created') or ''} end
end
local created_id = redis.call('HGET', meta, 'created')
if created_id then
  if mode == 'create' and redis.call('HGET', meta, 'args') ~= args then
    return {-1, 'args', created_id}
  end
elseif mode == 'existing' then
  return {-2, '', ''}
else
  created_id = redis.call('XADD', log, '*', 'e', created)
  redis.call('PERSIST', log)  -- the emptied log of a deleted incarnation had a TTL
  redis.call('HSET', meta, 'type', etype, 'status', 'active', 'cursor', '0-0',
             'args', args, 'parent', parent, 'created', created_id, 'last_in', created_id)
  redis.call('SADD', typeset, url)
end
local id = created_id
local last_in = false
for j = 0, n - 1 do
  local flag, event = ARGV[first_pair + 2 * j], ARGV[first_pair + 2 * j + 1]
  id = redis.call('XADD', log, '*', 'e', event)
  if flag == 'i' then last_in = id end
end
if last_in then redis.call('HSET', meta, 'last_in', last_in) end
ensure_pointer(meta, inbox, url)
if idem_ttl ~= '' then redis.call('SET', idem, id, 'PX', idem_ttl) end
return {1, id, created_id}
"""
)

# -> {meta_flat, snapshot|nil, entries}
LOAD = """
local meta = KEYS[1]   -- the entity's metadata hash
local snap = KEYS[2]   -- the entity's snapshot
local log = KEYS[3]    -- the entity's log
local after = ARGV[1]  -- read the log after this id ('' = cold start from the snapshot)
local count = ARGV[2]  -- at most this many entries
local fields = redis.call('HGETALL', meta)
local snapshot = false
local start
if after == '' then
  local upto = redis.call('HGET', meta, 'snap_upto')
  if upto then
    snapshot = redis.call('GET', snap)
    start = '(' .. upto
  else
    start = '-'
  end
else
  start = '(' .. after
end
return {fields, snapshot, redis.call('XRANGE', log, start, '+', 'COUNT', count)}
"""

# Event flags: 'e' plain, 'i' input (moves last_in), 'o' outbox (moves out_last and
# adds a wake pointer so the delivery happens even if this worker dies now).
# -> {'OK', ids...} | {'FENCED'} | {'GONE'}
COMMIT = (
    _ID_GT
    + _ENSURE_POINTER
    + """
local lease = KEYS[1]                 -- the partition lease
local log = KEYS[2]                   -- the entity's log
local meta = KEYS[3]                  -- the entity's metadata hash
local inbox = KEYS[4]                 -- the partition inbox (wake pointers)
local snap = KEYS[5]                  -- the entity's snapshot
local timers = KEYS[6]                -- the partition's timers: member -> due ms
local timerdata = KEYS[7]             -- the partition's timers: member -> outbox event
local actions = KEYS[8]               -- the entity's pending actions
local token = ARGV[1]                 -- the lease token this commit is fenced by
local group = ARGV[2]                 -- the inbox consumer group
local cursor = ARGV[3]                -- new cursor ('' = keep)
local incarnation = ARGV[4]           -- meta.created to match ('' = skip the check)
local snapshot = ARGV[5]              -- new snapshot ('' = none)
local snapshot_seen = ARGV[6]         -- the snapshot holds every event up to this id
local last_out = ARGV[7]              -- and every output up to this one, unless this
                                      -- commit appends outputs (then its last one)
local channel = ARGV[8]               -- the entity's idle channel
local url = ARGV[9]
local n_events = tonumber(ARGV[10])   -- then n_events pairs (flag, event)
local n_acks = tonumber(ARGV[11])     -- then n_acks inbox ids to acknowledge
local n_fields = tonumber(ARGV[12])   -- then n_fields field, value items for meta
local n_timers = tonumber(ARGV[13])   -- then n_timers triples (member, due ms, data)
local n_actions = tonumber(ARGV[14])  -- then n_actions tool call ids now pending
local n_closed = tonumber(ARGV[15])   -- then n_closed pairs (tool call id, how its run
                                      -- ended): still pending, they are settled by that
local i = 16
if redis.call('GET', lease) ~= token then return {'FENCED'} end
if incarnation ~= '' and redis.call('HGET', meta, 'created') ~= incarnation then
  return {'GONE'}
end
local out = {'OK'}
local changed = false
for _ = 1, n_events do
  local flag, event = ARGV[i], ARGV[i + 1]
  local id = redis.call('XADD', log, '*', 'e', event)
  out[#out + 1] = id
  if flag == 'i' then
    redis.call('HSET', meta, 'last_in', id)
  else
    last_out = id
    if flag == 'o' then
      redis.call('HSET', meta, 'out_last', id)
      ensure_pointer(meta, inbox, url)
      changed = true
    end
  end
  i = i + 2
end
if n_acks > 0 then
  redis.call('XACK', inbox, group, unpack(ARGV, i, i + n_acks - 1))
  i = i + n_acks
end
if cursor ~= '' then
  redis.call('HSET', meta, 'cursor', cursor)
  changed = true
end
if n_fields > 0 then
  redis.call('HSET', meta, unpack(ARGV, i, i + n_fields - 1))
  i = i + n_fields
  changed = true
end
if n_acks > 0 then
  -- The wake's pointers are acknowledged: point again if work is left.
  redis.call('HDEL', meta, 'woke')
  local m = redis.call('HMGET', meta, 'status', 'cursor', 'last_in', 'out_done', 'out_last')
  local status, now_at, last_in = m[1], m[2], m[3]
  local out_done, out_last = m[4] or '0-0', m[5]
  if status and status ~= 'failed' and (id_gt(last_in, now_at) or id_gt(out_last, out_done)) then
    ensure_pointer(meta, inbox, url)
  end
end
for _ = 1, n_timers do
  local member, due, data = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('ZADD', timers, 'NX', due, member) == 1 then
    redis.call('HSET', timerdata, member, data)
    redis.call('HINCRBY', meta, 'timers', 1)
  end
  i = i + 3
end
for _ = 1, n_actions do
  if redis.call('HSETNX', actions, ARGV[i], 'pending') == 1 then
    redis.call('HINCRBY', meta, 'actions', 1)
  end
  i = i + 1
end
for _ = 1, n_closed do
  if redis.call('HGET', actions, ARGV[i]) == 'pending' then
    redis.call('HSET', actions, ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', meta, 'actions', -1)
  end
  i = i + 2
end
if snapshot ~= '' then
  redis.call('SET', snap, snapshot)
  redis.call('HSET', meta, 'snap_upto', snapshot_seen, 'snap_out', last_out)
end
if changed then redis.call('PUBLISH', channel, cursor) end
return out
"""
)

# A due timer of entity url: its outbox event goes into the entity's log and a
# wake pointer makes the owner deliver it. -> 1 fired | 0 gone | -1 fenced
FIRE = (
    _ENSURE_POINTER
    + """
local lease = KEYS[1]       -- the partition lease
local timers = KEYS[2]      -- the partition's timers: member -> due ms
local timerdata = KEYS[3]   -- the partition's timers: member -> outbox event
local meta = KEYS[4]        -- the entity's metadata hash
local log = KEYS[5]         -- the entity's log
local inbox = KEYS[6]       -- the partition inbox (wake pointers)
local token = ARGV[1]       -- the lease token this is fenced by
local member = ARGV[2]      -- the timer: '<url>|<incarnation>|<id>'
local url = ARGV[3]
local incarnation = ARGV[4] -- meta.created of the entity that set the timer
if redis.call('GET', lease) ~= token then return -1 end
if redis.call('ZREM', timers, member) == 0 then return 0 end
local data = redis.call('HGET', timerdata, member)
redis.call('HDEL', timerdata, member)
if not data or redis.call('HGET', meta, 'created') ~= incarnation then return 0 end
redis.call('HINCRBY', meta, 'timers', -1)
local id = redis.call('XADD', log, '*', 'e', data)
redis.call('HSET', meta, 'out_last', id)
ensure_pointer(meta, inbox, url)
return 1
"""
)

# -> 1 cancelled | 0 no such timer (fired or cancelled already) | -1 fenced
CANCEL_TIMER = """
local lease = KEYS[1]       -- the partition lease
local timers = KEYS[2]      -- the partition's timers: member -> due ms
local timerdata = KEYS[3]   -- the partition's timers: member -> outbox event
local meta = KEYS[4]        -- the entity's metadata hash
local token = ARGV[1]       -- the lease token this is fenced by
local member = ARGV[2]      -- the timer
if redis.call('GET', lease) ~= token then return -1 end
if redis.call('ZREM', timers, member) == 0 then return 0 end
redis.call('HDEL', timerdata, member)
-- The member is "<url>|<incarnation>|<id>": count it off only that incarnation's
-- metadata (a deleted entity has none, and must not get a hash back).
local incarnation = string.match(member, '^[^|]*|([^|]*)|')
if redis.call('HGET', meta, 'created') == incarnation then
  redis.call('HINCRBY', meta, 'timers', -1)
end
return 1
"""

# A wake pointer or a timer member the worker cannot use (a missing field, a
# malformed member) moves out of the inbox or the timer set into the partition's
# dead-letter stream, with why, so no loop trips over it again and an operator sees
# it. -> 1 moved | 0 gone already | -1 fenced
QUARANTINE = """
local lease = KEYS[1]       -- the partition lease
local bad = KEYS[2]         -- the partition's dead-letter stream
local source = KEYS[3]      -- the inbox (a pointer) or the timer set (a timer)
local timerdata = KEYS[4]   -- the partition's timers: member -> outbox event
local token = ARGV[1]       -- the lease token this is fenced by
local kind = ARGV[2]        -- 'pointer' | 'timer'
local item = ARGV[3]        -- the pointer's stream id | the timer member
local reason = ARGV[4]      -- why it cannot be used
local detail = ARGV[5]      -- what it held (a pointer's fields, as text)
local group = ARGV[6]       -- the inbox's consumer group
local worker = ARGV[7]
if redis.call('GET', lease) ~= token then return -1 end
if kind == 'pointer' then
  if redis.call('XACK', source, group, item) == 0 then return 0 end
  redis.call('XDEL', source, item)
else
  if redis.call('ZREM', source, item) == 0 then return 0 end
  detail = redis.call('HGET', timerdata, item) or ''
  redis.call('HDEL', timerdata, item)
end
redis.call('XADD', bad, 'MAXLEN', '~', 10000, '*', 'kind', kind, 'key', source,
  'item', item, 'reason', reason, 'detail', detail, 'worker', worker)
return 1
"""

# -> 1 deleted | 0 gone | -1 fenced
DELETE = """
local lease = KEYS[1]       -- the partition lease
local log = KEYS[2]         -- the entity's log
local meta = KEYS[3]        -- the entity's metadata hash
local snap = KEYS[4]        -- the entity's snapshot
local typeset = KEYS[5]     -- urls of the entity's type in the partition
local inbox = KEYS[6]       -- the partition inbox (wake pointers)
local actions = KEYS[7]     -- the entity's pending actions
local live = KEYS[8]        -- the entity's live output
local token = ARGV[1]       -- the lease token this is fenced by
local incarnation = ARGV[2] -- meta.created of the entity to delete
local url = ARGV[3]
local group = ARGV[4]       -- the inbox consumer group
local channel = ARGV[5]     -- the entity's idle channel
local first_ack = 6         -- then inbox ids to acknowledge
if redis.call('GET', lease) ~= token then return -1 end
if redis.call('HGET', meta, 'created') ~= incarnation then return 0 end
redis.call('DEL', meta, snap, actions, live)
-- The log is emptied, not deleted: a stream keeps its last id, so a re-create (SEND
-- persists the key again) gets a later created id even within the same millisecond, and
-- the incarnation check keeps refusing the deleted entity's writers. Emptied logs expire.
redis.call('XTRIM', log, 'MAXLEN', 0)
redis.call('PEXPIRE', log, 60000)
redis.call('SREM', typeset, url)
if #ARGV >= first_ack then redis.call('XACK', inbox, group, unpack(ARGV, first_ack, #ARGV)) end
redis.call('PUBLISH', channel, 'deleted')
return 1
"""

# Un-park a failed entity: it becomes active, its cursor moves past the inputs to skip
# (dead-lettered), the Resumed event is logged and the entity gets a wake pointer.
# -> 1 resumed | 0 not failed (or gone)
RESUME = (
    _ID_GT
    + _ENSURE_POINTER
    + """
local meta = KEYS[1]      -- the entity's metadata hash
local log = KEYS[2]       -- the entity's log
local inbox = KEYS[3]     -- the partition inbox (wake pointers)
local url = ARGV[1]
local resumed = ARGV[2]   -- the Resumed event
local first_skip = 3      -- then ids of the inputs to skip
if redis.call('HGET', meta, 'status') ~= 'failed' then return 0 end
local cursor = redis.call('HGET', meta, 'cursor')
for j = first_skip, #ARGV do
  if id_gt(ARGV[j], cursor) then cursor = ARGV[j] end
end
redis.call('HSET', meta, 'status', 'active', 'attempts', 0, 'error', '', 'cursor', cursor)
redis.call('XADD', log, '*', 'e', resumed)
ensure_pointer(meta, inbox, url)
return 1
"""
)

# -> token | nil (held by another)
ACQUIRE = """
local lease = KEYS[1]       -- the partition lease: '<worker>:<epoch>'
local epoch = KEYS[2]       -- the partition's fencing epoch counter
local worker_id = ARGV[1]
local ttl_ms = ARGV[2]
local current = redis.call('GET', lease)
if current then
  if string.sub(current, 1, string.len(worker_id) + 1) == worker_id .. ':' then
    redis.call('PEXPIRE', lease, ttl_ms)
    return current
  end
  return false
end
local token = worker_id .. ':' .. redis.call('INCR', epoch)
redis.call('SET', lease, token, 'PX', ttl_ms)
return token
"""

# -> 1 renewed | 0 lost
RENEW = """
local lease = KEYS[1]       -- the partition lease
local token = ARGV[1]
local ttl_ms = ARGV[2]
if redis.call('GET', lease) == token then
  redis.call('PEXPIRE', lease, ttl_ms)
  return 1
end
return 0
"""

# -> 1 released | 0 not ours
RELEASE = """
local lease = KEYS[1]       -- the partition lease
local token = ARGV[1]
if redis.call('GET', lease) == token then
  redis.call('DEL', lease)
  return 1
end
return 0
"""

# -> live worker ids
HEARTBEAT = """
local workers = KEYS[1]     -- live workers, score = expiry ms
local worker_id = ARGV[1]
local ttl_ms = ARGV[2]      -- '' = deregister
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ttl_ms == '' then
  redis.call('ZREM', workers, worker_id)
else
  redis.call('ZADD', workers, now + tonumber(ttl_ms), worker_id)
end
redis.call('ZREMRANGEBYSCORE', workers, '-inf', now)
return redis.call('ZRANGE', workers, 0, -1)
"""

# Settle a pending action at most once: concurrent answers race here and one wins.
# -> {1, event id} | {0, state} (state: '' unknown, 'settled' already answered, or how
# the run that closed it ended: 'cancelled', 'failed')
SETTLE = (
    _ENSURE_POINTER
    + """
local actions = KEYS[1]       -- the entity's pending actions
local log = KEYS[2]           -- the entity's log
local meta = KEYS[3]          -- the entity's metadata hash
local inbox = KEYS[4]         -- the partition inbox (wake pointers)
local tool_call_id = ARGV[1]
local event = ARGV[2]         -- the answer (an input)
local url = ARGV[3]
local state = redis.call('HGET', actions, tool_call_id)
if state ~= 'pending' then return {0, state or ''} end
redis.call('HSET', actions, tool_call_id, 'settled')
redis.call('HINCRBY', meta, 'actions', -1)
local id = redis.call('XADD', log, '*', 'e', event)
redis.call('HSET', meta, 'last_in', id)
ensure_pointer(meta, inbox, url)
return {1, id}
"""
)

# Log retention: trim the entity's log of what its latest snapshot covers and nothing a
# guarantee needs. Entries stay if they are after the snapshot's position or the cursor,
# at or after an undelivered outbox, younger than the retention, among the newest `keep`,
# or at or after `cap`; a parked (failed) entity keeps everything. With `dry` it only
# says what would go (the exporter reads those entries first, then trims with cap).
# meta.trimmed records the last entry trimmed, so readers before it get a marker.
# -> {n trimmed, minid (entries before it go), last entry trimmed} | {-1} fenced
TRIM = (
    _ID_GT
    + """
local function after(id)  -- the smallest id after `id`
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. (tonumber(seq) + 1)
end
local function earliest(a, b)
  if id_gt(a, b) then return b end
  return a
end
local lease = KEYS[1]                   -- the partition lease
local log = KEYS[2]                     -- the entity's log
local meta = KEYS[3]                    -- the entity's metadata hash
local token = ARGV[1]                   -- the lease token this is fenced by
local retention_ms = tonumber(ARGV[2])  -- entries younger than this stay
local keep = tonumber(ARGV[3])          -- the newest this many entries stay
local cap = ARGV[4]                     -- entries at or after this id stay ('' = no cap)
local dry = ARGV[5] == '1'              -- only say what would go
if redis.call('GET', lease) ~= token then return {-1} end
local m = redis.call('HMGET', meta, 'status', 'snap_upto', 'cursor', 'out_done', 'out_last')
local status, snap_upto, cursor, out_done, out_last = m[1], m[2], m[3], m[4] or '0-0', m[5]
if not status or status == 'failed' or not snap_upto or not cursor then return {0, '', ''} end
local minid = earliest(after(snap_upto), after(cursor))
if id_gt(out_last, out_done) then minid = earliest(minid, after(out_done)) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
minid = earliest(minid, math.max(0, now - retention_ms) .. '-0')
if cap ~= '' then minid = earliest(minid, cap) end
if keep > 0 then
  local newest = redis.call('XREVRANGE', log, '+', '-', 'COUNT', keep)
  if #newest < keep then return {0, '', ''} end
  minid = earliest(minid, newest[#newest][1])
end
local last = redis.call('XREVRANGE', log, '(' .. minid, '-', 'COUNT', 1)
if #last == 0 then return {0, '', ''} end
if dry then return {0, minid, last[1][1]} end
local n = redis.call('XTRIM', log, 'MINID', minid)
redis.call('HSET', meta, 'trimmed', last[1][1])
return {n, minid, last[1][1]}
"""
)

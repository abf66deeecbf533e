"""Lua scripts. Each one touches the keys of a single partition only.

Wake pointers: an entity has at most one unacknowledged pointer in its
partition inbox, marked by ``meta.woke``. A sender adds a pointer only if
there is none (``HSETNX``); the commit that acknowledges pointers clears the
mark and adds a fresh pointer if the entity still has work (input after the
cursor, or undelivered effects). So a burst of messages to one entity costs one
wake, and no input is ever left without a pointer.
"""

# Stream ids compare as (ms, seq) number pairs.
_ID_GT = """
local function id_gt(a, b)
  if not a then return false end
  if not b then return true end
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am > bm end
  return tonumber(as) > tonumber(bs)
end
"""

# KEYS: log, meta, inbox, idem, typeset
# ARGV: url, type, idem_ttl_ms ('' = no dedupe), mode, args, created_event, parent, n,
#       then n pairs (flag, event): flag 'i' = input (moves last_in), 'e' = other
# mode: 'send' creates the entity if missing; 'create' is get-or-create with args
#       (an existing entity with other args is a conflict; with the same args it
#       gets the events, like 'send'); 'existing' never creates.
# -> {1, id, created_id} appended | {0, id, created_id} deduplicated or existing
#    | {-1, 'args', created_id} other args | {-2, '', ''} missing ('existing')
SEND = """
local log, meta, inbox, idem, typeset = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local url, etype, idem_ttl, mode, args, created, parent =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local n = tonumber(ARGV[8])
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
  redis.call('HSET', meta, 'type', etype, 'status', 'active', 'cursor', '0-0',
             'args', args, 'parent', parent, 'created', created_id, 'last_in', created_id)
  redis.call('SADD', typeset, url)
end
local id = created_id
local last_in = false
for j = 0, n - 1 do
  id = redis.call('XADD', log, '*', 'e', ARGV[10 + 2 * j])
  if ARGV[9 + 2 * j] == 'i' then last_in = id end
end
if last_in then redis.call('HSET', meta, 'last_in', last_in) end
if redis.call('HSETNX', meta, 'woke', '1') == 1 then redis.call('XADD', inbox, '*', 'u', url) end
if idem_ttl ~= '' then redis.call('SET', idem, id, 'PX', idem_ttl) end
return {1, id, created_id}
"""

# KEYS: meta, snap, log     ARGV: after ('' = cold start from the snapshot), count
# -> {meta_flat, snapshot|nil, entries}
LOAD = """
local meta = redis.call('HGETALL', KEYS[1])
local snap = false
local start = ARGV[1]
if start == '' then
  local upto = redis.call('HGET', KEYS[1], 'snap_upto')
  if upto then
    snap = redis.call('GET', KEYS[2])
    start = '(' .. upto
  else
    start = '-'
  end
else
  start = '(' .. start
end
return {meta, snap, redis.call('XRANGE', KEYS[3], start, '+', 'COUNT', ARGV[2])}
"""

# KEYS: lease, log, meta, inbox, snap, timers, timerdata, actions
# ARGV: token, group, cursor ('' = keep), created ('' = skip incarnation check),
#       snapshot ('' = none), snapshot_seen, snapshot_out, channel, url,
#       n_events, n_acks, n_fields, n_timers, n_actions,
#       n pairs (flag, event), ack ids, field/value pairs, timer triples (member, due, data),
#       ids of tool calls that now wait for an action (pending actions)
# Event flags: 'e' plain, 'i' input (moves last_in), 'o' outbox (moves out_last and
# adds a wake pointer so the delivery happens even if this worker dies now).
# -> {'OK', ids...} | {'FENCED'} | {'GONE'}
COMMIT = (
    _ID_GT
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'FENCED'} end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], 'created') ~= ARGV[4] then return {'GONE'} end
local ne, na, nf, nt = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local nx = tonumber(ARGV[14])
local i = 15
local out = {'OK'}
local changed = false
local last_out = ARGV[7]
for _ = 1, ne do
  local flag = ARGV[i]
  local id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[i + 1])
  out[#out + 1] = id
  if flag == 'i' then
    redis.call('HSET', KEYS[3], 'last_in', id)
  else
    last_out = id
    if flag == 'o' then
      redis.call('HSET', KEYS[3], 'out_last', id)
      if redis.call('HSETNX', KEYS[3], 'woke', '1') == 1 then
        redis.call('XADD', KEYS[4], '*', 'u', ARGV[9])
      end
      changed = true
    end
  end
  i = i + 2
end
if na > 0 then
  redis.call('XACK', KEYS[4], ARGV[2], unpack(ARGV, i, i + na - 1))
  i = i + na
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], 'cursor', ARGV[3])
  changed = true
end
if nf > 0 then
  redis.call('HSET', KEYS[3], unpack(ARGV, i, i + nf - 1))
  i = i + nf
  changed = true
end
if na > 0 then
  -- The wake's pointers are acknowledged: point again if work is left.
  redis.call('HDEL', KEYS[3], 'woke')
  local m = redis.call('HMGET', KEYS[3], 'status', 'cursor', 'last_in', 'out_done', 'out_last')
  if m[1] and m[1] ~= 'failed' and (id_gt(m[3], m[2]) or id_gt(m[5], m[4] or '0-0')) then
    redis.call('HSET', KEYS[3], 'woke', '1')
    redis.call('XADD', KEYS[4], '*', 'u', ARGV[9])
  end
end
for _ = 1, nt do
  if redis.call('ZADD', KEYS[6], 'NX', ARGV[i + 1], ARGV[i]) == 1 then
    redis.call('HSET', KEYS[7], ARGV[i], ARGV[i + 2])
    redis.call('HINCRBY', KEYS[3], 'timers', 1)
  end
  i = i + 3
end
for _ = 1, nx do
  if redis.call('HSETNX', KEYS[8], ARGV[i], 'pending') == 1 then
    redis.call('HINCRBY', KEYS[3], 'actions', 1)
  end
  i = i + 1
end
if ARGV[5] ~= '' then
  redis.call('SET', KEYS[5], ARGV[5])
  redis.call('HSET', KEYS[3], 'snap_upto', ARGV[6], 'snap_out', last_out)
end
if changed then redis.call('PUBLISH', ARGV[8], ARGV[3]) end
return out
"""
)

# KEYS: lease, timers, timerdata, meta, log, inbox
# ARGV: token, member, url, created
# A due timer of entity url: its outbox event goes into the entity's log and a
# wake pointer makes the owner deliver it. -> 1 fired | 0 gone | -1 fenced
FIRE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
local data = redis.call('HGET', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
if not data or redis.call('HGET', KEYS[4], 'created') ~= ARGV[4] then return 0 end
redis.call('HINCRBY', KEYS[4], 'timers', -1)
local id = redis.call('XADD', KEYS[5], '*', 'e', data)
redis.call('HSET', KEYS[4], 'out_last', id)
if redis.call('HSETNX', KEYS[4], 'woke', '1') == 1 then redis.call('XADD', KEYS[6], '*', 'u', ARGV[3]) end
return 1
"""

# KEYS: lease, timers, timerdata, meta     ARGV: token, member
# -> 1 cancelled | 0 no such timer (fired or cancelled already) | -1 fenced
CANCEL_TIMER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HINCRBY', KEYS[4], 'timers', -1)
return 1
"""

# KEYS: lease, log, meta, snap, typeset, inbox, actions
# ARGV: token, created, url, group, channel, ack ids...   -> 1 deleted | 0 gone | -1 fenced
DELETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[3], 'created') ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[7])
redis.call('SREM', KEYS[5], ARGV[3])
if #ARGV > 5 then redis.call('XACK', KEYS[6], ARGV[4], unpack(ARGV, 6, #ARGV)) end
redis.call('PUBLISH', ARGV[5], 'deleted')
return 1
"""

# KEYS: lease, epoch     ARGV: worker_id, ttl_ms     -> token | nil (held by another)
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.sub(cur, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. ':' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return cur
  end
  return false
end
local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""

# KEYS: lease     ARGV: token, ttl_ms     -> 1 renewed | 0 lost
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease     ARGV: token     -> 1 released | 0 not ours
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: workers     ARGV: worker_id, ttl_ms ('' = deregister)   -> live worker ids
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: actions, log, meta, inbox     ARGV: tool_call_id, event, url
# Settle a pending action at most once: concurrent answers race here and one wins.
# -> {1, event id} | {0, state} (state: '' unknown, 'settled' already answered)
SETTLE = """
local state = redis.call('HGET', KEYS[1], ARGV[1])
if state ~= 'pending' then return {0, state or ''} end
redis.call('HSET', KEYS[1], ARGV[1], 'settled')
redis.call('HINCRBY', KEYS[3], 'actions', -1)
local id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
redis.call('HSET', KEYS[3], 'last_in', id)
if redis.call('HSETNX', KEYS[3], 'woke', '1') == 1 then redis.call('XADD', KEYS[4], '*', 'u', ARGV[3]) end
return {1, id}
"""

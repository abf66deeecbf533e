"""Lua scripts. Each one touches the keys of a single partition only."""

# KEYS: log, meta, inbox, idem, typeset
# ARGV: url, type, idem_ttl_ms ('' = no dedupe), mode ('send'|'create'),
#       args, created_event, parent, message_event ('' = none)
# -> {1, id, created_id} appended | {0, id, created_id} deduplicated/existing
#    | {-1, 'args'} create with conflicting args
SEND = """
local log, meta, inbox, idem, typeset = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local url, etype, idem_ttl, mode, args, created, parent, msg =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
if idem_ttl ~= '' then
  local prior = redis.call('GET', idem)
  if prior then return {0, prior, redis.call('HGET', meta, 'created') or ''} end
end
local created_id = redis.call('HGET', meta, 'created')
if created_id then
  if mode == 'create' then
    if redis.call('HGET', meta, 'args') ~= args then return {-1, 'args', created_id} end
    return {0, created_id, created_id}
  end
else
  created_id = redis.call('XADD', log, '*', 'e', created)
  redis.call('HSET', meta, 'type', etype, 'status', 'active', 'cursor', '0-0',
             'args', args, 'parent', parent, 'created', created_id, 'last_in', created_id)
  redis.call('SADD', typeset, url)
end
local id = created_id
if msg ~= '' then
  id = redis.call('XADD', log, '*', 'e', msg)
  redis.call('HSET', meta, 'last_in', id)
end
redis.call('XADD', inbox, '*', 'u', url)
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

# KEYS: lease, log, meta, inbox, snap
# ARGV: token, group, cursor ('' = keep), created ('' = skip incarnation check),
#       n_events, n_acks, n_fields, snapshot ('' = none), snapshot_upto, channel,
#       events..., ack ids..., field/value pairs...
# -> {'OK', ids...} | {'FENCED'} | {'GONE'}
COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'FENCED'} end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], 'created') ~= ARGV[4] then return {'GONE'} end
local ne, na, nf = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local i = 11
local out = {'OK'}
for _ = 1, ne do
  out[#out + 1] = redis.call('XADD', KEYS[2], '*', 'e', ARGV[i])
  i = i + 1
end
if na > 0 then
  redis.call('XACK', KEYS[4], ARGV[2], unpack(ARGV, i, i + na - 1))
  i = i + na
end
local changed = false
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[3], 'cursor', ARGV[3])
  changed = true
end
if nf > 0 then
  redis.call('HSET', KEYS[3], unpack(ARGV, i, i + nf - 1))
  changed = true
end
if ARGV[8] ~= '' then
  redis.call('SET', KEYS[5], ARGV[8])
  redis.call('HSET', KEYS[3], 'snap_upto', ARGV[9])
end
if changed then redis.call('PUBLISH', ARGV[10], ARGV[3]) end
return out
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

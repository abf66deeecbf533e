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

Notices (SPUBLISH on an entity's idle channel, a shard channel in the partition's
slot: see ``shard_channels.py``) are advisory: waiters re-check the status every
quarter second anyway. A Redis user without the right to publish
there must not make a script fail after its writes (Lua has no rollback), so
every notice goes through the one helper ``notify``, the script's last step,
which uses ``redis.pcall`` and reports a refusal in the script's reply instead.
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

# The one way a script publishes: last, after every write, and never failing the script.
# A shard channel (SPUBLISH, Redis 7.0+) named in the script's slot, so on a cluster the
# notice stays on the partition's master. A refused SPUBLISH (the Redis user lacks the
# channel right) comes back as false, and the script says so in its reply; the writes
# before it stand.
_NOTIFY = """
local function notify(channel, message)
  local reply = redis.pcall('SPUBLISH', channel, message)
  return not (type(reply) == 'table' and reply.err)
end
"""

# The wake-pointer rule: add a pointer to the entity's partition inbox unless it has
# one already (meta.woke marks it; the commit that acknowledges it clears the mark).
# On a Redis Cluster the scripts run with DOORBELL_MARK replaced by DOORBELL (see
# script_runner.py): a new pointer also rings the inbox's shard channel (named like
# the inbox key, so in its slot), which the partition's reader waits on.
DOORBELL_MARK = "-- doorbell"
DOORBELL = "redis.pcall('SPUBLISH', inbox_key, '1')"
_ENSURE_POINTER = """
local function ensure_pointer(meta_key, inbox_key, entity_url)
  if redis.call('HSETNX', meta_key, 'woke', '1') == 1 then
    redis.call('XADD', inbox_key, '*', 'u', entity_url)
    -- doorbell
  end
end
"""

# mode: 'send' creates the entity if missing; 'create' is get-or-create with args
#       (an existing entity with other args is a conflict; with the same args it
#       gets the events, like 'send'); 'existing' never creates.
# expect: the owner the caller's authoriser saw, checked here so that the decision
#       and the write are atomic ('' = no check; '!' the entity was missing, '~' it had
#       no owner, '=' .. owner); another owner now -> {-3, seen, ''}.
# -> {1, id, created_id} appended | {0, id, created_id} deduplicated or existing
#    | {-1, 'args', created_id} other args | {-2, '', ''} missing ('existing')
#    | {-3, seen, ''} the owner is not what the caller expected (nothing written)
_SEND = """
local function send()
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
  local owner = ARGV[8]        -- the identity (JSON) that owns the entity if this creates it
  local expect = ARGV[9]       -- the owner the caller expects (see above)
  local n = tonumber(ARGV[10]) -- then n pairs (flag, event): flag 'i' input (moves last_in)
  local first_pair = 11
  if idem_ttl ~= '' then
    local prior = redis.call('GET', idem)
    -- Only an event id is an earlier send's answer: a value written by hand (garbage)
    -- would drop this send and answer the garbage as its id. It is overwritten below.
    if prior and string.match(prior, '^%d+%-%d+$') then
      return {0, prior, redis.call('HGET', meta, 'created') or ''}
    end
  end
  local created_id = redis.call('HGET', meta, 'created')
  if expect ~= '' then
    local seen = '!'
    if created_id then
      local has = redis.call('HGET', meta, 'owner')
      seen = has and ('=' .. has) or '~'
    end
    if seen ~= expect then return {-3, seen, ''} end
  end
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
    if owner ~= '' then redis.call('HSET', meta, 'owner', owner) end
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
end
"""
SEND = _ENSURE_POINTER + _SEND + "return send()"

# -> {meta_flat, snapshot|nil, entries, conversation chunks (flat hash, {} without a
#    snapshot)}
LOAD = """
local meta = KEYS[1]   -- the entity's metadata hash
local snap = KEYS[2]   -- the entity's snapshot
local log = KEYS[3]    -- the entity's log
local conv = KEYS[4]   -- the conversation chunks the snapshot references
local after = ARGV[1]  -- read the log after this id ('' = cold start from the snapshot)
local count = ARGV[2]  -- at most this many entries
local fields = redis.call('HGETALL', meta)
local snapshot = false
local chunks = {}
local start
if after == '' then
  local upto = redis.call('HGET', meta, 'snap_upto')
  if upto then
    snapshot = redis.call('GET', snap)
    chunks = redis.call('HGETALL', conv)
    start = '(' .. upto
  else
    start = '-'
  end
else
  start = '(' .. after
end
return {fields, snapshot, redis.call('XRANGE', log, start, '+', 'COUNT', count), chunks}
"""

# The wake pointers of a partition inbox, each with what the wake of its entity reads
# first (the read and the load of a busy worker in one round trip; see
# Store.read_inbox). XREADGROUP never blocks in a script; the caller blocks with a
# plain XREADGROUP when this finds nothing. Per pointer: the entity's metadata and its
# log after the cursor, at most `page` entries, until `budget` entries are read in all;
# a pointer past the budget, without a url, or whose entity cannot be read (a cursor
# that is no stream id, a key of another type) comes without them (loaded = 0) and
# its wake loads as usual. The keys of the entity are its partition's: the inbox key
# without ':inbox', then ':meta:' or ':log:' and the url (keys.py).
# -> {{pointer id, pointer fields, loaded, meta_flat, entries}, ...}
_READ_WAKES = """
local function read_wakes(inbox, group, consumer, count, page, budget)
  local tag = string.sub(inbox, 1, #inbox - 6)
  local read = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
    'STREAMS', inbox, '>')
  if type(read) == 'table' and read.err then return nil, read.err end  -- NOGROUP, say
  local out = {}
  if not read or #read == 0 then return out end
  -- {{inbox, entries}} (a fakeredis gives {inbox, entries})
  local entries = type(read[1]) == 'table' and read[1][2] or read[2]
  local function load(url)
    local meta = tag .. ':meta:' .. url
    local meta_flat = redis.pcall('HGETALL', meta)
    if type(meta_flat) ~= 'table' or meta_flat.err then return nil end
    local cursor = redis.pcall('HGET', meta, 'cursor')
    if not cursor then cursor = '0-0' end
    if type(cursor) ~= 'string' or not string.match(cursor, '^%d+%-%d+$') then return nil end
    local tail = redis.pcall('XRANGE', tag .. ':log:' .. url, '(' .. cursor, '+', 'COUNT', page)
    if type(tail) ~= 'table' or tail.err then return nil end
    return meta_flat, tail
  end
  for _, entry in ipairs(entries) do
    local fields, url = entry[2], nil
    for f = 1, #fields, 2 do
      if fields[f] == 'u' then url = fields[f + 1] end
    end
    local meta_flat, tail = nil, nil
    if url and budget > 0 then meta_flat, tail = load(url) end
    if meta_flat then
      budget = budget - #tail
      out[#out + 1] = {entry[1], fields, 1, meta_flat, tail}
    else
      out[#out + 1] = {entry[1], fields, 0, {}, {}}
    end
  end
  return out
end
"""
WAKES = (
    _READ_WAKES
    + """
local out, err = read_wakes(
  KEYS[1],               -- the partition inbox (wake pointers)
  ARGV[1],               -- the inbox consumer group
  ARGV[2],               -- the reading worker
  ARGV[3],               -- at most this many pointers
  tonumber(ARGV[4]),     -- at most this many log entries per pointer
  tonumber(ARGV[5]))     -- at most this many log entries in all
if err then return redis.error_reply(err) end  -- the caller makes the group again
return out
"""
)

# SEND, and then, for a worker that holds the target's partition, WAKES on its inbox in
# the same script: the pointer the send added (and any other new one) comes back in the
# reply, with its entity's metadata and log tail, instead of reaching the worker's
# blocked XREADGROUP bare (Redis serves a blocked read only after the script, and finds
# the pointers read by then). Read only if the send was not refused and the lease is
# still the caller's (KEYS[6] holds it): another owner's pointers stay in the inbox. A
# read that fails (the group is gone, say) leaves the pointers to the worker's inbox
# read, never failing the send it follows.
# -> SEND's reply, with a 4th element when it read: WAKES's reply
_READ_AFTER = """
local function read_after(reply)
  local lease = KEYS[6]                     -- the target partition's lease
  local at = 11 + 2 * tonumber(ARGV[10])    -- after SEND's arguments:
  local token = ARGV[at]                    -- the lease token the caller holds
  if reply[1] >= 0 and redis.call('GET', lease) == token then
    local read = read_wakes(KEYS[3], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
                           tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]))
    if read then reply[4] = read end
  end
  return reply
end
"""
SEND_WAKE = _ENSURE_POINTER + _SEND + _READ_WAKES + _READ_AFTER + "return read_after(send())"

# A send pipelined right behind its sender's commit, in the same round trip
# (Store.commit's ``sends``), applied only if that commit and every send before it in
# the pipeline were: the commit sets the sender's metadata field 'commit' to the chain's
# first link, as its last write (a commit that errors midway sets none), and each send
# finds the link before its own there and leaves its own. A refusal such as 'args' or
# 'missing' is a result and passes the chain on, but marked: the link it leaves ends in
# '!', and so does every link after it, so the mark at the chain's end (a COMMIT whose
# 'guard' is the last link, see COMMIT) does not run, and the worker marks the outbox
# with the refusals as the sender's inputs. So a refused commit (fenced, gone) delivers
# nothing, and a send that errors (a full Redis) stops the sends after it, which the
# worker then makes one by one, in order. The sender's metadata is the last key; the
# link to find and the one to leave are the last two arguments (after SEND's, or
# SEND_WAKE's).
# -> {-4, '', ''} the chain was broken (nothing written) | the send's own reply
_IN_CHAIN = """
local chain_meta = KEYS[#KEYS]
local found, want = redis.call('HGET', chain_meta, 'commit'), ARGV[#ARGV - 1]
if found ~= want and found ~= want .. '!' then return {-4, '', ''} end
local reply = send()
local mine = ARGV[#ARGV]
if found ~= want or reply[1] < 0 then mine = mine .. '!' end
redis.call('HSET', chain_meta, 'commit', mine)
"""
SEND_AFTER = _ENSURE_POINTER + _SEND + _IN_CHAIN + "return reply"
SEND_WAKE_AFTER = (
    _ENSURE_POINTER + _SEND + _READ_WAKES + _READ_AFTER + _IN_CHAIN + "return read_after(reply)"
)

# Event flags: 'e' plain, 'i' input (moves last_in), 'o' outbox (moves out_last and
# adds a wake pointer so the delivery happens even if this worker dies now).
# A delivery's mark is a commit with 'delivered', the outbox it delivered: out_done
# moves to it, unless an earlier outbox is still undelivered. That happens when an
# outbox was appended behind one not yet delivered (a timer fired while the wake ran,
# or a flush's delivery was postponed): the commit then notes 'out_wait' = '<its id>
# <the outbox before it>', and the mark of that outbox leaves out_done alone until
# out_done has reached the one before (the commit's pointer rule, out_last past
# out_done, makes the next wake deliver them all in order, and mark each).
# A commit with a 'guard' is the mark at the end of a chain of sends (see
# SEND_AFTER): it runs only if it finds the guard, the chain's last link, in the
# metadata field 'commit' (the commit and every send ran, none refused), and then
# marks the outbox the chain's commit wrote (its 'chain_out').
# -> {'OK', ids...} | {'UNNOTIFIED', ids...} committed, its notice refused (see
#    notify) | {'FENCED'} | {'GONE'} | {'UNCHAINED'} a guard not found (nothing written)
COMMIT = (
    _ID_GT
    + _ENSURE_POINTER
    + _NOTIFY
    + """
local lease = KEYS[1]                 -- the partition lease
local log = KEYS[2]                   -- the entity's log
local meta = KEYS[3]                  -- the entity's metadata hash
local inbox = KEYS[4]                 -- the partition inbox (wake pointers)
local snap = KEYS[5]                  -- the entity's snapshot
local timers = KEYS[6]                -- the partition's timers: member -> due ms
local timerdata = KEYS[7]             -- the partition's timers: member -> outbox event
local actions = KEYS[8]               -- the entity's pending actions
local conv = KEYS[9]                  -- the conversation chunks of the snapshot
local trimdue = KEYS[10]              -- the partition's retention sweep set (see TRIM)
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
                                      -- then the snapshot's conversation chunks: a count
                                      -- of fields to drop and those, a count of chunks
                                      -- to write and (field, chunk) pairs of those
local link = ARGV[16]                 -- the first link of the chain of sends behind this
                                      -- commit ('' = none; see SEND_AFTER), written last
local guard = ARGV[17]                -- the chain's last link, for its mark ('' = none)
local delivered = ARGV[18]            -- the outbox this mark records ('' = none)
local i = 19
if redis.call('GET', lease) ~= token then return {'FENCED'} end
if incarnation ~= '' and redis.call('HGET', meta, 'created') ~= incarnation then
  return {'GONE'}
end
local out = {'OK'}
local changed = false
local outbox = nil
if guard ~= '' then
  local chain = redis.call('HMGET', meta, 'commit', 'chain_out')
  if chain[1] ~= guard or not chain[2] or chain[2] == '' then return {'UNCHAINED'} end
  delivered = chain[2]
end
if delivered ~= '' then
  local m = redis.call('HMGET', meta, 'out_done', 'out_wait')
  local done = m[1] or '0-0'
  local waits, before = string.match(m[2] or '', '^(%S+) (%S+)$')
  if id_gt(delivered, done) and not (waits == delivered and id_gt(before, done)) then
    redis.call('HSET', meta, 'out_done', delivered)
  end
  changed = true
end
for _ = 1, n_events do
  local flag, event = ARGV[i], ARGV[i + 1]
  local id = redis.call('XADD', log, '*', 'e', event)
  out[#out + 1] = id
  if flag == 'i' then
    redis.call('HSET', meta, 'last_in', id)
  else
    last_out = id
    if flag == 'o' then
      outbox = id
      local m = redis.call('HMGET', meta, 'out_last', 'out_done')
      if m[1] and id_gt(m[1], m[2] or '0-0') then  -- an earlier outbox is undelivered
        redis.call('HSET', meta, 'out_wait', id .. ' ' .. m[1])
      end
      redis.call('HSET', meta, 'out_last', id)
      ensure_pointer(meta, inbox, url)
      changed = true
    end
  end
  i = i + 2
end
if n_acks > 0 then
  -- Acknowledged pointers leave the inbox: it holds only what is pending.
  redis.call('XACK', inbox, group, unpack(ARGV, i, i + n_acks - 1))
  redis.call('XDEL', inbox, unpack(ARGV, i, i + n_acks - 1))
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
  -- New, or requested again after the run refused its answer ('settled'); a call
  -- closed with its run ('cancelled', 'failed') is never reopened.
  local was = redis.call('HGET', actions, ARGV[i])
  if not was or was == 'settled' then
    redis.call('HSET', actions, ARGV[i], 'pending')
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
  -- The chunks the snapshot seals, and the drop of those no snapshot references any
  -- more, go with it: a snapshot never points at a chunk that is not there.
  local n_drop = tonumber(ARGV[i]) or 0
  if n_drop > 0 then redis.call('HDEL', conv, unpack(ARGV, i + 1, i + n_drop)) end
  i = i + 1 + n_drop
  local n_chunks = tonumber(ARGV[i]) or 0
  if n_chunks > 0 then redis.call('HSET', conv, unpack(ARGV, i + 1, i + 2 * n_chunks)) end
  redis.call('SET', snap, snapshot)
  redis.call('HSET', meta, 'snap_upto', snapshot_seen, 'snap_out', last_out)
  -- The log before the snapshot may go: the sweep looks at it even if the worker dies
  -- before its own trim (which files the entity anew).
  redis.call('ZADD', trimdue, 0, url)
end
if link ~= '' then redis.call('HSET', meta, 'commit', link, 'chain_out', outbox or '') end
if changed and not notify(channel, cursor) then out[1] = 'UNNOTIFIED' end
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
local source = KEYS[3]      -- the inbox (a pointer), the timer set (a timer) or the
                            -- retention sweep set (a sweep member)
local timerdata = KEYS[4]   -- the partition's timers: member -> outbox event
local token = ARGV[1]       -- the lease token this is fenced by
local kind = ARGV[2]        -- 'pointer' | 'timer' | 'sweep'
local item = ARGV[3]        -- the pointer's stream id | the timer member
local reason = ARGV[4]      -- why it cannot be used
local detail = ARGV[5]      -- what it held (a pointer's fields, as text)
local group = ARGV[6]       -- the inbox's consumer group
local worker = ARGV[7]
if redis.call('GET', lease) ~= token then return -1 end
if kind == 'pointer' then
  if redis.call('XACK', source, group, item) == 0 then return 0 end
  redis.call('XDEL', source, item)
else  -- a member of a sorted set: a timer, or an entry of the retention sweep set
  if redis.call('ZREM', source, item) == 0 then return 0 end
  if kind == 'timer' then
    detail = redis.call('HGET', timerdata, item) or ''
    redis.call('HDEL', timerdata, item)
  end
end
redis.call('XADD', bad, 'MAXLEN', '~', 10000, '*', 'kind', kind, 'key', source,
  'item', item, 'reason', reason, 'detail', detail, 'worker', worker)
return 1
"""

# -> 1 deleted | 2 deleted, its notice refused (see notify) | 0 gone | -1 fenced
DELETE = (
    _NOTIFY
    + """
local lease = KEYS[1]       -- the partition lease
local log = KEYS[2]         -- the entity's log
local meta = KEYS[3]        -- the entity's metadata hash
local snap = KEYS[4]        -- the entity's snapshot
local typeset = KEYS[5]     -- urls of the entity's type in the partition
local inbox = KEYS[6]       -- the partition inbox (wake pointers)
local actions = KEYS[7]     -- the entity's pending actions
local live = KEYS[8]        -- the entity's live output
local conv = KEYS[9]        -- the conversation chunks of its snapshot
local trimdue = KEYS[10]    -- the partition's retention sweep set
local token = ARGV[1]       -- the lease token this is fenced by
local incarnation = ARGV[2] -- meta.created of the entity to delete
local url = ARGV[3]
local group = ARGV[4]       -- the inbox consumer group
local channel = ARGV[5]     -- the entity's idle channel
local first_ack = 6         -- then inbox ids to acknowledge
if redis.call('GET', lease) ~= token then return -1 end
if redis.call('HGET', meta, 'created') ~= incarnation then return 0 end
redis.call('DEL', meta, snap, actions, live, conv)
-- The log is emptied, not deleted: a stream keeps its last id, so a re-create (SEND
-- persists the key again) gets a later created id even within the same millisecond, and
-- the incarnation check keeps refusing the deleted entity's writers. Emptied logs expire.
redis.call('XTRIM', log, 'MAXLEN', 0)
redis.call('PEXPIRE', log, 60000)
redis.call('SREM', typeset, url)
redis.call('ZREM', trimdue, url)
if #ARGV >= first_ack then
  redis.call('XACK', inbox, group, unpack(ARGV, first_ack, #ARGV))
  redis.call('XDEL', inbox, unpack(ARGV, first_ack, #ARGV))
end
if not notify(channel, 'deleted') then return 2 end
return 1
"""
)

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
-- Every lease is written with an expiry: one without (an operator's SET, a partial
-- restore) would hold the partition forever. It is taken like a missing one (the epoch
-- moves on, so no holder of it could commit anyway).
if current and redis.call('PTTL', lease) == -1 then
  current = false
end
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

# How many pointers of a partition inbox are pending for ``me`` and for the other
# consumers. The renewal reports both for each held partition, and the owner
# reconciles them with what it tracks (leases.py, "Pending pointers are reconciled"):
# another consumer's pointer in a held inbox is one nobody will process (a read that
# reached Redis after the acquisition's claim, by a worker that then died), and more
# of its own than it tracks are reads whose reply it never saw. A missing inbox or
# group holds nothing.
_PENDING_SPLIT = """
local function pending_split(inbox, group, me)
  local summary = redis.pcall('XPENDING', inbox, group)
  if type(summary) ~= 'table' or summary.err or type(summary[4]) ~= 'table' then
    return 0, 0
  end
  local own, others = 0, 0
  for _, consumer in ipairs(summary[4]) do
    local n = tonumber(consumer[2])
    if consumer[1] == me then own = own + n else others = others + n end
  end
  return own, others
end
"""

# KEYS[2] and ARGV[3..4] are optional: with them (the inbox, the group and the
# renewing worker) a renewed lease answers {1, own, others} (see pending_split).
# -> 1 renewed | 0 lost | {1, own pending, others' pending} | {0, 0, 0}
RENEW = (
    _PENDING_SPLIT
    + """
local lease = KEYS[1]       -- the partition lease
local token = ARGV[1]
local ttl_ms = ARGV[2]
local held = 0
if redis.call('GET', lease) == token then
  redis.call('PEXPIRE', lease, ttl_ms)
  held = 1
end
if not KEYS[2] then return held end
if held == 0 then return {0, 0, 0} end
local own, others = pending_split(KEYS[2], ARGV[3], ARGV[4])
return {1, own, others}
"""
)

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

# The single-node form of RENEW for every lease a worker holds: one call a tick, each
# lease renewed or not on its own (a reply per lease, in order). Its keys span slots,
# so it is never sent to a Redis Cluster (there each lease is renewed by RENEW on its
# master, pipelined per master). With a consumer (ARGV[3]), KEYS holds the n leases
# and then their n inboxes, and each answer is RENEW's {held, own, others}.
# -> {1 renewed | 0 lost, ...} | {{held, own pending, others' pending}, ...}
RENEW_ALL = (
    _PENDING_SPLIT
    + """
local ttl_ms = ARGV[1]
local group = ARGV[2]       -- the inbox consumer group
local me = ARGV[3]          -- the renewing worker ('' = do not look at the inboxes)
local n = #ARGV - 3         -- then the n tokens, in the order of the leases
local out = {}
for i = 1, n do
  local held = 0
  if redis.call('GET', KEYS[i]) == ARGV[i + 3] then
    redis.call('PEXPIRE', KEYS[i], ttl_ms)
    held = 1
  end
  if me == '' then
    out[i] = held
  elseif held == 0 then
    out[i] = {0, 0, 0}
  else
    local own, others = pending_split(KEYS[n + i], group, me)
    out[i] = {1, own, others}
  end
end
return out
"""
)

# Take over the pointers of a partition inbox pending for consumers other than the
# owner (ARGV[2]), whatever their idle time, and forget every other consumer left
# with nothing pending (a worker that died, or one that read late): consumers are
# never removed otherwise, and XPENDING's summary walks them all. Not fenced: it moves
# no work to anyone but the caller, and a wake is idempotent. -> XCLAIM's entries
CLAIM_OTHERS = """
local inbox = KEYS[1]       -- the partition inbox (wake pointers)
local group = ARGV[1]       -- the inbox consumer group
local me = ARGV[2]          -- the owner, who takes them
local page = tonumber(ARGV[3])
local consumers = redis.pcall('XINFO', 'CONSUMERS', inbox, group)
if type(consumers) ~= 'table' or consumers.err then return {} end
local out = {}
for _, info in ipairs(consumers) do
  local name, pending = nil, 0
  for f = 1, #info, 2 do
    if info[f] == 'name' then name = info[f + 1] end
    if info[f] == 'pending' then pending = tonumber(info[f + 1]) end
  end
  if name and name ~= me then
    local left = pending
    if pending > 0 then
      local ids = {}
      for _, e in ipairs(redis.call('XPENDING', inbox, group, '-', '+', page, name)) do
        ids[#ids + 1] = e[1]
      end
      if #ids > 0 then
        for _, entry in ipairs(redis.call('XCLAIM', inbox, group, me, 0, unpack(ids))) do
          if type(entry) == 'table' then out[#out + 1] = entry end
        end
      end
      left = pending - #ids
    end
    if left <= 0 then redis.call('XGROUP', 'DELCONSUMER', inbox, group, name) end
  end
end
return out
"""

# The earliest due time (ms) of each sorted set in KEYS (a partition's timers and
# schedules), '' for an empty one: the timer loop's safety-net read over every owned
# partition, one call. Read only; single-node only, like RENEW_ALL.
# -> {score or '', ...}
FIRST_DUE = """
local out = {}
for i, key in ipairs(KEYS) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  out[i] = first[2] or ''
end
return out
"""

# Put back wake pointers a worker read for a partition it no longer holds (a read in
# flight across a hand-over or a lapse): each pointer still pending for that worker is
# copied to a new entry and acknowledged, in one step, so the partition's owner reads
# it at once instead of finding it in a pending sweep a lease period later. A pointer
# another worker claimed meanwhile is left alone. Not fenced: it moves no work, and an
# entity keeps exactly one unacknowledged pointer. -> the number put back
REQUEUE = """
local inbox = KEYS[1]      -- the partition inbox (wake pointers)
local group = ARGV[1]      -- the inbox consumer group
local consumer = ARGV[2]   -- the worker that read the pointers
local inbox_key = inbox    -- the name the doorbell line uses (see ensure_pointer)
local moved = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', inbox, group, id, id, 1)
  if pending[1] and pending[1][2] == consumer then
    local entry = redis.call('XRANGE', inbox, id, id)
    if entry[1] then
      redis.call('XADD', inbox_key, '*', unpack(entry[1][2]))
      -- doorbell
    end
    redis.call('XACK', inbox, group, id)
    redis.call('XDEL', inbox, id)
    moved = moved + 1
  end
end
return moved
"""

# The expiry is written only once less than half of it is left: an idle worker's
# heartbeat writes every few ticks, not every tick, and reads the live workers each time.
# -> live worker ids
HEARTBEAT = """
local workers = KEYS[1]     -- live workers, score = expiry ms
local worker_id = ARGV[1]
local ttl_ms = ARGV[2]      -- '' = deregister
local horizon_ms = ARGV[3]  -- no worker's expiry is further ahead than this
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dropped = {}
if ttl_ms == '' then
  redis.call('ZREM', workers, worker_id)
else
  local expires = tonumber(redis.call('ZSCORE', workers, worker_id))
  if not expires or expires < now + tonumber(ttl_ms) / 2 then
    redis.call('ZADD', workers, now + tonumber(ttl_ms), worker_id)
  end
  -- A member that expires further ahead than any worker sets (written by hand, a
  -- restore from another clock) would get its share of the partitions, served by no
  -- one, for ever: it goes, and the caller names it.
  local beyond = '(' .. (now + tonumber(horizon_ms))
  dropped = redis.call('ZRANGEBYSCORE', workers, beyond, '+inf')
  if #dropped > 0 then redis.call('ZREMRANGEBYSCORE', workers, beyond, '+inf') end
end
redis.call('ZREMRANGEBYSCORE', workers, '-inf', now)
return {redis.call('ZRANGE', workers, 0, -1), dropped}
"""

# Append a client's tool data for a call whose action is still pending. It does not
# wake the entity (like a subscription, it is folded, not handled).
# -> {1, event id} | {0, state} (as SETTLE)
TOOL_DATA = """
local actions = KEYS[1]       -- the entity's pending actions
local log = KEYS[2]           -- the entity's log
local tool_call_id = ARGV[1]
local event = ARGV[2]         -- the tool_data event
local state = redis.call('HGET', actions, tool_call_id)
if state ~= 'pending' then return {0, state or ''} end
return {1, redis.call('XADD', log, '*', 'e', event)}
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

# -- recurring schedules (schedules.py, schedule_store.py) -------------------------
# An entity's schedules are a hash (schedule id -> spec) and one member '<url>|<id>' each
# in the partition's sorted set (score = the next occurrence, epoch ms). The worker
# computes occurrences (cron is not parsed in Lua); these scripts only compare and set.

# Upsert a schedule of one incarnation of the entity. An unchanged spec keeps its next
# occurrence (a retried wake or tool call that upserts again changes nothing).
# -> {1, next ms} written | {0, next ms} unchanged | {-1} fenced | {-2} no such entity
# (incarnation) | {-3} the entity has max_schedules already
CRON_UPSERT = """
local lease = KEYS[1]        -- the partition lease
local meta = KEYS[2]         -- the entity's metadata hash
local crons = KEYS[3]        -- the entity's schedules: id -> spec
local due = KEYS[4]          -- the partition's schedules: '<url>|<id>' -> next ms
local token = ARGV[1]        -- the lease token this is fenced by ('' = a client's write)
local url = ARGV[2]
local schedule_id = ARGV[3]
local spec = ARGV[4]         -- the packed spec (it names the incarnation)
local incarnation = ARGV[5]  -- meta.created of the entity the spec is for
local next_ms = ARGV[6]      -- its first occurrence after now
local max_schedules = tonumber(ARGV[7])
if token ~= '' and redis.call('GET', lease) ~= token then return {-1} end
if redis.call('HGET', meta, 'created') ~= incarnation then return {-2} end
local member = url .. '|' .. schedule_id
local current = redis.call('HGET', crons, schedule_id)
local score = redis.call('ZSCORE', due, member)
if current == spec and score then return {0, score} end
if not current and redis.call('HLEN', crons) >= max_schedules then return {-3} end
redis.call('HSET', crons, schedule_id, spec)
redis.call('ZADD', due, next_ms, member)
return {1, next_ms}
"""

# -> 1 deleted | 0 no such schedule | -1 fenced | -2 no such entity (incarnation)
CRON_DELETE = """
local lease = KEYS[1]        -- the partition lease
local meta = KEYS[2]         -- the entity's metadata hash
local crons = KEYS[3]        -- the entity's schedules: id -> spec
local due = KEYS[4]          -- the partition's schedules: '<url>|<id>' -> next ms
local token = ARGV[1]        -- the lease token this is fenced by ('' = a client's write)
local url = ARGV[2]
local schedule_id = ARGV[3]
local incarnation = ARGV[4]  -- meta.created of the entity
if token ~= '' and redis.call('GET', lease) ~= token then return -1 end
if redis.call('HGET', meta, 'created') ~= incarnation then return -2 end
if redis.call('HDEL', crons, schedule_id) == 0 then return 0 end
redis.call('ZREM', due, url .. '|' .. schedule_id)
return 1
"""

# Every schedule of a deleted entity goes with it. -> how many | -1 fenced
CRON_PURGE = """
local lease = KEYS[1]        -- the partition lease
local crons = KEYS[2]        -- the entity's schedules: id -> spec
local due = KEYS[3]          -- the partition's schedules: '<url>|<id>' -> next ms
local token = ARGV[1]        -- the lease token this is fenced by
local url = ARGV[2]
if redis.call('GET', lease) ~= token then return -1 end
local ids = redis.call('HKEYS', crons)
for _, schedule_id in ipairs(ids) do
  redis.call('ZREM', due, url .. '|' .. schedule_id)
end
redis.call('DEL', crons)
return #ids
"""

# Fire one occurrence and move the schedule to its next one, in one step: the
# occurrence's message goes into the entity's log (an input, with a wake pointer) and
# the score becomes the next occurrence, or neither happens. The worker passes the
# occurrence (the score it read) and the spec it computed the next one from; if either
# changed meanwhile (fired by another, upserted), nothing is written and it reads again.
# A schedule of a deleted incarnation is removed instead of fired.
# -> 1 fired | 0 not due as read (nothing written) | -1 fenced | -2 removed (gone)
CRON_FIRE = (
    _ENSURE_POINTER
    + """
local lease = KEYS[1]        -- the partition lease
local due = KEYS[2]          -- the partition's schedules: '<url>|<id>' -> next ms
local crons = KEYS[3]        -- the entity's schedules: id -> spec
local meta = KEYS[4]         -- the entity's metadata hash
local log = KEYS[5]          -- the entity's log
local inbox = KEYS[6]        -- the partition inbox (wake pointers)
local token = ARGV[1]        -- the lease token this is fenced by
local url = ARGV[2]
local schedule_id = ARGV[3]
local occurrence = ARGV[4]   -- the occurrence fired: the score the worker read (ms)
local spec = ARGV[5]         -- the spec the worker read
local incarnation = ARGV[6]  -- meta.created of the entity the spec is for
local next_ms = ARGV[7]      -- the occurrence after this one (and after now)
local event = ARGV[8]        -- the occurrence's message (an input)
if redis.call('GET', lease) ~= token then return -1 end
local member = url .. '|' .. schedule_id
local score = redis.call('ZSCORE', due, member)
if not score or tonumber(score) ~= tonumber(occurrence) then return 0 end
local current = redis.call('HGET', crons, schedule_id)
if not current then  -- its spec was removed by hand: nothing to fire
  redis.call('ZREM', due, member)
  return -2
end
if current ~= spec then return 0 end
if redis.call('HGET', meta, 'created') ~= incarnation then
  -- A leftover of a deleted incarnation: never fire it into another one.
  redis.call('ZREM', due, member)
  redis.call('HDEL', crons, schedule_id)
  return -2
end
local id = redis.call('XADD', log, '*', 'e', event)
redis.call('HSET', meta, 'last_in', id)
ensure_pointer(meta, inbox, url)
redis.call('ZADD', due, next_ms, member)
return 1
"""
)

# A schedule member or spec the worker cannot use (malformed, undecodable, an expression
# or zone no longer valid) leaves the sorted set for the dead-letter stream, its spec
# kept in the entity's hash as detail. -> 1 moved | 0 gone already | -1 fenced
CRON_QUARANTINE = """
local lease = KEYS[1]        -- the partition lease
local bad = KEYS[2]          -- the partition's dead-letter stream
local due = KEYS[3]          -- the partition's schedules: '<url>|<id>' -> next ms
local token = ARGV[1]        -- the lease token this is fenced by
local member = ARGV[2]
local reason = ARGV[3]       -- why it cannot be used
local detail = ARGV[4]       -- what its spec held
local worker = ARGV[5]
if redis.call('GET', lease) ~= token then return -1 end
if redis.call('ZREM', due, member) == 0 then return 0 end
redis.call('XADD', bad, 'MAXLEN', '~', 10000, '*', 'kind', 'schedule', 'key', due,
  'item', member, 'reason', reason, 'detail', detail, 'worker', worker)
return 1
"""
# Log retention: trim the entity's log of what its latest snapshot covers and nothing a
# guarantee needs. Entries stay if they are after the snapshot's position or the cursor,
# at or after an undelivered outbox, younger than the retention, among the newest `keep`,
# or at or after `cap`; a parked (failed) entity keeps everything. With `dry` it only
# says what would go (the exporter reads those entries first, then trims with cap).
# meta.trimmed records the last entry trimmed, so readers before it get a marker.
# Unless dry, it also files the entity in the partition's retention sweep set (trimdue)
# for when its log can next lose an entry without a new snapshot: the oldest entry's time
# plus the retention, `retry_ms` from now while a parked entity or an undelivered outbox
# holds it, or nowhere (ZREM) when only a new snapshot or new entries can free more.
# -> {n trimmed, minid (entries before it go), last entry trimmed, next due ms ('' =
# none)} | {-1} fenced
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
local due = KEYS[4]                     -- the partition's sweep set: url -> next due ms
local token = ARGV[1]                   -- the lease token this is fenced by
local retention_ms = tonumber(ARGV[2])  -- entries younger than this stay
local keep = tonumber(ARGV[3])          -- the newest this many entries stay
local cap = ARGV[4]                     -- entries at or after this id stay ('' = no cap)
local dry = ARGV[5] == '1'              -- only say what would go
local url = ARGV[6]                     -- the entity (its member in `due`)
local retry_ms = tonumber(ARGV[7])      -- when to look again at a held entity
if redis.call('GET', lease) ~= token then return {-1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function file(at)  -- the entity's next due time in the sweep set (nil = none)
  if dry then return '' end
  if at then
    redis.call('ZADD', due, at, url)
    return tostring(at)
  end
  redis.call('ZREM', due, url)
  return ''
end
local m = redis.call('HMGET', meta, 'status', 'snap_upto', 'cursor', 'out_done', 'out_last')
local status, snap_upto, cursor, out_done, out_last = m[1], m[2], m[3], m[4] or '0-0', m[5]
if status == 'failed' then return {0, '', '', file(now + retry_ms)} end
if not status or not snap_upto or not cursor then return {0, '', '', file(nil)} end
local covered = earliest(after(snap_upto), after(cursor))  -- what only a snapshot moves
local minid = covered
local outbox = id_gt(out_last, out_done)
if outbox then minid = earliest(minid, after(out_done)) end
-- entries at least retention_ms old may go (with 0, all: even those of this ms)
minid = earliest(minid, math.max(0, now - retention_ms + 1) .. '-0')
if cap ~= '' then minid = earliest(minid, cap) end
local kept = nil  -- the oldest of the newest `keep` entries
if keep > 0 then
  local newest = redis.call('XREVRANGE', log, '+', '-', 'COUNT', keep)
  if #newest < keep then return {0, '', '', file(nil)} end
  kept = newest[#newest][1]
  minid = earliest(minid, kept)
end
local n, last = 0, ''
local before = redis.call('XREVRANGE', log, '(' .. minid, '-', 'COUNT', 1)
if #before > 0 then
  last = before[1][1]
  if dry then return {0, minid, last, ''} end
  n = redis.call('XTRIM', log, 'MINID', minid)
  redis.call('HSET', meta, 'trimmed', last)
elseif dry then
  return {0, '', '', ''}
end
local first = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)[1]
if not first or not id_gt(covered, first[1]) or (kept and not id_gt(kept, first[1])) then
  return {n, minid, last, file(nil)}  -- only a new snapshot or new entries free more
end
if outbox and not id_gt(after(out_done), first[1]) then
  return {n, minid, last, file(now + retry_ms)}  -- held until the outbox is delivered
end
local born = tonumber(string.match(first[1], '^(%d+)-')) or 0
return {n, minid, last, file(math.max(born + retention_ms, now))}
"""
)

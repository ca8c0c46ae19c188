#!lua name=gpualloc
--[[
gpualloc reservation functions (Redis 7 Functions). Each function is one atomic step on ONE node's
keys, which all share the hash tag {node}, so the library runs unchanged on Redis Cluster.

Per node, with base = "<prefix>:{<node>}:":
  base..'res:'..id   HASH  id owner state fence created expires devices uses idem doc
                           [conditions: JSON [[device, type, status], ...], once reported]
  base..'dev:'..dev  STRING  the id of the reservation holding exclusive device dev
  base..'use:'..key  HASH  reservation id -> amount (milli-units) of limited use key
  base..'leases'     ZSET  RESERVED ids scored by expiry (ms, server TIME)
  base..'ids'        SET   every live id of the node
  base..'fence'      STRING  the node's last fencing token (INCR per grant, seeded by TIME)
  base..'idem'       HASH  JSON [owner, idempotency key] -> id
  base..'preempted:'..id      STRING  who preempted revoked id (expires with the memory, PX)
  base..'pending-owner:'..id  STRING  its owner, until that owner is answered 'preempted' (PX)
  base..'pending:'..tenant    ZSET  the tenant's revoked ids not told yet, scored by the end
                                    of their memory (ms); pruned by the next revoke there

Times come from TIME (milliseconds), never from the client. A lease is live while expires > now.
Every step first frees the node's leases that are due, so expired holds never block.

ARGV of every function starts with: base, node, channel. Amounts travel as decimal strings and are
summed as Lua doubles: exact up to 2^53 milli-units (see reservations.py).
]]

local VERSION = '@VERSION@'

local function context(args)
  return {base = args[1], node = args[2], channel = args[3]}
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The token is formatted by hand: cjson prints numbers with 14 significant digits only.
-- `owner` (for WatchReservations' tenant filter) and `by` (a revocation: who preempted it) are
-- optional fields: readers that do not know them ignore them.
local function publish(ctx, op, id, fence, owner, by)
  local extra = ''
  if owner then extra = extra .. ',"owner":' .. cjson.encode(owner) end
  if by then extra = extra .. ',"preempted_by":' .. cjson.encode(by) end
  redis.call('PUBLISH', ctx.channel, string.format(
    '{"op":%s,"id":%s,"node":%s,"fencing_token":%d%s}',
    cjson.encode(op), cjson.encode(id), cjson.encode(ctx.node), tonumber(fence) or 0, extra))
end

-- Delete reservation id and everything it holds; returns its fencing token and owner, or nil if
-- absent.
local function free(ctx, id)
  local rkey = ctx.base .. 'res:' .. id
  local r = redis.call('HMGET', rkey, 'devices', 'uses', 'idem', 'fence', 'owner')
  if not r[1] then return nil end
  for _, device in ipairs(cjson.decode(r[1])) do
    local dkey = ctx.base .. 'dev:' .. device
    if redis.call('GET', dkey) == id then redis.call('DEL', dkey) end
  end
  for _, use in ipairs(cjson.decode(r[2])) do
    redis.call('HDEL', ctx.base .. 'use:' .. use[1], id)
  end
  if r[3] ~= '' and redis.call('HGET', ctx.base .. 'idem', r[3]) == id then
    redis.call('HDEL', ctx.base .. 'idem', r[3])
  end
  redis.call('DEL', rkey)
  redis.call('ZREM', ctx.base .. 'leases', id)
  redis.call('SREM', ctx.base .. 'ids', id)
  return r[4], r[5]
end

-- Free every lease of the node that is due at now; returns their ids.
local function expire_due(ctx, now)
  local due = redis.call('ZRANGEBYSCORE', ctx.base .. 'leases', '-inf', string.format('%d', now))
  for _, id in ipairs(due) do
    local fence, owner = free(ctx, id)
    publish(ctx, 'expire', id, fence, owner)
  end
  return due
end

local function is_live(fields, now)
  local expires = fields.expires
  return expires == '' or tonumber(expires) > now
end

-- The tenant of an owner: the part before the first '/' (all of it without one), as
-- services/common/security/principal.py tenant_of_owner says.
local function tenant_of(owner)
  return string.match(owner, '^[^/]*')
end

local function hash_table(flat)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- Reservation checks shared by commit, renew and release: {'notfound'} | {'denied'} | {'fence'}.
local function owned(ctx, id, owner, fence)
  local r = redis.call('HMGET', ctx.base .. 'res:' .. id, 'owner', 'fence', 'state')
  if not r[1] then
    local by = redis.call('GET', ctx.base .. 'preempted:' .. id)
    if by then
      local untold = ctx.base .. 'pending-owner:' .. id
      if redis.call('GET', untold) == owner then  -- its holder is told now: no longer pending
        redis.call('ZREM', ctx.base .. 'pending:' .. tenant_of(owner), id)
        redis.call('DEL', untold)
      end
      return nil, {'preempted', by}
    end
    return nil, {'notfound'}
  end
  if r[1] ~= owner then return nil, {'denied'} end
  if fence ~= 0 and fence ~= tonumber(r[2]) then return nil, {'fence', r[2]} end
  return {owner = r[1], fence = r[2], state = r[3]}, nil
end

-- One grant at `now` (due leases already freed): its reply, and its event appended to `granted`
-- ({id, fence, owner}) when it took the hold.
-- -> {'ok', {fence, created, expires}} | {'existing', fields} | {'conflict', items}
local function take(ctx, now, id, owner, idem, lease_ms, devices_json, uses_json, doc, granted)
  if idem ~= '' then
    local existing = redis.call('HGET', ctx.base .. 'idem', idem)
    if existing then
      local fields = redis.call('HGETALL', ctx.base .. 'res:' .. existing)
      if #fields > 0 then return {'existing', fields} end
    end
  end
  local devices, uses = cjson.decode(devices_json), cjson.decode(uses_json)
  local conflicts = {}
  for _, device in ipairs(devices) do
    local holder = redis.call('GET', ctx.base .. 'dev:' .. device)
    if holder then table.insert(conflicts, {'device', device, holder}) end
  end
  for _, use in ipairs(uses) do
    local used = 0
    for _, amount in ipairs(redis.call('HVALS', ctx.base .. 'use:' .. use[1])) do
      used = used + tonumber(amount)
    end
    local free_amount = tonumber(use[3]) - used
    if tonumber(use[2]) > free_amount then
      table.insert(conflicts, {'use', use[1], use[2], string.format('%d', free_amount)})
    end
  end
  if #conflicts > 0 then return {'conflict', conflicts} end

  -- A node's first grant starts from the clock (ms), so that tokens keep increasing even
  -- after Redis lost its data, unless a node averaged more than 1000 grants per second.
  local fence_key = ctx.base .. 'fence'
  if redis.call('EXISTS', fence_key) == 0 then
    redis.call('SET', fence_key, string.format('%d', now))
  end
  local fence = redis.call('INCR', fence_key)
  local expires = string.format('%d', now + tonumber(lease_ms))
  for _, device in ipairs(devices) do
    redis.call('SET', ctx.base .. 'dev:' .. device, id)
  end
  for _, use in ipairs(uses) do
    redis.call('HSET', ctx.base .. 'use:' .. use[1], id, use[2])
  end
  local rkey = ctx.base .. 'res:' .. id
  redis.call('HSET', rkey, 'id', id, 'owner', owner, 'state', 'RESERVED', 'fence', fence,
    'created', string.format('%d', now), 'expires', expires, 'devices', devices_json,
    'uses', uses_json, 'idem', idem, 'doc', doc)
  redis.call('ZADD', ctx.base .. 'leases', expires, id)
  redis.call('SADD', ctx.base .. 'ids', id)
  if idem ~= '' then redis.call('HSET', ctx.base .. 'idem', idem, id) end
  table.insert(granted, {id, fence, owner})
  return {'ok', {fence, string.format('%d', now), expires}}
end

-- ARGV: base node channel id owner idem lease_ms devices_json uses_json doc
-- -> {'ok', {fence, created, expires}, expired} | {'existing', fields, expired}
--  | {'conflict', items, expired}   (a grant returns only what the caller did not send)
local function grant(keys, args)
  local ctx = context(args)
  local now = now_ms()
  local expired = expire_due(ctx, now)
  local granted = {}
  local reply = take(ctx, now, args[4], args[5], args[6], args[7], args[8], args[9], args[10],
    granted)
  for _, g in ipairs(granted) do publish(ctx, 'reserve', g[1], g[2], g[3]) end
  table.insert(reply, expired)
  return reply
end

-- ONE message for the grants a step made on the node: the first grant as a single event's
-- fields, the others in `more` ([id, fencing token, owner] each; readers that do not know it
-- see the first).
local function announce(ctx, granted)
  if #granted == 0 then return end
  local first = granted[1]
  local more = {}
  for i = 2, #granted do
    local g = granted[i]
    table.insert(more, string.format('[%s,%d,%s]', cjson.encode(g[1]), tonumber(g[2]),
      cjson.encode(g[3])))
  end
  local extra = ''
  if #more > 0 then extra = ',"more":[' .. table.concat(more, ',') .. ']' end
  redis.call('PUBLISH', ctx.channel, string.format(
    '{"op":"reserve","id":%s,"node":%s,"fencing_token":%d,"owner":%s%s}',
    cjson.encode(first[1]), cjson.encode(ctx.node), tonumber(first[2]),
    cjson.encode(first[3]), extra))
end

-- Many grants on one node in one step, in order, each seeing the ones before it (a batch's
-- placements there), announced by ONE message (`announce`). Kept with its ARGV for versions
-- before gpualloc_grant_batch (replicas of both versions share the library during an upgrade).
-- ARGV: base node channel count, then count x (id owner idem lease_ms devices_json uses_json doc)
-- -> {replies, expired}: replies[i] as `take` answers for grant i
local function grant_many(keys, args)
  local ctx = context(args)
  local now = now_ms()
  local expired = expire_due(ctx, now)
  local replies, granted = {}, {}
  for i = 1, tonumber(args[4]) do
    local at = 5 + (i - 1) * 7
    replies[i] = take(ctx, now, args[at], args[at + 1], args[at + 2], args[at + 3], args[at + 4],
      args[at + 5], args[at + 6], granted)
  end
  announce(ctx, granted)
  return {replies, expired}
end

-- gpualloc_grant_many's step with the grants in ONE argument and a shorter reply: a JSON array
-- of [id, owner, idem, lease_ms, devices_json, uses_json, doc] (the three documents as JSON
-- strings, stored exactly as sent).
-- ARGV: base node channel grants_json
-- -> {now, replies, expired}: replies[i] is grant i's fencing token (an integer: taken, created
--    at now, expiring at now + lease_ms) or `take`'s {'existing', fields} | {'conflict', items}
local function grant_batch(keys, args)
  local ctx = context(args)
  local now = now_ms()
  local expired = expire_due(ctx, now)
  local replies, granted = {}, {}
  for i, g in ipairs(cjson.decode(args[4])) do
    local reply = take(ctx, now, g[1], g[2], g[3], g[4], g[5], g[6], g[7], granted)
    if reply[1] == 'ok' then reply = reply[2][1] end
    replies[i] = reply
  end
  announce(ctx, granted)
  return {now, replies, expired}
end

-- The step as versions before gpualloc_grant called it (same ARGV): a grant replies with every
-- field, {'ok', fields, expired}. Kept so that replicas of both versions work during an upgrade.
local function reserve(keys, args)
  local reply = grant(keys, args)
  if reply[1] == 'ok' then
    reply[2] = redis.call('HGETALL', args[1] .. 'res:' .. args[4])
  end
  return reply
end

-- ARGV: base node channel id owner fence -> {'ok', fields, expired} | {error..., expired}
local function commit(keys, args)
  local ctx = context(args)
  local id, owner, fence = args[4], args[5], tonumber(args[6])
  local expired = expire_due(ctx, now_ms())
  local current, err = owned(ctx, id, owner, fence)
  if err then table.insert(err, expired) return err end
  local rkey = ctx.base .. 'res:' .. id
  if current.state ~= 'COMMITTED' then
    redis.call('HSET', rkey, 'state', 'COMMITTED', 'expires', '')
    redis.call('ZREM', ctx.base .. 'leases', id)
    publish(ctx, 'commit', id, current.fence, owner)
  end
  return {'ok', redis.call('HGETALL', rkey), expired}
end

-- ARGV: base node channel id owner lease_ms -> {'ok', fields, expired} | {error..., expired}
local function renew(keys, args)
  local ctx = context(args)
  local id, owner, lease_ms = args[4], args[5], tonumber(args[6])
  local now = now_ms()
  local expired = expire_due(ctx, now)
  local current, err = owned(ctx, id, owner, 0)
  if err then table.insert(err, expired) return err end
  if current.state == 'COMMITTED' then return {'committed', expired} end
  local expires = string.format('%d', now + lease_ms)
  local rkey = ctx.base .. 'res:' .. id
  redis.call('HSET', rkey, 'expires', expires)
  redis.call('ZADD', ctx.base .. 'leases', expires, id)
  publish(ctx, 'renew', id, current.fence, owner)
  return {'ok', redis.call('HGETALL', rkey), expired}
end

-- ARGV: base node channel id owner fence -> {'ok', expired} | {error..., expired}
local function release(keys, args)
  local ctx = context(args)
  local id, owner, fence = args[4], args[5], tonumber(args[6])
  local expired = expire_due(ctx, now_ms())
  local current, err = owned(ctx, id, owner, fence)
  if err then table.insert(err, expired) return err end
  free(ctx, id)
  publish(ctx, 'release', id, current.fence, owner)
  return {'ok', expired}
end

-- A preemption: free id whoever owns it, if its token is still fence, and remember for ttl_ms
-- who preempted it (commit/renew/release then answer 'preempted') and, until its owner is
-- answered so, that it is pending for the owner's tenant.
-- ARGV: base node channel id fence by ttl_ms -> {'ok', expired} | {error..., expired}
local function revoke(keys, args)
  local ctx = context(args)
  local id, fence, by, ttl = args[4], tonumber(args[5]), args[6], args[7]
  local now = now_ms()
  local expired = expire_due(ctx, now)
  local r = redis.call('HMGET', ctx.base .. 'res:' .. id, 'fence', 'owner', 'state')
  local current, owner = r[1], r[2]
  if not current then return {'notfound', expired} end
  if tonumber(current) ~= fence then return {'fence', current, expired} end
  local binding = string.sub(by, 1, 8) == 'binding:'  -- a failed binding (binding.py)
  if binding and r[3] == 'COMMITTED' then return {'committed', expired} end  -- bound: stays
  free(ctx, id)
  redis.call('SET', ctx.base .. 'preempted:' .. id, by, 'PX', ttl)
  if not binding then  -- a failed binding preempts nobody
    redis.call('SET', ctx.base .. 'pending-owner:' .. id, owner, 'PX', ttl)
    local pending = ctx.base .. 'pending:' .. tenant_of(owner)
    redis.call('ZREMRANGEBYSCORE', pending, '-inf', string.format('%d', now))
    redis.call('ZADD', pending, string.format('%d', now + tonumber(ttl)), id)
  end
  publish(ctx, 'release', id, current, owner, by)
  return {'ok', expired}
end

-- Device conditions reported for id, whoever owns it (binding.py): the newest status of each
-- (device, type) wins, in first-report order.
-- ARGV: base node channel id conditions_json fence -> {'ok', fields, expired} | {error..., expired}
local function conditions(keys, args)
  local ctx = context(args)
  local id, reported, fence = args[4], cjson.decode(args[5]), tonumber(args[6])
  local expired = expire_due(ctx, now_ms())
  local rkey = ctx.base .. 'res:' .. id
  local r = redis.call('HMGET', rkey, 'fence', 'owner', 'conditions')
  if not r[1] then
    local by = redis.call('GET', ctx.base .. 'preempted:' .. id)
    if by then return {'preempted', by, expired} end
    return {'notfound', expired}
  end
  if fence ~= 0 and fence ~= tonumber(r[1]) then return {'fence', r[1], expired} end
  local have = {}
  if r[3] then have = cjson.decode(r[3]) end
  for _, c in ipairs(reported) do
    local found = false
    for _, h in ipairs(have) do
      if h[1] == c[1] and h[2] == c[2] then
        h[3] = c[3]
        found = true
        break
      end
    end
    if not found then table.insert(have, c) end
  end
  redis.call('HSET', rkey, 'conditions', cjson.encode(have))
  publish(ctx, 'conditions', id, r[1], r[2])
  return {'ok', redis.call('HGETALL', rkey), expired}
end

-- ARGV: base node channel -> ids freed
local function expire(keys, args)
  return expire_due(context(args), now_ms())
end

-- Read-only. ARGV: base node channel id... -> the field lists of those ids that are live.
local function get(keys, args)
  local ctx = context(args)
  local now = now_ms()
  local found = {}
  for i = 4, #args do
    local fields = redis.call('HGETALL', ctx.base .. 'res:' .. args[i])
    if #fields > 0 and is_live(hash_table(fields), now) then table.insert(found, fields) end
  end
  return found
end

-- Read-only. KEYS: the node's pending:<tenant> sets; ARGV: base node channel max_ids
-- -> per key {count, {id, score, ...}}: the revocations still remembered and not told, with the
-- oldest max_ids ids and their scores (O(log n) per key, plus the ids returned).
local function pending(keys, args)
  local now = string.format('(%d', now_ms())
  local shown = tonumber(args[4])
  local found = {}
  for i, key in ipairs(keys) do
    local count = redis.call('ZCOUNT', key, now, '+inf')
    local ids = {}
    if count > 0 and shown > 0 then
      ids = redis.call('ZRANGEBYSCORE', key, now, '+inf', 'WITHSCORES', 'LIMIT', 0, shown)
    end
    found[i] = {count, ids}
  end
  return found
end

-- Read-only. ARGV: base node channel -> the field lists of every live reservation of the node.
local function list(keys, args)
  local ids = redis.call('SMEMBERS', args[1] .. 'ids')
  for i = #ids, 1, -1 do args[3 + i] = ids[i] end
  return get(keys, args)
end

--[[
The quota ledger of one cohort (services/allocator/reservations/quota_ledger.py), all under one hash tag,
base = "<prefix>:{quota:<cohort>}:":
  base..'entries'  HASH    entry id -> JSON {"tenant":..., "amounts":{resource: milli}}
  base..'expires'  ZSET    the leased entries by expiry (ms, server TIME); committed ones absent
  base..'version'  STRING  grows with every take: the compare-and-set of a grant's check
  base..'consumed'          HASH    tenant -> JSON {"amounts":{resource: milli}, "at": ms}: its
                                    usage decayed with a half-life, as last sampled
  base..'consumed-version'  STRING  grows with every sample written
The rule is checked by the caller on a read; a take adds only if nothing was taken since.
]]

local function quota_prune(base, now)
  local due = redis.call('ZRANGEBYSCORE', base .. 'expires', '-inf', string.format('%d', now))
  if #due == 0 then return end
  for _, id in ipairs(due) do redis.call('HDEL', base .. 'entries', id) end
  redis.call('ZREMRANGEBYSCORE', base .. 'expires', '-inf', string.format('%d', now))
end

-- Read-only. ARGV: base -> {now, version, entries (flat), expiries (flat, with scores)}
local function quota_read(keys, args)
  local base = args[1]
  return {string.format('%d', now_ms()), redis.call('GET', base .. 'version') or '0',
    redis.call('HGETALL', base .. 'entries'),
    redis.call('ZRANGE', base .. 'expires', 0, -1, 'WITHSCORES')}
end

-- ARGV: base version id json lease_ms -> {'ok'} | {'stale'}
local function quota_take(keys, args)
  local base, id, json, lease_ms = args[1], args[3], args[4], tonumber(args[5])
  local now = now_ms()
  quota_prune(base, now)
  if (redis.call('GET', base .. 'version') or '0') ~= args[2] then return {'stale'} end
  redis.call('HSET', base .. 'entries', id, json)
  redis.call('ZADD', base .. 'expires', string.format('%d', now + lease_ms), id)
  redis.call('INCR', base .. 'version')
  return {'ok'}
end

-- ARGV: base ticket lease_ms (id json)... -> {'ok'}: the ticket's parts replace it, keeping its
-- expiry; an entry that already exists (an idempotent replay) is left as it is.
local function quota_bind(keys, args)
  local base, ticket = args[1], args[2]
  local now = now_ms()
  quota_prune(base, now)
  local expires = redis.call('ZSCORE', base .. 'expires', ticket)
  if not expires then expires = string.format('%d', now + tonumber(args[3])) end
  redis.call('HDEL', base .. 'entries', ticket)
  redis.call('ZREM', base .. 'expires', ticket)
  for i = 4, #args, 2 do
    if redis.call('HSETNX', base .. 'entries', args[i], args[i + 1]) == 1 then
      redis.call('ZADD', base .. 'expires', expires, args[i])
    end
  end
  return {'ok'}
end

-- Many tickets in one compare-and-set (a batch's grants of one ledger); the version grows once.
-- ARGV: base version count, then count x (id json lease_ms) -> {'ok'} | {'stale'}
local function quota_take_many(keys, args)
  local base = args[1]
  local now = now_ms()
  quota_prune(base, now)
  if (redis.call('GET', base .. 'version') or '0') ~= args[2] then return {'stale'} end
  for i = 1, tonumber(args[3]) do
    local at = 4 + (i - 1) * 3
    redis.call('HSET', base .. 'entries', args[at], args[at + 1])
    redis.call('ZADD', base .. 'expires', string.format('%d', now + tonumber(args[at + 2])),
      args[at])
  end
  redis.call('INCR', base .. 'version')
  return {'ok'}
end

-- Many tickets bound at once, as quota_bind each.
-- ARGV: base count, then per ticket: ticket lease_ms parts, then parts x (id json) -> {'ok'}
local function quota_bind_many(keys, args)
  local base = args[1]
  local now = now_ms()
  quota_prune(base, now)
  local at = 3
  for _ = 1, tonumber(args[2]) do
    local ticket, lease_ms, parts = args[at], tonumber(args[at + 1]), tonumber(args[at + 2])
    at = at + 3
    local expires = redis.call('ZSCORE', base .. 'expires', ticket)
    if not expires then expires = string.format('%d', now + lease_ms) end
    redis.call('HDEL', base .. 'entries', ticket)
    redis.call('ZREM', base .. 'expires', ticket)
    for _ = 1, parts do
      if redis.call('HSETNX', base .. 'entries', args[at], args[at + 1]) == 1 then
        redis.call('ZADD', base .. 'expires', expires, args[at])
      end
      at = at + 2
    end
  end
  return {'ok'}
end

-- ARGV: base id lease_ms -> 1 when the leased entry now expires lease_ms from now, else 0
local function quota_extend(keys, args)
  local base, id = args[1], args[2]
  local now = now_ms()
  quota_prune(base, now)
  if not redis.call('ZSCORE', base .. 'expires', id) then return 0 end
  redis.call('ZADD', base .. 'expires', string.format('%d', now + tonumber(args[3])), id)
  return 1
end

-- ARGV: base id -> 1 when the entry exists (it no longer expires), else 0
local function quota_commit(keys, args)
  local base, id = args[1], args[2]
  quota_prune(base, now_ms())
  if redis.call('HEXISTS', base .. 'entries', id) == 0 then return 0 end
  redis.call('ZREM', base .. 'expires', id)
  return 1
end

-- ARGV: base id... -> how many entries were dropped
local function quota_drop(keys, args)
  local base = args[1]
  local dropped = 0
  for i = 2, #args do
    dropped = dropped + redis.call('HDEL', base .. 'entries', args[i])
    redis.call('ZREM', base .. 'expires', args[i])
  end
  return dropped
end

-- Read-only. ARGV: base -> {now, version, consumed (flat)}
local function quota_consumed_read(keys, args)
  local base = args[1]
  return {string.format('%d', now_ms()), redis.call('GET', base .. 'consumed-version') or '0',
    redis.call('HGETALL', base .. 'consumed')}
end

-- ARGV: base version (tenant json)... -> 1 when the sample replaced the last one, else 0 (another
-- sample came first)
local function quota_consumed_put(keys, args)
  local base = args[1]
  if (redis.call('GET', base .. 'consumed-version') or '0') ~= args[2] then return 0 end
  redis.call('DEL', base .. 'consumed')
  for i = 3, #args, 2 do redis.call('HSET', base .. 'consumed', args[i], args[i + 1]) end
  redis.call('INCR', base .. 'consumed-version')
  return 1
end

local function version()
  return VERSION
end

redis.register_function('gpualloc_grant', grant)
redis.register_function('gpualloc_grant_many', grant_many)
redis.register_function('gpualloc_grant_batch', grant_batch)
redis.register_function('gpualloc_reserve', reserve)
redis.register_function('gpualloc_commit', commit)
redis.register_function('gpualloc_renew', renew)
redis.register_function('gpualloc_release', release)
redis.register_function('gpualloc_expire', expire)
redis.register_function('gpualloc_revoke', revoke)
redis.register_function('gpualloc_conditions', conditions)
redis.register_function('gpualloc_quota_take', quota_take)
redis.register_function('gpualloc_quota_bind', quota_bind)
redis.register_function('gpualloc_quota_take_many', quota_take_many)
redis.register_function('gpualloc_quota_bind_many', quota_bind_many)
redis.register_function('gpualloc_quota_extend', quota_extend)
redis.register_function('gpualloc_quota_commit', quota_commit)
redis.register_function('gpualloc_quota_drop', quota_drop)
redis.register_function('gpualloc_quota_consumed_put', quota_consumed_put)
redis.register_function{function_name = 'gpualloc_quota_consumed_read',
  callback = quota_consumed_read, flags = {'no-writes'}}
redis.register_function{function_name = 'gpualloc_quota_read', callback = quota_read,
  flags = {'no-writes'}}
redis.register_function{function_name = 'gpualloc_get', callback = get, flags = {'no-writes'}}
redis.register_function{function_name = 'gpualloc_list', callback = list, flags = {'no-writes'}}
redis.register_function{function_name = 'gpualloc_pending', callback = pending,
  flags = {'no-writes'}}
redis.register_function{function_name = 'gpualloc_version', callback = version,
  flags = {'no-writes'}}

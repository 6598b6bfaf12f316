"""Redis-backed store: shared by every process, and restart-proof with AOF or RDB.

:class:`RedisStore` implements :class:`~mqguard.stores.base.Store` with exactly the semantics of
:class:`~mqguard.stores.memory.MemoryStore`, against a standalone Redis (``redis://``,
``rediss://``, ``unix://``) or a Redis Cluster (``redis+cluster://host:port[,host:port...]``,
``rediss+cluster://...``).

Key layout
----------
Every key of one name (ring name, queue or audit scope) carries the same hash tag, so they all
sit in one Cluster slot and one Lua script may touch them all. The tag is the name percent-encoded
(UTF-8, :func:`urllib.parse.quote`): ``%``, ``{``, ``}``, space, ``"``, the glob characters
``*?[]\\``, control and non-ASCII characters are escaped, so a tag never contains ``}`` and a
readable name stays readable. The empty name, whose tag would be empty (and Redis would then
hash the whole key), is encoded as the lone ``%``, which quoting never produces. With the
default namespace ``mqg`` and ``T`` the tag:

==========================  =======  ========================================================
key                         type     content
==========================  =======  ========================================================
``mqg:{T}:ring``            hash     ring metadata: ``cap`` (capacity), ``shards`` (count)
``mqg:{T}:ring:ids``        list     the ids, oldest first (a FIFO: push newest, pop oldest)
``mqg:{T}:ring:m:<i>``      hash     membership shard ``i``: field = id, value ``1``
``mqg:{T}:deliveries``      hash     delivery counts: field = message id, value = count
                                     (negated once settled, for the grace period)
``mqg:{T}:settled``         zset     settled message id -> end of its grace (epoch ms)
``mqg:{T}:sched:due``       zset     scheduled item id -> due time (epoch ms)
``mqg:{T}:sched:data``      hash     scheduled item id -> payload
``mqg:{T}:audit:meta:<P>``  hash     audit window of producer ``P``: ``w`` (size), ``h``
                                     (highest marked sequence)
``mqg:{T}:audit:bits:<P>``  string   its bitmap: bit ``seq % w`` is set when ``seq`` is marked
``mqg:{T}:presence``        zset     live consumer -> expiry (epoch ms, Redis server clock)
``mqg:{T}:presence:info``   hash     live consumer -> its info (group, node, selector)
==========================  =======  ========================================================

``<P>`` is the producer id encoded like a tag, so it holds no ``}`` (a ``SCAN`` for ``}:ring``
never matches an audit key), no glob character and, once prefixed, never collides with
another producer's keys.

Why this ring layout: a ring must cost <= 64 bytes of ``used_memory`` per id at a million ids.
Measured on Redis 7.0 (default config), a plain SET of 8-byte digests alone costs ~56 bytes per
member (dict entry, sds, bucket), and a circular STRING buffer another 8-17, so SET + STRING
misses the budget. Instead membership is split over small hashes, which Redis keeps in its
compact listpack encoding while they hold at most ``hash-max-listpack-entries`` (128 by
default) fields: ~12 bytes per id plus the key overhead shared by the shard's ids. The shard
count is the smallest power of two with at most 64 ids per shard at full capacity, so a full
shard holds 32-64 ids on average and, ids being uniform digests, practically never reaches 128.
The order lives in a LIST, itself a quicklist of listpacks (~10 bytes per 8-byte id).
Measured: ~25 bytes per id, for one ring of 1,000,000 as for 50 rings of 20,000. A ring whose
FIFO is full pops its oldest id when it pushes a new one, which is exactly the
overwrite-the-oldest-slot behaviour of the Artemis circular cache, and it accepts ids of any
length (a shard holding ids longer than ``hash-max-listpack-value`` = 64 bytes just falls back
to a bigger hashtable encoding).

An id's shard is its first four bytes (big endian) modulo the shard count when it is an 8-byte
digest (uniform already), otherwise the first 32 bits of its SHA-1. A capacity change that
crosses a power of two changes the shard count and rebuilds the shards from the list, in the
same script: O(ring size), about 3-4 s per million ids during which that Redis serves
nothing else, so resizing a huge ring is an operator action, not something to do per message.

Audit windows (``audit_*``, ActiveMQ's message audit) cost ``w / 8`` bytes of bitmap plus the
overhead of two keys: measured on Redis 7.0, ~900 bytes of ``used_memory`` per producer at the
default 2048 with ~30-character scope and producer ids. ``seq`` lives at bit ``seq % w``.
``audit_mark`` is one script: a sequence above ``h`` first clears the slots it slides over
(``BITFIELD`` for partial bytes, one ``SETRANGE`` of zero bytes for whole ones, so never a loop
over the gap), or deletes the bitmap when it jumps by ``w`` or more; a sequence at or below
``h - w`` is ignored; the others get their ``SETBIT``; finally both keys get ``PEXPIRE
ttl_ms``, which is how a producer that went away is forgotten. A stored window of another size
(or a bitmap without its meta) is dropped first. Sequences travel as decimal strings and ``h``
is stored as the argument string it came from, never formatted by Lua (which keeps only 14
digits); Lua compares them as doubles, exact below 2**53, hence ``AUDIT_SEQUENCE_LIMIT``.
``audit_seen`` reads (``HMGET`` + ``GETBIT``) in one script for a consistent view;
``audit_forget`` clears bits without touching the expiry. Marking and forgetting are
idempotent, so both retry after a timeout.

Atomicity: every multi-step update is one Lua script (EVALSHA through redis-py's ``Script``,
which loads it again after a NOSCRIPT). Scripts receive the ring's meta and list keys and
derive the shard keys from them; derived keys share the tag, so they are legal on Cluster.
``ring_check_and_add`` and ``ring_add_all_or_none`` take the whole batch in one call.

Failures: every redis-py error becomes :class:`~mqguard.errors.StoreError`, whose message names
the store by its URL with the credentials masked. Connection errors (including a Redis that is
still loading its AOF after a restart) are retried with jittered exponential backoff for up to
``retry_timeout`` seconds, so a short Redis restart delays calls instead of failing them. A
*timeout* is retried only by operations that are idempotent: a script that ran but whose reply
timed out would, when run again, flag its own ids as duplicates. (The same would happen if a
connection died between Redis running a script and the reply reaching us; that window is tiny,
and a graceful Redis shutdown replies before it closes connections.)
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, cast
from urllib.parse import quote, unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ConnectionError,
    ExternalAuthProviderError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)
from redis.retry import Retry

from mqguard.errors import StoreError
from mqguard.redact import (
    AMBIGUOUS_USERINFO,
    redact_url,
    url_secrets,
    userinfo_is_ambiguous,
)
from mqguard.stores.base import (
    RingOutcome,
    RingStats,
    ScheduledItem,
    check_audit_mark,
    check_audit_sequences,
    check_pending_ms,
    check_presence_ttl,
)

__all__ = ["DEFAULT_NAMESPACE", "RedisStore", "key_tag", "mask_url"]

_T = TypeVar("_T")

DEFAULT_NAMESPACE: Final = "mqg"

#: Most ids per membership shard on average at full capacity. Half of Redis' default
#: ``hash-max-listpack-entries`` (128): a shard's fill is ~Poisson(<=64), which exceeds 128 with
#: probability ~1e-12, so shards stay listpack-encoded for the life of the ring (Redis never
#: converts a hash back to listpack once it has grown into a hashtable).
IDS_PER_SHARD: Final = 64

# Printable ASCII that may stay as is in a hash tag. Left out (so percent-encoded): '%' (the
# escape), '{' and '}' (tag delimiters), space and '"' (awkward in redis-cli), and the glob
# characters '*?[]\\' (so SCAN MATCH patterns built from a tag match literally).
_TAG_SAFE: Final = "!#$&'()+,-./:;<=>@^_`|~"
_EMPTY_TAG: Final = "%"

# Defaults for redis-py connections; keyword arguments and URL query parameters override them.
_CLIENT_DEFAULTS: Final[dict[str, Any]] = {
    # Long enough for the slowest script (rebuilding the shards of a million-id ring, ~3 s),
    # short enough that a hung server surfaces as a StoreError rather than a stuck broker.
    "socket_timeout": 10.0,
    "socket_connect_timeout": 2.0,
    "socket_keepalive": True,
    # PING a pooled connection idle for this long before reusing it, so a connection killed by
    # a Redis restart is detected before it carries a command.
    "health_check_interval": 15,
    "client_name": "mqguard",
}

_BACKOFF_BASE: Final = 0.05
_BACKOFF_CAP: Final = 1.0
_SCAN_COUNT: Final = 1000

# Errors after which the command did not run (no connection, server loading, cluster
# reconfiguring, replica not yet promoted), so any operation may be retried. See the module
# docstring for the one narrow exception (a connection lost after the command ran).
_RETRY_ALWAYS: Final[tuple[type[BaseException], ...]] = (
    ConnectionError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
    ReadOnlyError,
)
# ConnectionError subclasses that a retry cannot fix: wrong credentials or permissions.
_RETRY_NEVER: Final[tuple[type[BaseException], ...]] = (
    AuthenticationError,
    AuthorizationError,
    ExternalAuthProviderError,
)


# -- Lua ---------------------------------------------------------------------------------------
#
# KEYS[1] is the ring's meta hash, KEYS[2] its FIFO list; shard keys are derived from KEYS[1].
# Numbers go through Lua doubles, exact for every capacity and shard index we can meet.

_RING_PRELUDE: Final = """
local meta, fifo = KEYS[1], KEYS[2]
local shard_prefix = meta .. ':m:'
local PER_SHARD = __IDS_PER_SHARD__
-- Lua's unpack() and Redis' argument handling both prefer bounded command sizes.
local CHUNK = 1000

-- A power of two, so that most capacity changes (anything within the same factor of two)
-- keep the shard count and need no rebuild.
local function shard_count(cap)
  local n = 1
  while n * PER_SHARD < cap do
    n = n * 2
  end
  return n
end

-- The membership shard holding id when the ring has n shards.
local function shard(id, n)
  local h
  if #id == 8 then
    local a, b, c, d = string.byte(id, 1, 4)
    h = ((a * 256 + b) * 256 + c) * 256 + d
  else
    h = tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
  end
  return shard_prefix .. (h % n)
end

local function unlink_shards(n)
  local batch = {}
  for i = 0, n - 1 do
    batch[#batch + 1] = shard_prefix .. i
    if #batch == CHUNK or i == n - 1 then
      redis.call('UNLINK', unpack(batch))
      batch = {}
    end
  end
end

-- RPUSH list[first..#list] in bounded chunks.
local function push_from(list, first)
  local i = first
  while i <= #list do
    local j = math.min(i + CHUNK - 1, #list)
    redis.call('RPUSH', fifo, unpack(list, i, j))
    i = j + 1
  end
end

-- Bring the ring to capacity cap, creating it when missing; a shrink keeps the newest ids.
-- Returns the shard count now in use and how many ids were deleted.
local function ensure(cap)
  local cur = redis.call('HMGET', meta, 'cap', 'shards')
  local want = shard_count(cap)
  if not cur[1] then
    redis.call('HSET', meta, 'cap', cap, 'shards', want)
    return want, 0
  end
  local n = tonumber(cur[2])
  if tonumber(cur[1]) == cap then
    return n, 0
  end
  local len = redis.call('LLEN', fifo)
  local deleted = math.max(0, len - cap)
  if want ~= n then
    -- An id's shard depends on the shard count, so nearly every id moves: rebuild the shards
    -- from the surviving ids instead of moving them one by one.
    if deleted > 0 then
      redis.call('LTRIM', fifo, deleted, -1)
    end
    unlink_shards(n)
    local start = 0
    while true do
      local chunk = redis.call('LRANGE', fifo, start, start + CHUNK - 1)
      for _, id in ipairs(chunk) do
        redis.call('HSET', shard(id, want), id, 1)
      end
      if #chunk < CHUNK then break end
      start = start + CHUNK
    end
  else
    local start = 0
    while start < deleted do
      local stop = math.min(start + CHUNK, deleted) - 1
      for _, id in ipairs(redis.call('LRANGE', fifo, start, stop)) do
        redis.call('HDEL', shard(id, n), id)
      end
      start = stop + 1
    end
    if deleted > 0 then
      redis.call('LTRIM', fifo, deleted, -1)
    end
  end
  redis.call('HSET', meta, 'cap', cap, 'shards', want)
  return want, deleted
end

-- Reservations: a shard field holds '1' for a confirmed id, or the reservation time in ms
-- (the server's clock) for an id whose send is not confirmed yet.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- '0' new, '1' duplicate (confirmed), '2' in flight; for a value v found in a shard.
local function outcome(v, now, pending)
  if not v then return '0' end
  if v == '1' then return '1' end
  if now - tonumber(v) >= pending then return '0' end
  return '2'
end

-- Confirm the reserved ids of ARGV[first..last].
local function confirm(first, last, n)
  for i = first, last do
    local s = shard(ARGV[i], n)
    local v = redis.call('HGET', s, ARGV[i])
    if v and v ~= '1' then
      redis.call('HSET', s, ARGV[i], 1)
    end
  end
end

-- For each id of ARGV[first..], in order: flag it '1' when a member, else add it ('0'),
-- evicting the oldest id when the ring is full. Returns the flags as one string.
-- With reserve = {now, pending} the ids are added as reservations; a confirmed member is
-- '1', a reservation younger than pending ms '2', an older one is taken over ('0').
local function add_batch(first, cap, n, reserve)
  local count = redis.call('LLEN', fifo)
  local nids = #ARGV - first + 1
  local value = reserve and reserve[1] or 1
  -- Every id added beyond the free slots evicts one: fetch the ones that can be evicted from
  -- the list up front (one LRANGE instead of an LPOP per id). Once they are exhausted, the
  -- victims are the ids this very batch added, oldest first.
  local old = {}
  if count > 0 and nids > cap - count then
    old = redis.call('LRANGE', fifo, 0, nids - (cap - count) - 1)
  end
  local added, flags, evicted, mine = {}, {}, 0, {}
  for i = first, #ARGV do
    local id = ARGV[i]
    local s = shard(id, n)
    if redis.call('HSETNX', s, id, value) == 1 then
      if count < cap then
        count = count + 1
      else
        evicted = evicted + 1
        local victim = old[evicted] or added[evicted - #old]
        redis.call('HDEL', shard(victim, n), victim)
      end
      added[#added + 1] = id
      mine[id] = true
      flags[#flags + 1] = '0'
    elseif not reserve or mine[id] then
      flags[#flags + 1] = '1'
    else
      local f = outcome(redis.call('HGET', s, id), reserve[1], reserve[2])
      if f == '0' then
        redis.call('HSET', s, id, value)  -- a stale reservation: taken over in place
        mine[id] = true
      end
      flags[#flags + 1] = f
    end
  end
  local from_old = math.min(evicted, #old)
  if from_old > 0 then
    redis.call('LTRIM', fifo, from_old, -1)
  end
  push_from(added, evicted - from_old + 1)
  return table.concat(flags)
end
""".replace("__IDS_PER_SHARD__", str(IDS_PER_SHARD))

# ARGV: capacity, id...
_CHECK_AND_ADD: Final = _RING_PRELUDE + """
local cap = tonumber(ARGV[1])
local n = ensure(cap)
return add_batch(2, cap, n)
"""

# ARGV: capacity, id...
_ADD_ALL_OR_NONE: Final = _RING_PRELUDE + """
local cap = tonumber(ARGV[1])
local n = ensure(cap)
local seen, flags, dup = {}, {}, false
for i = 2, #ARGV do
  local id = ARGV[i]
  if seen[id] or redis.call('HEXISTS', shard(id, n), id) == 1 then
    flags[#flags + 1] = '1'
    dup = true
  else
    flags[#flags + 1] = '0'
  end
  seen[id] = true
end
if dup then
  return table.concat(flags)
end
return add_batch(2, cap, n)
"""

# ARGV: capacity, pending ms, all-or-none (0/1), number of ids to confirm, those ids, ids...
_RESERVE: Final = _RING_PRELUDE + """
local cap, pending = tonumber(ARGV[1]), tonumber(ARGV[2])
local nconfirm = tonumber(ARGV[4])
local first = 5 + nconfirm
local n = ensure(cap)
confirm(5, first - 1, n)
local now = now_ms()
if ARGV[3] == '1' then
  local seen, flags, ok = {}, {}, true
  for i = first, #ARGV do
    local id = ARGV[i]
    local f = seen[id] and '1' or outcome(redis.call('HGET', shard(id, n), id), now, pending)
    seen[id] = true
    flags[#flags + 1] = f
    ok = ok and f == '0'
  end
  if not ok then
    return table.concat(flags)
  end
end
return add_batch(first, cap, n, {now, pending})
"""

# ARGV: id...
_CONFIRM: Final = _RING_PRELUDE + """
local n = redis.call('HGET', meta, 'shards')
if n then
  confirm(1, #ARGV, tonumber(n))
end
return 0
"""

# ARGV: id...
_RELEASE: Final = _RING_PRELUDE + """
local n = redis.call('HGET', meta, 'shards')
if not n then
  return 0
end
n = tonumber(n)
local released = 0
for i = 1, #ARGV do
  local s = shard(ARGV[i], n)
  local v = redis.call('HGET', s, ARGV[i])
  if v and v ~= '1' then
    redis.call('HDEL', s, ARGV[i])
    -- The newest ids are at the tail, and a released id is usually among them.
    redis.call('LREM', fifo, -1, ARGV[i])
    released = released + 1
  end
end
return released
"""

# ARGV: pending ms, id...
_LOOKUP: Final = _RING_PRELUDE + """
local n = redis.call('HGET', meta, 'shards')
local now, pending = now_ms(), tonumber(ARGV[1])
local flags = {}
for i = 2, #ARGV do
  local v = n and redis.call('HGET', shard(ARGV[i], tonumber(n)), ARGV[i])
  flags[#flags + 1] = outcome(v or nil, now, pending)
end
return table.concat(flags)
"""

# ARGV: id...
_CONTAINS: Final = _RING_PRELUDE + """
local n = tonumber(redis.call('HGET', meta, 'shards'))
local flags = {}
for i = 1, #ARGV do
  if n and redis.call('HEXISTS', shard(ARGV[i], n), ARGV[i]) == 1 then
    flags[i] = '1'
  else
    flags[i] = '0'
  end
end
return table.concat(flags)
"""

_STATS: Final = """
local cap = redis.call('HGET', KEYS[1], 'cap')
if not cap then
  return false
end
return {tonumber(cap), redis.call('LLEN', KEYS[2])}
"""

# ARGV: capacity
_RESIZE: Final = _RING_PRELUDE + """
local _, deleted = ensure(tonumber(ARGV[1]))
return deleted
"""

_CLEAR: Final = _RING_PRELUDE + """
local n = redis.call('HGET', meta, 'shards')
if not n then
  return 0
end
unlink_shards(tonumber(n))
redis.call('UNLINK', meta, fifo)
return 1
"""

# Delivery counts: ``<ns>:{Q}:deliveries`` maps message id -> count; a *settled* count (the
# message reached its fate) is kept negated for a grace period, with its due time in the
# ``settled`` zset, because the ack that settled it is not confirmed by the broker:
# when it is lost (the guard or the broker dies first), the redelivery must go on counting
# from there, not from zero. Any settle purges (up to 256) counts whose grace has passed, so
# nothing is left behind when the process that settled them dies.
# KEYS: counts hash, settled zset. ARGV: message id. Returns the new count.
_COUNT_INCR: Final = """
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
if n < 0 then
  n = -n
  redis.call('ZREM', KEYS[2], ARGV[1])
end
n = n + 1
redis.call('HSET', KEYS[1], ARGV[1], n)
return n
"""

# KEYS: counts hash, settled zset. ARGV: grace ms, message id... Time from the server (TIME):
# scripts are replicated by effects, which makes TIME legal before a write.
_COUNT_SETTLE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  local n = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0
  if n > 0 then
    redis.call('HSET', KEYS[1], ARGV[i], -n)
    redis.call('ZADD', KEYS[2], due, ARGV[i])
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
for _, id in ipairs(old) do
  local n = tonumber(redis.call('HGET', KEYS[1], id) or '0') or 0
  if n <= 0 then
    redis.call('HDEL', KEYS[1], id)
  end
  redis.call('ZREM', KEYS[2], id)
end
return #old
"""

# KEYS: due zset, data hash. ARGV: item id, payload, due ms.
_SCHEDULE_ADD: Final = """
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
"""

# KEYS: due zset, data hash. ARGV: now ms, limit, lease end ms.
# ZSET order is (score, member bytes), and UTF-8 byte order is code point order, so this is
# MemoryStore's (due_ms, item_id) order. Returns id, payload, original due (as Redis formats the
# score, exact for integers below 2**53) for each claimed item.
_SCHEDULE_CLAIM: Final = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local out = {}
for i = 1, #due, 2 do
  local id = due[i]
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
  out[#out + 1] = due[i + 1]
end
return out
"""

# KEYS: due zset, data hash. ARGV: item id.
_SCHEDULE_REMOVE: Final = """
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return removed
"""


# KEYS[1] is an audit window's meta hash (``w`` size, ``h`` highest marked sequence), KEYS[2] its
# bitmap. Positions (< w) are small; sequences stay below 2**53, exact as doubles, and math.fmod
# is exact where Lua's '%' (a - floor(a/b)*b) may round.
_AUDIT_PRELUDE: Final = """
local meta, bits = KEYS[1], KEYS[2]

-- Clear bits [a, b) of the bitmap: BITFIELD for partial bytes at either end, one SETRANGE of
-- zero bytes for the whole bytes between.
local function clear_bits(a, b)
  if a >= b then return end
  local first = a + (8 - a % 8) % 8
  local last = b - b % 8
  if first >= last then
    -- Within at most two partial bytes: fewer than 16 bits.
    redis.call('BITFIELD', bits, 'SET', 'u' .. (b - a), a, 0)
    return
  end
  if first > a then
    redis.call('BITFIELD', bits, 'SET', 'u' .. (first - a), a, 0)
  end
  redis.call('SETRANGE', bits, first / 8, string.rep(string.char(0), (last - first) / 8))
  if b > last then
    redis.call('BITFIELD', bits, 'SET', 'u' .. (b - last), last, 0)
  end
end

-- Clear the slots of sequences from .. from+count-1 (count < window), wrapping around.
local function clear_slots(from, count, window)
  local p = math.fmod(from, window)
  if p + count <= window then
    clear_bits(p, p + count)
  else
    clear_bits(p, window)
    clear_bits(0, p + count - window)
  end
end
"""

# ARGV: window, ttl ms, sequence...
_AUDIT_MARK: Final = _AUDIT_PRELUDE + """
local window = tonumber(ARGV[1])
local cur = redis.call('HMGET', meta, 'w', 'h')
local high, high_arg = -1, nil
if cur[1] and tonumber(cur[1]) == window then
  high, high_arg = tonumber(cur[2]), cur[2]
else
  -- No window yet, or one of another size: start afresh.
  redis.call('DEL', bits)
end
for i = 3, #ARGV do
  local seq = tonumber(ARGV[i])
  if seq > high then
    if high < 0 or seq - high >= window then
      redis.call('DEL', bits)
    elseif seq - high > 1 then
      -- The slots of high+1 .. seq-1 still hold marks of the previous lap; seq's own slot is
      -- set just below.
      clear_slots(high + 1, seq - high - 1, window)
    end
    high, high_arg = seq, ARGV[i]
  end
  if seq > high - window then
    redis.call('SETBIT', bits, math.fmod(seq, window), 1)
  end
end
redis.call('HSET', meta, 'w', ARGV[1], 'h', high_arg)
redis.call('PEXPIRE', meta, ARGV[2])
redis.call('PEXPIRE', bits, ARGV[2])
return 0
"""

# ARGV: sequence... Returns one '0'/'1' flag per sequence.
_AUDIT_SEEN: Final = _AUDIT_PRELUDE + """
local cur = redis.call('HMGET', meta, 'w', 'h')
local window, high = tonumber(cur[1]), tonumber(cur[2])
local flags = {}
for i = 1, #ARGV do
  local seq = tonumber(ARGV[i])
  if window and seq <= high and seq > high - window
      and redis.call('GETBIT', bits, math.fmod(seq, window)) == 1 then
    flags[i] = '1'
  else
    flags[i] = '0'
  end
end
return table.concat(flags)
"""

# ARGV: sequence... Leaves the expiry alone, and never creates a key (which would not expire).
_AUDIT_FORGET: Final = _AUDIT_PRELUDE + """
local cur = redis.call('HMGET', meta, 'w', 'h')
if not cur[1] or redis.call('EXISTS', bits) == 0 then
  return 0
end
local window, high = tonumber(cur[1]), tonumber(cur[2])
for i = 1, #ARGV do
  local seq = tonumber(ARGV[i])
  if seq <= high and seq > high - window then
    redis.call('SETBIT', bits, math.fmod(seq, window), 0)
  end
end
return 0
"""


# -- consumer presence -------------------------------------------------------------------------
#
# KEYS[1]: zset member -> expiry (epoch ms of the Redis server clock), KEYS[2]: hash member ->
# info. Time comes from the server (TIME), so clients with skewed clocks agree; scripts are
# replicated by effects (Redis >= 5), which makes TIME legal before a write. Epoch ms have 13
# digits, within the 14 that Lua keeps when a number becomes a string.

_PRESENCE_PRELUDE: Final = """
local live, info = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Forget the members whose expiry has passed.
local function prune()
  local dead = redis.call('ZRANGEBYSCORE', live, '-inf', now)
  for i = 1, #dead do
    redis.call('ZREM', live, dead[i])
    redis.call('HDEL', info, dead[i])
  end
end
"""

# ARGV: member, info, ttl ms
_PRESENCE_BEAT: Final = _PRESENCE_PRELUDE + """
local ttl = tonumber(ARGV[3])
prune()
redis.call('ZADD', live, now + ttl, ARGV[1])
redis.call('HSET', info, ARGV[1], ARGV[2])
-- Both keys outlive their newest member by a little, so an abandoned scope disappears.
local keep = redis.call('ZRANGE', live, -1, -1, 'WITHSCORES')
local ms = math.max(tonumber(keep[2]) - now, ttl) + 1000
redis.call('PEXPIRE', live, ms)
redis.call('PEXPIRE', info, ms)
return 0
"""

# Returns member, info, member, info, ...
_PRESENCE_LIVE: Final = _PRESENCE_PRELUDE + """
prune()
local members = redis.call('ZRANGE', live, 0, -1)
local out = {}
for i = 1, #members do
  out[#out + 1] = members[i]
  out[#out + 1] = redis.call('HGET', info, members[i]) or ''
end
return out
"""

# ARGV: member. Returns 1 when it was live.
_PRESENCE_LEAVE: Final = _PRESENCE_PRELUDE + """
local expires = redis.call('ZSCORE', live, ARGV[1])
redis.call('ZREM', live, ARGV[1])
redis.call('HDEL', info, ARGV[1])
if expires and tonumber(expires) > now then
  return 1
end
return 0
"""


# -- names, URLs, errors ----------------------------------------------------------------------


def key_tag(name: str) -> str:
    """The hash tag (without braces) of every key of ``name``; see the module docstring."""
    if not name:
        return _EMPTY_TAG
    return quote(name, safe=_TAG_SAFE, encoding="utf-8", errors="surrogatepass")


def _tag_name(tag: str) -> str:
    if tag == _EMPTY_TAG:
        return ""
    return unquote(tag, encoding="utf-8", errors="surrogatepass")


def _text(value: str) -> bytes:
    # surrogatepass: names and ids are arbitrary Python strings, lone surrogates included.
    return value.encode("utf-8", "surrogatepass")


def _untext(value: bytes) -> str:
    return value.decode("utf-8", "surrogatepass")


def mask_url(url: str) -> str:
    """``url`` with its user-info (and password-like query parameters) replaced by ``***``
    (:func:`mqguard.redact.redact_url`: safe for passwords holding URL delimiters)."""
    return redact_url(url)


def _url_secrets(url: str) -> list[str]:
    """Every string of ``url`` that may be a secret, raw and percent-decoded, longest first."""
    return url_secrets(url)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _retryable(exc: BaseException, idempotent: bool) -> bool:
    if isinstance(exc, _RETRY_NEVER):
        return False
    if isinstance(exc, _RETRY_ALWAYS):
        return True
    if isinstance(exc, TimeoutError):
        return idempotent
    if isinstance(exc, ResponseError) and str(exc).startswith("BUSY "):
        # Another client's long script (e.g. a big ring rebuild) holds the server; ours was
        # refused, not run.
        return True
    # redis-py's cluster client raises a bare RedisClusterException when no node answers its
    # topology refresh; its cause is the ConnectionError, so it is a connection failure too.
    if type(exc) is RedisClusterException:
        cause = exc.__cause__ or exc.__context__
        return isinstance(cause, ConnectionError) or "cannot be connected" in str(exc)
    return False


_OUTCOMES: Final = {ord("0"): RingOutcome.NEW, ord("1"): RingOutcome.DUPLICATE,
                   ord("2"): RingOutcome.IN_FLIGHT}


def _outcomes(reply: bytes) -> list[RingOutcome]:
    return [_OUTCOMES[flag] for flag in reply]


def _flags(reply: bytes) -> list[bool]:
    return [char == 0x31 for char in reply]  # b"1"


def _ring_args(capacity: int, ids: Sequence[bytes]) -> list[bytes | int]:
    args: list[bytes | int] = [capacity]
    args.extend(ids)
    return args


def _check_capacity(capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"ring capacity must be >= 1, got {capacity}")



def _split_cluster_url(url: str) -> tuple[str, list[ClusterNode]]:
    """``redis+cluster://[auth@]h1:p1[,h2:p2...]/...`` -> (``redis://[auth@]h1:p1/...``, extra
    seed nodes). redis-py wants a plain redis:// URL and takes extra seeds separately."""
    scheme, rest = url.split("://", 1)
    base = "rediss" if scheme.lower().startswith("rediss") else "redis"
    netloc, sep, tail = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    first, *others = hosts.split(",")
    nodes: list[ClusterNode] = []
    for item in others:
        host, _, port = item.strip().rpartition(":")
        nodes.append(ClusterNode(host.strip("[]") or "localhost", int(port or 6379)))
    return f"{base}://{auth}{at}{first}{sep}{tail}", nodes


class RedisStore:
    """:class:`~mqguard.stores.base.Store` kept in Redis or Redis Cluster; see the module doc.

    Thread-safe: redis-py clients pool their connections and the scripts hold no state.
    """

    def __init__(self, client: redis.Redis | RedisCluster, *, url: str | None = None,
                 namespace: str = DEFAULT_NAMESPACE, retry_timeout: float = 5.0) -> None:
        """Wrap an existing redis-py client. Prefer :meth:`from_url`, which configures the
        timeouts and retries this class relies on. ``url`` only names the store in errors
        (masked); ``namespace`` prefixes every key."""
        if not namespace or any(c in namespace for c in "{}*?[]\\ "):
            raise ValueError(f"namespace {namespace!r} must be non-empty, without braces, "
                             "blanks or glob characters")
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        self._ns = namespace
        self._retry_timeout = retry_timeout
        self._secrets = _url_secrets(url) if url else []
        self._where = mask_url(url) if url else self._describe_client()
        register = client.register_script
        self._s_check_and_add: Script = register(_CHECK_AND_ADD)
        self._s_add_all_or_none: Script = register(_ADD_ALL_OR_NONE)
        self._s_contains: Script = register(_CONTAINS)
        self._s_reserve: Script = register(_RESERVE)
        self._s_confirm: Script = register(_CONFIRM)
        self._s_release: Script = register(_RELEASE)
        self._s_lookup: Script = register(_LOOKUP)
        self._s_stats: Script = register(_STATS)
        self._s_resize: Script = register(_RESIZE)
        self._s_clear: Script = register(_CLEAR)
        self._s_count_incr: Script = register(_COUNT_INCR)
        self._s_count_settle: Script = register(_COUNT_SETTLE)
        self._s_schedule_add: Script = register(_SCHEDULE_ADD)
        self._s_schedule_claim: Script = register(_SCHEDULE_CLAIM)
        self._s_schedule_remove: Script = register(_SCHEDULE_REMOVE)
        self._s_audit_mark: Script = register(_AUDIT_MARK)
        self._s_audit_seen: Script = register(_AUDIT_SEEN)
        self._s_audit_forget: Script = register(_AUDIT_FORGET)
        self._s_presence_beat: Script = register(_PRESENCE_BEAT)
        self._s_presence_live: Script = register(_PRESENCE_LIVE)
        self._s_presence_leave: Script = register(_PRESENCE_LEAVE)

    @classmethod
    def from_url(cls, url: str, *, namespace: str = DEFAULT_NAMESPACE,
                 retry_timeout: float = 5.0, **options: Any) -> RedisStore:
        """Open ``redis://``, ``rediss://``, ``unix://`` (standalone) or ``redis+cluster://``,
        ``rediss+cluster://`` (Cluster; several seeds may be given comma-separated) URLs.

        ``options`` are passed to redis-py (``redis.Redis`` / ``RedisCluster``) over this
        module's defaults; URL query parameters (``?socket_timeout=3``) override both.
        ``retry_timeout`` bounds how long connection failures are retried per call.
        """
        where = mask_url(url)
        secrets = _url_secrets(url)
        if userinfo_is_ambiguous(url):
            # redis-py would take part of the password for the host and port, and name
            # them in its errors.
            raise StoreError(f"Redis store URL {where}: {AMBIGUOUS_USERINFO}")
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        # The store retries by itself (see _call), so redis-py must not: its retries would
        # also repeat non-idempotent scripts after a timeout.
        opts: dict[str, Any] = {**_CLIENT_DEFAULTS, "retry": Retry(NoBackoff(), 0), **options}
        # Ids, payloads and script replies are binary.
        opts["decode_responses"] = False
        client: redis.Redis | RedisCluster
        try:
            if scheme in ("redis+cluster", "rediss+cluster"):
                plain, seeds = _split_cluster_url(url)
                if seeds:
                    opts["startup_nodes"] = seeds
                # RedisCluster connects at construction to learn the slot map.
                client = _retrying(
                    lambda: RedisCluster.from_url(plain, **opts), retry_timeout, idempotent=True)
            elif scheme in ("redis", "rediss", "unix"):
                client = redis.Redis.from_url(url, **opts)
            else:
                raise StoreError(
                    f"unsupported store URL {where}: expected redis://, rediss://, unix://, "
                    "redis+cluster:// or rediss+cluster://")
        except (RedisError, RedisClusterException, ValueError, TypeError) as exc:
            detail = _scrub(f"{type(exc).__name__}: {exc}", secrets)
            raise StoreError(f"cannot open Redis store {where}: {detail}") from None
        return cls(client, url=url, namespace=namespace, retry_timeout=retry_timeout)

    # -- plumbing --------------------------------------------------------------------------

    def _describe_client(self) -> str:
        if isinstance(self._client, RedisCluster):
            nodes = ",".join(n.name for n in self._client.get_primaries())
            return f"redis+cluster://{nodes}"
        kwargs = self._client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

    def _call(self, op: str, fn: Callable[[], _T], *, idempotent: bool) -> _T:
        """Run ``fn`` with the retry policy, turning redis-py errors into StoreError."""
        started = time.monotonic()
        try:
            return _retrying(fn, self._retry_timeout, idempotent=idempotent)
        except (RedisError, RedisClusterException) as exc:
            # 'from None': the chained redis-py exception is not scrubbed of secrets.
            raise self._error(op, exc, time.monotonic() - started) from None

    def _error(self, op: str, exc: BaseException, elapsed: float) -> StoreError:
        detail = _scrub(f"{type(exc).__name__}: {exc}", self._secrets)
        hint = ""
        if _retryable(exc, idempotent=True):
            hint = f" (is Redis running and reachable? gave up after {elapsed:.1f} s)"
        return StoreError(f"Redis store {self._where}: {op} failed: {detail}{hint}")

    def _key(self, name: str, suffix: str) -> str:
        return f"{self._ns}:{{{key_tag(name)}}}:{suffix}"

    def _ring_keys(self, name: str) -> list[str]:
        return [self._key(name, "ring"), self._key(name, "ring:ids")]

    def _count_keys(self, queue: str) -> list[str]:
        return [self._key(queue, "deliveries"), self._key(queue, "settled")]

    def _sched_keys(self, queue: str) -> list[str]:
        return [self._key(queue, "sched:due"), self._key(queue, "sched:data")]

    def _audit_keys(self, scope: str, producer_id: str) -> list[str]:
        producer = key_tag(producer_id)
        return [self._key(scope, "audit:meta:" + producer),
                self._key(scope, "audit:bits:" + producer)]

    def _presence_keys(self, scope: str) -> list[str]:
        return [self._key(scope, "presence"), self._key(scope, "presence:info")]

    def _primaries(self) -> list[redis.Redis]:
        if isinstance(self._client, RedisCluster):
            cluster = self._client
            return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
        return [self._client]

    # -- rings -----------------------------------------------------------------------------

    def ring_check_and_add(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        _check_capacity(capacity)
        keys, args = self._ring_keys(name), _ring_args(capacity, ids)
        reply = self._call("ring_check_and_add",
                           lambda: self._s_check_and_add(keys=keys, args=args), idempotent=False)
        return _flags(reply)

    def ring_add_all_or_none(self, name: str, ids: Sequence[bytes], capacity: int) -> list[bool]:
        _check_capacity(capacity)
        keys, args = self._ring_keys(name), _ring_args(capacity, ids)
        reply = self._call("ring_add_all_or_none",
                           lambda: self._s_add_all_or_none(keys=keys, args=args),
                           idempotent=False)
        return _flags(reply)

    def ring_reserve(self, name: str, ids: Sequence[bytes], capacity: int, pending_ms: int, *,
                     confirm: Sequence[bytes] = (), all_or_none: bool = False
                     ) -> list[RingOutcome]:
        _check_capacity(capacity)
        check_pending_ms(pending_ms)
        keys = self._ring_keys(name)
        args: list[bytes | int] = [capacity, pending_ms, int(all_or_none), len(confirm),
                                   *confirm, *ids]
        reply = self._call("ring_reserve", lambda: self._s_reserve(keys=keys, args=args),
                           idempotent=False)
        return _outcomes(reply)

    def ring_confirm(self, name: str, ids: Sequence[bytes]) -> None:
        if ids:
            keys, args = self._ring_keys(name), list(ids)
            self._call("ring_confirm", lambda: self._s_confirm(keys=keys, args=args),
                       idempotent=True)

    def ring_release(self, name: str, ids: Sequence[bytes]) -> int:
        if not ids:
            return 0
        keys, args = self._ring_keys(name), list(ids)
        # Idempotent in effect (a rerun releases nothing more); only the count could be lost.
        return int(self._call("ring_release", lambda: self._s_release(keys=keys, args=args),
                              idempotent=True))

    def ring_lookup(self, name: str, ids: Sequence[bytes], pending_ms: int
                    ) -> list[RingOutcome]:
        check_pending_ms(pending_ms)
        if not ids:
            return []
        keys = self._ring_keys(name)
        args: list[int | bytes] = [pending_ms, *ids]
        reply = self._call("ring_lookup", lambda: self._s_lookup(keys=keys, args=args),
                           idempotent=True)
        return _outcomes(reply)

    def ring_contains(self, name: str, ids: Sequence[bytes]) -> list[bool]:
        if not ids:
            return []
        keys, args = self._ring_keys(name), list(ids)
        reply = self._call("ring_contains", lambda: self._s_contains(keys=keys, args=args),
                           idempotent=True)
        return _flags(reply)

    def ring_ids(self, name: str) -> list[bytes]:
        fifo = self._key(name, "ring:ids")
        items = self._call("ring_ids", lambda: self._client.lrange(fifo, 0, -1),
                           idempotent=True)
        # The client does not decode responses (decode_responses=False), so these are bytes.
        return cast(list[bytes], items)

    def ring_stats(self, name: str) -> RingStats | None:
        keys = self._ring_keys(name)
        reply = self._call("ring_stats", lambda: self._s_stats(keys=keys), idempotent=True)
        if reply is None:
            return None
        capacity, count = reply
        return RingStats(name, int(capacity), int(count))

    def ring_names(self) -> list[str]:
        prefix, suffix = f"{self._ns}:{{", "}:ring"

        def scan() -> list[str]:
            # SCAN (not a registry key) because a registry would put every ring in one slot.
            # RedisCluster.scan_iter walks every primary.
            found = self._client.scan_iter(match=f"{prefix}*{suffix}", count=_SCAN_COUNT,
                                           _type="hash")
            names = {_tag_name(_untext(key)[len(prefix):-len(suffix)]) for key in found}
            return sorted(names)

        return self._call("ring_names", scan, idempotent=True)

    def ring_resize(self, name: str, capacity: int) -> int:
        _check_capacity(capacity)
        keys = self._ring_keys(name)
        # Idempotent in effect (a rerun resizes nothing); only the deleted count could be lost.
        return int(self._call("ring_resize",
                              lambda: self._s_resize(keys=keys, args=[capacity]),
                              idempotent=False))

    def ring_clear(self, name: str) -> bool:
        keys = self._ring_keys(name)
        return bool(self._call("ring_clear", lambda: self._s_clear(keys=keys), idempotent=False))

    # -- delivery counts -------------------------------------------------------------------

    def delivery_count_incr(self, queue: str, message_id: str) -> int:
        keys, args = self._count_keys(queue), [_text(message_id)]
        return int(self._call("delivery_count_incr",
                              lambda: self._s_count_incr(keys=keys, args=args),
                              idempotent=False))

    def delivery_count_get(self, queue: str, message_id: str) -> int:
        key, field = self._key(queue, "deliveries"), _text(message_id)
        value = self._call("delivery_count_get", lambda: self._client.hget(key, field),
                           idempotent=True)
        return abs(int(value)) if value is not None else 0

    def delivery_count_settle(self, queue: str, message_ids: Sequence[str],
                              grace_ms: int) -> None:
        if not message_ids:
            return
        keys = self._count_keys(queue)
        args: list[bytes | int] = [max(0, int(grace_ms)), *map(_text, message_ids)]
        self._call("delivery_count_settle",
                   lambda: self._s_count_settle(keys=keys, args=args), idempotent=True)

    def delivery_count_clear(self, queue: str, message_id: str) -> None:
        key, field = self._key(queue, "deliveries"), _text(message_id)
        settled = self._key(queue, "settled")

        def clear() -> None:
            pipe = self._client.pipeline(transaction=not self._cluster)
            pipe.hdel(key, field)
            pipe.zrem(settled, field)
            pipe.execute()

        self._call("delivery_count_clear", clear, idempotent=True)

    # -- scheduled items -------------------------------------------------------------------

    def schedule_add(self, queue: str, item_id: str, payload: bytes, due_ms: int) -> None:
        keys = self._sched_keys(queue)
        args: list[bytes | int] = [_text(item_id), payload, int(due_ms)]
        self._call("schedule_add", lambda: self._s_schedule_add(keys=keys, args=args),
                   idempotent=True)

    def schedule_claim_due(self, queue: str, now_ms: int, limit: int,
                           lease_ms: int) -> list[ScheduledItem]:
        if limit <= 0:
            # ZRANGEBYSCORE ... LIMIT 0 -1 would mean "all"; MemoryStore claims nothing.
            return []
        keys = self._sched_keys(queue)
        # The lease end is computed here, not in Lua, whose number formatting loses digits
        # beyond 14; ZSET scores are doubles, exact for epoch ms (< 2**53).
        args = [int(now_ms), int(limit), int(now_ms) + int(lease_ms)]
        reply = self._call("schedule_claim_due",
                           lambda: self._s_schedule_claim(keys=keys, args=args),
                           idempotent=False)
        return [ScheduledItem(_untext(reply[i]), reply[i + 1] or b"", int(float(reply[i + 2])))
                for i in range(0, len(reply), 3)]

    def schedule_remove(self, queue: str, item_id: str) -> bool:
        keys, args = self._sched_keys(queue), [_text(item_id)]
        return bool(self._call("schedule_remove",
                               lambda: self._s_schedule_remove(keys=keys, args=args),
                               idempotent=False))

    def schedule_count(self, queue: str) -> int:
        key = self._key(queue, "sched:due")
        return int(self._call("schedule_count", lambda: self._client.zcard(key),
                              idempotent=True))

    # -- consumer audit windows ------------------------------------------------------------

    def audit_seen(self, scope: str, producer_id: str, sequences: Sequence[int]) -> list[bool]:
        check_audit_sequences(sequences)
        if not sequences:
            return []
        keys, args = self._audit_keys(scope, producer_id), [int(seq) for seq in sequences]
        reply = self._call("audit_seen", lambda: self._s_audit_seen(keys=keys, args=args),
                           idempotent=True)
        return _flags(reply)

    def audit_mark(self, scope: str, producer_id: str, sequences: Sequence[int], window: int,
                   ttl_ms: int) -> None:
        check_audit_mark(sequences, window, ttl_ms)
        if not sequences:
            return
        keys = self._audit_keys(scope, producer_id)
        args = [int(window), int(ttl_ms), *(int(seq) for seq in sequences)]
        # Idempotent: a rerun sets the same bits and extends the same expiry.
        self._call("audit_mark", lambda: self._s_audit_mark(keys=keys, args=args),
                   idempotent=True)

    def audit_forget(self, scope: str, producer_id: str, sequences: Sequence[int]) -> None:
        check_audit_sequences(sequences)
        if not sequences:
            return
        keys, args = self._audit_keys(scope, producer_id), [int(seq) for seq in sequences]
        self._call("audit_forget", lambda: self._s_audit_forget(keys=keys, args=args),
                   idempotent=True)

    # -- consumer presence -----------------------------------------------------------------

    def presence_beat(self, scope: str, member: str, info: bytes, ttl_ms: int) -> None:
        check_presence_ttl(ttl_ms)
        keys = self._presence_keys(scope)
        args: list[bytes | int] = [_text(member), bytes(info), int(ttl_ms)]
        # Idempotent: a rerun refreshes the same member with the same info.
        self._call("presence_beat", lambda: self._s_presence_beat(keys=keys, args=args),
                   idempotent=True)

    def presence_live(self, scope: str) -> dict[str, bytes]:
        keys = self._presence_keys(scope)
        # Idempotent: pruning what has expired twice changes nothing.
        reply = self._call("presence_live", lambda: self._s_presence_live(keys=keys),
                           idempotent=True)
        return {_untext(reply[i]): bytes(reply[i + 1]) for i in range(0, len(reply), 2)}

    def presence_leave(self, scope: str, member: str) -> bool:
        keys, args = self._presence_keys(scope), [_text(member)]
        return bool(self._call("presence_leave",
                               lambda: self._s_presence_leave(keys=keys, args=args),
                               idempotent=True))

    # -- lifecycle -------------------------------------------------------------------------

    def ping(self) -> None:
        self._call("ping", self._client.ping, idempotent=True)

    def close(self) -> None:
        # Best effort: the sockets go away with the process anyway.
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            self._client.close()

    # -- extras (tests, benchmarks, operations) ----------------------------------------------

    def memory_usage_bytes(self) -> int:
        """Redis ``used_memory`` (INFO memory), summed over the primaries of a Cluster."""
        def used() -> int:
            return sum(int(node.info("memory")["used_memory"]) for node in self._primaries())

        return self._call("memory_usage_bytes", used, idempotent=True)

    def flush_namespace(self) -> int:
        """Delete every key of this store's namespace (on every primary); returns how many."""
        def flush() -> int:
            deleted = 0
            for node in self._primaries():
                batch: list[bytes] = []
                for key in node.scan_iter(match=f"{self._ns}:*", count=_SCAN_COUNT):
                    batch.append(key)
                    if len(batch) >= 500:
                        deleted += self._unlink(node, batch)
                        batch = []
                deleted += self._unlink(node, batch)
            return deleted

        return self._call("flush_namespace", flush, idempotent=True)

    def _unlink(self, node: redis.Redis, keys: list[bytes]) -> int:
        if not keys:
            return 0
        if not self._cluster:
            return int(node.unlink(*keys))
        # A Cluster node refuses a multi-key UNLINK across slots: one key per command, pipelined.
        pipe = node.pipeline(transaction=False)
        for key in keys:
            pipe.unlink(key)
        return sum(int(n) for n in pipe.execute())

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, namespace={self._ns!r})"


def _retrying(fn: Callable[[], _T], retry_timeout: float, *, idempotent: bool) -> _T:
    """Call ``fn``, retrying retryable failures with jittered exponential backoff until
    ``retry_timeout`` seconds have passed; then re-raise the last error."""
    deadline = time.monotonic() + retry_timeout
    delay = _BACKOFF_BASE
    while True:
        try:
            return fn()
        except (RedisError, RedisClusterException) as exc:
            if not _retryable(exc, idempotent) or time.monotonic() + delay > deadline:
                raise
        # Jitter keeps many clients that lost Redis at the same moment from reconnecting in
        # lock-step when it comes back.
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, _BACKOFF_CAP)

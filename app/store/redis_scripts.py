"""Server-side Lua for every read-modify-write, so gateway replicas sharing one Redis never race.

Rate windows are integer leaky buckets (GCRA): a request or token costs `window_us` units, the
bucket drains `limit` units per µs and holds `limit * window_us`, so exactly `limit` fit in an
idle window and the state is two integers. All values stay below 2^53 for limits up to ~10^8 per
minute, so Lua's doubles compute them exactly. Time is the server's `TIME`, shared by all replicas.
"""

from __future__ import annotations

# Shared helper: drain a bucket to `now`; returns level (units) before adding the new cost.
_DRAIN = """
local function drained(key, limit, now)
  local st = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(st[1]) or 0
  local last = tonumber(st[2]) or now
  local elapsed = now - last
  if elapsed < 0 then elapsed = 0 end
  if elapsed * limit >= level then return 0 end
  return level - elapsed * limit
end
local function store_bucket(key, level, limit, now)
  redis.call('HSET', key, 'l', string.format('%.0f', level), 't', string.format('%.0f', now))
  redis.call('PEXPIRE', key, math.ceil(level / limit / 1000) + 1000)
end
"""

# KEYS: concurrency zset. ARGV: lease id, lease µs. Returns 1 when the lease was held (and now expires later).
RENEW_LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local exp = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not exp or exp <= now then return 0 end
local lease_us = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + lease_us, ARGV[1])
if redis.call('PTTL', KEYS[1]) < math.ceil(lease_us / 1000) + 1000 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(lease_us / 1000) + 1000)
end
return 1
"""

ADMIT_KEYS = 4
SETTLE_KEYS = 5

# KEYS: rpm bucket, tpm bucket, concurrency zset, month spend
# ARGV: rpm, tpm, concurrent (0 = none), budget_micros (-1 = none), tokens, lease id, lease µs,
#       window µs, force_lease ('1'/'0')
# Returns "admitted|reason|retry_us|lease_taken|tokens_reserved" (one string parses cheaper than an array).
ADMIT = (
    _DRAIN
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local conc = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local lease = ARGV[6]
local lease_us = tonumber(ARGV[7])
local window = tonumber(ARGV[8])
local force = ARGV[9] == '1'
local fail = false
local retry = 0

if budget >= 0 then
  local spent = tonumber(redis.call('GET', KEYS[4]) or '0')
  if spent >= budget then fail = 'budget' end
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc then
    fail = fail or 'concurrent'
    if retry < 1000000 then retry = 1000000 end
  end
end
local rpm_new, tpm_new
if rpm > 0 then
  rpm_new = drained(KEYS[1], rpm, now) + window
  local cap = rpm * window
  if rpm_new > cap then
    fail = fail or 'rpm'
    local r = math.ceil((rpm_new - cap) / rpm)
    if r > retry then retry = r end
  end
end
if tpm > 0 then
  tpm_new = drained(KEYS[2], tpm, now) + tokens * window
  local cap = tpm * window
  if tpm_new > cap then
    fail = fail or 'tpm'
    local r = math.ceil((tpm_new - cap) / tpm)
    if r > retry then retry = r end
  end
end
local take = conc > 0 and ((not fail) or force)
if take then
  redis.call('ZADD', KEYS[3], now + lease_us, lease)
  redis.call('PEXPIRE', KEYS[3], math.ceil(lease_us / 1000) + 1000)
end
if fail then
  return '0|' .. fail .. '|' .. string.format('%.0f', retry) .. '|' .. (take and '1' or '0') .. '|0'
end
if rpm > 0 then store_bucket(KEYS[1], rpm_new, rpm, now) end
local reserved = 0
if tpm > 0 then
  store_bucket(KEYS[2], tpm_new, tpm, now)
  reserved = tokens
end
return '1||0|' .. (take and '1' or '0') .. '|' .. string.format('%.0f', reserved)
"""
)

# KEYS: tpm bucket, concurrency zset, month spend, day hash, dedupe marker
# ARGV: lease id ('' = none), tpm (0 = none), token delta, window µs, has_spend ('1'/'0'), pool,
#       usd_micros, uncached, cached, output, requests, dedupe ms, keep ms
SETTLE = (
    _DRAIN
    + """
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[2], ARGV[1]) end
local tpm = tonumber(ARGV[2])
local delta = tonumber(ARGV[3])
if tpm > 0 and delta ~= 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local level = drained(KEYS[1], tpm, now) + delta * tonumber(ARGV[4])
  if level < 0 then level = 0 end
  store_bucket(KEYS[1], level, tpm, now)
end
if ARGV[5] == '1' and redis.call('SET', KEYS[5], '1', 'NX', 'PX', ARGV[12]) then
  local pool = ARGV[6]
  local keep = ARGV[13]
  redis.call('INCRBY', KEYS[3], ARGV[7])
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('HINCRBY', KEYS[4], pool .. '|usd_micros', ARGV[7])
  redis.call('HINCRBY', KEYS[4], pool .. '|uncached_tokens', ARGV[8])
  redis.call('HINCRBY', KEYS[4], pool .. '|cached_tokens', ARGV[9])
  redis.call('HINCRBY', KEYS[4], pool .. '|output_tokens', ARGV[10])
  redis.call('HINCRBY', KEYS[4], pool .. '|requests', ARGV[11])
  redis.call('PEXPIRE', KEYS[4], keep)
  return 1
end
return 0
"""
)

# KEYS: the load hash (field: gateway process id, value: "<expiry ms>|<written µs>|<its payload>")
# ARGV: this process's id, ttl ms, its payload ('' = read only)
# Publishes this process's payload (unless reading only), drops processes past their expiry (they died or lost
# the store) and returns the server's clock (µs), then every live process's id and "<written µs>|<payload>",
# this one's included. Expiry and write times are by the server's clock, so gateway hosts with skewed clocks
# still agree on who is alive and on which round a payload was published in (app/routing/peer_load.py).
SHARE_LOAD = """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local stamp = string.format('%.0f', now_us)
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + tonumber(ARGV[2])) .. '|' .. stamp .. '|' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local out = {stamp}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local v = all[i + 1]
  local bar = string.find(v, '|', 1, true)
  if bar == nil or tonumber(string.sub(v, 1, bar - 1)) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = string.sub(v, bar + 1)
  end
end
return out
"""

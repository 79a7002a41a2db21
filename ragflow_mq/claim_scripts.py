"""The Lua of the claims (``ragflow_mq.claims``), one script per state change, each atomic.

A single Valkey, not a cluster, as the sidecar's other scripts assume: the liveness and
incarnation keys of a holder are read by name, known only inside the script.

A holder ``<consumer>|<incarnation>`` is gone when its ``alive`` key has lapsed (its process
silent for ``SERVE_LEASE_S``), or when its consumer name has started again under another
incarnation (RAGFlow's entrypoint restarts a dead executor under its old name within a second;
no other process may carry that name).
"""

from __future__ import annotations

from typing import Final

# ARGV of the prologue: alive prefix, incarnation prefix. Shared by the scripts that judge a
# holder.
_GONE: Final = """
local function gone(holder, alive_prefix, incarnation_prefix)
  if redis.call('EXISTS', alive_prefix .. holder) == 0 then return true end
  local bar = string.find(holder, '|', 1, true)
  if not bar then return true end
  local current = redis.call('GET', incarnation_prefix .. string.sub(holder, 1, bar - 1))
  return current ~= false and current ~= string.sub(holder, bar + 1)
end
"""

# KEYS: claim_1, done_1, claim_2, done_2, ...; ARGV: owner, "<consumer>|", alive prefix,
# incarnation prefix, ttl_s, cautious ("1": the store may have just forgotten its claims, so a
# task with neither claim nor done marker may still be running somewhere: wait, claim nothing),
# claim prefix, pending prefix. A task its live holder gave up on is in the holder's pending
# list, which is the copy that runs again: its record is skipped like a done one.
CLAIM: Final = (
    _GONE
    + """
local out = {}
for i = 1, #KEYS, 2 do
  local claim, done = KEYS[i], KEYS[i + 1]
  if redis.call('EXISTS', done) == 1 then
    out[#out + 1] = 'done'
  else
    local holder = redis.call('GET', claim)
    if not holder then
      if ARGV[6] == '1' then
        out[#out + 1] = 'held'
      else
        redis.call('SET', claim, ARGV[1], 'EX', ARGV[5])
        out[#out + 1] = 'new'
      end
    elseif string.sub(holder, 1, #ARGV[2]) == ARGV[2] and holder ~= ARGV[1]
        or holder ~= ARGV[1] and gone(holder, ARGV[3], ARGV[4]) then
      redis.call('SET', claim, ARGV[1], 'EX', ARGV[5])
      out[#out + 1] = 'retaken'
    else
      local bar = string.find(holder, '|', 1, true) or (#holder + 1)
      local task_id = string.sub(claim, #ARGV[7] + 1)
      if redis.call('HEXISTS', ARGV[8] .. string.sub(holder, 1, bar - 1), task_id) == 1 then
        out[#out + 1] = 'done'
      elseif holder == ARGV[1] then
        out[#out + 1] = 'ours'
      else
        out[#out + 1] = 'held'
      end
    end
  end
end
return out
"""
)

# KEYS: claim_1, done_1, ..., pending hash (last); ARGV: owner, done ttl_s, task ids... Done
# whoever holds the claim now: the task ran to its ack here, and no record of it may run again.
# Every reader (the claims, the pending lists, drain-to-redis) asks only whether a marker exists,
# so it holds "1", not the owner's ~40 bytes paid a task for SERVE_DONE_TTL_S.
FINISH: Final = """
local n = (#KEYS - 1) / 2
for i = 1, n do
  local claim, done = KEYS[2 * i - 1], KEYS[2 * i]
  redis.call('SET', done, '1', 'EX', ARGV[2])
  if redis.call('GET', claim) == ARGV[1] then redis.call('DEL', claim) end
  redis.call('HDEL', KEYS[#KEYS], ARGV[2 + i])
end
return n
"""

# KEYS: claims; ARGV: owner. Claims of records fetched ahead and never handed out.
RELEASE: Final = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
"""

# KEYS: claim, done; ARGV: marker, ttl_s. 1: the task is Redis's now; 0: Kafka's record of it
# was claimed or ran already (a try that timed out had landed), so it must not go to Redis too.
DIVERT: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""

# KEYS: alive, incarnation, claims of the tasks this process holds...; ARGV: owner,
# incarnation, lease_ms, incarnation ttl_s, claim ttl_s. The liveness refresh, and every claim
# in hand asserted again in the same step: one a restarted or evicting store forgot is written
# back (counted), one another process took meanwhile is named (it may run twice: said loudly).
KEEP_ALIVE: Final = """
redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4])
local restored, lost = 0, {}
for i = 3, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if not holder then
    redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[5])
    restored = restored + 1
  elseif holder == ARGV[1] then
    redis.call('EXPIRE', KEYS[i], ARGV[5])
  else
    lost[#lost + 1] = KEYS[i]
  end
end
return {restored, lost}
"""

# KEYS: pending hash of this consumer name, index of consumer names with pending tasks, claim;
# ARGV: consumer name, task id, entry, owner, claim ttl_s. A task RAGFlow took and gave up on
# (never acked) is this consumer name's pending entry now: its record can be committed past.
PEND: Final = """
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
if not redis.call('GET', KEYS[3]) then redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5]) end
return 1
"""

# KEYS: index of consumer names with pending tasks; ARGV: owner, consumer name, alive prefix,
# incarnation prefix, claim prefix, done prefix, pending prefix, ttl_s, at most. The pending
# tasks this process may run: its own consumer name's (a restart replays them, as Redis replays
# a consumer's pending entries), then those of consumer names whose holder is gone, moved to
# this name's list. Done ones are dropped. Returns task id, entry pairs.
# Another name's list is read only when the process now under that name is gone (its lease
# lapsed, or no incarnation left): a live one holds and re-asserts the claims of every task it
# gave up on, so none of its list is free to others, and reading every list at every refresh
# cost each executor a pass over all of them. What a live name's list holds from its earlier
# incarnation that name's own process takes back, as Redis replays a consumer's entries.
ADOPT: Final = (
    _GONE
    + """
local function live_name(name, alive_prefix, incarnation_prefix)
  local current = redis.call('GET', incarnation_prefix .. name)
  return current and redis.call('EXISTS', alive_prefix .. name .. '|' .. current) == 1
end
local out, taken = {}, 0
local mine = ARGV[7] .. ARGV[2]
local names = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if name == ARGV[2] then
    table.insert(names, 1, name)
  elseif not live_name(name, ARGV[3], ARGV[4]) then
    names[#names + 1] = name
  end
end
for _, name in ipairs(names) do
  local list = ARGV[7] .. name
  local entries = redis.call('HGETALL', list)
  for j = 1, #entries, 2 do
    local task_id, entry = entries[j], entries[j + 1]
    local claim = ARGV[5] .. task_id
    if redis.call('EXISTS', ARGV[6] .. task_id) == 1 then
      redis.call('HDEL', list, task_id)
    elseif taken < tonumber(ARGV[9]) then
      local holder = redis.call('GET', claim)
      -- Never one this process holds: Redis replays a consumer's own pending entries only
      -- when it starts again, and this process gave up on it.
      local free = (not holder)
          or (holder ~= ARGV[1] and name == ARGV[2]
              and string.sub(holder, 1, #ARGV[2] + 1) == ARGV[2] .. '|')
          or (holder ~= ARGV[1] and gone(holder, ARGV[3], ARGV[4]))
      if free then
        redis.call('SET', claim, ARGV[1], 'EX', ARGV[8])
        if list ~= mine then
          redis.call('HDEL', list, task_id)
          redis.call('HSET', mine, task_id, entry)
          redis.call('SADD', KEYS[1], ARGV[2])
        end
        out[#out + 1] = task_id
        out[#out + 1] = entry
        taken = taken + 1
      end
    end
  end
  if redis.call('HLEN', list) == 0 then redis.call('SREM', KEYS[1], name) end
end
return out
"""
)

//! The Lua scripts of the protocol. Each runs
//! atomically on one node. Every new connection
//! loads them all first; requests then go by SHA (EVALSHA), and redis-rs reloads a script on
//! NOSCRIPT (e.g. after `SCRIPT FLUSH`).

use redis::Script;
use std::sync::LazyLock;

/// Phase 1 of acquire: take the lock, read the fence and the progress register, and where the
/// lock was granted and the fence is below the proposed token, raise the fence to it. Reads
/// come first so that a foreign value refuses the node before anything is written.
/// KEYS: lock, fence [, progress (step acquisitions only)]. ARGV: value, ttl ms, proposed token.
/// Returns {granted 0/1, fence before, progress, raised 0/1, current holder where refused}.
const ACQUIRE_LUA: &str = r#"
local fence = redis.call('GET', KEYS[2])
local progress = false
if KEYS[3] then
  progress = redis.call('GET', KEYS[3])
end
if fence and not string.match(fence, '^%d+$') then
  return redis.error_reply('NOTATOKEN ' .. KEYS[2] .. ' holds ' .. string.sub(fence, 1, 40))
end
if progress and not string.match(progress, '^%d+$') then
  return redis.error_reply('NOTATOKEN ' .. KEYS[3] .. ' holds ' .. string.sub(progress, 1, 40))
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, fence or false, progress or false, 0, redis.call('GET', KEYS[1])}
end
if tonumber(ARGV[3]) > tonumber(fence or '0') then
  redis.call('SET', KEYS[2], ARGV[3])
  return {1, fence or false, progress or false, 1, false}
end
return {1, fence or false, progress or false, 0, false}
"#;

/// Marks a step started when the token was settled in phase 1. KEYS: progress. ARGV: step.
const PROGRESS_LUA: &str = r#"
local done = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > done then
  redis.call('SET', KEYS[1], ARGV[1])
end
return done
"#;

/// Phase 2: raise the fence to the new token (a max-register, so it is safe on every node),
/// and, when a second key is given, the progress register to the step being started, in the
/// same round trip. KEYS: fence [, progress]. ARGV: token [, step]. Returns the fence value
/// *before* this call, which lets the engine notice another acquisition that issued the same
/// or a larger token.
const FENCE_LUA: &str = r#"
local previous = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > previous then
  redis.call('SET', KEYS[1], ARGV[1])
end
if KEYS[2] then
  local done = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tonumber(ARGV[2]) > done then
    redis.call('SET', KEYS[2], ARGV[2])
  end
end
return previous
"#;

/// Extend: push each lock's expiry out only while it still holds our value. Never re-creates
/// an expired key, which could resurrect a lock someone else now holds. Several leases share
/// one call (renewals that share a round, docs/design.md "Renewal"). KEYS: locks. ARGV: value
/// and ttl ms for each key in turn. Returns one 1 (extended) or 0 per key.
const EXTEND_LUA: &str = r#"
local extended = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    extended[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    extended[i] = 0
  end
end
return extended
"#;

/// Compare-and-delete. KEYS: lock. ARGV: value. Returns 1 when deleted, 0 otherwise.
const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Reachability probe that also proves scripting works.
const PING_LUA: &str = "return 1";

/// Reads keys (lock values: "who holds it"; progress registers) through the same bounded path
/// as everything else. KEYS: the keys. Returns one value (or nil) per key.
const GET_LUA: &str = r#"
local values = {}
for i, key in ipairs(KEYS) do
  values[i] = redis.call('GET', key)
end
return values
"#;

/// Locks' values on one node and their PTTLs in ms (-2 when absent), for the orphan check's
/// hint. KEYS: locks. Returns one {value, ttl} per key.
const HINT_LUA: &str = r#"
local hints = {}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  hints[i] = {value, redis.call('PTTL', key)}
end
return hints
"#;

/// One node's view of a lock, for `lockedjob status`. KEYS: lock, fence, progress. Returns
/// {value or false, PTTL of the lock (-2 when absent), fence or false, progress or false}.
/// One call a line, so that an ACL denial names the command (`denied_call`).
const INSPECT_LUA: &str = r#"
local value = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
local fence = redis.call('GET', KEYS[2])
local progress = redis.call('GET', KEYS[3])
return {value, ttl, fence, progress}
"#;

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(crate) static PROGRESS: LazyLock<Script> = LazyLock::new(|| Script::new(PROGRESS_LUA));
pub(crate) static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE_LUA));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static PING: LazyLock<Script> = LazyLock::new(|| Script::new(PING_LUA));
pub(crate) static GET: LazyLock<Script> = LazyLock::new(|| Script::new(GET_LUA));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(crate) static HINT: LazyLock<Script> = LazyLock::new(|| Script::new(HINT_LUA));

const ALL: [(&str, &str); 9] = [
    ("acquire", ACQUIRE_LUA),
    ("progress", PROGRESS_LUA),
    ("fence", FENCE_LUA),
    ("extend", EXTEND_LUA),
    ("release", RELEASE_LUA),
    ("ping", PING_LUA),
    ("get", GET_LUA),
    ("inspect", INSPECT_LUA),
    ("hint", HINT_LUA),
];

/// Redis 7.0 reports a right missing inside a script as "The user executing the script can't
/// run this command or subcommand script: SHA, on @user_script:LINE.", without the command;
/// the script and line name it: "NOPERM PEXPIRE in the extend script".
pub(crate) fn denied_call(message: &str) -> Option<String> {
    let rest = message
        .split_once("can't run this command or subcommand script: ")?
        .1;
    let (sha, rest) = rest.split_once(", on @user_script:")?;
    let line: usize = rest
        .trim_end_matches('.')
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let (name, source) = ALL
        .iter()
        .find(|(_, source)| Script::new(source).get_hash() == sha)?;
    let command = source
        .lines()
        .nth(line.checked_sub(1)?)?
        .split_once("redis.call('")?
        .1
        .split_once('\'')?
        .0;
    Some(format!(
        "NOPERM the user may not run {command} (called by the {name} script)"
    ))
}

/// Loads every script on a new connection, in one pipeline.
pub(crate) async fn load_all(
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for (_, source) in ALL {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe.query_async::<()>(conn).await
}

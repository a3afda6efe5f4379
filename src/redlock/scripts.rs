//! The Lua scripts of the protocol. Each runs
//! atomically on one node. Every new connection
//! loads them all first; requests then go by SHA (EVALSHA), and redis-rs reloads a script on
//! NOSCRIPT (e.g. after `SCRIPT FLUSH`).

use redis::{Cmd, Script, ToRedisArgs};
use std::sync::LazyLock;

/// Phase 1 of acquire: take the lock, read the fence and the progress register, and where the
/// lock was granted and the fence is below the proposed token, raise the fence to it.
/// KEYS: lock, fence [, progress (step acquisitions only)]. ARGV: value, ttl ms, proposed token.
/// Returns {granted 0/1, fence before, progress, raised 0/1, current holder where refused}.
/// Each command does two things, as few calls being what makes a script cheap: `SET NX GET`
/// takes the lock or names its holder, and `SET GET` raises the fence while reading it, put
/// back in the same script where it was not below the proposal (rare: the proposal is the last
/// token seen plus one) or not a token at all. A lock taken on a node whose fence is no token
/// is released by the engine, which counts that node as failed.
const ACQUIRE_LUA: &str = r#"
local progress = false
if KEYS[3] then
  progress = redis.call('GET', KEYS[3])
  if progress and not string.match(progress, '^%d+$') then
    return redis.error_reply('NOTATOKEN ' .. KEYS[3] .. ' holds ' .. string.sub(progress, 1, 40))
  end
end
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
local fence
if holder then
  fence = redis.call('GET', KEYS[2])
else
  fence = redis.call('SET', KEYS[2], ARGV[3], 'GET')
end
if fence and not string.match(fence, '^%d+$') then
  if not holder then
    redis.call('SET', KEYS[2], fence)
  end
  return redis.error_reply('NOTATOKEN ' .. KEYS[2] .. ' holds ' .. string.sub(fence, 1, 40))
end
if holder then
  return {0, fence or false, progress or false, 0, holder}
end
if tonumber(ARGV[3]) > tonumber(fence or '0') then
  return {1, fence or false, progress or false, 1, false}
end
redis.call('SET', KEYS[2], fence)
return {1, fence, progress or false, 0, false}
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

/// Extend: push the expiry out only while the key still holds our value. Never re-creates an
/// expired key, which could resurrect a lock someone else now holds. KEYS: lock. ARGV: value,
/// ttl ms. Returns 1 when extended, 0 otherwise.
const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
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

/// Reads the lock value ("who holds it") through the same bounded path as everything else.
const GET_LUA: &str = "return redis.call('GET', KEYS[1])";

/// A lock's value on one node and its PTTL in ms (-2 when absent), for the orphan check's hint.
const HINT_LUA: &str = r#"
local value = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
return {value, ttl}
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

/// A script of the protocol, by what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Acquire,
    Progress,
    Fence,
    Extend,
    Release,
    Ping,
    Get,
    Inspect,
    Hint,
}

const OPS: [(Op, &str, &str); 9] = [
    (Op::Acquire, "acquire", ACQUIRE_LUA),
    (Op::Progress, "progress", PROGRESS_LUA),
    (Op::Fence, "fence", FENCE_LUA),
    (Op::Extend, "extend", EXTEND_LUA),
    (Op::Release, "release", RELEASE_LUA),
    (Op::Ping, "ping", PING_LUA),
    (Op::Get, "get", GET_LUA),
    (Op::Inspect, "inspect", INSPECT_LUA),
    (Op::Hint, "hint", HINT_LUA),
];

impl Op {
    fn index(self) -> usize {
        OPS.iter().position(|(op, _, _)| *op == self).unwrap_or(0)
    }

    fn script(self) -> &'static Script {
        &SCRIPTS[self.index()]
    }
}

static SCRIPTS: LazyLock<Vec<Script>> = LazyLock::new(|| {
    OPS.iter()
        .map(|(_, _, source)| Script::new(source))
        .collect()
});

/// Several calls on one node in one script, in order: each op's source above becomes a
/// function of its own `KEYS` and `ARGV`, so the batch runs exactly the code a single call
/// runs. Why: under load most of a node's CPU goes to the cost of a script call, not to its
/// few commands, and the calls that queue up while one request is on the wire can share one
/// (docs/design.md, "Batching"). ARGV: count, then per call: op, key count, arg count, args.
/// KEYS: every call's keys in order. Returns one reply per call; a call's own error reply
/// (NOTATOKEN) stays its own, while an error raised by a command (NOPERM, OOM) fails the batch.
const DISPATCH_LUA: &str = r#"
local replies = {}
local k, a = 1, 2
for i = 1, tonumber(ARGV[1]) do
  local op, nkeys, nargs = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local reply = run[op]({unpack(KEYS, k, k + nkeys - 1)}, {unpack(ARGV, a, a + nargs - 1)})
  k, a = k + nkeys, a + nargs
  if reply == nil then reply = false end
  replies[i] = reply
end
return replies
"#;

/// The batch script's header line for one op; `denied_call` reads it back.
fn batch_header(name: &str) -> String {
    format!("run['{name}'] = function(KEYS, ARGV)")
}

static BATCH_LUA: LazyLock<String> = LazyLock::new(|| {
    let mut source = String::from("local run = {}\n");
    for (_, name, body) in OPS {
        source.push_str(&batch_header(name));
        source.push_str(body);
        source.push_str("\nend\n");
    }
    source.push_str(DISPATCH_LUA);
    source
});

static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(&BATCH_LUA));

/// Calls at most in one batch: bounds how long one script holds a node (each call is a few
/// commands) and the Lua stack `unpack` needs.
pub(crate) const MAX_BATCH: usize = 128;

/// One script call for one node: the op and its keys and arguments, encoded once and shared by
/// every node of a round.
#[derive(Debug)]
pub(crate) struct Call {
    op: Op,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    pub(crate) fn new(op: Op) -> Self {
        Self {
            op,
            keys: Vec::with_capacity(3),
            args: Vec::with_capacity(3),
        }
    }

    pub(crate) fn key(mut self, key: impl ToRedisArgs) -> Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }
}

/// One EVALSHA for `calls`, in order: the op's own script for a single call, the batch script
/// for several. The reply is the call's own, or an array of one reply per call.
pub(crate) fn command<'a>(calls: impl ExactSizeIterator<Item = &'a Call> + Clone) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    if calls.len() == 1 {
        for call in calls {
            cmd.arg(call.op.script().get_hash())
                .arg(call.keys.len())
                .arg(&call.keys[..])
                .arg(&call.args[..]);
        }
        return cmd;
    }
    let keys: usize = calls.clone().map(|call| call.keys.len()).sum();
    cmd.arg(BATCH.get_hash()).arg(keys);
    for call in calls.clone() {
        cmd.arg(&call.keys[..]);
    }
    cmd.arg(calls.len());
    for call in calls {
        cmd.arg(OPS[call.op.index()].1)
            .arg(call.keys.len())
            .arg(call.args.len())
            .arg(&call.args[..]);
    }
    cmd
}

/// Every script a node needs: the ops' own and the batch script.
fn sources() -> impl Iterator<Item = (&'static str, &'static str)> {
    OPS.iter()
        .map(|(_, name, source)| (*name, *source))
        .chain(std::iter::once(("batch", BATCH_LUA.as_str())))
}

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
    let (name, source) = sources().find(|(_, source)| Script::new(source).get_hash() == sha)?;
    let lines: Vec<&str> = source.lines().take(line).collect();
    let command = lines
        .last()?
        .split_once("redis.call('")?
        .1
        .split_once('\'')?
        .0;
    // In the batch script, the op is the function the line belongs to.
    let name = lines
        .iter()
        .rev()
        .find_map(|line| {
            OPS.iter()
                .find(|(_, op, _)| line.starts_with(&batch_header(op)))
                .map(|(_, op, _)| *op)
        })
        .unwrap_or(name);
    Some(format!(
        "NOPERM the user may not run {command} (called by the {name} script)"
    ))
}

/// Loads every script on a new connection, in one pipeline.
pub(crate) async fn load_all(
    conn: &mut redis::aio::MultiplexedConnection,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for (_, source) in sources() {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe.query_async::<()>(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".into(),
            })
            .collect()
    }

    #[test]
    fn one_call_runs_its_own_script_and_several_run_the_batch_in_order() {
        let release = Call::new(Op::Release).key("lock:a").arg("v1");
        let fence = Call::new(Op::Fence)
            .key("fence:b")
            .key("progress:b")
            .arg(8)
            .arg(3);
        assert_eq!(
            args(&command(std::iter::once(&release))),
            [
                "EVALSHA",
                Op::Release.script().get_hash(),
                "1",
                "lock:a",
                "v1"
            ]
        );
        assert_eq!(
            args(&command([&release, &fence].into_iter())),
            [
                "EVALSHA",
                BATCH.get_hash(),
                "3",
                "lock:a",
                "fence:b",
                "progress:b",
                "2",
                "release",
                "1",
                "1",
                "v1",
                "fence",
                "2",
                "2",
                "8",
                "3"
            ]
        );
    }

    #[test]
    fn a_denial_inside_the_batch_names_the_command_and_the_op() {
        // (script source, its SHA, the denied call, what the message must say)
        let table = [
            (
                BATCH_LUA.as_str(),
                BATCH.get_hash(),
                "redis.call('PEXPIRE'",
                "NOPERM the user may not run PEXPIRE (called by the extend script)",
            ),
            (
                RELEASE_LUA,
                Op::Release.script().get_hash(),
                "redis.call('DEL'",
                "NOPERM the user may not run DEL (called by the release script)",
            ),
        ];
        for (source, sha, call, expected) in table {
            let line = source
                .lines()
                .position(|line| line.contains(call))
                .expect("the call is in the script")
                + 1;
            let message = format!(
                "ERR The user executing the script can't run this command or subcommand script: {sha}, on @user_script:{line}."
            );
            assert_eq!(denied_call(&message).as_deref(), Some(expected), "{call}");
        }
    }
}

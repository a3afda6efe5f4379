#!/usr/bin/env python3
"""Server CPU per acquire+release on one local redis-server, for several ways of taking a lock.

Why the lock bench's nodes cost more for lockedjob than for rslock: each way runs in a fresh
redis-server (no persistence) fed by `redis-cli --pipe`, and the server's own CPU (`INFO cpu`)
is divided by the operations. Every way releases with the same compare-and-delete script.

  rslock    SET NX PX (no fencing token)
  lua       lockedjob's phase-1 script (redlock/src/scripts.rs): lock, fence read and raise
  multi     native commands in MULTI/EXEC: SET NX PX, ZADD GT CH (a native max-register), ZSCORE
  pipe3     the same three commands without MULTI (not atomic: what the commands alone cost)

Usage: scripts/lock-server-cost.py [operations per way, default 300000]
"""
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def acquire_script():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "src", "redlock", "scripts.rs")) as f:
        return re.search(r'const ACQUIRE_LUA: &str = r#"(.*?)"#;', f.read(), re.S).group(1)


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def commands(way, n, acquire):
    sha = lambda s: hashlib.sha1(s.encode()).hexdigest()
    out = []
    for i in range(n):
        key, value, token = "lock:%d" % (i % 64), "holder-%d" % i, 1_000_000 + i
        if way == "rslock":
            out.append(resp("SET", key, value, "NX", "PX", 30000))
        elif way == "lua":
            out.append(resp("EVALSHA", sha(acquire), 2, key, "fence:%d" % (i % 64), value, 30000, token))
        else:
            native = [
                resp("SET", key, value, "NX", "PX", 30000),
                resp("ZADD", "fences", "GT", "CH", token, key),
                resp("ZSCORE", "fences", key),
            ]
            out += [resp("MULTI")] + native + [resp("EXEC")] if way == "multi" else native
        out.append(resp("EVALSHA", sha(RELEASE), 1, key, value))
    return b"".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cpu(port):
    info = subprocess.run(["redis-cli", "-p", str(port), "info", "cpu"], capture_output=True, text=True).stdout
    return sum(float(line.split(":")[1]) for line in info.splitlines() if line.startswith(("used_cpu_sys:", "used_cpu_user:")))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    acquire = acquire_script()
    for way in ["rslock", "lua", "multi", "pipe3"]:
        port = free_port()
        with tempfile.TemporaryDirectory() as d:
            server = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
                stdout=subprocess.DEVNULL,
            )
            try:
                for _ in range(100):
                    if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0:
                        break
                    time.sleep(0.05)
                load = resp("SCRIPT", "LOAD", acquire) + resp("SCRIPT", "LOAD", RELEASE)
                subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=load, capture_output=True, check=True)
                before = server_cpu(port)
                fed = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=commands(way, n, acquire), capture_output=True, check=True)
                used = server_cpu(port) - before
                if b"errors: 0," not in fed.stdout:
                    sys.exit(f"{way}: the server answered with errors: {fed.stdout.decode()}")
                print(f"{way:7} {used / n * 1e6:5.2f} µs server CPU per acquire+release")
            finally:
                server.terminate()
                server.wait()


if __name__ == "__main__":
    main()

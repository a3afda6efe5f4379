#!/bin/sh
# Starts one lockedjob Redis node. Before serving, it stays out of service for
# RESTART_DELAY_SECONDS (antirez's delayed restart): a node that restarted may have lost
# keys (disk lost, a write not yet fsynced), and a lock it forgot must expire everywhere else
# before it takes part again. Set the delay to at least the longest lock TTL in use.
#
# Environment:
#   RESTART_DELAY_SECONDS  seconds to wait before starting (default 60; 0 disables)
#   REDIS_CONFIG           base configuration file (default /etc/lockedjob-redis/redis.conf)
#   REDIS_PASSWORD         when set, required from every client (written to a private
#                          include file, never on the command line where `ps` would show it)
#   REDIS_DATA_DIR         where the append-only file lives (default /data, the volume)
#   REDIS_RUNTIME_DIR      where that include file goes (default /run/redis, an emptyDir)
#   REDIS_SERVER           the server binary (default redis-server)
# Extra arguments are passed to redis-server (tests use them to pick a port and a data dir).
set -eu

delay="${RESTART_DELAY_SECONDS:-60}"
config="${REDIS_CONFIG:-/etc/lockedjob-redis/redis.conf}"
data_dir="${REDIS_DATA_DIR:-/data}"
runtime_dir="${REDIS_RUNTIME_DIR:-/run/redis}"
server="${REDIS_SERVER:-redis-server}"

case "$delay" in
  ''|*[!0-9]*) echo "start-redis: RESTART_DELAY_SECONDS must be a whole number of seconds, got '$delay'" >&2; exit 64 ;;
esac
[ -r "$config" ] || { echo "start-redis: cannot read the configuration file $config" >&2; exit 64; }
[ -d "$data_dir" ] && [ -w "$data_dir" ] || { echo "start-redis: the data directory $data_dir is missing or not writable" >&2; exit 64; }

mkdir -p "$runtime_dir"
umask 077
auth="$runtime_dir/auth.conf"
: > "$auth"
if [ -n "${REDIS_PASSWORD:-}" ]; then
  # Escape for a double-quoted Redis config string.
  escaped=$(printf '%s' "$REDIS_PASSWORD" | sed 's/\\/\\\\/g; s/"/\\"/g')
  printf 'requirepass "%s"\n' "$escaped" > "$auth"
fi

if [ "$delay" -gt 0 ]; then
  echo "start-redis: staying out of service for ${delay}s before serving (restart delay)" >&2
  sleep "$delay"
fi
echo "start-redis: starting redis-server" >&2
exec "$server" "$config" --dir "$data_dir" --include "$auth" "$@"

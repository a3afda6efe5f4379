#!/bin/sh
# Starts one lockedjob Redis node. Before serving, it stays out of service for
# RESTART_DELAY_SECONDS (antirez's delayed restart): a node that restarted may have lost
# keys (disk lost, a write not yet fsynced), and a lock it forgot must expire everywhere else
# before it takes part again. Set the delay to at least the longest lock TTL in use.
#
# Environment:
#   RESTART_DELAY_SECONDS  seconds to wait before starting (default 60; 0 disables)
#   REDIS_CONFIG           base configuration file (default /etc/lockedjob-redis/redis.conf)
#   REDIS_PASSWORD         when set: the ACL user REDIS_USER gets exactly the rights the
#                          engine needs, on keys under REDIS_KEY_PREFIX only, and nobody
#                          can log in as the default user (written to a private include file as
#                          a SHA-256, never on the command line where `ps` would show it)
#   REDIS_NEXT_PASSWORD    when set too: a second password the same users accept, for a
#                          rotation (docs/security.md, "Rotation")
#   REDIS_USER             that user's name (default lockedjob)
#   REDIS_KEY_PREFIX       the operator's key prefix (default lockedjob)
#   REDIS_MONITORING_USER  when "yes", the user `monitoring` logs in with the same password,
#                          with monitoring rights only (INFO and the like, no keys): for an
#                          exporter
#   REDIS_TLS_DIR          when set: serve TLS only, with tls.crt, tls.key and ca.crt from
#                          this directory (a cert-manager Secret), plain-text port off
#   REDIS_TLS_AUTH_CLIENTS "yes" to require client certificates the CA signed (default no)
#   REDIS_PORT             the port to serve on (default 6379)
#   REDIS_DATA_DIR         where the append-only file lives (default /data, the volume)
#   REDIS_RUNTIME_DIR      where that include file goes (default /run/redis, an emptyDir)
#   REDIS_SERVER           the server binary (default redis-server)
# Extra arguments are passed to redis-server (tests use them to bind to loopback only).
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

# The engine's rights: its scripts (loaded once per connection, run by SHA) and the commands
# they call, on its keys only. The ACL SETUSER line of docs/security.md lists the same; a test compares.
engine_rights='resetchannels -@all +evalsha +script|load +get +set +pexpire +del +pttl'
monitoring_rights='resetchannels -@all +ping +info +config|get +client|list +slowlog|get +slowlog|len +latency|latest +memory|stats +dbsize'
user="${REDIS_USER:-lockedjob}"
monitoring_user=monitoring
prefix="${REDIS_KEY_PREFIX:-lockedjob}"
port="${REDIS_PORT:-6379}"
case "$user" in
  ''|*[!A-Za-z0-9_.-]*) echo "start-redis: REDIS_USER must be letters, digits, '_', '.' or '-', got '$user'" >&2; exit 64 ;;
esac
case "$prefix" in
  ''|*[!A-Za-z0-9_.:-]*) echo "start-redis: REDIS_KEY_PREFIX must be letters, digits, '_', '.', ':' or '-', got '$prefix'" >&2; exit 64 ;;
esac

mkdir -p "$runtime_dir"
umask 077
auth="$runtime_dir/node.conf"
: > "$auth"
if [ -n "${REDIS_PASSWORD:-}" ]; then
  # A SHA-256 in the file: no escaping to get wrong, and no password at rest.
  passwords="#$(printf '%s' "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)"
  if [ -n "${REDIS_NEXT_PASSWORD:-}" ]; then
    passwords="$passwords #$(printf '%s' "$REDIS_NEXT_PASSWORD" | sha256sum | cut -d' ' -f1)"
  fi
  printf 'user %s on %s resetkeys ~%s:* %s\n' "$user" "$passwords" "$prefix" "$engine_rights" >> "$auth"
  # Nobody can log in as the default user, but it keeps every right: Redis replays the
  # append-only file's MULTI/EXEC blocks (what the engine's scripts write) as the default user
  # and re-checks EXEC against its rights (redis/redis#14541). Without them a restarted node
  # would come back without its locks and fences, and tokens could go backwards.
  printf 'user default off ~* &* +@all\n' >> "$auth"
  if [ "${REDIS_MONITORING_USER:-no}" = yes ]; then
    printf 'user %s on %s resetkeys %s\n' "$monitoring_user" "$passwords" "$monitoring_rights" >> "$auth"
  fi
fi
if [ -n "${REDIS_TLS_DIR:-}" ]; then
  for file in tls.crt tls.key ca.crt; do
    [ -r "$REDIS_TLS_DIR/$file" ] || { echo "start-redis: cannot read $REDIS_TLS_DIR/$file (the TLS Secret needs tls.crt, tls.key and ca.crt)" >&2; exit 64; }
  done
  case "${REDIS_TLS_AUTH_CLIENTS:-no}" in
    yes|no) ;;
    *) echo "start-redis: REDIS_TLS_AUTH_CLIENTS must be yes or no, got '$REDIS_TLS_AUTH_CLIENTS'" >&2; exit 64 ;;
  esac
  {
    echo "port 0"
    echo "tls-port $port"
    echo "tls-cert-file $REDIS_TLS_DIR/tls.crt"
    echo "tls-key-file $REDIS_TLS_DIR/tls.key"
    echo "tls-ca-cert-file $REDIS_TLS_DIR/ca.crt"
    echo "tls-auth-clients ${REDIS_TLS_AUTH_CLIENTS:-no}"
  } >> "$auth"
else
  echo "port $port" >> "$auth"
fi

if [ "$delay" -gt 0 ]; then
  echo "start-redis: staying out of service for ${delay}s before serving (restart delay)" >&2
  sleep "$delay"
fi
echo "start-redis: starting redis-server" >&2
exec "$server" "$config" --dir "$data_dir" --include "$auth" "$@"

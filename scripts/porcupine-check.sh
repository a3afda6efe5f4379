#!/usr/bin/env bash
# Builds tools/porcupine-check (porcupine, the linearizability checker of etcd's robustness
# tests, with the lab's two models) into a cache; the last line of stdout is the binary's path:
#   checker=$(scripts/porcupine-check.sh | tail -n1)
exec "$(dirname "$0")/go-tool.sh" porcupine-check

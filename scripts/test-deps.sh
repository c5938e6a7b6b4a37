#!/usr/bin/env bash
# System packages the test suite uses for real: systemd-analyze (exported units),
# Chromium (the HTML report in a real browser), OpenSSH's sshd and iproute2 (the remote
# tests run real sshd processes, two of them in network namespaces), PostgreSQL's server
# binaries (tests/pg_server.py runs throw-away servers for the shared-study tests).
# Installed only when missing.
set -euo pipefail
need=()
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing test dependencies: ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "warning: missing ${need[*]} (not root or no apt-get); the tests that need them will skip" >&2
  fi
fi

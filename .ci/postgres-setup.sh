#!/usr/bin/env bash
# PostgreSQL for the SQL-source tests (tests/postgres_server.py starts a throw-away server with the
# package's initdb/pg_ctl). Installs the Debian `postgresql` package if initdb is missing. It never skips
# silently: if PostgreSQL cannot be installed it says so, and the tests that need a server then fail.
set -uo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  echo ".ci/postgres-setup.sh: PostgreSQL present ($(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1))"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
if command -v apt-get >/dev/null 2>&1; then
  echo ".ci/postgres-setup.sh: installing postgresql (apt-get)"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
fi
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  echo ".ci/postgres-setup.sh: PostgreSQL installed"
else
  echo ".ci/postgres-setup.sh: could not install PostgreSQL; the SQL-source tests will FAIL (install the" \
       "Debian package 'postgresql')" >&2
fi
exit 0

#!/bin/sh
# The part of the official postgres image's entrypoint compose.yaml relies on: on an empty volume, a
# cluster whose superuser is POSTGRES_USER (password POSTGRES_PASSWORD, checked with scram-sha-256 over
# TCP) and a database POSTGRES_DB; then PostgreSQL in the foreground, as the `postgres` user.
set -eu
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    chown postgres "$pwfile"
    as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 \
        --auth-host=scram-sha-256 --auth-local=trust --no-instructions
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"  # the other containers
    as_postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    if [ "$POSTGRES_DB" != postgres ]; then
        as_postgres createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
    fi
    as_postgres pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*' "$@"

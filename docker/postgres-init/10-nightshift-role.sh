#!/bin/sh
# Runs once, when the postgres container first initialises its data volume (the image runs
# /docker-entrypoint-initdb.d/* as the superuser). Nightshift connects as `nightshift`, a
# plain role: it may log in, connect to its database and create its tables in the public
# schema (first use and `nightshift db upgrade` run the migrations), and owns what it
# creates; it is not a superuser and cannot create roles or databases or read other
# databases. A volume initialised before this script existed keeps its old roles: see
# docs/guide/team-cluster.md.
set -eu
: "${NIGHTSHIFT_DB_PASSWORD:?set NIGHTSHIFT_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
     -v app_password="$NIGHTSHIFT_DB_PASSWORD" -v db="$POSTGRES_DB" <<'SQL'
CREATE ROLE nightshift LOGIN PASSWORD :'app_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO nightshift;
-- The maintenance databases are the superuser's alone.
REVOKE CONNECT ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT ON DATABASE template1 FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO nightshift;
SQL

"""Alembic environment of the SQL storage schema.

Migrations run only through `SqlStorage.initialize()`, which passes an open connection, already
inside the transaction that holds the schema lock, in `config.attributes["connection"]`.
"""

from __future__ import annotations

from alembic import context

VERSION_TABLE = "choreography_alembic_version"

config = context.config
connection = config.attributes.get("connection")

if context.is_offline_mode() or connection is None:
    raise RuntimeError(
        "choreography_ray migrations run through SqlStorage.initialize(), which passes its "
        "connection in config.attributes['connection']; offline (--sql) mode is not supported"
    )

context.configure(
    connection=connection,
    target_metadata=None,
    version_table=config.attributes.get("version_table", VERSION_TABLE),
    transactional_ddl=True,
)

with context.begin_transaction():
    context.run_migrations()

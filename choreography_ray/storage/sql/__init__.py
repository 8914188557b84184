"""SQL storage through SQLAlchemy Core: SQLite and PostgreSQL (`sqlite:///`, `postgresql+psycopg://`).

`provider` owns connections, threads, transactions and the schema's migrations; `schema` the
tables; `engines` the engines and which errors are transient; `jobs`, `steps` and `plans` turn a
partition's calls into statements.
"""

from .provider import SqlStorage

__all__ = ["SqlStorage"]

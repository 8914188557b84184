"""MongoDB storage through pymongo (`mongodb://`, `mongodb+srv://`; `mongomock://` for tests).

`provider` owns the client, threads and the catalog of partitions; `names` the database names;
`partition` a partition's collections and indexes; `documents` the stored form of records;
`jobs`, `steps` and `plans` a partition's calls.
"""

from .names import database_name
from .provider import MongoStorage, forget_mongomock_store

__all__ = ["MongoStorage", "database_name", "forget_mongomock_store"]

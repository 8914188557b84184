"""The host actors' storage hook, for tests: a fault injected into a real Ray cluster
(`MultiNodeCluster`) as `InProcessCluster(wrap_storage=...)` does in-process. The hook is the
runtime's (`runtime/storage_hook.py`), since a host applies it; tests name it from here."""

from ..runtime.storage_hook import STORAGE_WRAPPER_ENV, hooked_storage, storage_wrapper

__all__ = ["STORAGE_WRAPPER_ENV", "hooked_storage", "storage_wrapper"]

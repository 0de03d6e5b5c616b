"""The SQLite backend: :class:`~.store.SQLiteStore` (assembled in :mod:`.store`
from :mod:`.base`, the connection, transactions, journal, fence and load, and
its parts), the read-only :mod:`.reader`, group commit (:mod:`.group`), the
file checks (:mod:`.files`) and housekeeping.

Importing the package loads nothing: ``status`` reads through :mod:`.reader`
alone.
"""

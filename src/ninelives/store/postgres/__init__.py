"""The PostgreSQL backend: :class:`~.store.PostgresStore` (assembled in
:mod:`.store` from :mod:`.base`, the session, pipelined transactions, refusals
and leases, and its parts), the blob tables (:mod:`.blobs`) and housekeeping.

The only package that imports psycopg; :func:`ninelives.store.open_store`
imports it only for a PostgreSQL URL.
"""

-- Task ids are unique regardless of case: "Demo" and "demo" would publish to
-- one artifact name on a case-insensitive file system. A plain (not unique)
-- index, so that this migration cannot fail on a database that already holds
-- such a pair; create checks the index before inserting, under a
-- transaction-scoped advisory lock on the lower-cased id (task_id_taken).
CREATE INDEX IF NOT EXISTS tasks_id_lower ON tasks (lower(id));

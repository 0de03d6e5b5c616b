-- The ids of the tasks gc removed, with when. A task's idempotency keys are
-- <task_id>-<idx>: a new task of a removed id would reuse the old one's keys,
-- and an effect keyed by them (a published artifact, a charge at a service
-- keyed by idem_key) would answer the new task with the old task's outcome.
-- So an id is never used twice: gc records each id it deletes here, in the
-- same transaction, and create and fork refuse an id found here (regardless
-- of case, as in tasks; task_id_taken reads both through their lower(id)
-- indexes).
CREATE TABLE IF NOT EXISTS removed_tasks (
    id TEXT PRIMARY KEY,
    removed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS removed_tasks_id_lower ON removed_tasks (lower(id));

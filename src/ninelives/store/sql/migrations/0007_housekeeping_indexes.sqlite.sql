-- Housekeeping without full scans, however many finished tasks the database keeps:
-- tasks_created         ls, newest first (and verify --all, oldest first);
-- tasks_status_created  ls --status S, newest first;
-- tasks_queue_created   ls --queue Q, newest first;
-- tasks_status_updated  gc: the finished tasks of one status last changed before
--                       a cutoff, oldest first; doctor: the tasks left running.
-- The journal is already reached by events_task_seq (0002), steps by their key.
CREATE INDEX IF NOT EXISTS tasks_created ON tasks (created_at, id);
CREATE INDEX IF NOT EXISTS tasks_status_created ON tasks (status, created_at, id);
CREATE INDEX IF NOT EXISTS tasks_queue_created ON tasks (queue, created_at, id);
CREATE INDEX IF NOT EXISTS tasks_status_updated ON tasks (status, updated_at, id);

-- Workers look for the oldest unfinished task of their queue: a partial index
-- holds only the tasks that can still be claimed.
CREATE INDEX IF NOT EXISTS tasks_runnable ON tasks (queue, created_at, id)
WHERE status IN ('pending', 'running');

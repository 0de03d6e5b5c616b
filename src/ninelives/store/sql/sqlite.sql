-- Named queries of the SQLite store. Each block starts with "-- name: NAME";
-- postgres.sql has the same names, so a diff shows where the dialects differ.

-- name: get_task
SELECT id, goal, status, created_at, updated_at, lease_epoch, artifacts FROM tasks
WHERE id = :id;

-- name: get_steps
SELECT idx, tool, input, status, output, attempts, policy, progress, not_before FROM steps
WHERE task_id = :id ORDER BY idx;

-- name: task_id_taken
-- Ids are unique regardless of case (artifact names built from them must not
-- collide on a case-insensitive file system); the tasks_id_lower index
-- (migration 0004) makes this a lookup, not a scan.
SELECT id FROM tasks WHERE lower(id) = lower(:id) LIMIT 1;

-- name: task_ids
SELECT id FROM tasks ORDER BY created_at, id;

-- name: insert_task
INSERT INTO tasks (id, goal, status, created_at, updated_at, queue, artifacts)
VALUES (:id, :goal, 'pending', :now, :now, :queue, :artifacts);

-- name: insert_step
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (:id, :idx, :tool, :input, 'pending', 0, :policy);

-- name: insert_event
INSERT INTO events (ts, task_id, run_id, kind, step_idx, data)
VALUES (:now, :id, :run, :kind, :step, :data);

-- name: claim
UPDATE tasks
SET lease_epoch = lease_epoch + 1,
    status = CASE WHEN status = 'pending' THEN 'running' ELSE status END,
    updated_at = :now
WHERE id = :id
RETURNING lease_epoch;

-- name: running_steps
SELECT idx FROM steps WHERE task_id = :id AND status = 'running' ORDER BY idx;

-- name: recover_steps
UPDATE steps SET status = 'pending' WHERE task_id = :id AND status = 'running';

-- name: fence
UPDATE tasks SET status = :status, updated_at = :now WHERE id = :id AND lease_epoch = :epoch;

-- name: fence_unchecked
-- Test-only (see ninelives.store.fencing_disabled): the fence without its epoch.
UPDATE tasks SET status = :status, updated_at = :now WHERE id = :id;

-- name: claim_candidates
-- Workers on one host: the oldest unfinished tasks of the queue after
-- (:after_ts, :after_id), a page at a time; the per-task kernel lock then
-- decides which of them this worker gets.
SELECT id, created_at FROM tasks
WHERE queue = :queue AND status IN ('pending', 'running')
  AND (created_at, id) > (:after_ts, :after_id)
ORDER BY created_at, id
LIMIT :page;

-- name: abandon
-- Give a task up without waiting for its runner: the new epoch fences that
-- runner out, and the next claim recovers the step it left running.
UPDATE tasks SET lease_epoch = lease_epoch + 1, updated_at = :now
WHERE id = :id AND lease_epoch = :epoch;

-- name: unfinished
-- :skip is a JSON array of ids left out of the count.
SELECT count(*) FROM tasks WHERE queue = :queue AND status IN ('pending', 'running')
  AND id NOT IN (SELECT value FROM json_each(:skip));

-- name: recoveries
-- How often a step was recovered before: read only when recovering it again.
SELECT count(*) FROM events
WHERE task_id = :id AND step_idx = :idx AND kind = 'step_recovered';

-- name: fail_task
UPDATE tasks SET status = 'failed', updated_at = :now WHERE id = :id;

-- name: first_pending
SELECT s.idx, s.tool FROM steps s JOIN tasks t ON t.id = s.task_id
WHERE s.task_id = :id AND s.status = 'pending' AND t.status IN ('pending', 'running')
ORDER BY s.idx LIMIT 1;

-- name: step_running
UPDATE steps SET status = 'running', attempts = attempts + 1
WHERE task_id = :id AND idx = :idx AND status = 'pending'
RETURNING attempts;

-- name: step_done
UPDATE steps SET status = 'done', output = :output
WHERE task_id = :id AND idx = :idx AND status = 'running';

-- name: step_back
UPDATE steps SET status = :status
WHERE task_id = :id AND idx = :idx AND status = 'running'
RETURNING attempts;

-- name: step_failed
UPDATE steps SET status = 'failed' WHERE task_id = :id AND idx = :idx;

-- name: events
SELECT seq, ts, task_id, run_id, kind, step_idx, data FROM events WHERE task_id = :id ORDER BY seq;

-- name: table_names
-- SQLite only: the tables of a file, to tell a ninelives database from another one.
SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\';

-- name: task_columns
-- SQLite only: the columns tasks has, so read-only commands read older schemas
-- (the guide's version 0 has no lease columns) without migrating them.
SELECT name FROM pragma_table_info('tasks');

-- name: step_columns
SELECT name FROM pragma_table_info('steps');

-- name: get_steps_v5
-- SQLite only, read-only commands on a schema older than 0006 (no policy,
-- progress or backoff columns).
SELECT idx, tool, input, status, output, attempts, NULL, NULL, NULL FROM steps
WHERE task_id = :id ORDER BY idx;

-- name: get_task_unleased
-- SQLite only, read-only commands on a schema older than 0002 (no lease_epoch).
SELECT id, goal, status, created_at, updated_at, 0, NULL FROM tasks WHERE id = :id;

-- name: get_task_unrecorded
-- SQLite only, read-only commands on a schema older than 0005 (no artifacts folder).
SELECT id, goal, status, created_at, updated_at, lease_epoch, NULL FROM tasks WHERE id = :id;
-- name: retry_task
-- A failed task back to pending under a new epoch, so that no runner from
-- before the retry can commit to it again.
UPDATE tasks SET status = 'pending', lease_epoch = lease_epoch + 1, updated_at = :now
WHERE id = :id AND status = 'failed';

-- name: retry_step
UPDATE steps SET status = 'pending', attempts = 0
WHERE task_id = :id AND idx = :idx AND status = 'failed';

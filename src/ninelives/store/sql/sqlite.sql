-- Named queries of the SQLite store. Each block starts with "-- name: NAME";
-- postgres.sql has the same names, so a diff shows where the dialects differ.

-- name: get_task
SELECT id, goal, status, created_at, updated_at, lease_epoch, artifacts, plan_sha256
FROM tasks WHERE id = :id;

-- name: get_steps
SELECT idx, tool, input, status, output, attempts, policy, progress, not_before FROM steps
WHERE task_id = :id ORDER BY idx;

-- name: get_task_steps
-- The task and its steps in one statement (get_task's columns, then
-- get_steps', NULL for a task with no step yet): one statement is its own
-- snapshot, so a read needs no BEGIN and COMMIT around it, and a claim reads
-- the task once. In steps' key order (task_id, idx): no sort. The goal (up to
-- a MiB: a workflow's arguments) comes with the first row only, not once per
-- step; the subquery names none of the outer columns, so it runs once.
SELECT t.id,
       CASE WHEN s.idx IS NULL OR s.idx = (SELECT MIN(idx) FROM steps WHERE task_id = :id)
            THEN t.goal END,
       t.status, t.created_at, t.updated_at, t.lease_epoch, t.artifacts, t.plan_sha256,
       s.idx, s.tool, s.input, s.status, s.output, s.attempts, s.policy, s.progress, s.not_before
FROM tasks t LEFT JOIN steps s ON s.task_id = t.id
WHERE t.id = :id ORDER BY s.idx;

-- name: task_id_taken
-- Ids are unique regardless of case (artifact names built from them must not
-- collide on a case-insensitive file system); the tasks_id_lower index
-- (migration 0004) makes this a lookup, not a scan. An id gc removed stays
-- taken (removed_tasks, migration 0009): its idempotency keys may name the
-- old task's effects. The second column is when it was removed (NULL: stored).
SELECT id, NULL FROM tasks WHERE lower(id) = lower(:id)
UNION ALL
SELECT id, removed_at FROM removed_tasks WHERE lower(id) = lower(:id)
LIMIT 1;

-- name: task_ids
SELECT id FROM tasks ORDER BY created_at, id;

-- name: insert_task
INSERT INTO tasks (id, goal, status, created_at, updated_at, queue, artifacts, plan_sha256)
VALUES (:id, :goal, 'pending', :now, :now, :queue, :artifacts, :plan_sha256);

-- name: insert_task_unless_taken
-- SQLite's create: insert_task only if task_id_taken would find nothing (both
-- through their lower(id) indexes), one statement instead of two. Inserting
-- nothing, create reads task_id_taken to say by whom the id is taken.
INSERT INTO tasks (id, goal, status, created_at, updated_at, queue, artifacts, plan_sha256)
SELECT :id, :goal, 'pending', :now, :now, :queue, :artifacts, :plan_sha256
WHERE NOT EXISTS (SELECT 1 FROM tasks WHERE lower(id) = lower(:id))
  AND NOT EXISTS (SELECT 1 FROM removed_tasks WHERE lower(id) = lower(:id));

-- name: insert_step
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (:id, :idx, :tool, :input, 'pending', 0, :policy);

-- name: insert_steps
-- SQLite's create: every step of the plan in one statement instead of one
-- each. :steps is a JSON array of [tool, input, policy] whose input and policy
-- are the JSON texts insert_step would store, carried as JSON strings, so
-- each column gets those texts exactly (policy null: NULL); idx is the
-- position in the array.
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
SELECT :id, key, json_extract(value, '$[0]'), json_extract(value, '$[1]'), 'pending', 0,
       json_extract(value, '$[2]')
FROM json_each(:steps);

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

-- name: recover_steps
UPDATE steps SET status = 'pending' WHERE task_id = :id AND status = 'running';

-- name: fence
-- A cancelled task closes the fence too (the runner then reads why: see
-- ninelives.lineage); a cancel never moves the epoch.
UPDATE tasks SET status = :status, updated_at = :now
WHERE id = :id AND lease_epoch = :epoch AND status <> 'cancelled';

-- name: fence_unchecked
-- Test-only (see ninelives.store.fencing_disabled): the fence without its epoch.
UPDATE tasks SET status = :status, updated_at = :now WHERE id = :id AND status <> 'cancelled';

-- name: fence_read
-- The fence of a transition that leaves the task running: read, not written.
-- Inside the write transaction it is as strong as the UPDATE, and rewriting
-- the row each step would rewrite three of its index entries too.
SELECT status FROM tasks WHERE id = :id AND lease_epoch = :epoch AND status <> 'cancelled';

-- name: fence_read_unchecked
SELECT status FROM tasks WHERE id = :id AND status <> 'cancelled';

-- name: claim_candidates
-- Workers on one host: the oldest unfinished tasks of the queue after
-- (:after_ts, :after_id), a page at a time; the per-task kernel lock then
-- decides which of them this worker gets. A task whose step waits out its
-- backoff is left until due, rather than claimed to hold a slot asleep.
SELECT id, created_at FROM tasks
WHERE queue = :queue AND status IN ('pending', 'running')
  AND (created_at, id) > (:after_ts, :after_id)
  AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.task_id = tasks.id
                  AND s.status = 'pending' AND s.not_before > :now)
ORDER BY created_at, id
LIMIT :page;

-- name: abandon
-- Give a task up without waiting for its runner: the new epoch fences that
-- runner out, and the next claim recovers the step it left running.
UPDATE tasks SET lease_epoch = lease_epoch + 1, updated_at = :now
WHERE id = :id AND lease_epoch = :epoch;

-- name: unfinished
-- :skip is a JSON array of ids left out. The ids, not their count: one that
-- is not UTF-8 is counted in Python (store.unfinished). INDEXED BY: without
-- statistics SQLite would otherwise walk every task of the queue (tasks_queue_created).
SELECT id FROM tasks INDEXED BY tasks_runnable
WHERE queue = :queue AND status IN ('pending', 'running')
  AND id NOT IN (SELECT value FROM json_each(:skip));

-- name: recoveries
-- How often a step was recovered before: read only when recovering it again.
SELECT count(*) FROM events
WHERE task_id = :id AND step_idx = :idx AND kind = 'step_recovered';

-- name: recovery_history
-- A claim's count for a step left running for its probe: the runs that found a
-- step running and the step's journaled recoveries. Read only then.
SELECT kind, data FROM events
WHERE task_id = :id AND (kind = 'run_started' OR (kind = 'step_recovered' AND step_idx = :idx));

-- name: fail_task
UPDATE tasks SET status = 'failed', updated_at = :now WHERE id = :id;

-- name: step_running
-- A step waiting out its backoff (not_before) is not started before then.
UPDATE steps SET status = 'running', attempts = attempts + 1, not_before = NULL
WHERE task_id = :id AND idx = :idx AND status = 'pending'
  AND (not_before IS NULL OR not_before <= :now)
RETURNING attempts;

-- name: step_running_fenced
-- step_running with the fence of a running task folded in (fence_read's
-- condition, and the task already 'running'): the common start of a step is
-- one statement instead of two. Matching nothing, the runner falls back to
-- fence, then step_running, which say why (or set a task back to running).
UPDATE steps SET status = 'running', attempts = attempts + 1, not_before = NULL
WHERE task_id = :id AND idx = :idx AND status = 'pending'
  AND (not_before IS NULL OR not_before <= :now)
  AND EXISTS (SELECT 1 FROM tasks WHERE id = :id AND lease_epoch = :epoch
              AND status = 'running')
RETURNING attempts;

-- name: step_due_in
-- Why step_running matched nothing: seconds until a pending step is due (NULL: not pending).
SELECT coalesce(not_before - :now, 0) FROM steps
WHERE task_id = :id AND idx = :idx AND status = 'pending';

-- name: step_progress
UPDATE steps SET progress = :progress
WHERE task_id = :id AND idx = :idx AND status = 'running';

-- name: step_done
UPDATE steps SET status = 'done', output = :output
WHERE task_id = :id AND idx = :idx AND status = 'running';

-- name: step_done_fenced
-- step_done with the fence of a running task folded in, for a step that
-- leaves its task running: one statement instead of two. Matching nothing,
-- the runner falls back to fence, then step_done, which say why.
UPDATE steps SET status = 'done', output = :output
WHERE task_id = :id AND idx = :idx AND status = 'running'
  AND EXISTS (SELECT 1 FROM tasks WHERE id = :id AND lease_epoch = :epoch
              AND status = 'running');

-- name: step_back
-- :delay NULL: due at once; otherwise not started again before now + delay.
UPDATE steps SET status = :status, not_before = :now + :delay
WHERE task_id = :id AND idx = :idx AND status = 'running'
RETURNING attempts, not_before;

-- name: step_failed
UPDATE steps SET status = 'failed', not_before = NULL WHERE task_id = :id AND idx = :idx;

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

-- name: get_task_v5
-- SQLite only, read-only commands on a schema older than 0006 (no plan_sha256).
SELECT id, goal, status, created_at, updated_at, lease_epoch, artifacts FROM tasks WHERE id = :id;

-- name: get_task_unleased
-- SQLite only, read-only commands on a schema older than 0002 (no lease_epoch).
SELECT id, goal, status, created_at, updated_at, 0, NULL FROM tasks WHERE id = :id;

-- name: get_task_unrecorded
-- SQLite only, read-only commands on a schema older than 0005 (no artifacts folder).
SELECT id, goal, status, created_at, updated_at, lease_epoch, NULL FROM tasks WHERE id = :id;
-- name: move_artifacts
-- The artifacts folder a run was given, recorded in place of the one of create
-- while no step of the task has ever started: nothing can be published in the
-- old one yet. A task of the guide (NULL) keeps following the runner's settings.
UPDATE tasks SET artifacts = :artifacts
WHERE id = :id AND status = 'pending' AND artifacts IS NOT NULL AND artifacts <> :artifacts
  AND NOT EXISTS (SELECT 1 FROM events WHERE task_id = :id AND kind = 'step_started')
RETURNING id;

-- name: retry_task
-- A failed task back to pending under a new epoch, so that no runner from
-- before the retry can commit to it again.
UPDATE tasks SET status = 'pending', lease_epoch = lease_epoch + 1, updated_at = :now
WHERE id = :id AND status = 'failed';

-- name: retry_step
-- Progress is kept (the next attempt resumes from it); a pending wait is dropped.
UPDATE steps SET status = 'pending', attempts = 0, not_before = NULL
WHERE task_id = :id AND idx = :idx AND status = 'failed';

-- Cancel, fork and plan integrity (ninelives.lineage).

-- name: task_row_lock
-- The task's row, locked for a cancel or a fork of it (SQLite: BEGIN IMMEDIATE).
SELECT status FROM tasks WHERE id = :id;

-- name: cancel_task
-- No new epoch: a runner holding the task finds the fence closed and reads
-- "cancelled" (exit 9) rather than "taken over" (exit 3).
UPDATE tasks SET status = 'cancelled', updated_at = :now
WHERE id = :id AND status NOT IN ('done', 'cancelled');

-- name: fence_cancelled
-- The fence for the commit a runner still owes after a cancel landed: the
-- output (or error) of the step it was running, and nothing else.
UPDATE tasks SET updated_at = :now
WHERE id = :id AND lease_epoch = :epoch AND status = 'cancelled';

-- name: insert_copied_step
-- A fork's step before its --from: done with the source's output, no attempt of its own.
INSERT INTO steps (task_id, idx, tool, input, status, output, attempts, policy)
VALUES (:id, :idx, :tool, :input, 'done', :output, 0, :policy);

-- name: appended_by
-- Which turn appended each step (step_appended's "by"): a fork leaves out what
-- its re-run turns append again.
SELECT step_idx, data FROM events WHERE task_id = :id AND kind = 'step_appended';

-- name: plan_sha256
SELECT plan_sha256 FROM tasks WHERE id = :id;

-- name: set_plan_sha256
UPDATE tasks SET plan_sha256 = :plan_sha256 WHERE id = :id;

-- name: recover_step
-- One step of unknown outcome back to pending (on_unknown rerun, or a probe
-- that found the effect had not happened).
UPDATE steps SET status = 'pending' WHERE task_id = :id AND idx = :idx AND status = 'running';

-- name: park_step
-- A step parked for a person: blocked (unknown outcome) or waiting (approval).
UPDATE steps SET status = :status
WHERE task_id = :id AND idx = :idx AND status IN ('pending', 'running');

-- name: park_task
UPDATE tasks SET status = :status, updated_at = :now WHERE id = :id;

-- name: settle_step
-- A probe's answer for a step left running: done with its output, or blocked.
UPDATE steps SET status = :status, output = :output
WHERE task_id = :id AND idx = :idx AND status = 'running';

-- name: decide_task
-- A person's decision moves a parked task on under a new epoch, so that no
-- runner from before it can commit to the task again.
UPDATE tasks SET status = :status, lease_epoch = lease_epoch + 1, updated_at = :now
WHERE id = :id AND status = :expect;

-- name: decide_step
UPDATE steps SET status = :status, output = :output
WHERE task_id = :id AND idx = :idx AND status = :expect;

-- name: blob_rows
-- Outputs that are, or hold, a blob reference (ninelives.blobs): gc and doctor.
SELECT task_id, idx, output FROM steps
WHERE output LIKE '%"$blob"%' ORDER BY task_id, idx;

-- Housekeeping (ls, gc, doctor). Each query reaches its rows through an index
-- of migration 0007; tests/unit/test_query_plans.py checks that none scans a table.

-- name: ls_page
-- The newest tasks first, a page of ids (tasks_created).
SELECT id FROM tasks ORDER BY created_at DESC, id DESC LIMIT :limit;

-- name: ls_page_status
SELECT id FROM tasks WHERE status = :status ORDER BY created_at DESC, id DESC LIMIT :limit;

-- name: ls_page_queue
SELECT id FROM tasks WHERE queue = :queue ORDER BY created_at DESC, id DESC LIMIT :limit;

-- name: ls_page_status_queue
SELECT id FROM tasks WHERE status = :status AND queue = :queue
ORDER BY created_at DESC, id DESC LIMIT :limit;

-- name: ls_rows
-- One line of ls per id of a page (:ids, a JSON array): steps done of total,
-- attempts, and the last event, each through the task's own keys.
SELECT t.id, t.status, t.queue, t.goal, t.created_at, t.updated_at,
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status = 'done'),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id),
    (SELECT coalesce(sum(s.attempts), 0) FROM steps s WHERE s.task_id = t.id),
    (SELECT e.kind FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1),
    (SELECT e.ts FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1)
FROM tasks t WHERE t.id IN (SELECT value FROM json_each(:ids));

-- name: ls_rows_unqueued
-- SQLite only, read-only commands on a schema older than 0003 (no queue): ls_rows.
SELECT t.id, t.status, NULL, t.goal, t.created_at, t.updated_at,
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status = 'done'),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id),
    (SELECT coalesce(sum(s.attempts), 0) FROM steps s WHERE s.task_id = t.id),
    (SELECT e.kind FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1),
    (SELECT e.ts FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1)
FROM tasks t WHERE t.id IN (SELECT value FROM json_each(:ids));

-- name: gc_candidates
-- Finished tasks of one status last changed before :before, oldest first,
-- after (:after_ts, :after_id): a page at a time (tasks_status_updated).
SELECT id, updated_at FROM tasks
WHERE status = :status AND updated_at < :before AND (updated_at, id) > (:after_ts, :after_id)
ORDER BY updated_at, id LIMIT :limit;

-- name: gc_recheck
-- Inside the deleting transaction: which of the page are still finished and
-- old enough (a retry may have moved one back to pending meanwhile).
SELECT id FROM tasks WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN (SELECT value FROM json_each(:statuses)) AND updated_at < :before;

-- name: gc_events
-- The journal first, then the steps, then the task: one transaction, so a
-- kill leaves all three or none.
DELETE FROM events WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: gc_steps
DELETE FROM steps WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: gc_tasks
DELETE FROM tasks WHERE id IN (SELECT value FROM json_each(:ids));

-- name: gc_remember
-- In the same transaction as gc_tasks: the ids deleted stay taken (migration 0009).
INSERT OR IGNORE INTO removed_tasks (id, removed_at)
SELECT value, :now FROM json_each(:ids);

-- name: tasks_in_status
-- doctor: the tasks of one status with their lease (tasks_status_updated).
SELECT id, queue, lease_epoch, lease_owner, lease_expires_at, 0 FROM tasks WHERE status = :status;

-- name: artifact_folders
-- doctor: every folder tasks publish to, for orphaned temporary files.
SELECT DISTINCT artifacts FROM tasks WHERE artifacts IS NOT NULL;

-- name: dangling_rows
-- doctor: journal events and steps whose task is gone (a delete that was not
-- one transaction). Reads the whole journal's index: doctor only, never a hot path.
SELECT 'events', count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = e.task_id)
UNION ALL
SELECT 'steps', count(*) FROM steps s WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = s.task_id);

-- name: delete_dangling_events
DELETE FROM events WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = events.task_id);

-- name: delete_dangling_steps
DELETE FROM steps WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = steps.task_id);

-- name: metric_tasks
-- /metrics of `ninelives ui`: whole-table counts, read once per scrape.
SELECT status, count(*) FROM tasks GROUP BY status;

-- name: metric_steps
SELECT status, count(*), coalesce(sum(attempts), 0) FROM steps GROUP BY status;

-- name: metric_recoveries
SELECT count(*) FROM events WHERE kind = 'step_recovered';

-- name: metric_durations
-- /metrics: step attempt durations, paired as report.py pairs them: a
-- step_started and the next step_finished or step_error of the same step of
-- the same task (an attempt left open by a kill, followed by the next run's
-- step_started, has no duration). One pass over the journal's step events,
-- aggregated here so that a scrape never ships the journal. Rows: (bucket,
-- outcome, attempts, seconds), bucket the smallest upper bound of
-- models.DURATION_BUCKETS the attempts are under (NULL: over all of them),
-- outcome NULL for the row that counts every step_started.
WITH marks AS MATERIALIZED (
    SELECT kind, ts,
           lead(kind) OVER (PARTITION BY task_id, step_idx ORDER BY seq) AS next_kind,
           lead(ts) OVER (PARTITION BY task_id, step_idx ORDER BY seq) AS next_ts
    FROM events
    WHERE kind IN ('step_started', 'step_finished', 'step_error') AND step_idx IS NOT NULL
),
attempts AS (
    SELECT CASE next_kind WHEN 'step_finished' THEN 'done' ELSE 'error' END AS outcome,
           max(next_ts - ts, 0) AS seconds
    FROM marks
    WHERE kind = 'step_started' AND next_kind IN ('step_finished', 'step_error')
)
SELECT CASE
           WHEN seconds <= 0.005 THEN 0.005
           WHEN seconds <= 0.01 THEN 0.01
           WHEN seconds <= 0.025 THEN 0.025
           WHEN seconds <= 0.05 THEN 0.05
           WHEN seconds <= 0.1 THEN 0.1
           WHEN seconds <= 0.25 THEN 0.25
           WHEN seconds <= 0.5 THEN 0.5
           WHEN seconds <= 1 THEN 1
           WHEN seconds <= 2.5 THEN 2.5
           WHEN seconds <= 5 THEN 5
           WHEN seconds <= 10 THEN 10
           WHEN seconds <= 30 THEN 30
           WHEN seconds <= 60 THEN 60
           WHEN seconds <= 300 THEN 300
           WHEN seconds <= 1800 THEN 1800
       END AS bucket,
       outcome, count(*), sum(seconds)
FROM attempts
GROUP BY bucket, outcome
UNION ALL
SELECT NULL, NULL, count(*), NULL FROM marks WHERE kind = 'step_started';

-- name: append_head
-- Where a workflow's next step is appended (one past the last) and the plan
-- digest it carries over, in one read instead of two.
SELECT (SELECT COALESCE(MAX(idx) + 1, 0) FROM steps WHERE task_id = :id), plan_sha256
FROM tasks WHERE id = :id;

-- name: append_head_fenced
-- append_head with the fence of a running task folded in (fence_read's
-- condition, and the task already 'running'): inside the write transaction a
-- read is as strong as the fence, one statement instead of two. No row: the
-- runner falls back to fence, then append_head, which say why.
SELECT (SELECT COALESCE(MAX(idx) + 1, 0) FROM steps WHERE task_id = :id), plan_sha256
FROM tasks WHERE id = :id AND lease_epoch = :epoch AND status = 'running';

-- name: insert_running_step
-- A workflow's step appended and started at once: the row as insert_step
-- then step_running would leave it (attempt 1, no wait), in one statement.
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (:id, :idx, :tool, :input, 'running', 1, :policy);

-- name: step_defer
-- A workflow's timer (ctx.sleep): its step is not started before it is due.
UPDATE steps SET not_before = :now + :delay WHERE task_id = :id AND idx = :idx;

-- Named queries of the PostgreSQL store. Each block starts with "-- name: NAME";
-- sqlite.sql has the same names for what both dialects do, so a diff shows
-- where they differ: here every time comes from the database's clock
-- (ninelives_now()), and a claim is a lease with an expiry, not a kernel lock.

-- name: get_task
SELECT id, goal, status, created_at, updated_at, lease_epoch, artifacts FROM tasks
WHERE id = %(id)s;

-- name: get_steps
SELECT idx, tool, input, status, output, attempts, policy, progress, not_before FROM steps
WHERE task_id = %(id)s ORDER BY idx;

-- name: task_id_lock
-- Serialises concurrent creates of ids equal but for case ("Demo", "demo"):
-- a transaction-scoped advisory lock on the lower-cased id, taken in its own
-- statement so that task_id_taken, run after it, sees what the other committed.
SELECT pg_advisory_xact_lock(hashtextextended('ninelives-task-id:' || lower(%(id)s), 0));

-- name: task_id_taken
-- Ids are unique regardless of case (artifact names built from them must not
-- collide on a case-insensitive file system); the tasks_id_lower index
-- (migration 0004) makes this a lookup, not a scan.
SELECT id FROM tasks WHERE lower(id) = lower(%(id)s) LIMIT 1;

-- name: task_ids
SELECT id FROM tasks ORDER BY created_at, id;

-- name: insert_task
INSERT INTO tasks (id, goal, status, created_at, updated_at, queue, artifacts)
SELECT %(id)s, %(goal)s, 'pending', n.t, n.t, %(queue)s, %(artifacts)s
FROM (SELECT ninelives_now() AS t) AS n;

-- name: insert_step
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (%(id)s, %(idx)s, %(tool)s, %(input)s, 'pending', 0, %(policy)s);

-- name: insert_event
INSERT INTO events (ts, task_id, run_id, kind, step_idx, data)
VALUES (ninelives_now(), %(id)s, %(run)s, %(kind)s, %(step)s, %(data)s);

-- name: lease_state
-- The row lock serialises claims of one task; "live" is an unexpired lease.
SELECT lease_epoch, lease_owner IS NOT NULL AND lease_expires_at >= ninelives_now()
FROM tasks WHERE id = %(id)s
FOR UPDATE;

-- name: holder_lock
-- A runner holds a session advisory lock named by (task, epoch) for as long as
-- it holds the lease, shared, on its main connection and on its heartbeat's:
-- the server drops it the moment the runner's connections die, so a free lock
-- under a live lease means the holder's sessions are gone (see holder_gone).
SELECT pg_try_advisory_lock_shared(hashtextextended(concat(%(id)s::text, ':', %(epoch)s::bigint), 0));

-- name: holder_probe
-- Exclusive: taken only while some holder session still holds its shared lock.
SELECT pg_try_advisory_lock(hashtextextended(concat(%(id)s::text, ':', %(epoch)s::bigint), 0));

-- name: holder_probe_end
SELECT pg_advisory_unlock(hashtextextended(concat(%(id)s::text, ':', %(epoch)s::bigint), 0));

-- name: holder_gone
-- A free holder lock proves the holder's session is gone, but not that the
-- holder is: a server restart ends every session, live holders' included.
-- So it counts only if the holder claimed the task (its run_started) since
-- the server's current life began (its start, or the restart of its
-- checkpointer after a crash that reinitialised shared memory).
SELECT coalesce(max(ts), 0) > greatest(
    extract(epoch FROM pg_postmaster_start_time()),
    coalesce((SELECT extract(epoch FROM min(backend_start)) FROM pg_stat_activity
              WHERE backend_type = 'checkpointer'), 0))
FROM events WHERE task_id = %(id)s AND kind = 'run_started';

-- name: holder_unlock
SELECT pg_advisory_unlock_shared(hashtextextended(concat(%(id)s::text, ':', %(epoch)s::bigint), 0));

-- name: claim
UPDATE tasks
SET lease_epoch = lease_epoch + 1,
    lease_owner = %(owner)s,
    lease_expires_at = ninelives_now() + %(lease)s,
    status = CASE WHEN status = 'pending' THEN 'running' ELSE status END,
    updated_at = ninelives_now()
WHERE id = %(id)s
RETURNING lease_epoch;

-- name: claim_next
-- The oldest unfinished task of the queue whose lease is free or expired;
-- SKIP LOCKED lets concurrent workers each take a different one without waiting.
WITH next AS (
    SELECT id FROM tasks
    WHERE queue = %(queue)s AND status IN ('pending', 'running')
      AND (lease_owner IS NULL OR lease_expires_at < ninelives_now())
      AND id <> ALL(%(skip)s::text[])
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks AS t
SET lease_epoch = t.lease_epoch + 1,
    lease_owner = %(owner)s,
    lease_expires_at = ninelives_now() + %(lease)s,
    status = CASE WHEN t.status = 'pending' THEN 'running' ELSE t.status END,
    updated_at = ninelives_now()
FROM next
WHERE t.id = next.id
RETURNING t.id, t.lease_epoch;

-- name: running_steps
SELECT idx FROM steps WHERE task_id = %(id)s AND status = 'running' ORDER BY idx;

-- name: recover_steps
UPDATE steps SET status = 'pending' WHERE task_id = %(id)s AND status = 'running';

-- name: fence
-- Every commit of a runner goes through here first and renews its lease.
UPDATE tasks
SET status = %(status)s, updated_at = ninelives_now(),
    lease_expires_at = ninelives_now() + %(lease)s
WHERE id = %(id)s AND lease_epoch = %(epoch)s;

-- name: fence_unchecked
-- Test-only (see ninelives.store.fencing_disabled): the fence without its epoch.
UPDATE tasks SET status = %(status)s, updated_at = ninelives_now() WHERE id = %(id)s;

-- name: renew
-- No expiry condition, on purpose (as in the fence): a lapsed lease that nobody
-- claimed still carries the holder's epoch, so nobody else can have committed or
-- started a tool under it, and renewing it is safe. A claim moves the epoch, and
-- then this matches no row. lease_owner IS NULL: released, not to be revived.
UPDATE tasks SET lease_expires_at = ninelives_now() + %(lease)s
WHERE id = %(id)s AND lease_epoch = %(epoch)s AND lease_owner IS NOT NULL;

-- name: release
-- Free the lease only if it is still ours, and drop our liveness lock either way.
WITH released AS (
    UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL
    WHERE id = %(id)s AND lease_epoch = %(epoch)s
    RETURNING id
)
SELECT pg_advisory_unlock_shared(hashtextextended(concat(%(id)s::text, ':', %(epoch)s::bigint), 0)),
       (SELECT count(*) FROM released);

-- name: abandon
-- Give a task up without waiting for its runner: the new epoch fences that
-- runner out, and the next claim recovers the step it left running.
UPDATE tasks
SET lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = ninelives_now()
WHERE id = %(id)s AND lease_epoch = %(epoch)s;

-- name: unfinished
SELECT count(*) FROM tasks WHERE queue = %(queue)s AND status IN ('pending', 'running')
  AND id <> ALL(%(skip)s::text[]);

-- name: recoveries
-- How often a step was recovered before: read only when recovering it again.
SELECT count(*) FROM events
WHERE task_id = %(id)s AND step_idx = %(idx)s AND kind = 'step_recovered';

-- name: fail_task
UPDATE tasks SET status = 'failed', updated_at = ninelives_now() WHERE id = %(id)s;

-- name: first_pending
SELECT s.idx, s.tool FROM steps s JOIN tasks t ON t.id = s.task_id
WHERE s.task_id = %(id)s AND s.status = 'pending' AND t.status IN ('pending', 'running')
ORDER BY s.idx LIMIT 1;

-- name: step_running
UPDATE steps SET status = 'running', attempts = attempts + 1
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'pending'
RETURNING attempts;

-- name: step_done
UPDATE steps SET status = 'done', output = %(output)s
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running';

-- name: step_back
UPDATE steps SET status = %(status)s
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running'
RETURNING attempts;

-- name: step_failed
UPDATE steps SET status = 'failed' WHERE task_id = %(id)s AND idx = %(idx)s;

-- name: events
SELECT seq, ts, task_id, run_id, kind, step_idx, data FROM events WHERE task_id = %(id)s ORDER BY seq;

-- name: schema_exists
SELECT to_regclass('ninelives_schema') IS NOT NULL;

-- name: schema_table
CREATE TABLE IF NOT EXISTS ninelives_schema (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
);

-- name: schema_version
SELECT coalesce(max(version), 0) FROM ninelives_schema;

-- name: schema_applied
INSERT INTO ninelives_schema (version, name, applied_at)
VALUES (%(version)s, %(name)s, extract(epoch FROM clock_timestamp()));

-- name: migration_lock
-- One migrator at a time per database; released at commit.
SELECT pg_advisory_xact_lock(hashtextextended('ninelives-schema', 0));

-- name: retry_task
-- A failed task back to pending under a new epoch, so that no runner from
-- before the retry can commit to it again; its lease is free for the next claim.
UPDATE tasks
SET status = 'pending', lease_epoch = lease_epoch + 1, lease_owner = NULL,
    lease_expires_at = NULL, updated_at = ninelives_now()
WHERE id = %(id)s AND status = 'failed';

-- name: retry_step
UPDATE steps SET status = 'pending', attempts = 0
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'failed';

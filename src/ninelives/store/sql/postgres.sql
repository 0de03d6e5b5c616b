-- Named queries of the PostgreSQL store. Each block starts with "-- name: NAME";
-- sqlite.sql has the same names for what both dialects do, so a diff shows
-- where they differ: here every time comes from the database's clock
-- (ninelives_now()), and a claim is a lease with an expiry, not a kernel lock.

-- name: get_task
SELECT id, goal, status, created_at, updated_at, lease_epoch, artifacts, plan_sha256
FROM tasks WHERE id = %(id)s;

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
-- (migration 0004) makes this a lookup, not a scan. An id gc removed stays
-- taken (removed_tasks, migration 0009): its idempotency keys may name the
-- old task's effects. The second column is when it was removed (NULL: stored).
SELECT id, NULL FROM tasks WHERE lower(id) = lower(%(id)s)
UNION ALL
SELECT id, removed_at FROM removed_tasks WHERE lower(id) = lower(%(id)s)
LIMIT 1;

-- name: task_ids
SELECT id FROM tasks ORDER BY created_at, id;

-- name: insert_task
INSERT INTO tasks (id, goal, status, created_at, updated_at, queue, artifacts, plan_sha256)
SELECT %(id)s, %(goal)s, 'pending', n.t, n.t, %(queue)s, %(artifacts)s, %(plan_sha256)s
FROM (SELECT ninelives_now() AS t) AS n;

-- name: insert_step
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (%(id)s, %(idx)s, %(tool)s, %(input)s, 'pending', 0, %(policy)s);

-- name: insert_event
INSERT INTO events (ts, task_id, run_id, kind, step_idx, data)
VALUES (ninelives_now(), %(id)s, %(run)s, %(kind)s, %(step)s, %(data)s);

-- name: lease_state
-- The row lock serialises claims of one task; "live" is an unexpired lease.
SELECT lease_epoch, lease_owner IS NOT NULL AND lease_expires_at >= ninelives_now(),
       lease_owner
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

-- name: holder_owner
-- The lease_owner of the claim under epoch, which names its process (housekeeping.holder_dead_here).
SELECT lease_owner FROM tasks WHERE id = %(id)s AND lease_epoch = %(epoch)s;

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
-- A task whose step waits out its backoff is left until due, rather than
-- claimed to hold a slot asleep.
WITH next AS (
    SELECT id FROM tasks
    WHERE queue = %(queue)s AND status IN ('pending', 'running')
      AND (lease_owner IS NULL OR lease_expires_at < ninelives_now())
      AND id <> ALL(%(skip)s::text[])
      AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.task_id = tasks.id
                      AND s.status = 'pending' AND s.not_before > ninelives_now())
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
-- Every commit of a runner goes through here first and renews its lease. A
-- cancelled task closes the fence too (the runner then reads why: see
-- ninelives.lineage); a cancel never moves the epoch. A closed fence fails the
-- statement: a "refusal", a cast error carrying the client's token, which
-- store/postgres/base.py turns back into the runner's exception. The server then
-- skips the transaction's later statements and its COMMIT, sent in the same
-- flush: a fenced commit needs no round trip of its own to learn the fence held.
-- (Not 1/0 or a constant cast: the planner would fold those and always fail.)
WITH fenced AS (
    UPDATE tasks
    SET status = %(status)s, updated_at = ninelives_now(),
        lease_expires_at = ninelives_now() + %(lease)s
    WHERE id = %(id)s AND lease_epoch = %(epoch)s AND status <> 'cancelled'
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer END
FROM fenced;

-- name: fence_unchecked
-- Test-only (see ninelives.store.fencing_disabled): the fence without its epoch.
WITH fenced AS (
    UPDATE tasks SET status = %(status)s, updated_at = ninelives_now()
    WHERE id = %(id)s AND status <> 'cancelled'
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer END
FROM fenced;

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

-- name: recovery_history
-- A claim's count for a step left running for its probe: the runs that found a
-- step running and the step's journaled recoveries. Read only then.
SELECT kind, data FROM events
WHERE task_id = %(id)s AND (kind = 'run_started' OR (kind = 'step_recovered' AND step_idx = %(idx)s));

-- name: fail_task
UPDATE tasks SET status = 'failed', updated_at = ninelives_now() WHERE id = %(id)s;

-- name: step_running
-- A step waiting out its backoff (not_before) is not started before then.
UPDATE steps SET status = 'running', attempts = attempts + 1, not_before = NULL
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'pending'
  AND (not_before IS NULL OR not_before <= ninelives_now())
RETURNING attempts;

-- name: fenced
-- PostgreSQL only: the fence's UPDATE as the first CTE of a transition that
-- is one statement (start_step, finish_step below): "WITH fenced AS (this)".
-- One statement is its own transaction, committed in one round trip and one
-- message; an error anywhere in it (a refusal) writes nothing.
UPDATE tasks
SET status = %(status)s, updated_at = ninelives_now(),
    lease_expires_at = ninelives_now() + %(lease)s
WHERE id = %(id)s AND lease_epoch = %(epoch)s AND status <> 'cancelled'
RETURNING 1;

-- name: fenced_unchecked
-- Test-only, as fence_unchecked.
UPDATE tasks SET status = %(status)s, updated_at = ninelives_now()
WHERE id = %(id)s AND status <> 'cancelled'
RETURNING 1;

-- name: start_step
-- PostgreSQL only, after "WITH fenced AS (fenced),": step_running and its
-- step_started event. The event's data is canonical JSON whose first key is
-- "attempt" (ninelives.lineage.started_data): the client sends what comes
-- before and after the number. The step's UPDATE reads fenced, so the task's
-- row is locked before the step's, in the order every other writer takes them.
-- Refused if the fence is closed, else if the step is not startable (the
-- runner then reads step_due_in to say why).
running AS (
    UPDATE steps SET status = 'running', attempts = attempts + 1, not_before = NULL
    WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'pending'
      AND (not_before IS NULL OR not_before <= ninelives_now())
      AND EXISTS (SELECT 1 FROM fenced)
    RETURNING attempts
), journaled AS (
    INSERT INTO events (ts, task_id, run_id, kind, step_idx, data)
    SELECT ninelives_now(), %(id)s, %(run)s, 'step_started', %(idx)s,
           %(head)s || attempts || %(tail)s
    FROM running
)
SELECT CASE
    WHEN (SELECT count(*) FROM fenced) <> 1 THEN
        ('ninelives-refused:' || %(fence)s || ':' || (SELECT count(*) FROM fenced))::integer
    WHEN count(*) <> 1 THEN ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer
    ELSE max(attempts) END
FROM running;

-- name: finish_step
-- PostgreSQL only, after "WITH fenced AS (fenced),": step_done and its
-- step_finished event, then task_done or task_failed when %(then)s names one,
-- journaled in that order. Refused as start_step.
done AS (
    UPDATE steps SET status = 'done', output = %(output)s
    WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running'
      AND EXISTS (SELECT 1 FROM fenced)
    RETURNING 1
), journaled AS (
    INSERT INTO events (ts, task_id, run_id, kind, step_idx, data)
    SELECT ninelives_now(), %(id)s, %(run)s, e.kind, e.step, e.data
    FROM (VALUES (1, 'step_finished'::text, %(idx)s::integer, %(data)s::text),
                 (2, %(then)s::text, NULL::integer, %(then_data)s::text)) AS e (n, kind, step, data)
    WHERE e.kind IS NOT NULL AND EXISTS (SELECT 1 FROM done)
    ORDER BY e.n
)
SELECT CASE
    WHEN (SELECT count(*) FROM fenced) <> 1 THEN
        ('ninelives-refused:' || %(fence)s || ':' || (SELECT count(*) FROM fenced))::integer
    WHEN count(*) <> 1 THEN ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer
    ELSE 1 END
FROM done;

-- name: step_due_in
-- Why step_running matched nothing: seconds until a pending step is due (NULL: not pending).
SELECT coalesce(not_before - ninelives_now(), 0) FROM steps
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'pending';

-- name: step_progress
-- Refused unless the step is running, as step_done.
WITH saved AS (
    UPDATE steps SET progress = %(progress)s
    WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running'
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer END
FROM saved;

-- name: step_done
-- Refused (see the fence) unless the step was running: checked by the server,
-- within the commit's single round trip.
WITH done AS (
    UPDATE steps SET status = 'done', output = %(output)s
    WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running'
    RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
    ELSE ('ninelives-refused:' || %(refusal)s || ':' || count(*))::integer END
FROM done;

-- name: step_back
-- %(delay)s NULL: due at once; otherwise not started again before now + delay.
UPDATE steps SET status = %(status)s, not_before = ninelives_now() + %(delay)s::double precision
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running'
RETURNING attempts, not_before;

-- name: step_failed
UPDATE steps SET status = 'failed', not_before = NULL WHERE task_id = %(id)s AND idx = %(idx)s;

-- name: events
SELECT seq, ts, task_id, run_id, kind, step_idx, data FROM events WHERE task_id = %(id)s ORDER BY seq;

-- name: schema_exists
SELECT to_regclass('ninelives_schema') IS NOT NULL;

-- name: contract_tables
-- The contract's tables found where a database without ninelives' schema table
-- holds them: another application's, never migrated over.
SELECT name FROM unnest(ARRAY['tasks', 'steps', 'events']) AS name
WHERE to_regclass(quote_ident(name)) IS NOT NULL
ORDER BY name;

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

-- name: move_artifacts
-- The artifacts folder a run was given, recorded in place of the one of create
-- while no step of the task has ever started: nothing can be published in the
-- old one yet. A task of the guide (NULL) keeps following the runner's settings.
UPDATE tasks SET artifacts = %(artifacts)s
WHERE id = %(id)s AND status = 'pending' AND artifacts IS NOT NULL
  AND artifacts <> %(artifacts)s
  AND NOT EXISTS (SELECT 1 FROM events WHERE task_id = %(id)s AND kind = 'step_started')
RETURNING id;

-- name: retry_task
-- A failed task back to pending under a new epoch, so that no runner from
-- before the retry can commit to it again; its lease is free for the next claim.
UPDATE tasks
SET status = 'pending', lease_epoch = lease_epoch + 1, lease_owner = NULL,
    lease_expires_at = NULL, updated_at = ninelives_now()
WHERE id = %(id)s AND status = 'failed';

-- name: retry_step
-- Progress is kept (the next attempt resumes from it); a pending wait is dropped.
UPDATE steps SET status = 'pending', attempts = 0, not_before = NULL
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'failed';

-- Cancel, fork and plan integrity (ninelives.lineage).

-- name: task_row_lock
-- The task's row, locked for a cancel or a fork of it (SQLite: BEGIN IMMEDIATE).
SELECT status FROM tasks WHERE id = %(id)s
FOR UPDATE;

-- name: cancel_task
-- No new epoch: a runner holding the task finds the fence closed and reads
-- "cancelled" (exit 9) rather than "taken over" (exit 3).
UPDATE tasks SET status = 'cancelled', updated_at = ninelives_now()
WHERE id = %(id)s AND status NOT IN ('done', 'cancelled');

-- name: fence_cancelled
-- The fence for the commit a runner still owes after a cancel landed: the
-- output (or error) of the step it was running, and nothing else.
UPDATE tasks SET updated_at = ninelives_now()
WHERE id = %(id)s AND lease_epoch = %(epoch)s AND status = 'cancelled';

-- name: insert_copied_step
-- A fork's step before its --from: done with the source's output, no attempt of its own.
INSERT INTO steps (task_id, idx, tool, input, status, output, attempts, policy)
VALUES (%(id)s, %(idx)s, %(tool)s, %(input)s, 'done', %(output)s, 0, %(policy)s);

-- name: appended_by
-- Which turn appended each step (step_appended's "by"): a fork leaves out what
-- its re-run turns append again.
SELECT step_idx, data FROM events WHERE task_id = %(id)s AND kind = 'step_appended';

-- name: plan_sha256
SELECT plan_sha256 FROM tasks WHERE id = %(id)s;

-- name: set_plan_sha256
UPDATE tasks SET plan_sha256 = %(plan_sha256)s WHERE id = %(id)s;

-- name: recover_step
-- One step of unknown outcome back to pending (on_unknown rerun, or a probe
-- that found the effect had not happened).
UPDATE steps SET status = 'pending'
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running';

-- name: park_step
-- A step parked for a person: blocked (unknown outcome) or waiting (approval).
UPDATE steps SET status = %(status)s
WHERE task_id = %(id)s AND idx = %(idx)s AND status IN ('pending', 'running');

-- name: park_task
UPDATE tasks SET status = %(status)s, updated_at = ninelives_now() WHERE id = %(id)s;

-- name: settle_step
-- A probe's answer for a step left running: done with its output, or blocked.
UPDATE steps SET status = %(status)s, output = %(output)s
WHERE task_id = %(id)s AND idx = %(idx)s AND status = 'running';

-- name: decide_task
-- A person's decision moves a parked task on under a new epoch, so that no
-- runner from before it can commit to the task again; the lease is freed, so a
-- worker claims the task at once (its holder was checked gone, or released it).
UPDATE tasks SET status = %(status)s, lease_epoch = lease_epoch + 1, updated_at = ninelives_now(),
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND status = %(expect)s;

-- name: decide_step
UPDATE steps SET status = %(status)s, output = %(output)s
WHERE task_id = %(id)s AND idx = %(idx)s AND status = %(expect)s;

-- name: blob_rows
-- Outputs that are, or hold, a blob reference (ninelives.blobs): gc and doctor.
SELECT task_id, idx, output FROM steps
WHERE output LIKE '%"$blob"%' ORDER BY task_id, idx;

-- name: blob_chunk_insert
-- PostgreSQL only, as every blob_ query below: the blob store is files on SQLite.
INSERT INTO blob_chunks (sha256, n, data) VALUES (%(key)s, %(n)s, %(data)s);

-- name: blob_insert
-- True when the row is new. Content already stored is kept once (the writer then
-- drops its own chunks) and its created_at refreshed, so that a sweep spares it
-- until the reference commits. The row lock orders this against a sweep's
-- blob_delete: after a delete that committed first, this inserts afresh.
INSERT INTO blobs (sha256, size, created_at)
VALUES (%(sha256)s, %(size)s, extract(epoch FROM clock_timestamp()))
ON CONFLICT (sha256) DO UPDATE SET created_at = EXCLUDED.created_at
RETURNING xmax = 0;

-- name: blob_chunks_rename
UPDATE blob_chunks SET sha256 = %(sha256)s WHERE sha256 = %(key)s;

-- name: blob_chunks_drop
DELETE FROM blob_chunks WHERE sha256 = %(key)s;

-- name: blob_chunks_read
SELECT data FROM blob_chunks WHERE sha256 = %(sha256)s AND n >= %(from)s ORDER BY n LIMIT %(count)s;

-- name: blob_list
SELECT sha256, size, created_at FROM blobs ORDER BY sha256;

-- name: blob_delete
DELETE FROM blobs WHERE sha256 = %(sha256)s AND created_at < %(before)s RETURNING sha256;

-- Housekeeping (ls, gc, doctor). Each query reaches its rows through an index
-- of migration 0007; tests/unit/test_query_plans.py checks that none scans a table.

-- name: ls_page
-- The newest tasks first, a page of ids (tasks_created).
SELECT id FROM tasks ORDER BY created_at DESC, id DESC LIMIT %(limit)s;

-- name: ls_page_status
SELECT id FROM tasks WHERE status = %(status)s ORDER BY created_at DESC, id DESC LIMIT %(limit)s;

-- name: ls_page_queue
SELECT id FROM tasks WHERE queue = %(queue)s ORDER BY created_at DESC, id DESC LIMIT %(limit)s;

-- name: ls_page_status_queue
SELECT id FROM tasks WHERE status = %(status)s AND queue = %(queue)s
ORDER BY created_at DESC, id DESC LIMIT %(limit)s;

-- name: ls_rows
-- One line of ls per id of a page (:ids, an array): steps done of total,
-- attempts, and the last event, each through the task's own keys.
SELECT t.id, t.status, t.queue, t.goal, t.created_at, t.updated_at,
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id AND s.status = 'done'),
    (SELECT count(*) FROM steps s WHERE s.task_id = t.id),
    (SELECT coalesce(sum(s.attempts), 0) FROM steps s WHERE s.task_id = t.id),
    (SELECT e.kind FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1),
    (SELECT e.ts FROM events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1)
FROM tasks t WHERE t.id = ANY(%(ids)s::text[]);

-- name: gc_candidates
-- Finished tasks of one status last changed before :before, oldest first,
-- after (:after_ts, :after_id): a page at a time (tasks_status_updated).
SELECT id, updated_at FROM tasks
WHERE status = %(status)s AND updated_at < %(before)s
  AND (updated_at, id) > (%(after_ts)s::double precision, %(after_id)s::text)
ORDER BY updated_at, id LIMIT %(limit)s;

-- name: gc_recheck
-- Inside the deleting transaction, locking the rows: which of the page are
-- still finished, old enough and not held by a live lease (a runner ending,
-- a retry under way); a row another transaction holds is left for next time.
SELECT id FROM tasks WHERE id = ANY(%(ids)s::text[])
  AND status = ANY(%(statuses)s::text[]) AND updated_at < %(before)s
  AND (lease_owner IS NULL OR lease_expires_at < ninelives_now())
FOR UPDATE SKIP LOCKED;

-- name: gc_events
-- The journal first, then the steps, then the task: one transaction, so a
-- kill leaves all three or none.
DELETE FROM events WHERE task_id = ANY(%(ids)s::text[]);

-- name: gc_steps
DELETE FROM steps WHERE task_id = ANY(%(ids)s::text[]);

-- name: gc_tasks
DELETE FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: gc_remember
-- In the same transaction as gc_tasks: the ids deleted stay taken (migration 0009).
INSERT INTO removed_tasks (id, removed_at)
SELECT unnest(%(ids)s::text[]), ninelives_now()
ON CONFLICT DO NOTHING;

-- name: tasks_in_status
-- doctor: the tasks of one status with their lease, and whether it expired
-- on the database's clock (tasks_status_updated).
SELECT id, queue, lease_epoch, lease_owner, lease_expires_at,
       lease_owner IS NOT NULL AND lease_expires_at < ninelives_now()
FROM tasks WHERE status = %(status)s;

-- name: artifact_folders
-- doctor: every folder tasks publish to, for orphaned temporary files.
SELECT DISTINCT artifacts FROM tasks WHERE artifacts IS NOT NULL;

-- name: expired_leases
-- PostgreSQL only (SQLite has no leases that expire: the kernel lock is the claim).
-- doctor: leases whose holder stopped renewing (a dead or stalled worker), on
-- tasks of any status.
SELECT id, status, lease_epoch, lease_owner, ninelives_now() - lease_expires_at FROM tasks
WHERE lease_owner IS NOT NULL AND lease_expires_at < ninelives_now();

-- name: clear_expired_lease
-- PostgreSQL only.
-- doctor --fix: free a lease that expired, under a new epoch, so that its
-- holder, were it only stalled, is fenced out and the next claim recovers.
UPDATE tasks SET lease_epoch = lease_epoch + 1, lease_owner = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND lease_epoch = %(epoch)s AND lease_expires_at < ninelives_now();

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
           greatest(next_ts - ts, 0) AS seconds
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
SELECT (SELECT COALESCE(MAX(idx) + 1, 0) FROM steps WHERE task_id = %(id)s), plan_sha256
FROM tasks WHERE id = %(id)s;

-- name: insert_running_step
-- A workflow's step appended and started at once: the row as insert_step
-- then step_running would leave it (attempt 1, no wait), in one statement.
INSERT INTO steps (task_id, idx, tool, input, status, attempts, policy)
VALUES (%(id)s, %(idx)s, %(tool)s, %(input)s, 'running', 1, %(policy)s);

-- name: step_defer
-- A workflow's timer (ctx.sleep): its step is not started before it is due.
UPDATE steps SET not_before = ninelives_now() + %(delay)s::double precision
WHERE task_id = %(id)s AND idx = %(idx)s;

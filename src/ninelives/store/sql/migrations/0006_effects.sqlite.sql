-- Effects that matter (one migration for the whole capability):
-- steps.policy      the step's policy as JSON (max_attempts, timeout, backoff,
--                   on_unknown: the plan's defaults merged with the step's own);
--                   NULL: the runner's settings decide, as before.
-- steps.progress    the last progress a tool committed with ctx.checkpoint (JSON).
-- steps.not_before  the earliest time (epoch seconds) the step's next attempt may
--                   start: a backoff wait that survives a restart.
-- tasks.plan_sha256 SHA-256 of the canonical plan, stored at create; run and
--                   verify refuse a task whose stored goal or steps no longer match.
ALTER TABLE steps ADD COLUMN policy TEXT;
ALTER TABLE steps ADD COLUMN progress TEXT;
ALTER TABLE steps ADD COLUMN not_before REAL;
ALTER TABLE tasks ADD COLUMN plan_sha256 TEXT;

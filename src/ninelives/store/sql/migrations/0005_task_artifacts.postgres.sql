-- The folder a task publishes its artifacts to, absolute, recorded at create so
-- that every later run (library, command, worker) publishes to the same place
-- whatever its working directory or AGENT_ARTIFACTS. NULL (tasks written by
-- older versions): the runner's settings decide, as before.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS artifacts TEXT;

-- Fencing and leases: every claim increments lease_epoch, and every write a
-- runner makes is conditional on the epoch it claimed.
ALTER TABLE tasks ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN lease_owner TEXT;
ALTER TABLE tasks ADD COLUMN lease_expires_at REAL;
ALTER TABLE tasks ADD COLUMN queue TEXT;
CREATE INDEX IF NOT EXISTS events_task_seq ON events (task_id, seq);

-- Fencing and leases: every claim increments lease_epoch, and every write a
-- runner makes is conditional on the epoch it claimed. lease_expires_at is
-- on the database's clock (ninelives_now()).
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_owner TEXT;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS lease_expires_at DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS queue TEXT;
CREATE INDEX IF NOT EXISTS events_task_seq ON events (task_id, seq);

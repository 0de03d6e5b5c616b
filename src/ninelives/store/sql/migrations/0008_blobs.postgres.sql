-- Large step outputs out of the row (ninelives.blobs): a content-addressed blob
-- store. A row of steps.output over NINELIVES_BLOB_THRESHOLD holds a reference
-- {"$blob": {"sha256", "size"}}; the bytes are here, committed before it.
-- blobs        one row per stored blob; created_at is refreshed when a writer
--              finds its content already stored, so a sweep of unreferenced
--              blobs spares one whose reference is about to be committed.
-- blob_chunks  the bytes, CHUNK (1 MiB) per row in order of n: no value
--              larger than a chunk is ever held in memory, on either side.
CREATE TABLE IF NOT EXISTS blobs (
    sha256 TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS blob_chunks (
    sha256 TEXT NOT NULL,
    n INTEGER NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (sha256, n)
);

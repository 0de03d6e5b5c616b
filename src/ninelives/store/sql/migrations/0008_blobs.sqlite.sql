-- Large step outputs out of the row (ninelives.blobs). On SQLite the blobs are
-- files in <database>.blobs/ named by their SHA-256, written (fsynced, linked,
-- folder fsynced) before the done commit whose steps.output refers to them;
-- no table is needed. This migration only moves the schema version, so that
-- an older ninelives, which would show a reference as the output, refuses the
-- file instead.
SELECT 1;

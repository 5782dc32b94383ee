-- When a finished job's workspace and log went up to the archive (`cordon serve
-- --archive`): from then on every process serves its files from there.
ALTER TABLE jobs ADD COLUMN archived_ms BIGINT;
-- What each worker still has to send up: kept small (only those rows), as
-- the worker looks every 30 seconds.
CREATE INDEX jobs_to_archive ON jobs (worker, finished_ms)
    WHERE archived_ms IS NULL AND workspace_removed_ms IS NULL AND finished_ms IS NOT NULL;

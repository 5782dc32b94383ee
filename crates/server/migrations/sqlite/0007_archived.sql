-- When a finished job's workspace and log went up to the archive (`cordon serve
-- --archive`): from then on every process serves its files from there.
ALTER TABLE jobs ADD COLUMN archived_ms BIGINT;

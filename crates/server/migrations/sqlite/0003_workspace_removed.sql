-- When a finished job's workspace was removed (`cordon serve --keep-workspaces`);
-- its events, output and result stay.
ALTER TABLE jobs ADD COLUMN workspace_removed_ms BIGINT;

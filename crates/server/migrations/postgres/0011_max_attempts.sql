-- The most times a job may be started, as the worker that claimed it was
-- configured: whichever process settles the job after its lease lapsed
-- (an API process with settings of its own, say) keeps to it. NULL for a
-- run claimed before this column: 1, the default.
ALTER TABLE jobs ADD COLUMN max_attempts BIGINT;

-- Leases: the worker running a job holds it until lease_until_ms (the
-- database's clock) and extends it while it runs; a lapsed lease lets any
-- process settle the job (queue it again or fail it). cancel_requested
-- carries a cancel to the worker that runs it.
ALTER TABLE jobs ADD COLUMN worker TEXT;
ALTER TABLE jobs ADD COLUMN lease_until_ms BIGINT;
ALTER TABLE jobs ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cancel_requested BIGINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_worker ON jobs (worker, state);

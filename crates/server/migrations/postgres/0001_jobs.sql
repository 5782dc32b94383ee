-- Jobs, their events, and the tokens of tenants.
CREATE TABLE jobs (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    started_ms BIGINT,
    finished_ms BIGINT,
    exit_code BIGINT,
    error TEXT,
    stdout TEXT NOT NULL DEFAULT '',
    stderr TEXT NOT NULL DEFAULT '',
    stdout_truncated BIGINT NOT NULL DEFAULT 0,
    stderr_truncated BIGINT NOT NULL DEFAULT 0,
    result TEXT
);
CREATE INDEX jobs_by_state ON jobs (state, seq);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);

CREATE TABLE job_events (
    job_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    ts_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);

CREATE TABLE tokens (
    hash TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);

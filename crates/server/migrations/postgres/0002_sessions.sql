-- Conversations with the agent over HTTP; their messages live in each
-- session's log file beside its workspace.
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL
);
CREATE INDEX sessions_by_tenant ON sessions (tenant, created_ms);

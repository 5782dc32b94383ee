-- Sandboxes made through the sandbox API: one record each, a tenant's own.
-- The sandbox itself lives in the API process that made it, its
-- workspace under that process's data directory. `request` is the JSON it
-- was made with (limits and network checked, the image named); `metadata`
-- a JSON object of strings the tenant filters its list by. `ended_ms` is
-- set when it ended (killed, timed out, the process stopped) and why in
-- `end_reason`.
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    ended_ms BIGINT,
    end_reason TEXT,
    request TEXT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, created_ms);

-- A tenant's logins for git hosts and their forges' APIs: what a job
-- with `repo` clones, pushes and opens pull requests with, on the worker,
-- never in the sandbox. One per tenant and host (`host` or `host:port`).
CREATE TABLE git_credentials (
    tenant TEXT NOT NULL,
    host TEXT NOT NULL,
    username TEXT NOT NULL,
    secret TEXT NOT NULL,
    forge TEXT,
    forge_api TEXT,
    author_name TEXT,
    author_email TEXT,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, host)
);

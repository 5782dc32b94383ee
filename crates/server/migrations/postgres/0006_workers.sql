-- Where each worker takes relayed requests (its --advertise URL): an API
-- process sends a job's files, live view and Lab requests to the worker
-- that runs it.
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    advertised_ms BIGINT NOT NULL
);

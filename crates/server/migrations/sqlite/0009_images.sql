-- A tenant's own images: pulled, built or snapshotted through the API.
-- The blobs are in the image store of the process that made the image;
-- this is what the tenant sees and names, and what garbage collection
-- keeps. `origin` is JSON: {"pulled": REF}, {"built": JOB}, {"snapshot": SESSION}.
CREATE TABLE images (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    digest TEXT NOT NULL,
    size BIGINT NOT NULL,
    origin TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE INDEX images_digest ON images (digest);

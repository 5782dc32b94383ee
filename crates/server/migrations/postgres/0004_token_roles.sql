-- A token may be the operator's: it manages tokens over the API, too.
ALTER TABLE tokens ADD COLUMN operator BIGINT NOT NULL DEFAULT 0;

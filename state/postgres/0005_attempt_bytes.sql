-- What each request carried, for policies counted in content-bytes: bytes
-- is the request body's length (known before sending), and cbytes the
-- bytes the key's log has carried up to and including this admission, in
-- the order of seq. The bytes a window holds are then the difference of
-- two running sums, each found by one index seek, however many attempts
-- it holds; and the admission by which a window has carried n bytes is
-- one seek along cbytes.
ALTER TABLE attempts ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN cbytes BIGINT; -- NULL unless counted

UPDATE attempts SET cbytes = 0 WHERE counted = 1;

CREATE INDEX attempts_bytes ON attempts(key, cbytes, seq) WHERE counted = 1;

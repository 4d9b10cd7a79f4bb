-- What each request carried, for policies counted in content-bytes: bytes
-- is the request body's length (known before sending), and cbytes the
-- bytes the key's log has carried up to and including this admission, in
-- the order of seq. The bytes a window holds are then the difference of
-- two running sums, each found by one index seek, however many attempts
-- it holds; and the admission by which a window has carried n bytes is
-- one seek along cbytes.
ALTER TABLE attempts ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN cbytes INTEGER; -- NULL unless counted

UPDATE attempts SET cbytes = 0 WHERE counted = 1;

CREATE INDEX attempts_bytes ON attempts(key, cbytes, seq) WHERE counted = 1;

-- An admission recorded without a running sum (by a process of an
-- earlier version sharing the file) carried no bytes that it knew of: it
-- continues the key's latest sum.
CREATE TRIGGER attempts_bytes_sum AFTER INSERT ON attempts
WHEN NEW.cbytes IS NULL AND NEW.counted = 1
BEGIN
	UPDATE attempts SET cbytes = NEW.bytes + coalesce(
		(SELECT cbytes FROM attempts WHERE key = NEW.key AND counted = 1 AND cbytes IS NOT NULL AND id != NEW.id
		ORDER BY at DESC, seq DESC LIMIT 1), 0)
	WHERE id = NEW.id;
END;

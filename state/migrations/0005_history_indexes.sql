-- Costs that grow with what they touch, not with history.
--
-- The activity pages newest first by (at, id), of one key or of all, and
-- the retention sweep deletes the oldest first: both walk an index from
-- one end and stop after a page or a batch.
CREATE INDEX attempts_key_at ON attempts(key, at, id);
CREATE INDEX attempts_at ON attempts(at, id);
CREATE INDEX observations_received ON observations(received_at);
CREATE INDEX warnings_at ON warnings(at);

-- The sliding-window log numbered per caller too: cseq runs 1, 2, … per
-- key and caller in the order of (at, id), so a reserving caller's count
-- in a window is a difference of two numbers, each found by one index
-- seek, however many calls the window holds. NULL for slots reserved by
-- a lease (caller '' until they are handed out): they count in the key's
-- log, not in a caller's.
ALTER TABLE attempts ADD COLUMN cseq INTEGER;

UPDATE attempts SET cseq = o.n
FROM (SELECT id, row_number() OVER (PARTITION BY key, caller ORDER BY at, id) AS n
	FROM attempts WHERE counted = 1 AND caller != '') AS o
WHERE attempts.id = o.id;

CREATE INDEX attempts_caller_log ON attempts(key, caller, at, cseq) WHERE counted = 1;

-- An admission recorded without a caller's number (by a process of an
-- earlier version sharing the file) is numbered after the caller's latest.
CREATE TRIGGER attempts_caller_number AFTER INSERT ON attempts
WHEN NEW.cseq IS NULL AND NEW.counted = 1 AND NEW.caller != ''
BEGIN
	UPDATE attempts SET cseq = coalesce(
		(SELECT cseq FROM attempts WHERE key = NEW.key AND caller = NEW.caller AND counted = 1 AND cseq IS NOT NULL
		ORDER BY at DESC, cseq DESC LIMIT 1), 0) + 1
	WHERE id = NEW.id;
END;

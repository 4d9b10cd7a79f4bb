-- The sliding-window log numbered: every admitted attempt of a key gets
-- seq 1, 2, … in the order of (at, id), without gaps. The attempts a
-- window holds are then a run of numbers, counted from the first and the
-- key's last, each found by one index seek, however many there are.
ALTER TABLE attempts ADD COLUMN seq INTEGER; -- NULL unless counted

UPDATE attempts SET seq = o.n
FROM (SELECT id, row_number() OVER (PARTITION BY key ORDER BY at, id) AS n FROM attempts WHERE counted = 1) AS o
WHERE attempts.id = o.id;

-- The log's index carries the numbers: reading a window never visits the
-- table.
DROP INDEX attempts_sent;
CREATE INDEX attempts_sent ON attempts(key, at, seq) WHERE counted = 1;

-- An admission recorded without a number (by a process of an earlier
-- version sharing the file) is numbered after the key's latest: such
-- processes record admissions in order of time, under the write lock.
CREATE TRIGGER attempts_number AFTER INSERT ON attempts
WHEN NEW.seq IS NULL AND NEW.counted = 1
BEGIN
	UPDATE attempts SET seq = coalesce(
		(SELECT seq FROM attempts WHERE key = NEW.key AND counted = 1 AND seq IS NOT NULL ORDER BY at DESC, seq DESC LIMIT 1), 0) + 1
	WHERE id = NEW.id;
END;

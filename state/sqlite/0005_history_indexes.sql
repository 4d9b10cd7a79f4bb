-- Costs that grow with what they touch, not with history.
--
-- The activity pages newest first by (at, id), of one key or of all, and
-- the retention sweep deletes the oldest first: both walk an index from
-- one end and stop after a page or a batch.
CREATE INDEX attempts_key_at ON attempts(key, at, id);
CREATE INDEX attempts_at ON attempts(at, id);
CREATE INDEX observations_received ON observations(received_at);
CREATE INDEX warnings_at ON warnings(at);

-- The sliding-window log numbered per caller too, for keys whose callers
-- have reservations (the admission says so): cseq runs 1, 2, … per key and
-- caller in the order of (at, id), so a reserving caller's count in a
-- window is a difference of two numbers, each found by one index seek,
-- however many calls the window holds. NULL otherwise, and then in no
-- index: keys without reservations pay nothing for it.
ALTER TABLE attempts ADD COLUMN cseq INTEGER;
CREATE INDEX attempts_caller_log ON attempts(key, caller, at, cseq) WHERE cseq IS NOT NULL;

-- attempts_key_at serves what attempts_key_id served (a key's slots are
-- found by their IDs, on the table itself).
DROP INDEX attempts_key_id;

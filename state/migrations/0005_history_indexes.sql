-- Costs that grow with what they touch, not with history.
--
-- The activity pages newest first by (at, id), of one key or of all, and
-- the retention sweep deletes the oldest first: both walk an index from
-- one end and stop after a page or a batch.
CREATE INDEX attempts_key_at ON attempts(key, at, id);
CREATE INDEX attempts_at ON attempts(at, id);
CREATE INDEX observations_received ON observations(received_at);
CREATE INDEX warnings_at ON warnings(at);

-- How long after its admission a send of a key may still reach the
-- upstream: the longest admission-to-answer latency answered in the
-- current period (from latency_since) and in the one before it. The
-- pacer keeps a send in the sliding-window log that much longer (within
-- bounds), so that a call admitted the moment a slot frees never reaches
-- the upstream before the send whose slot it takes has left the
-- upstream's own window, which counts from receipt.
ALTER TABLE key_state ADD COLUMN latency_us      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE key_state ADD COLUMN prev_latency_us INTEGER NOT NULL DEFAULT 0;
ALTER TABLE key_state ADD COLUMN latency_since   INTEGER NOT NULL DEFAULT 0;

-- Calls in flight with their admission times, read from the index alone:
-- a send still unanswered counts in the log as long as it is in flight.
DROP INDEX attempts_in_flight;
CREATE INDEX attempts_in_flight ON attempts(key, lease_until, at) WHERE lease_until IS NOT NULL;

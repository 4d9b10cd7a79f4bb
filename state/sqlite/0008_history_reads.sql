-- What the dashboard reads of one key, at a cost that does not grow with
-- the key's history: its timeline by send time, one call's attempts, and
-- the observations of one attempt. (A call's ID is never empty; a lease's
-- slots, which have none until reported, stay out of attempts_call and
-- are found by their IDs.)
CREATE INDEX attempts_call ON attempts(key, call_id) WHERE call_id != '';
CREATE INDEX attempts_sent_time ON attempts(key, coalesce(nullif(sent_at, 0), at));
CREATE INDEX observations_attempt ON observations(key, attempt_id);

-- A lease's slot enters fewer indexes of attempts, as on SQLite (its
-- migration 0015 says why): attempts_sent_time holds no reserved slot,
-- which the timeline never counts, and attempts_bytes only the
-- admissions that carried bytes, the only ones the seek along the
-- running sum can find.
DROP INDEX attempts_sent_time;
CREATE INDEX attempts_sent_time ON attempts(key, (coalesce(nullif(sent_at, 0), at))) WHERE state != 'reserved';
DROP INDEX attempts_bytes;
CREATE INDEX attempts_bytes ON attempts(key, cbytes, seq) WHERE counted AND bytes > 0;

-- Flags become booleans: until now they were the 0 and 1 of SQLite's
-- tables. Times stay microseconds since the Unix epoch (BIGINT), and
-- durations microseconds (the columns named *_us): the statements count
-- the window's log by ranges and differences of them (see
-- docs/ARCHITECTURE.md, "Each back end's SQL and schema").
--
-- A partial index on a flag names it in its predicate: those on counted
-- are made again on the boolean.
DROP INDEX attempts_sent;
DROP INDEX attempts_bytes;

ALTER TABLE attempts
	ALTER COLUMN probe DROP DEFAULT,
	ALTER COLUMN probe TYPE BOOLEAN USING probe <> 0,
	ALTER COLUMN probe SET DEFAULT false,
	ALTER COLUMN counted DROP DEFAULT,
	ALTER COLUMN counted TYPE BOOLEAN USING counted <> 0,
	ALTER COLUMN counted SET DEFAULT false;

CREATE INDEX attempts_sent ON attempts(key, at, seq) WHERE counted;
CREATE INDEX attempts_bytes ON attempts(key, cbytes, seq) WHERE counted;

ALTER TABLE observations
	ALTER COLUMN guessed DROP DEFAULT,
	ALTER COLUMN guessed TYPE BOOLEAN USING guessed <> 0,
	ALTER COLUMN guessed SET DEFAULT false,
	ALTER COLUMN from_cache DROP DEFAULT,
	ALTER COLUMN from_cache TYPE BOOLEAN USING from_cache <> 0,
	ALTER COLUMN from_cache SET DEFAULT false;

ALTER TABLE policies
	ALTER COLUMN hidden DROP DEFAULT,
	ALTER COLUMN hidden TYPE BOOLEAN USING hidden <> 0,
	ALTER COLUMN hidden SET DEFAULT false;

ALTER TABLE key_state
	ALTER COLUMN half_open DROP DEFAULT,
	ALTER COLUMN half_open TYPE BOOLEAN USING half_open <> 0,
	ALTER COLUMN half_open SET DEFAULT false;

ALTER TABLE path_failures
	ALTER COLUMN half_open TYPE BOOLEAN USING half_open <> 0;

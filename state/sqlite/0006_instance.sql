-- The process that recorded each attempt (host and process ID): with
-- many hosts on one PostgreSQL database the activity says which host
-- admitted a call; on one SQLite file, which process.
ALTER TABLE attempts ADD COLUMN instance TEXT NOT NULL DEFAULT '';

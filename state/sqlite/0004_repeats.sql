-- The loop guard counts one caller's identical requests (same method,
-- target and body) in the last minutes: read from an index, however long
-- the key's log.
CREATE INDEX attempts_repeats ON attempts(key, caller, digest, at) WHERE digest != '';

-- A lease's slot, reserved at the grant and finished by the journal's
-- applier, enters fewer indexes of attempts. Every leased call and every
-- admission of a request without a body wrote an entry in two indexes
-- that no statement reads them by:
--
-- attempts_sent_time serves only the dashboard's timeline, which never
-- counts a reserved slot: it now holds no row until the slot's call is
-- reported (or released), so the grant writes no entry and the finish
-- adds one instead of moving it.
--
-- attempts_bytes serves only the seek for the admission by which a
-- window has carried n bytes (n at least 1): that admission carried
-- bytes, since the running sum grows only at such admissions, so the
-- index holds those alone.
DROP INDEX attempts_sent_time;
CREATE INDEX attempts_sent_time ON attempts(key, coalesce(nullif(sent_at, 0), at)) WHERE state != 'reserved';
DROP INDEX attempts_bytes;
CREATE INDEX attempts_bytes ON attempts(key, cbytes, seq) WHERE counted = 1 AND bytes > 0;

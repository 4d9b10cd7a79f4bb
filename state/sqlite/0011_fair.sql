-- Fair shares. An admission of a key with shares is numbered in its
-- principal's own log too: pseq runs 1, 2, … per key and principal, so
-- what a principal spent of a window is two index seeks, however many
-- calls the window holds.
ALTER TABLE attempts ADD COLUMN principal TEXT;  -- NULL unless numbered
ALTER TABLE attempts ADD COLUMN pseq INTEGER;
CREATE INDEX attempts_principal_log ON attempts(key, principal, at, pseq) WHERE pseq IS NOT NULL;

-- The principals with calls waiting for a key: one row per principal and
-- process (waiter: a name its pacer draws), renewed while its calls
-- wait, lasting a moment past the last one's admission, and forgotten
-- once it ran out (by the next wait on the key, or a sweep). A key
-- holds at most one row per principal and live process.
CREATE TABLE waiters (
	key       TEXT    NOT NULL,
	principal TEXT    NOT NULL,
	waiter    TEXT    NOT NULL,
	since     INTEGER NOT NULL,              -- microseconds
	until     INTEGER NOT NULL,              -- microseconds: it waits no longer unless renewed
	PRIMARY KEY (key, principal, waiter)
);
CREATE INDEX waiters_until ON waiters(key, until);

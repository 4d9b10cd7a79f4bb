-- Every attempt to reach an upstream, and every call refused before one.
-- Times are microseconds since the Unix epoch.
CREATE TABLE attempts (
	id          INTEGER PRIMARY KEY,
	call_id     TEXT    NOT NULL,
	attempt     INTEGER NOT NULL,          -- 1, 2, … per call; 0 for a call refused locally
	key         TEXT    NOT NULL,
	caller      TEXT    NOT NULL,
	transport   TEXT    NOT NULL,          -- stdio, mcp-http, rest
	method      TEXT    NOT NULL,
	target      TEXT    NOT NULL,          -- path and query below the key's base URL, credential-free
	digest      TEXT    NOT NULL DEFAULT '', -- hash of method, target and body, for the loop guard
	state       TEXT    NOT NULL,          -- admitted, confirmed, accepted, rejected_upstream, failed, rejected_local, cached, interrupted
	reason      TEXT    NOT NULL DEFAULT '',
	probe       INTEGER NOT NULL DEFAULT 0,
	counted     INTEGER NOT NULL DEFAULT 0, -- 1 when it counts against the budget (it was admitted)
	at          INTEGER NOT NULL,          -- admitted (or refused) at
	wait_us     INTEGER NOT NULL DEFAULT 0, -- time spent waiting for admission
	sent_at     INTEGER,
	answered_at INTEGER,
	status      INTEGER,
	lease_until INTEGER                    -- in flight until; NULL once finished
);
-- The sliding-window log: every admitted attempt of a key, by time.
CREATE INDEX attempts_sent ON attempts(key, at) WHERE counted = 1;
CREATE INDEX attempts_in_flight ON attempts(key, lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX attempts_key_id ON attempts(key, id);

-- Every rate-limit statement an upstream made, with its full context.
CREATE TABLE observations (
	id          INTEGER PRIMARY KEY,
	key         TEXT    NOT NULL,
	attempt_id  INTEGER,
	policy      TEXT    NOT NULL,
	unit        TEXT    NOT NULL,
	partition   TEXT    NOT NULL,
	q           INTEGER,                   -- NULL when not stated
	w_us        INTEGER,
	r           INTEGER,
	t_us        INTEGER,
	status      INTEGER NOT NULL,
	received_at INTEGER NOT NULL,
	server_date INTEGER,
	shape       TEXT    NOT NULL,
	profile     TEXT    NOT NULL,
	guessed     INTEGER NOT NULL DEFAULT 0,
	from_cache  INTEGER NOT NULL DEFAULT 0,
	method      TEXT    NOT NULL,
	target      TEXT    NOT NULL
);
CREATE INDEX observations_key_id ON observations(key, id);

-- Every policy ever seen for a key, with the latest fresh observation of it.
CREATE TABLE policies (
	key         TEXT    NOT NULL,
	policy      TEXT    NOT NULL,
	unit        TEXT    NOT NULL,
	partition   TEXT    NOT NULL,
	q           INTEGER,
	w_us        INTEGER,
	r           INTEGER,
	t_us        INTEGER,
	received_at INTEGER NOT NULL,          -- of the latest observation
	basis_at    INTEGER NOT NULL,          -- when the observing request was sent: later sends are subtracted from r
	source      TEXT    NOT NULL,
	hidden      INTEGER NOT NULL DEFAULT 0, -- a limit nobody announced, inferred from a refusal
	route       TEXT    NOT NULL DEFAULT '',
	PRIMARY KEY (key, policy, unit, partition)
);

-- Times before which nothing is sent: Retry-After, backoff, open circuit, abnormal usage.
CREATE TABLE gates (
	key     TEXT    NOT NULL,
	scope   TEXT    NOT NULL,              -- '' for the whole key, else a policy name
	until   INTEGER NOT NULL,
	reason  TEXT    NOT NULL,
	source  TEXT    NOT NULL,
	set_at  INTEGER NOT NULL,
	PRIMARY KEY (key, scope)
);

-- Pacing state of a key shared by every process.
CREATE TABLE key_state (
	key              TEXT PRIMARY KEY,
	last_admit_at    INTEGER NOT NULL DEFAULT 0,
	interval_us      INTEGER NOT NULL DEFAULT 0, -- slow-start spacing between admissions
	last_response_at INTEGER NOT NULL DEFAULT 0,
	failures         INTEGER NOT NULL DEFAULT 0, -- consecutive 429/5xx without guidance
	opens            INTEGER NOT NULL DEFAULT 0, -- times the circuit opened in a row
	half_open        INTEGER NOT NULL DEFAULT 0, -- the next call is a probe
	probe_attempt    INTEGER NOT NULL DEFAULT 0,
	probe_until      INTEGER NOT NULL DEFAULT 0
);

-- Warnings an agent should see: hidden limit discovered, abnormal usage, circuit open.
CREATE TABLE warnings (
	id      INTEGER PRIMARY KEY,
	key     TEXT    NOT NULL,
	at      INTEGER NOT NULL,
	kind    TEXT    NOT NULL,
	message TEXT    NOT NULL
);
CREATE INDEX warnings_key_id ON warnings(key, id);

-- The last answer per key and URL, for conditional requests and the loop guard.
CREATE TABLE responses (
	key           TEXT    NOT NULL,
	target        TEXT    NOT NULL,
	etag          TEXT    NOT NULL DEFAULT '',
	last_modified TEXT    NOT NULL DEFAULT '',
	status        INTEGER NOT NULL,
	content_type  TEXT    NOT NULL DEFAULT '',
	body          BLOB    NOT NULL,
	digest        TEXT    NOT NULL,
	stored_at     INTEGER NOT NULL,
	unchanged     INTEGER NOT NULL DEFAULT 0, -- answers in a row equal to the one before
	PRIMARY KEY (key, target)
);

-- Callers with a reservation that are waiting for admission: their share is
-- not lent to others while they wait.
CREATE TABLE claims (
	key    TEXT    NOT NULL,
	caller TEXT    NOT NULL,
	until  INTEGER NOT NULL,
	PRIMARY KEY (key, caller)
);

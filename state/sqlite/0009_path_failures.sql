-- The failures of one route of a key that said nothing of rate limits
-- (a 5xx without a signal): the backoff and circuit of that route alone.
-- Rows are forgotten once their route has not failed for a while.
CREATE TABLE path_failures (
	key       TEXT    NOT NULL,
	scope     TEXT    NOT NULL,              -- the route: 'route ' || method || ' ' || path
	failures  INTEGER NOT NULL,
	opens     INTEGER NOT NULL,
	half_open INTEGER NOT NULL,
	last_at   INTEGER NOT NULL,              -- its latest failure (microseconds)
	PRIMARY KEY (key, scope)
);
CREATE INDEX path_failures_last ON path_failures(key, last_at);

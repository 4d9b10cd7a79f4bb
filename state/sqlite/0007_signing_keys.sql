-- Keys the processes sharing the file sign with, by name: what one
-- process gives out another checks (MCP session IDs). Not credentials:
-- every request still carries its caller's token.
CREATE TABLE signing_keys (
	name  TEXT PRIMARY KEY,
	value BLOB NOT NULL
);

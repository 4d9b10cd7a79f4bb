package state_test

import (
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/state"
)

// A state location is read as PostgreSQL's in both of its forms, a
// password in either is found, and the redacted form holds none.
func TestLocation(t *testing.T) {
	const pw = "hunter2-Pa55"
	for _, tt := range []struct {
		location       string
		postgres, pass bool
		shown          string // Redact's result; "" means only "holds no password"
	}{
		{"/var/lib/mcp-quota/state.db", false, false, "/var/lib/mcp-quota/state.db"},
		{"state.db", false, false, "state.db"},
		{"./a=b.db", false, false, "./a=b.db"},
		{`C:\state\state.db`, false, false, `C:\state\state.db`},
		{"postgres://mq@db.example:5432/mq?sslmode=require", true, false, "postgres://mq@db.example:5432/mq?sslmode=require"},
		{"postgresql://mq:" + pw + "@db.example/mq", true, true, "postgresql://mq:xxxxx@db.example/mq"},
		{"postgres://mq@db.example/mq?password=" + pw, true, true, ""},
		{"postgres://mq:" + pw + "@db.example:x/mq", true, true, "(a URL)"},
		{"host=127.0.0.1 port=15432 user=mq dbname=mq", true, false, "host=127.0.0.1 port=15432 user=mq dbname=mq"},
		{"host=127.0.0.1 port=15432 user=mq password=" + pw + " dbname=mq", true, true, "host=127.0.0.1 port=15432 user=mq password=xxxxx dbname=mq"},
		{"host = 127.0.0.1 password = '" + pw + " with \\' quote' dbname=mq", true, true, "host=127.0.0.1 password=xxxxx dbname=mq"},
		{"  password=" + pw, true, true, "password=xxxxx"},
		{"host=h password='" + pw, true, true, "(a PostgreSQL connection string)"},
		{"host=h nonsense=" + pw, true, false, "(a PostgreSQL connection string)"},
		{"s3://bucket/" + pw, false, false, ""},
	} {
		if got := state.IsPostgres(tt.location); got != tt.postgres {
			t.Errorf("IsPostgres(%q) = %v, want %v", tt.location, got, tt.postgres)
		}
		if got := state.HasPassword(tt.location); got != tt.pass {
			t.Errorf("HasPassword(%q) = %v, want %v", tt.location, got, tt.pass)
		}
		got := state.Redact(tt.location)
		if tt.shown != "" && got != tt.shown {
			t.Errorf("Redact(%q) = %q, want %q", tt.location, got, tt.shown)
		}
		if tt.pass && strings.Contains(got, pw) {
			t.Errorf("Redact(%q) = %q: the password is in it", tt.location, got)
		}
	}
}

package rest_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestHealthNamesTheDatabase: /healthz on a PostgreSQL state that does
// not answer speaks of the state database, not of a file, and says the
// reason once.
func TestHealthNamesTheDatabase(t *testing.T) {
	addr := closedPort(t)
	pg, err := state.OpenPostgres(context.Background(), "postgres://mq@"+addr+"/mq?sslmode=disable",
		state.PostgresOptions{WaitForServer: true, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rec := httptest.NewRecorder()
	rest.Health(pg, "v1").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, "The state database cannot be used") || strings.Contains(body, "state file") {
		t.Errorf("/healthz: %d %s; want 503 about the state database, not a file", rec.Code, body)
	}
	if n := strings.Count(body, addr); n != 1 {
		t.Errorf("/healthz names %s %d times: %s; want once", addr, n, body)
	}
}

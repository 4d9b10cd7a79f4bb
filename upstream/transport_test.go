package upstream

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestKeysShareConnections: calls through 100 keys of one API, one after
// another, reuse one connection instead of opening one per key.
func TestKeysShareConnections(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("{}"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	var cfg testkit.Config
	for i := range 100 {
		cfg.Keys = append(cfg.Keys, testkit.Key{Name: fmt.Sprintf("k%d", i), BaseURL: srv.URL, SecretEnv: "S", MaxRate: 1000})
	}
	keys, err := keystore.Parse([]byte(cfg.TOML()), keystore.Env{Getenv: func(string) string { return secret }})
	if err != nil {
		t.Fatal(err)
	}
	db := testkit.OpenState(t, state.Open)
	c := New(pacer.New(db), nil)
	for _, k := range keys.Keys() {
		resp, err := c.Do(t.Context(), k, Request{Caller: "sync", Transport: "rest", Path: "/x"})
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// A connection goes back to the pool in the transport's own goroutine
	// once its body is read, so on a busy machine the next call may find
	// none idle yet and open another; one pool per key would open 100.
	if n := conns.Load(); n > 10 {
		t.Errorf("100 keys of one API opened %d connections, want about 1 (10 at most)", n)
	}
}

package metrics_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"path/filepath"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/metrics"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Metrics hang off the upstream client's one observation seam; the
// handler goes behind the gateway, which puts the scraping caller in the
// request's context.
func Example() {
	db, err := state.Open(context.Background(), filepath.Join(os.TempDir(), "mcp-quota-example.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	keys := &keystore.Store{}
	p := pacer.New(db)
	client := upstream.New(p, nil)

	m := metrics.New(keys, p, db)
	client.Observe = m.Observe // every call through client is counted from here on
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m)
	_ = mux // gateway.Config{Metrics: m, …} in mcp-quota serve
}

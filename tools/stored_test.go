package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// viewCounter is a store that counts its read transactions.
type viewCounter struct {
	ledger.Store
	views atomic.Int64
}

func (v *viewCounter) View(ctx context.Context, fn func(ledger.ReadTx) error) error {
	v.views.Add(1)
	return v.Store.View(ctx, fn)
}

// KeepLater keeps through the store's journal, as the fetch tool does on
// the store itself.
func (v *viewCounter) KeepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func([]string)) error {
	return v.Store.(laterKeeper).KeepLater(ctx, r, keep, listed)
}

// storingProcess is the fetch tool of one process on a shared state file.
type storingProcess struct {
	s     *server.MCPServer
	store *viewCounter
	ctx   context.Context
}

func newStoringProcess(t *testing.T, keys *keystore.Store, path string) *storingProcess {
	t.Helper()
	db, err := state.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p := pacer.New(db)
	t.Cleanup(func() { p.Close(context.Background()) })
	store := &viewCounter{Store: db}
	d := &Deps{Keys: keys, DB: store, Pacer: p, Client: upstream.New(p, slog.New(slog.DiscardHandler)), Transport: "mcp-http"}
	return &storingProcess{s: NewServer(d, "test"), store: store, ctx: keystore.WithCaller(context.Background(), keys.Callers()[0])}
}

// settle waits until what the process handed its journal is in the
// state file, as a read of the process does (another process reads it a
// moment later, once the journal's applier has run).
func (p *storingProcess) settle(t *testing.T) {
	t.Helper()
	if err := p.store.Store.View(p.ctx, func(ledger.ReadTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// fetch calls the fetch tool with args and returns its structured result.
func (p *storingProcess) fetch(t *testing.T, args map[string]any) map[string]any {
	t.Helper()
	params, _ := json.Marshal(map[string]any{"name": "fetch", "arguments": args})
	msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":%s}`, params)
	out, _ := json.Marshal(p.s.HandleMessage(p.ctx, []byte(msg)))
	var resp struct {
		Result struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
			Content           []mcp.TextContent
		}
		Error any
	}
	if err := json.Unmarshal(out, &resp); err != nil || resp.Error != nil || resp.Result.IsError {
		t.Fatalf("fetch %v: %s", args, out)
	}
	return resp.Result.StructuredContent
}

// apiKeys is one key, "api", without credentials, at baseURL, and one
// caller, "agent", who may use it.
func apiKeys(t *testing.T, baseURL string) *keystore.Store {
	t.Helper()
	return parseKeys(t, testkit.Config{
		Keys:    []testkit.Key{{Name: "api", BaseURL: baseURL, Auth: "none"}},
		Callers: []testkit.Caller{{Name: "agent", TokenEnv: "AGENT", Keys: []string{"api"}}},
	})
}

// TestFetchReadsNothingWhenNothingIsStored fetches, in two processes on one
// state file, targets with an ETag; each process keeps its answers
// through its journal. A target with no stored answer goes
// without a read of the state once the process knows the key's kept
// targets; a target another process kept since is known after this
// process next keeps an answer of the key (the request then goes
// conditional on that copy, and its 304 shows the copy's body), and a
// page beyond the first always reads the state.
func TestFetchReadsNothingWhenNothingIsStored(t *testing.T) {
	var mu sync.Mutex
	conditional := map[string]string{} // path → the If-None-Match it last came with
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conditional[r.URL.Path] = r.Header.Get("If-None-Match")
		mu.Unlock()
		tag := `"v-` + r.URL.Path + `"`
		w.Header().Set("ETag", tag)
		if r.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "body of %s, long enough to page through: %0100d", r.URL.Path, 0)
	}))
	t.Cleanup(up.Close)
	keys := apiKeys(t, up.URL)
	path := testkit.StateFile(t, state.Open)
	a, b := newStoringProcess(t, keys, path), newStoringProcess(t, keys, path)

	b.fetch(t, map[string]any{"path": "/first"}) // b reads the key's kept targets: none
	views := b.store.views.Load()
	b.fetch(t, map[string]any{"path": "/second"})
	if got := b.store.views.Load() - views; got != 0 {
		t.Errorf("a fetch of a target with nothing kept read the state %d times; want 0", got)
	}

	a.fetch(t, map[string]any{"path": "/shared"}) // kept by a; b does not know it yet
	a.settle(t)
	b.fetch(t, map[string]any{"path": "/third"}) // b keeps an answer: it reads the kept targets again…
	b.settle(t)                                  // …in the transaction that keeps it
	res := b.fetch(t, map[string]any{"path": "/shared"})
	mu.Lock()
	got := conditional["/shared"]
	mu.Unlock()
	if got != `"v-/shared"` {
		t.Errorf("b's fetch of the target a kept went with If-None-Match %q; want a's copy's tag", got)
	}
	if res["not_modified"] != true || res["body"] == "" {
		t.Errorf("b's fetch of the target a kept: not_modified %v, body %q; want the kept body", res["not_modified"], res["body"])
	}

	a.fetch(t, map[string]any{"path": "/paged"})
	a.settle(t)
	views = b.store.views.Load()
	page := b.fetch(t, map[string]any{"path": "/paged", "start_index": 10, "max_length": 20})
	if b.store.views.Load() == views || page["from_cache"] != true {
		t.Errorf("b's page of a copy a kept: from_cache %v, %d reads; want it read from the state", page["from_cache"], b.store.views.Load()-views)
	}
}

// A 304 that does not repeat the kept copy's ETag (RFC 9110 §15.4.5 asks
// a server to; some do not) leaves the copy its validator: the fetch after
// it is conditional too, and answered from the same body.
func TestNotModifiedWithoutETagKeepsTheValidator(t *testing.T) {
	up := newValidatorLog(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified) // without the ETag
			return
		}
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprint(w, "version one")
	})
	p := newStoringProcess(t, apiKeys(t, up.url), testkit.StateFile(t, state.Open))
	for i := range 3 {
		res := p.fetch(t, map[string]any{"path": "/doc"})
		p.settle(t)
		if res["body"] != "version one" || (i > 0) != (res["not_modified"] == true) {
			t.Errorf("fetch %d: body %q, not_modified %v; want the one version, from the kept copy after the first", i+1, res["body"], res["not_modified"])
		}
	}
	if got, want := up.sent(), []string{"", `"v1"`, `"v1"`}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("If-None-Match of the three requests: %q; want %q", got, want)
	}
}

// An answer with Vary: * is kept only as a stand-in no request may get:
// the fetch after it goes unconditionally and is not answered from it.
func TestVaryStarIsNeverReused(t *testing.T) {
	up := newValidatorLog(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Vary", "*")
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		fmt.Fprint(w, "varies with everything")
	})
	p := newStoringProcess(t, apiKeys(t, up.url), testkit.StateFile(t, state.Open))
	for i := range 2 {
		res := p.fetch(t, map[string]any{"path": "/doc"})
		p.settle(t)
		if res["body"] != "varies with everything" || res["not_modified"] == true || res["from_cache"] == true {
			t.Errorf("fetch %d: body %q, not_modified %v, from_cache %v; want the upstream's whole answer", i+1, res["body"], res["not_modified"], res["from_cache"])
		}
	}
	if got, want := up.sent(), []string{"", ""}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("If-None-Match of the two requests: %q; want %q", got, want)
	}
}

// validatorLog is an upstream on loopback that records the If-None-Match
// of each request, then answers it as answer does.
type validatorLog struct {
	url      string
	mu       sync.Mutex
	matching []string
}

func newValidatorLog(t *testing.T, answer http.HandlerFunc) *validatorLog {
	t.Helper()
	v := &validatorLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.mu.Lock()
		v.matching = append(v.matching, r.Header.Get("If-None-Match"))
		v.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	v.url = srv.URL
	return v
}

// sent returns the If-None-Match of each request so far, in order.
func (v *validatorLog) sent() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.matching)
}

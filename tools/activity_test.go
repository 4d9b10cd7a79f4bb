package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
)

// TestReadActivityNotFound reads quota://activity/{key} as two callers in
// both protocol eras: a caller's own key answers; an unknown key and
// another caller's key answer alike, with the revision's code for a
// missing resource (-32002 before 2026-07-28, -32602 from it on), never
// an internal error, naming the caller's own keys (the one it likely
// meant first) and never another caller's.
func TestReadActivityNotFound(t *testing.T) {
	keys := parseKeys(t, testkit.Config{Keys: []testkit.Key{openKey("mine"), openKey("theirs")},
		Callers: []testkit.Caller{{Name: "me", TokenEnv: "ME", Keys: []string{"mine"}}}})
	db := testkit.OpenState(t, state.Open)
	s := NewServer(&Deps{Keys: keys, DB: db, Pacer: pacer.New(db)}, "test")
	ctx := keystore.WithCaller(context.Background(), keys.Callers()[0])

	type rpcError struct {
		Code    int
		Message string
	}
	read := func(t *testing.T, modern bool, key string) (json.RawMessage, *rpcError) {
		t.Helper()
		meta := ""
		if modern {
			meta = `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
		}
		msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"quota://activity/%s"%s}}`, key, meta)
		b, err := json.Marshal(s.HandleMessage(ctx, json.RawMessage(msg)))
		if err != nil {
			t.Fatal(err)
		}
		var resp struct {
			Result json.RawMessage
			Error  *rpcError
		}
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Fatal(err)
		}
		return resp.Result, resp.Error
	}
	for _, era := range []struct {
		name   string
		modern bool
		code   int
	}{{"2025-11-25", false, mcp.RESOURCE_NOT_FOUND}, {"2026-07-28", true, mcp.INVALID_PARAMS}} {
		t.Run(era.name, func(t *testing.T) {
			res, rerr := read(t, era.modern, "mine")
			if rerr != nil || !strings.Contains(string(res), `"uri":"quota://activity/mine"`) {
				t.Fatalf("own key: result %s, error %+v; want its activity", res, rerr)
			}
			var said []string
			for _, key := range []string{"ghost", "theirs", ""} {
				_, rerr := read(t, era.modern, key)
				if rerr == nil {
					t.Fatalf("key %q: no error", key)
				}
				if rerr.Code != era.code {
					t.Errorf("key %q: code %d (%s), want %d", key, rerr.Code, rerr.Message, era.code)
				}
				said = append(said, strings.Replace(rerr.Message, "activity/"+key, "activity/KEY", 1))
			}
			if said[0] != said[1] {
				t.Errorf("an unknown key and another caller's key are told apart:\n%s\n%s", said[0], said[1])
			}
			if strings.Contains(said[1], "theirs") || strings.Contains(said[0], "theirs") {
				t.Errorf("the error names another caller's key: %q", said)
			}
			// What the caller can read instead: its own keys, and the one
			// a misspelling meant.
			if !strings.Contains(said[0], "no key of yours has this name. Your keys: mine; read quota://activity/KEY with one of them") {
				t.Errorf("an unknown key: %q; want the caller's own keys named", said[0])
			}
			_, rerr = read(t, era.modern, "mnie")
			if rerr == nil || rerr.Code != era.code || !strings.Contains(rerr.Message, "Did you mean quota://activity/mine?") ||
				strings.Contains(rerr.Message, "theirs") {
				t.Errorf("a misspelt key: %+v; want it to suggest quota://activity/mine, and name no other caller's key", rerr)
			}
		})
	}
}

// A caller with many keys is told of the first 20, and how many more.
func TestNoActivityNamesAtMostTwentyKeys(t *testing.T) {
	cfg := testkit.Config{Callers: []testkit.Caller{{Name: "many", TokenEnv: "T"}}}
	for i := range 25 {
		name := fmt.Sprintf("key%02d", i)
		cfg.Keys = append(cfg.Keys, openKey(name))
		cfg.Callers[0].Keys = append(cfg.Callers[0].Keys, name)
	}
	keys := parseKeys(t, cfg)
	d := &Deps{Keys: keys}
	many := d.noActivity(keystore.WithCaller(context.Background(), keys.Callers()[0]), "nope")
	if !strings.Contains(many, "key19 and 5 more (resources/list lists them all)") || strings.Contains(many, "key20") {
		t.Errorf("25 keys: %q; want the first 20 and 5 more", many)
	}
}

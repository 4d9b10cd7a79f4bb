package dashboard

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// signedIn reports whether the sign-in id is still kept.
func signedIn(s *sessions, id string) bool {
	r := httptest.NewRequest("GET", "/ui/api/overview", nil)
	r.Header.Set("Cookie", CookieName+"="+id)
	_, ok := s.find(r)
	return ok
}

// TestSignInsBoundedPerCaller: one caller signing in over and over (1,030
// times in a burst) keeps at most MaxSignInsPerCaller sign-ins, its
// newest, and signs no other caller out; when all sign-ins together reach
// their bound, the caller holding the most gives way.
func TestSignInsBoundedPerCaller(t *testing.T) {
	clk := testkit.NewClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	s := &sessions{clock: clk, m: map[[32]byte]*session{}}
	a, b := keystore.Local("a"), keystore.Local("b")
	var as []string
	for range 3 {
		id, _ := s.start(a)
		as = append(as, id)
		clk.Advance(time.Second)
	}
	var bs []string
	for range 1030 {
		id, _ := s.start(b)
		bs = append(bs, id)
		clk.Advance(time.Millisecond)
	}
	for i, id := range as {
		if !signedIn(s, id) {
			t.Errorf("a's sign-in %d is gone after b signed in 1,030 times", i)
		}
	}
	kept := 0
	for _, id := range bs {
		if signedIn(s, id) {
			kept++
		}
	}
	if kept != MaxSignInsPerCaller || !signedIn(s, bs[len(bs)-1]) || signedIn(s, bs[len(bs)-MaxSignInsPerCaller-1]) {
		t.Errorf("b keeps %d sign-ins; want its newest %d", kept, MaxSignInsPerCaller)
	}
	if n := len(s.m); n != 3+MaxSignInsPerCaller {
		t.Errorf("%d sign-ins kept, want %d", n, 3+MaxSignInsPerCaller)
	}

	// All sign-ins at their bound: many callers at theirs push out each
	// other's oldest, never a's three.
	s.most = 40
	for i := range 10 {
		c := keystore.Local(fmt.Sprint("c", i))
		for range MaxSignInsPerCaller {
			s.start(c)
			clk.Advance(time.Millisecond)
		}
	}
	if n := len(s.m); n > s.most {
		t.Errorf("%d sign-ins kept, past the bound of %d", n, s.most)
	}
	for i, id := range as {
		if !signedIn(s, id) {
			t.Errorf("a's sign-in %d is gone after other callers filled the bound", i)
		}
	}
}

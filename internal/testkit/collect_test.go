package testkit_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// A Buffer takes writes from several goroutines while it is read, and
// keeps every one whole.
func TestBuffer(t *testing.T) {
	var b testkit.Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("line\n", 400) {
		t.Fatalf("the buffer holds %d bytes, not 400 whole lines", len(got))
	}
}

// A List keeps every value added from several goroutines, and All is a
// copy: changing it leaves the list as it was.
func TestList(t *testing.T) {
	var l testkit.List[int]
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 100 {
				l.Add(g*100 + i)
				_ = l.All()
			}
		})
	}
	wg.Wait()
	all := l.All()
	if len(all) != 400 {
		t.Fatalf("the list holds %d values; want 400", len(all))
	}
	seen := map[int]bool{}
	for _, v := range all {
		seen[v] = true
	}
	if len(seen) != 400 {
		t.Fatalf("the list holds %d distinct values of 400", len(seen))
	}
	first := all[0]
	all[0] = -1
	if got := l.All(); got[0] != first {
		t.Fatalf("a change to what All returned changed the list: its first value is %d, was %d", got[0], first)
	}
}

package testkit_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// DamageWAL overwrites the page of the first frame and every nth after
// it, and nothing else: not the log's header, no frame's header, not the
// frames between.
func TestDamageWAL(t *testing.T) {
	const header, frameHeader, page, frames = 32, 24, 4096, 7
	path := filepath.Join(t.TempDir(), "state.db")
	log := bytes.Repeat([]byte{0xA5}, header+frames*(frameHeader+page)+100) // a torn frame at the end
	if err := os.WriteFile(path+"-wal", log, 0o600); err != nil {
		t.Fatal(err)
	}
	overwrote, got := testkit.DamageWAL(t, path, 3)
	if overwrote != 3 || got != frames {
		t.Fatalf("DamageWAL = %d of %d frames; want 3 of %d (frames 0, 3 and 6)", overwrote, got, frames)
	}
	after, err := os.ReadFile(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(log) {
		t.Fatalf("the log is %d bytes after; want %d", len(after), len(log))
	}
	for i := range after {
		frame, at := (i-header)/(frameHeader+page), (i-header)%(frameHeader+page)
		damaged := i >= header && frame < frames && frame%3 == 0 && at >= frameHeader
		if changed := after[i] != 0xA5; changed != damaged {
			t.Fatalf("byte %d (frame %d, offset %d) changed: %v; want %v", i, frame, at, changed, damaged)
		}
	}
}

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

package testkit_test

import (
	"bytes"
	"os"
	"path/filepath"
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

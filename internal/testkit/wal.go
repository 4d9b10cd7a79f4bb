package testkit

import (
	"os"
	"strings"
	"testing"
)

// DamageWAL overwrites the page of every nth frame of the write-ahead log
// of the SQLite file at path (the first frame, then every nth after it),
// in place, as a failing disk or a stray writer would, and returns how
// many frames it overwrote and how many the log holds. It fails t when
// the log holds no frame.
func DamageWAL(t testing.TB, path string, nth int) (overwrote, frames int) {
	t.Helper()
	if nth < 1 {
		t.Fatalf("DamageWAL: every %dth frame", nth)
	}
	const header, frameHeader, page = 32, 24, 4096
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	frames = int((fi.Size() - header) / (frameHeader + page))
	if fi.Size() < header || frames == 0 {
		t.Fatalf("the log holds no frame to damage (%d bytes)", fi.Size())
	}
	f, err := os.OpenFile(path+"-wal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	junk := []byte(strings.Repeat("damaged!", page/8))
	for frame := 0; frame < frames; frame += nth {
		if _, err := f.WriteAt(junk, int64(header+frame*(frameHeader+page)+frameHeader)); err != nil {
			t.Fatal(err)
		}
		overwrote++
	}
	return overwrote, frames
}

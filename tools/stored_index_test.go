package tools

import "testing"

// storedIndex.set: a set read in a later write transaction replaces the
// key's, an earlier or a first-fetch read does not replace a known one,
// and a target this process kept is known either way.
func TestStoredIndexSetKeepsTheLatestRead(t *testing.T) {
	var x storedIndex
	check := func(step string, kept, absent []string) {
		t.Helper()
		for _, target := range kept {
			if x.absent("k", target) {
				t.Errorf("%s: %s reads as absent, want kept", step, target)
			}
		}
		for _, target := range absent {
			if !x.absent("k", target) {
				t.Errorf("%s: %s reads as kept, want absent", step, target)
			}
		}
	}
	if x.loaded("k") || x.absent("k", "/a") {
		t.Fatal("a key never read is loaded, or one of its targets known absent")
	}
	x.set("k", []string{"/a", "/b"}, 0, "")
	check("read at the first fetch", []string{"/a", "/b"}, []string{"/c"})
	x.set("k", []string{"/z"}, 0, "")
	check("read again outside a write", []string{"/a", "/b"}, []string{"/z"})
	first, second := x.next(), x.next()
	x.set("k", []string{"/b", "/c"}, second, "")
	check("read in the later write", []string{"/b", "/c"}, []string{"/a"})
	x.set("k", []string{"/a"}, first, "/d")
	check("read in the earlier write, /d kept in it", []string{"/b", "/c", "/d"}, []string{"/a"})
	x.set("k", nil, x.next(), "")
	check("read empty in a still later write", nil, []string{"/a", "/b", "/c", "/d"})
	if !x.loaded("k") || x.loaded("other") {
		t.Error("loaded: want k alone")
	}
}

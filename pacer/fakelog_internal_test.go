package pacer

import (
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// sent is one admission in a fake log: when, by which principal, and the
// bytes it carried.
type sent struct {
	at    time.Time
	by    string
	bytes int64
}

// fakeLog is a key's sliding-window log as defined: its admissions, oldest
// first, read by scanning them. The rule tests read it at fixed instants,
// with no database.
type fakeLog []sent

func (l fakeLog) after(since time.Time) fakeLog {
	var out fakeLog
	for _, s := range l {
		if s.at.After(since) {
			out = append(out, s)
		}
	}
	return out
}

func (l fakeLog) Count(since time.Time) (int, error) { return len(l.after(since)), nil }

func (l fakeLog) Window(since time.Time) (ledger.Window, error) {
	in := l.after(since)
	if len(in) == 0 {
		return ledger.Window{}, nil
	}
	return ledger.Window{Count: len(in), Oldest: in[0].at}, nil
}

func (l fakeLog) Nth(since time.Time, n int) (time.Time, error) {
	if in := l.after(since); n >= 1 && n <= len(in) {
		return in[n-1].at, nil
	}
	return time.Time{}, nil
}

func (l fakeLog) Bytes(since time.Time) (int64, error) {
	var n int64
	for _, s := range l.after(since) {
		n += s.bytes
	}
	return n, nil
}

func (l fakeLog) NthByte(since time.Time, n int64) (time.Time, error) {
	var run int64
	for _, s := range l.after(since) {
		if run += s.bytes; run >= n && n >= 1 {
			return s.at, nil
		}
	}
	return time.Time{}, nil
}

func (l fakeLog) PrincipalWindow(since time.Time, principals []string) (map[string]ledger.Use, error) {
	out := map[string]ledger.Use{}
	for _, s := range l.after(since) {
		if slices.Contains(principals, s.by) {
			u := out[s.by]
			if u.Count == 0 {
				u.Oldest = s.at
			}
			u.Count++
			out[s.by] = u
		}
	}
	return out, nil
}

package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// oddStrings are texts whose JSON takes care: quotes and backslashes,
// every kind of control character, what encoding/json escapes for HTML,
// invalid UTF-8, U+2028 and U+2029, and runes of every length.
var oddStrings = []string{
	"",
	`"quoted" \back\slash/`,
	"\x00\x01\x07\b\t\n\v\f\r\x1b\x1f\x7f",
	"<script>&amp;</script>",
	"\xff\xfe bad \xc3 \xe2\x82 \xed\xa0\x80 surrogate",
	"line\u2028sep\u2029para",
	"é ü 世界 🚀 \ufffd",
	"/v1/items?q=a b&c=%20#frag",
}

// A filler sets every field of a value, reflection walking it, to values
// taken in turn from its lists: a field added to a journal line's types
// is set too, and an encoder that forgets it fails the comparison.
type filler struct {
	strs   []string
	ints   []int64
	floats []float64
	times  []time.Time
	n      int
}

func (g *filler) next() int { g.n++; return g.n }

func (g *filler) fill(t testing.TB, v reflect.Value, path string) {
	t.Helper()
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(g.times[g.next()%len(g.times)]))
		return
	}
	if v.Type() == reflect.TypeFor[[]byte]() { // a body: text, as encoding/json writes it in base64
		v.SetBytes([]byte(g.strs[g.next()%len(g.strs)]))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				g.fill(t, v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	case reflect.String:
		v.SetString(g.strs[g.next()%len(g.strs)])
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(g.ints[g.next()%len(g.ints)])
	case reflect.Bool:
		v.SetBool(g.next()%3 != 0)
	case reflect.Float64, reflect.Float32:
		v.SetFloat(g.floats[g.next()%len(g.floats)])
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			g.fill(t, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	default:
		t.Fatalf("%s is a %v, which the test cannot fill: teach it, and appendJournalLine", path, v.Kind())
	}
}

// finishedFilled is a ledger.Finished with every field set by g, its
// attempt's ID too unless g gives it 0.
func finishedFilled(t testing.TB, g *filler) ledger.Finished {
	var f ledger.Finished
	g.fill(t, reflect.ValueOf(&f).Elem(), "Finished")
	return f
}

// sameLine checks that an encoder's line, appended to "prefix", is
// encoding/json's byte for byte, or that both failed; it reports whether
// there is a line to read back.
func sameLine(t *testing.T, encoder string, got []byte, gotErr error, want []byte, wantErr error) bool {
	t.Helper()
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%s's error %v, encoding/json's %v", encoder, gotErr, wantErr)
	}
	if wantErr != nil {
		return false
	}
	got, ok := bytes.CutPrefix(got, []byte("prefix"))
	if !ok {
		t.Fatalf("%s did not append to its buffer: %q", encoder, got)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s differs from encoding/json at byte %d:\n got %s\nwant %s", encoder, i, got[i:], want[i:])
	}
	return true
}

// checkJournalLine checks that appendJournalLine writes f as
// encoding/json writes its journal line, byte for byte, and that the
// line reads back (with the decoder Recover uses) as that one does.
func checkJournalLine(t *testing.T, f ledger.Finished) {
	t.Helper()
	want, wantErr := json.Marshal(journalLineOf(f))
	got, gotErr := appendJournalLine([]byte("prefix"), f)
	if !sameLine(t, "appendJournalLine", got, gotErr, want, wantErr) {
		return
	}
	got = got[len("prefix"):]
	if diff := cmp.Diff(readJournalLine(t, got), readJournalLine(t, want)); diff != "" {
		t.Errorf("the line read back (-appendJournalLine +encoding/json):\n%s", diff)
	}
}

func TestJournalLineEncoding(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	zones := []*time.Location{time.UTC, time.FixedZone("", -(3*3600 + 30*60)), time.FixedZone("X", 14*3600)}
	var times []time.Time
	for i, z := range zones {
		times = append(times, at.In(z), at.Add(time.Duration(i)*123456789*time.Nanosecond).In(z))
	}
	times = append(times, time.Time{}, time.Date(0, 1, 1, 0, 0, 0, 1, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC))
	ints := []int64{7, 0, -1, 1, math.MaxInt64, math.MinInt64, 200, int64(90 * time.Second)}
	floats := []float64{0, 0.5, 1, -2.25, 1e-6, 9.99e-7, 1.5e-9, 1e20, 1e21, -1e21, 123456789.123456789, math.SmallestNonzeroFloat64, math.MaxFloat64, 1.0 / 3}

	t.Run("routine", func(t *testing.T) { checkJournalLine(t, routineOutcome(5, at)) })
	t.Run("no reason, no observations", func(t *testing.T) {
		f := routineOutcome(5, at)
		f.Attempt.Reason, f.Observations = reason.Reason{}, []ledger.ObservationRecord{}
		checkJournalLine(t, f)
	})
	for i, s := range oddStrings {
		t.Run(fmt.Sprintf("every field, strings %d", i), func(t *testing.T) {
			g := &filler{strs: []string{s, s + "x", "y" + s}, ints: ints, floats: floats, times: times}
			f := finishedFilled(t, g)
			f.Attempt.ID = 1
			checkJournalLine(t, f)
		})
	}
	for i := range 40 {
		t.Run(fmt.Sprint("every field, shifted ", i), func(t *testing.T) {
			g := &filler{strs: oddStrings, ints: ints, floats: floats, times: times, n: i}
			checkJournalLine(t, finishedFilled(t, g))
		})
	}
	t.Run("every reason field alone", func(t *testing.T) {
		// Each field of reason.Reason set alone, the others zero: its
		// omitzero is kept.
		rt := reflect.TypeFor[reason.Reason]()
		for i := range rt.NumField() {
			f := routineOutcome(5, at)
			f.Attempt.Reason = reason.Reason{}
			g := &filler{strs: []string{"s"}, ints: []int64{3}, floats: []float64{0.25}, times: []time.Time{at}}
			g.fill(t, reflect.ValueOf(&f.Attempt.Reason).Elem().Field(i), rt.Field(i).Name)
			checkJournalLine(t, f)
		}
	})
	// What encoding/json refuses, or omits, goes through it.
	for name, change := range map[string]func(*ledger.Finished){
		"no attempt ID":    func(f *ledger.Finished) { f.Attempt.ID = 0 },
		"no attempt":       func(f *ledger.Finished) { *f = ledger.Finished{Observations: f.Observations} },
		"year 10000":       func(f *ledger.Finished) { f.Attempt.SentAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		"year -1":          func(f *ledger.Finished) { f.Observations[0].ServerDate = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) },
		"a day's offset":   func(f *ledger.Finished) { f.Attempt.At = at.In(time.FixedZone("", 24*3600)) },
		"share NaN":        func(f *ledger.Finished) { f.Attempt.Reason.Share = math.NaN() },
		"rate +Inf":        func(f *ledger.Finished) { f.Attempt.Reason.Rate = math.Inf(1) },
		"until year 10000": func(f *ledger.Finished) { f.Attempt.Reason.Until = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
	} {
		t.Run(name, func(t *testing.T) {
			f := routineOutcome(5, at)
			change(&f)
			checkJournalLine(t, f)
		})
	}
}

// FuzzJournalLine holds appendJournalLine to encoding/json's bytes for
// lines of any text, number and time.
//
//	go test ./state -run '^$' -fuzz FuzzJournalLine -fuzztime 30s
func FuzzJournalLine(f *testing.F) {
	for i, s := range oddStrings {
		f.Add(s, oddStrings[(i+1)%len(oddStrings)], int64(i), float64(i)/7, int64(1777636800+i), int64(i*123456789), 3600*i)
	}
	f.Add("", "", int64(0), 0.0, int64(0), int64(0), 0)
	f.Add("\u2028", "\xf4\x90\x80\x80", int64(-1), 1e-7, int64(-62135596800), int64(999999999), -86399)
	f.Add("a", "b", int64(math.MaxInt64), 1e21, int64(253402300799), int64(1), 86400)
	f.Add("a", "b", int64(math.MinInt64), math.Inf(-1), int64(253402300800), int64(0), 0)
	f.Fuzz(func(t *testing.T, s1, s2 string, n int64, fl float64, sec, nsec int64, offset int) {
		zone := time.FixedZone("", offset%(30*3600))
		g := &filler{
			strs:   []string{s1, s2, s1 + s2},
			ints:   []int64{n, n + 1, 0},
			floats: []float64{fl, 0, -fl},
			times:  []time.Time{time.Unix(sec, nsec).In(zone), time.Unix(sec, nsec).UTC(), {}},
		}
		checkJournalLine(t, finishedFilled(t, g))
	})
}

// BenchmarkJournalLine measures encoding a routine outcome's journal
// line (a leased call's, with one observation), as FinishLater does on
// its caller's path: by encoding/json's reflection, as before, or
// appended field by field.
//
//	go test ./state -run '^$' -bench JournalLine
func BenchmarkJournalLine(b *testing.B) {
	f := routineOutcome(5, time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(journalLineOf(f)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 2048)
		for b.Loop() {
			var err error
			if buf, err = appendJournalLine(buf[:0], f); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// checkKeptLine checks that appendKeptLine writes k as encoding/json
// writes its journal line, byte for byte, and that the line reads back
// (with the decoder Recover uses) as that one does.
func checkKeptLine(t *testing.T, k *keptAnswer) {
	t.Helper()
	want, wantErr := json.Marshal(journalLine{Kept: k})
	got, gotErr := appendKeptLine([]byte("prefix"), k)
	if !sameLine(t, "appendKeptLine", got, gotErr, want, wantErr) {
		return
	}
	got = got[len("prefix"):]
	g, w := readKeptLine(t, got), readKeptLine(t, want)
	if diff := cmp.Diff(g.Response, w.Response); diff != "" || g.Keep != w.Keep {
		t.Errorf("the line reads back with keep %d against %d, the answer (-appendKeptLine +encoding/json):\n%s", g.Keep, w.Keep, diff)
	}
}

// readKeptLine reads a kept answer's journal line as Recover does.
func readKeptLine(t *testing.T, line []byte) *keptAnswer {
	t.Helper()
	var l journalLine
	if err := json.Unmarshal(line, &l); err != nil || l.Kept == nil || l.Attempt.ID != 0 {
		t.Fatalf("%s reads back as %+v: %v", line, l, err)
	}
	return l.Kept
}

// keptFilled is a kept answer with every field set by g.
func keptFilled(t testing.TB, g *filler) *keptAnswer {
	k := &keptAnswer{listed: func([]string) {}}
	g.fill(t, reflect.ValueOf(&k.Response).Elem(), "StoredResponse")
	k.Keep = int(g.ints[g.next()%len(g.ints)])
	return k
}

func TestKeptLineEncoding(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	times := []time.Time{at, at.In(time.FixedZone("", -(3*3600 + 30*60))), {}, at.Add(123456789), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)}
	ints := []int64{7, 0, -1, 200, math.MaxInt64, math.MinInt64}
	routine := &keptAnswer{Response: ledger.StoredResponse{
		Key: "demo", Target: "/v1/items?page=2", ETag: `W/"abc"`, Status: 200, ContentType: "application/json",
		Body: []byte(`{"items":[1,2,3]}`), Digest: "sha256:00ff", StoredAt: at, Unchanged: 2, Vary: "accept,accept-encoding", Varied: "application/json\ngzip",
	}, Keep: 64}
	t.Run("routine", func(t *testing.T) { checkKeptLine(t, routine) })
	for name, body := range map[string][]byte{"no body": nil, "an empty body": {}, "binary": {0, 0xff, 0xfe, '"', '\\', 0x80}, "one byte": {'a'}, "two bytes": {'a', 'b'}} {
		t.Run(name, func(t *testing.T) {
			k := *routine
			k.Response.Body = body
			checkKeptLine(t, &k)
		})
	}
	for i := range 3 * len(oddStrings) {
		t.Run(fmt.Sprint("every field, shifted ", i), func(t *testing.T) {
			g := &filler{strs: oddStrings, ints: ints, times: times, n: i}
			checkKeptLine(t, keptFilled(t, g))
		})
	}
	for name, at := range map[string]time.Time{
		"stored in year 10000": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		"stored in year -1":    time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		"a day's offset":       at.In(time.FixedZone("", 24*3600)),
	} {
		t.Run(name, func(t *testing.T) { // encoding/json refuses these: so does appendKeptLine
			k := *routine
			k.Response.StoredAt = at
			checkKeptLine(t, &k)
			if _, err := appendKeptLine(nil, &k); err == nil {
				t.Fatalf("appendKeptLine wrote a time encoding/json refuses: %v", at)
			}
		})
	}
}

// FuzzKeptLine holds appendKeptLine to encoding/json's bytes for kept
// answers of any text, body, number and time.
//
//	go test ./state -run '^$' -fuzz FuzzKeptLine -fuzztime 30s
func FuzzKeptLine(f *testing.F) {
	for i, s := range oddStrings {
		f.Add(s, oddStrings[(i+1)%len(oddStrings)], int64(i), int64(1777636800+i), int64(i*123456789), 3600*i)
	}
	f.Add("", "", int64(0), int64(0), int64(0), 0)
	f.Add("a", "b", int64(math.MinInt64), int64(253402300800), int64(0), 0)
	f.Fuzz(func(t *testing.T, s1, s2 string, n int64, sec, nsec int64, offset int) {
		zone := time.FixedZone("", offset%(30*3600))
		g := &filler{
			strs:  []string{s1, s2, s1 + s2},
			ints:  []int64{n, n + 1, 0},
			times: []time.Time{time.Unix(sec, nsec).In(zone), time.Unix(sec, nsec).UTC(), {}},
		}
		checkKeptLine(t, keptFilled(t, g))
	})
}

// BenchmarkKeptLine measures encoding a kept answer's journal line, a
// 2 KB body, by reflection and field by field.
func BenchmarkKeptLine(b *testing.B) {
	k := &keptAnswer{Response: ledger.StoredResponse{
		Key: "demo", Target: "/v1/items?page=2", ETag: `W/"abc"`, Status: 200, ContentType: "application/json",
		Body: bytes.Repeat([]byte(`{"id":1,"name":"item"},`), 90), Digest: "sha256:00ff", StoredAt: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
	}, Keep: 64}
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(journalLine{Kept: k}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for b.Loop() {
			var err error
			if buf, err = appendKeptLine(buf[:0], k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStoredWhyEncoding: the reason a row keeps (storedWhy, written field
// by field) is json.Marshal's, every field set, each alone, with odd
// texts, and what encoding/json refuses is refused.
func TestStoredWhyEncoding(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var reasons []reason.Reason
	for i := range 30 {
		var r reason.Reason
		g := &filler{strs: oddStrings, ints: []int64{7, 0, -1, math.MaxInt64}, floats: []float64{0.5, 1e-7, 1e21, 0, 1.0 / 3},
			times: []time.Time{at, {}, at.In(time.FixedZone("", 3600))}, n: i}
		g.fill(t, reflect.ValueOf(&r).Elem(), "Reason")
		reasons = append(reasons, r)
	}
	rt := reflect.TypeFor[reason.Reason]()
	for i := range rt.NumField() {
		var r reason.Reason
		g := &filler{strs: []string{"s"}, ints: []int64{3}, floats: []float64{0.25}, times: []time.Time{at}}
		g.fill(t, reflect.ValueOf(&r).Elem().Field(i), rt.Field(i).Name)
		reasons = append(reasons, r)
	}
	reasons = append(reasons, reason.Reason{Kind: reason.Answered, Share: math.NaN()},
		reason.Reason{Kind: reason.Answered, Until: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	for _, r := range reasons {
		got, gotErr := storedWhy(r)
		want, wantErr := json.Marshal(r)
		switch {
		case (gotErr != nil) != (wantErr != nil):
			t.Errorf("storedWhy(%#v): error %v, encoding/json's %v", r, gotErr, wantErr)
		case wantErr == nil && (!got.Valid || got.String != string(want)):
			t.Errorf("storedWhy(%#v) = %q, want %s", r, got.String, want)
		}
	}
}

package keystore_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// scrubSecret needs percent-encoding, form encoding and JSON escaping.
const scrubSecret = "zqx+9/8=x&y <\"k\">"

// forms are the ways an upstream or a client can write scrubSecret.
func forms(v string) map[string]string {
	lowerHex := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) {
				b.WriteString("%" + strings.ToLower(s[i+1:i+3]))
				i += 2
				continue
			}
			b.WriteByte(s[i])
		}
		return b.String()
	}
	j, _ := json.Marshal(v) // Go escapes & < > as \u0026…
	return map[string]string{
		"raw":                 v,
		"query escape":        url.QueryEscape(v),
		"query escape, lower": lowerHex(url.QueryEscape(v)),
		"path escape":         url.PathEscape(v),
		"double escape":       url.QueryEscape(url.QueryEscape(v)),
		"form values":         url.Values{"api_key": {v}}.Encode(),
		"json":                string(j),
		"html":                html.EscapeString(v),
		"base64 std":          base64.StdEncoding.EncodeToString([]byte(v)),
		"base64 url raw":      base64.RawURLEncoding.EncodeToString([]byte(v)),
		"basic auth":          "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+v)),
		"base64 offset 2":     base64.StdEncoding.EncodeToString([]byte("ab" + v + "tail")),
		// A cursor that encodes the request's query, the key in it escaped.
		"base64 of the query":        base64.StdEncoding.EncodeToString([]byte("page=2&api_key=" + url.QueryEscape(v) + "&n=1")),
		"base64 of the query, lower": base64.RawURLEncoding.EncodeToString([]byte("api_key=" + lowerHex(url.QueryEscape(v)))),
	}
}

func TestScrubberFindsEveryForm(t *testing.T) {
	s := keystore.NewScrubber(scrubSecret)
	for name, form := range forms(scrubSecret) {
		t.Run(name, func(t *testing.T) {
			text := `{"echo":"https://api.example/v1/x?page=2&key=` + form + `&z=1"}`
			got, hit := s.Scrub(text)
			if !hit || strings.Contains(got, form) {
				t.Errorf("Scrub(%q) = %q, %v; want the form removed", text, got, hit)
			}
			if !strings.Contains(got, keystore.Redacted) || !strings.HasPrefix(got, `{"echo":"https://api.example/v1/x?page=2&key=`) {
				t.Errorf("Scrub(%q) = %q; want the rest kept and a redaction in its place", text, got)
			}
		})
	}
}

func TestScrubberLeavesInnocentText(t *testing.T) {
	s := keystore.NewScrubber(scrubSecret)
	for _, text := range []string{"", "zqx+9/8=x", "zqx 9/8=x&y <\"k\"", "%7A%71%78", "\\u007a", "&#122;", "nothing to see"} {
		if got, hit := s.Scrub(text); hit || got != text {
			t.Errorf("Scrub(%q) = %q, %v; want it unchanged", text, got, hit)
		}
	}
	if s := keystore.NewScrubber("short"); s != nil {
		t.Errorf("NewScrubber(short) = %v; want nil (secrets under %d bytes would match innocent text)", s, keystore.MinScrubLen)
	}
	var none *keystore.Scrubber
	if got, hit := none.Scrub(scrubSecret); hit || got != scrubSecret {
		t.Errorf("nil Scrubber changed %q to %q", scrubSecret, got)
	}
}

// TestScrubReaderAcrossReads splits a body holding every form at every
// point, and reads it a byte at a time: the stream comes out as a
// one-shot scrub does.
func TestScrubReaderAcrossReads(t *testing.T) {
	s := keystore.NewScrubber(scrubSecret)
	var body strings.Builder
	for _, form := range forms(scrubSecret) {
		body.WriteString("<p>" + form + "</p>\n")
	}
	text := body.String()
	want, _ := s.Scrub(text)
	for cut := 0; cut <= len(text); cut += 7 {
		r := io.MultiReader(strings.NewReader(text[:cut]), strings.NewReader(text[cut:]))
		sr := s.Reader(r)
		got, err := io.ReadAll(sr)
		if err != nil || string(got) != want {
			t.Fatalf("split at %d: got %q, %v; want %q", cut, got, err, want)
		}
		if !sr.Hit() {
			t.Fatalf("split at %d: Hit() = false", cut)
		}
	}
	got, err := io.ReadAll(s.Reader(iotest.OneByteReader(strings.NewReader(text))))
	if err != nil || string(got) != want {
		t.Errorf("a byte at a time: got %q, %v; want %q", got, err, want)
	}
	if err := iotest.TestReader(s.Reader(strings.NewReader("plain text, long enough to be held back and then released")),
		[]byte("plain text, long enough to be held back and then released")); err != nil {
		t.Error(err)
	}
}

func FuzzScrubber(f *testing.F) {
	for _, form := range forms(scrubSecret) {
		f.Add("a"+form+"b", 3)
	}
	f.Add("", 0)
	s := keystore.NewScrubber(scrubSecret)
	f.Fuzz(func(t *testing.T, text string, cut int) {
		got, _ := s.Scrub(text)
		if strings.Contains(got, scrubSecret) || strings.Contains(got, url.QueryEscape(scrubSecret)) {
			t.Fatalf("Scrub(%q) = %q still holds the secret", text, got)
		}
		if cut < 0 {
			cut = -cut
		}
		cut %= len(text) + 1
		r := io.MultiReader(strings.NewReader(text[:cut]), iotest.HalfReader(strings.NewReader(text[cut:])))
		streamed, err := io.ReadAll(s.Reader(r))
		if err != nil || !bytes.Equal(streamed, []byte(got)) {
			t.Fatalf("streamed %q, %v; one-shot %q", streamed, err, got)
		}
	})
}

// TestScrubReaderDoesNotHoldBackAStream: what cannot begin a form goes
// out as soon as it is read, so an event stream is not delayed; a tail
// that could begin one waits for the next read.
func TestScrubReaderDoesNotHoldBackAStream(t *testing.T) {
	s := keystore.NewScrubber(scrubSecret)
	pr, pw := io.Pipe()
	sr := s.Reader(pr)
	got := make(chan string)
	go func() {
		for {
			b := make([]byte, 64)
			n, err := sr.Read(b)
			if err != nil {
				close(got)
				return
			}
			got <- string(b[:n])
		}
	}()
	go pw.Write([]byte("data: {\"n\":1}\n\n"))
	if g := <-got; g != "data: {\"n\":1}\n\n" {
		t.Errorf("first event: %q", g)
	}
	go pw.Write([]byte("data: zqx%2"))
	if g := <-got; g != "data: " {
		t.Errorf("an event ending in what could begin the credential: %q, want only what cannot", g)
	}
	go func() { pw.Write([]byte("B9%2F8%3Dx%26y+%3C%22k%22%3E\n\n")); pw.Close() }()
	if g := <-got; g != keystore.Redacted+"\n\n" {
		t.Errorf("the rest: %q, want the credential replaced", g)
	}
}

// BenchmarkScrubReader is the cost of scrubbing an answer's body as it
// streams: 1 MiB of JSON that does not hold the credential.
func BenchmarkScrubReader(b *testing.B) {
	s := keystore.NewScrubber("sk-live-UPSTREAM-7f3a9c1e5b2d4086")
	var body bytes.Buffer
	for body.Len() < 1<<20 {
		body.WriteString(`{"id":"p-000123","name":"Ada Lovelace","email":"ada@example.com","updated":"2026-11-30T12:00:00Z","tags":["a","b"]},`)
	}
	b.SetBytes(int64(body.Len()))
	b.ReportAllocs()
	for b.Loop() {
		io.Copy(io.Discard, s.Reader(bytes.NewReader(body.Bytes())))
	}
}

// TestScrubHandler: every credential of the store is removed from log
// records — message, string, error and group values, and attributes
// given to WithAttrs — once Use is called.
func TestScrubHandler(t *testing.T) {
	env := map[string]string{"K": scrubSecret, "T": "caller-token-0123456789"}
	store, err := keystore.Parse([]byte(`
[[keys]]
name = "k"
base_url = "https://api.example.com/"
secret_env = "K"
auth = "query:api_key"

[[callers]]
name = "c"
token_env = "T"
keys = ["k"]
`), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	h := keystore.NewScrubHandler(slog.NewJSONHandler(&b, nil))
	h.Use(store)
	log := slog.New(h).With("url", "https://api.example.com/?api_key="+url.QueryEscape(scrubSecret))
	log.Info("got "+scrubSecret, "err", fmt.Errorf("dial %s: refused", url.QueryEscape(scrubSecret)),
		slog.Group("g", "token", "caller-token-0123456789"), "n", 3)
	for _, v := range []string{scrubSecret, url.QueryEscape(scrubSecret), "caller-token-0123456789"} {
		if strings.Contains(b.String(), v) {
			t.Errorf("the log holds %q: %s", v, b.String())
		}
	}
	if strings.Count(b.String(), keystore.Redacted) != 4 || !strings.Contains(b.String(), `"n":3`) {
		t.Errorf("log %s; want four redactions and the rest kept", b.String())
	}
}

// TestScrubReaderWithholdsACutTail: a stream that breaks (or is cut at a
// bound) just after the start of a form of the credential does not pass
// that start on — where the cut falls may be the caller's choice — while
// a stream that ends there (EOF) is the upstream's own ending and passes
// as it came.
func TestScrubReaderWithholdsACutTail(t *testing.T) {
	const secret = "sk-live-CUT-0123456789abcdef"
	s := keystore.NewScrubber(secret)
	for _, n := range []int{1, 4, 12, len(secret) - 1} {
		broken := io.MultiReader(strings.NewReader("padding "+secret[:n]), iotest.ErrReader(io.ErrUnexpectedEOF))
		got, err := io.ReadAll(s.Reader(broken))
		if err == nil || string(got) != "padding " {
			t.Errorf("cut %d bytes into the key: read %q, %v; want %q and the error", n, got, err, "padding ")
		}
		got, err = io.ReadAll(s.Reader(strings.NewReader("padding " + secret[:n])))
		if err != nil || string(got) != "padding "+secret[:n] {
			t.Errorf("ending %d bytes into the key: read %q, %v; want it whole", n, got, err)
		}
	}
}

// TestCutTail: a prefix cut from a longer text loses a tail that could
// begin the credential, and nothing else.
func TestCutTail(t *testing.T) {
	const secret = "sk-live-CUT-0123456789abcdef"
	s := keystore.NewScrubber(secret)
	for _, tt := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"text sk-live-C", "text "},
		{"text " + secret + " more", "text " + secret + " more"}, // a whole one is the scrubber's to replace
	} {
		if got := string(s.CutTail([]byte(tt.in))); got != tt.want {
			t.Errorf("CutTail(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	var none *keystore.Scrubber
	if got := string(none.CutTail([]byte("sk-live-C"))); got != "sk-live-C" {
		t.Errorf("nil Scrubber: %q; want it unchanged", got)
	}
}

// TestScrubReaderReusesItsBuffers: a reader that reached its end hands
// its buffers to the next, so an answer read whole allocates neither
// the 8 KiB it reads into nor what it scrubs into; and what the next one
// reads is its own answer alone, scrubbed, whatever the buffers held.
func TestScrubReaderReusesItsBuffers(t *testing.T) {
	s := keystore.NewScrubber(scrubSecret)
	var long strings.Builder
	for _, form := range forms(scrubSecret) {
		long.WriteString("<p>" + form + "</p>\n")
	}
	bodies := []string{long.String(), "short", long.String()[:100], "", "a second short answer"}
	p := make([]byte, 512)
	read := func(r io.Reader) (string, error) {
		var out []byte
		for {
			n, err := r.Read(p)
			out = append(out, p[:n]...)
			if err == io.EOF {
				return string(out), nil
			}
			if err != nil {
				return string(out), err
			}
		}
	}
	for round := range 3 {
		for _, body := range bodies {
			want, _ := s.Scrub(body)
			if got, err := read(s.Reader(iotest.HalfReader(strings.NewReader(body)))); err != nil || got != want {
				t.Fatalf("round %d: read %q, %v; want %q", round, got, err, want)
			}
		}
	}

	body := strings.NewReader("")
	p = make([]byte, 8<<10)
	allocs := testing.AllocsPerRun(100, func() {
		body.Reset("an answer of a few hundred bytes, with the key in it: " + scrubSecret)
		r := s.Reader(body)
		for {
			if _, err := r.Read(p); err != nil {
				break
			}
		}
	})
	if allocs >= 2 { // the reader itself
		t.Errorf("reading a short answer whole: %v allocations; want 1, the reader (its buffers are reused)", allocs)
	}
}

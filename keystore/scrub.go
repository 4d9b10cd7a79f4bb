package keystore

import (
	"encoding/base64"
	"errors"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Redacted is what a Scrubber puts where it removed a credential.
const Redacted = redacted

// MinScrubLen is the shortest credential a Scrubber looks for: shorter
// ones would match innocent text.
const MinScrubLen = 8

// A Scrubber finds a credential in text in every form it can take on the
// wire and replaces each occurrence with Redacted. A form is the
// credential's bytes with any of them written as
//
//   - itself;
//   - a percent-encoding, in either case of hex digit ("%2B", "%2b"),
//     or that encoding percent-encoded once more ("%252B");
//   - "+" for a space (form encoding);
//   - a JSON escape ("\u002b", "\/", "\"", "\\");
//   - an HTML character reference ("&amp;", "&#43;", "&#x2B;");
//
// in any mixture, or the credential inside base64 (standard or URL
// alphabet, padded or not, at any alignment: a Basic credential
// "user:secret" or a base64 body that holds it). The nil *Scrubber
// removes nothing. A Scrubber is immutable and safe for concurrent use.
type Scrubber struct {
	// The secrets sit behind a pointer, as a Secret's value does, so
	// that printing a struct that holds a Scrubber shows an address.
	*scrubber
}

type scrubber struct {
	secrets []string
	cores   []string  // base64 runs that only a text holding a secret contains
	hold    int       // the longest form of any secret, in bytes
	start   [256]bool // the bytes a form can begin with
}

func (s *Scrubber) String() string   { return "keystore.Scrubber(" + redacted + ")" }
func (s *Scrubber) GoString() string { return s.String() }

// NewScrubber returns a Scrubber for secrets; those shorter than
// MinScrubLen are not looked for. It returns nil when none is left.
func NewScrubber(secrets ...string) *Scrubber {
	s := &Scrubber{&scrubber{}}
	for _, c := range []byte{'%', '\\', '&', '+'} {
		s.start[c] = true
	}
	for _, v := range secrets {
		if len(v) < MinScrubLen {
			continue
		}
		s.secrets = append(s.secrets, v)
		s.start[v[0]] = true
		s.hold = max(s.hold, maxForm*len(v))
		// Inside base64: the secret, and the secret percent-encoded (a
		// cursor that encodes the request's query), whose base64 differs
		// when the secret holds a byte that is escaped.
		q := url.QueryEscape(v)
		for _, text := range slices.Compact([]string{v, q, lowerHex(q), url.PathEscape(v)}) {
			s.addCores(text)
		}
	}
	if len(s.secrets) == 0 {
		return nil
	}
	return s
}

// addCores adds the runs of base64 that only a text holding text
// contains, at each of the three alignments, in both alphabets.
func (s *scrubber) addCores(text string) {
	for off := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, off), text...))
		// The characters that carry bits of the prefix, or of the
		// padding, differ from one text to another: keep the run in
		// between, which only the secret decides.
		from, to := (8*off+5)/6, 8*(off+len(text))/6
		core := enc[from:to]
		for _, c := range slices.Compact([]string{core, strings.NewReplacer("+", "-", "/", "_").Replace(core)}) {
			if !slices.Contains(s.cores, c) {
				s.cores = append(s.cores, c)
				s.start[c[0]] = true
			}
		}
	}
}

// lowerHex writes the hex digits of s's percent-escapes in lower case.
func lowerHex(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = lowerASCII(b[i+1]), lowerASCII(b[i+2])
			i += 2
		}
	}
	return string(b)
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// maxForm is the most bytes one byte of a secret takes in any form a
// Scrubber matches ("&#x0002B;" is the longest it reads).
const maxForm = 10

// Scrub returns text with every form of the credential replaced, and
// whether anything was.
func (s *Scrubber) Scrub(text string) (string, bool) {
	if s == nil || text == "" {
		return text, false
	}
	if !s.found(bytesOf(text)) { // most text: no copy
		return text, false
	}
	out, _, hit := s.scrub(nil, []byte(text), len(text))
	if !hit {
		return text, false
	}
	return string(out), true
}

// bytesOf is text's bytes, not copied: only for reading.
func bytesOf(text string) []byte { return unsafe.Slice(unsafe.StringData(text), len(text)) }

// found reports whether a form of a secret starts anywhere in b: where
// scrub would replace one, without copying anything.
func (s *Scrubber) found(b []byte) bool {
	for i, c := range b {
		if s.start[c] && s.matchAt(b, i) > 0 {
			return true
		}
	}
	return false
}

// ScrubBytes is Scrub for a byte slice; b itself is not changed.
func (s *Scrubber) ScrubBytes(b []byte) ([]byte, bool) {
	if s == nil || len(b) == 0 {
		return b, false
	}
	if !s.found(b) {
		return b, false
	}
	out, _, hit := s.scrub(nil, b, len(b))
	if !hit {
		return b, false
	}
	return out, true
}

// Contains reports whether text holds the credential in any form.
func (s *Scrubber) Contains(text string) bool {
	return s != nil && s.found(bytesOf(text))
}

// ContainsFold reports whether text holds a secret in any of the forms
// Contains finds, or the secret itself in any case: for a header field's
// name, which HTTP compares without case and Go rewrites in its own
// (X-Leak-Abc… for x-leak-abc…).
func (s *Scrubber) ContainsFold(text string) bool {
	if s == nil {
		return false
	}
	if s.Contains(text) {
		return true
	}
	lower := strings.ToLower(text)
	return slices.ContainsFunc(s.secrets, func(v string) bool { return strings.Contains(lower, strings.ToLower(v)) })
}

// scrub appends to dst b's bytes from the start up to at least cut, with
// every form of a secret that starts before cut replaced. It returns the
// copy, how many bytes of b it consumed (cut, or the end of a form that
// straddles it) and whether anything was replaced. A form starting
// before len(b)-s.hold ends inside b.
func (s *Scrubber) scrub(dst, b []byte, cut int) ([]byte, int, bool) {
	out := slices.Grow(dst[:0], len(b))
	hit := false
	i := 0
	for i < cut {
		j := i
		for j < cut && !s.start[b[j]] {
			j++
		}
		out = append(out, b[i:j]...)
		if i = j; i >= cut {
			break
		}
		if n := s.matchAt(b, i); n > 0 {
			out = append(out, redacted...)
			i += n
			hit = true
			continue
		}
		out = append(out, b[i])
		i++
	}
	return out, i, hit
}

// matchAt returns the length of the longest form of a secret at b[i:],
// or 0.
func (s *Scrubber) matchAt(b []byte, i int) int {
	best := 0
	c := b[i]
	for _, v := range s.secrets {
		if c != v[0] && c != '%' && c != '\\' && c != '&' && c != '+' {
			continue
		}
		if n := formAt(b, i, v); n > best {
			best = n
		}
	}
	for _, core := range s.cores {
		if c == core[0] && len(b)-i >= len(core) && string(b[i:i+len(core)]) == core {
			best = max(best, len(core))
		}
	}
	return best
}

// formAt returns how many bytes of b from i spell v in the forms a
// Scrubber reads, or 0 when they do not.
func formAt(b []byte, i int, v string) int {
	n := spell(b, i, v)
	return max(n, 0)
}

// spell returns how many bytes of b from j spell v, or -1. Where a byte
// can be read two ways ("&" itself, or the start of "&amp;"), both are
// tried.
func spell(b []byte, j int, v string) int {
	if v == "" {
		return 0
	}
	var opts [2]int
	for _, n := range byteAt(b, j, v[0], opts[:0]) {
		if r := spell(b, j+n, v[1:]); r >= 0 {
			return n + r
		}
	}
	return -1
}

// byteAt appends to opts how many bytes of b from j can spell the byte c.
func byteAt(b []byte, j int, c byte, opts []int) []int {
	if j >= len(b) {
		return opts
	}
	rest := b[j:]
	if rest[0] == c || (rest[0] == '+' && c == ' ') {
		opts = append(opts, 1)
	}
	switch rest[0] {
	case '%':
		d := -1
		if len(rest) >= 3 {
			d = unhex2(rest[1], rest[2])
		}
		if d == int(c) || (d == '+' && c == ' ') {
			opts = append(opts, 3)
		} else if d == '%' && len(rest) >= 5 {
			if d2 := unhex2(rest[3], rest[4]); d2 == int(c) || (d2 == '+' && c == ' ') {
				opts = append(opts, 5)
			}
		}
	case '\\':
		switch {
		case len(rest) >= 2 && rest[1] == c && (c == '/' || c == '"' || c == '\\'):
			opts = append(opts, 2)
		case len(rest) >= 6 && rest[1] == 'u' && unhex2(rest[2], rest[3]) == 0 && unhex2(rest[4], rest[5]) == int(c):
			opts = append(opts, 6)
		}
	case '&':
		if n := entityAt(rest, c); n > 0 {
			opts = append(opts, n)
		}
	}
	return opts
}

// entityAt returns the length of the HTML character reference at the
// start of b when it stands for c, or 0.
func entityAt(b []byte, c byte) int {
	for name, v := range map[string]byte{"&amp;": '&', "&quot;": '"', "&apos;": '\'', "&lt;": '<', "&gt;": '>', "&sol;": '/', "&plus;": '+', "&equals;": '='} {
		if v == c && len(b) >= len(name) && strings.EqualFold(string(b[:len(name)]), name) {
			return len(name)
		}
	}
	if len(b) < 4 || b[1] != '#' {
		return 0
	}
	hex := b[2] == 'x' || b[2] == 'X'
	j, n := 2, 0
	if hex {
		j = 3
	}
	start := j
	for ; j < len(b) && j < maxForm && b[j] != ';'; j++ {
		d := unhex(b[j])
		if d < 0 || (!hex && d > 9) {
			return 0
		}
		if hex {
			n = n*16 + d
		} else {
			n = n*10 + d
		}
	}
	if j == start || j >= len(b) || b[j] != ';' || n != int(c) {
		return 0
	}
	return j + 1
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func unhex2(a, b byte) int {
	x, y := unhex(a), unhex(b)
	if x < 0 || y < 0 {
		return -1
	}
	return x<<4 | y
}

// Reader returns a reader of r's bytes with every form of the credential
// replaced, also where a form is split across r's reads. Hit reports
// whether anything was replaced so far. For the nil *Scrubber it returns
// a reader that passes r through.
func (s *Scrubber) Reader(r io.Reader) *ScrubReader {
	return &ScrubReader{s: s, r: r}
}

// A ScrubReader is what Scrubber.Reader returns. It holds back only a
// tail of what it read that could begin a form of the credential, until
// the next read tells; the rest goes out at once (a stream's events are
// not delayed). It is not safe for concurrent use, except for Hit.
type ScrubReader struct {
	s       *Scrubber
	r       io.Reader
	pending []byte     // read, not yet scrubbed
	out     []byte     // scrubbed, not yet returned
	buf     []byte     // out's array, used again once out is drained
	err     error      // r's error, returned once pending and out are empty
	bufs    *scrubPair // where pending's and buf's arrays came from, when from scrubBufs
	hit     atomic.Bool
}

// Read reads scrubbed bytes.
func (sr *ScrubReader) Read(p []byte) (int, error) {
	if sr.s == nil {
		return sr.r.Read(p)
	}
	for len(sr.out) == 0 {
		if sr.err != nil {
			if len(sr.pending) == 0 {
				sr.release()
				return 0, sr.err
			}
			if !errors.Is(sr.err, io.EOF) {
				// The stream broke (or was cut at a bound) where the
				// caller may have chosen: a tail that could begin a form
				// of the credential never goes out.
				sr.pending = sr.pending[:sr.s.partialCut(sr.pending)]
				if len(sr.pending) == 0 {
					continue
				}
			}
			sr.emit(len(sr.pending))
			continue
		}
		// Room to read into: 8 KiB to start with (most answers are
		// smaller, and one is read per call), taken from the buffers of
		// readers that reached their end; more only while a form held
		// back at the tail fills it.
		if cap(sr.pending) == 0 {
			sr.bufs = takeScrubBufs()
			sr.pending, sr.buf = sr.bufs.pending, sr.bufs.out
		}
		if cap(sr.pending)-len(sr.pending) < 4<<10 {
			sr.pending = append(make([]byte, 0, 2*cap(sr.pending)+8<<10), sr.pending...)
		}
		n, err := sr.r.Read(sr.pending[len(sr.pending):cap(sr.pending)])
		sr.pending = sr.pending[:len(sr.pending)+n]
		sr.err = err
		if err == nil {
			// Everything but a tail that could begin a form goes out now,
			// so a stream's events are not held back.
			if cut := sr.s.partialCut(sr.pending); cut > 0 {
				sr.emit(cut)
			}
		}
	}
	n := copy(p, sr.out)
	sr.out = sr.out[n:]
	return n, nil
}

// CutTail returns b without a tail that could begin a form of the
// credential: what to keep of a prefix cut from a longer text, whose
// next bytes are unknown. For the nil *Scrubber it returns b.
func (s *Scrubber) CutTail(b []byte) []byte {
	if s == nil {
		return b
	}
	return b[:s.partialCut(b)]
}

// partialCut returns where a tail of b that could begin a form of a
// secret starts; len(b) when none could.
func (s *Scrubber) partialCut(b []byte) int {
	for i := max(0, len(b)-s.hold); i < len(b); i++ {
		if s.partialAt(b, i) {
			return i
		}
	}
	return len(b)
}

// partialAt reports whether b[i:] could be the start of a form of a
// secret that the end of b cut short.
func (s *Scrubber) partialAt(b []byte, i int) bool {
	for _, v := range s.secrets {
		if prefixForm(b, i, v) {
			return true
		}
	}
	rest := b[i:]
	for _, core := range s.cores {
		if len(rest) < len(core) && string(rest) == core[:len(rest)] {
			return true
		}
	}
	return false
}

// prefixForm reports whether b[j:], which runs to the end of b, spells
// the start of v (not all of it) in the forms a Scrubber reads,
// counting an escape the end of b cut short as a possible byte.
func prefixForm(b []byte, j int, v string) bool {
	if v == "" {
		return false // all of v: a form, not a part of one
	}
	if j == len(b) {
		return true
	}
	var opts [2]int
	for _, n := range byteAt(b, j, v[0], opts[:0]) {
		if prefixForm(b, j+n, v[1:]) {
			return true
		}
	}
	rest := b[j:]
	return len(rest) < maxForm && (rest[0] == '%' || rest[0] == '\\' || rest[0] == '&')
}

// emit scrubs pending up to cut and moves it to out.
func (sr *ScrubReader) emit(cut int) {
	out, used, hit := sr.s.scrub(sr.buf, sr.pending, cut)
	if hit {
		sr.hit.Store(true)
	}
	sr.out, sr.buf = out, out
	sr.pending = append(sr.pending[:0], sr.pending[used:]...)
}

// Hit reports whether the reader replaced anything so far.
func (sr *ScrubReader) Hit() bool { return sr.hit.Load() }

// scrubBufs are the buffers of ScrubReaders that reached the end of
// their reader, cleared, for the next ones: a reader per answer would
// otherwise allocate 8 KiB to read into and as much to scrub into, most
// answers being far shorter. Only buffers of scrubBufSize go back; one a
// long form made grow is left to the collector.
var scrubBufs sync.Pool // of *scrubPair

const scrubBufSize = 8 << 10

type scrubPair struct{ pending, out []byte }

// takeScrubBufs returns an empty buffer to read into and one to scrub
// into, each of scrubBufSize.
func takeScrubBufs() *scrubPair {
	if b, ok := scrubBufs.Get().(*scrubPair); ok {
		return b
	}
	return &scrubPair{pending: make([]byte, 0, scrubBufSize), out: make([]byte, 0, scrubBufSize)}
}

// release gives the reader's buffers back, cleared (they held the
// answer before it was scrubbed), once nothing is left in them to
// return.
func (sr *ScrubReader) release() {
	b, pending, out := sr.bufs, sr.pending, sr.buf
	sr.bufs, sr.pending, sr.out, sr.buf = nil, nil, nil, nil
	if b == nil || cap(pending) != scrubBufSize || cap(out) != scrubBufSize {
		return
	}
	clear(pending[:cap(pending)])
	clear(out[:cap(out)])
	b.pending, b.out = pending[:0], out[:0]
	scrubBufs.Put(b)
}

// Scrubber returns the Scrubber of the key's credential; nil when the key
// has none, or one shorter than MinScrubLen.
func (k *Key) Scrubber() *Scrubber {
	if k == nil || k.Auth.Kind == AuthNone {
		return nil
	}
	if k.scrub != nil {
		return k.scrub
	}
	return NewScrubber(k.secret.Reveal())
}

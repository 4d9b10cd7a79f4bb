package upstream

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestDecodeAnswer: what each Content-Encoding an upstream may send
// becomes — decoded, refused, or bounded.
func TestDecodeAnswer(t *testing.T) {
	plain := []byte(`{"hello":"world"}`)
	tests := []struct {
		name, coding string
		status       int
		method       string
		body         []byte
		limit        int64
		want         string // the decoded body
		refused      string // the error's text must hold this
		tooLarge     bool
	}{
		{name: "none", body: plain, want: string(plain)},
		{name: "identity", coding: "identity", body: plain, want: string(plain)},
		{name: "gzip", coding: "gzip", body: testkit.Gzip(plain), want: string(plain)},
		{name: "x-gzip, any case", coding: "X-Gzip", body: testkit.Gzip(plain), want: string(plain)},
		{name: "deflate as zlib", coding: "deflate", body: testkit.Zlib(plain), want: string(plain)},
		{name: "deflate as raw deflate", coding: "deflate", body: testkit.RawDeflate(plain), want: string(plain)},
		{name: "stacked", coding: "deflate, gzip", body: testkit.Gzip(testkit.Zlib(plain)), want: string(plain)},
		{name: "stacked, identity between", coding: "gzip, identity, gzip", body: testkit.Gzip(testkit.Gzip(plain)), want: string(plain)},
		{name: "brotli", coding: "br", body: plain, refused: `"br"`},
		{name: "zstd after gzip", coding: "gzip, zstd", body: plain, refused: `"zstd"`},
		{name: "four deep", coding: "gzip, gzip, gzip, gzip", body: plain, refused: "4 content codings"},
		{name: "a part for the whole", status: http.StatusPartialContent, body: plain, refused: "206"},
		{name: "HEAD", coding: "gzip", method: http.MethodHead, want: ""},
		{name: "bomb", coding: "gzip", body: testkit.Gzip(bytes.Repeat([]byte("a"), 1<<20)), limit: 1000, tooLarge: true},
		{name: "exactly the limit", coding: "gzip", body: testkit.Gzip(plain), limit: int64(len(plain)), want: string(plain)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(tt.body)), ContentLength: int64(len(tt.body))}
			if tt.status != 0 {
				resp.StatusCode = tt.status
			}
			if tt.coding != "" {
				resp.Header.Set("Content-Encoding", tt.coding)
				resp.Header.Set("Content-Length", "123")
			}
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			err := decodeAnswer(resp, method, false, tt.limit)
			if tt.refused != "" {
				if !errors.Is(err, ErrRefusedAnswer) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("got %v; want ErrRefusedAnswer naming %s", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.coding != "" && tt.coding != "identity" && (resp.Header.Get("Content-Encoding") != "" || resp.Header.Get("Content-Length") != "" || resp.ContentLength != -1) {
				t.Errorf("header %v, length %d; want no Content-Encoding or Content-Length left", resp.Header, resp.ContentLength)
			}
			if method == http.MethodHead {
				return
			}
			got, err := io.ReadAll(resp.Body)
			if tt.tooLarge {
				if !errors.Is(err, ErrAnswerTooLarge) || int64(len(got)) > tt.limit {
					t.Errorf("read %d bytes, %v; want at most %d and ErrAnswerTooLarge", len(got), err, tt.limit)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Errorf("read %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestSentHeader: what the caller sent that goes upstream — never its
// Accept-Encoding, and never a range for a key with a credential.
func TestSentHeader(t *testing.T) {
	caller := http.Header{"Accept-Encoding": {"br"}, "Range": {"bytes=0-9"}, "If-Range": {`"e"`}, "Request-Range": {"bytes=0-9"},
		"X-Ms-Range": {"bytes=0-9"}, "Accept-Language": {"xx"}}
	withKey := SentHeader(newKey(t, "bearer"), caller)
	if got := withKey.Get("Accept-Encoding"); got != AcceptEncoding {
		t.Errorf("Accept-Encoding %q; want %q", got, AcceptEncoding)
	}
	for _, f := range []string{"Range", "If-Range", "Request-Range", "X-Ms-Range"} {
		if withKey.Get(f) != "" {
			t.Errorf("%s went upstream for a key with a credential", f)
		}
	}
	if withKey.Get("Accept-Language") != "xx" {
		t.Errorf("Accept-Language dropped; want the caller's")
	}
	if open := SentHeader(newKey(t, "none"), caller); open.Get("Range") != "bytes=0-9" || open.Get("Accept-Encoding") != AcceptEncoding {
		t.Errorf("a key without a credential: %v; want the caller's Range, mcp-quota's Accept-Encoding", open)
	}
}

// TestSentHeaderDrops: the fields that never go upstream — hop-by-hop
// ones, those the caller's Connection names (in any case), the caller's
// credentials and the key's own credential field — whatever the case the
// caller spelled them in.
func TestSentHeaderDrops(t *testing.T) {
	caller := http.Header{"Connection": {"keep-alive, x-trace-hop"}, "X-Trace-Hop": {"1"}, "Keep-Alive": {"timeout=5"},
		"Authorization": {"Bearer caller"}, "Cookie": {"c=1"}, "x-api-key": {"caller's"}, "Te": {"trailers"},
		"Accept": {"application/json"}, "X-Request-Id": {"r1"}}
	got := SentHeader(newKey(t, "header:X-Api-Key"), caller)
	want := http.Header{"Accept": {"application/json"}, "X-Request-Id": {"r1"}, "Accept-Encoding": {AcceptEncoding}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sent %v; want %v", got, want)
	}
}

// TestSentHeaderAllocations: what goes upstream is worked out without a
// set of dropped names built for each call: a caller's usual three
// fields cost the new header (its map and table) and a slice for each
// field sent, and no more (a set built per call made it 11).
func TestSentHeaderAllocations(t *testing.T) {
	k := newKey(t, "bearer")
	caller := http.Header{"Accept": {"application/json"}, "User-Agent": {"sync/1.0"}, "Authorization": {"Bearer caller"}}
	if n := testing.AllocsPerRun(100, func() { SentHeader(k, caller) }); n > 5 {
		t.Errorf("SentHeader made %.0f allocations; want at most 5", n)
	}
}

// FuzzDecodeAnswer: any Content-Encoding and any body either decode
// within the limit, fail to decode, or are refused — never a panic, never
// more than the limit.
func FuzzDecodeAnswer(f *testing.F) {
	f.Add("gzip", testkit.Gzip([]byte("hello")))
	f.Add("deflate, gzip", testkit.Gzip(testkit.Zlib([]byte("hello"))))
	f.Add("deflate", testkit.RawDeflate([]byte("hello")))
	f.Add("br", []byte("hello"))
	f.Add(" , identity ,gzip", []byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, coding string, body []byte) {
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Encoding": {coding}}, Body: io.NopCloser(bytes.NewReader(body))}
		if err := decodeAnswer(resp, http.MethodGet, false, 1<<16); err != nil {
			if !errors.Is(err, ErrRefusedAnswer) {
				t.Fatalf("refused with %v; want ErrRefusedAnswer", err)
			}
			return
		}
		got, _ := io.ReadAll(resp.Body)
		if len(got) > 1<<16 {
			t.Fatalf("decoded %d bytes past the limit", len(got))
		}
	})
}

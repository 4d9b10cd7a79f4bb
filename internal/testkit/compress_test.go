package testkit_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestCompressed: each coding's body reads back, with the standard
// library's reader of that format, as what was written.
func TestCompressed(t *testing.T) {
	plain := bytes.Repeat([]byte("the quota of the key, "), 100)
	tests := []struct {
		name   string
		body   []byte
		reader func(io.Reader) (io.Reader, error)
	}{
		{"gzip", testkit.Gzip(plain), func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }},
		{"zlib", testkit.Zlib(plain), func(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }},
		{"raw deflate", testkit.RawDeflate(plain), func(r io.Reader) (io.Reader, error) { return flate.NewReader(r), nil }},
	}
	for _, tc := range tests {
		if len(tc.body) >= len(plain) {
			t.Errorf("%s: %d bytes for %d bytes of repeated text; want fewer", tc.name, len(tc.body), len(plain))
		}
		r, err := tc.reader(bytes.NewReader(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("%s: read back %d bytes (%v); want the %d written", tc.name, len(got), err, len(plain))
		}
	}
}

package testkit

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
)

// Gzip is b in the gzip format (Content-Encoding: gzip).
func Gzip(b []byte) []byte {
	return compressed(b, func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
}

// Zlib is b in the zlib format, which HTTP's Content-Encoding: deflate
// names.
func Zlib(b []byte) []byte {
	return compressed(b, func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
}

// RawDeflate is b as raw DEFLATE, without zlib's header: what some
// servers send as Content-Encoding: deflate.
func RawDeflate(b []byte) []byte {
	return compressed(b, func(w io.Writer) io.WriteCloser {
		z, _ := flate.NewWriter(w, flate.DefaultCompression) // an error only for a bad level
		return z
	})
}

// compressed is b written through the writer that format makes.
func compressed(b []byte, format func(io.Writer) io.WriteCloser) []byte {
	var out bytes.Buffer
	z := format(&out)
	z.Write(b) // a bytes.Buffer does not fail
	z.Close()
	return out.Bytes()
}

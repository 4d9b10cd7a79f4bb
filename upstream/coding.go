package upstream

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// AcceptEncoding is what every request mcp-quota sends upstream says it
// accepts: the content codings it decodes itself, so that the key's
// credential can be removed from what the body says. The caller's own
// Accept-Encoding is never passed on, and callers always get the decoded
// body (identity).
const AcceptEncoding = "gzip, deflate"

// maxCodings is how many content codings, one on top of another, an
// answer may come in.
const maxCodings = 3

// DefaultMaxDecoded bounds a decoded body when Request.MaxDecoded is zero.
const DefaultMaxDecoded = 32 << 20

// ErrRefusedAnswer reports an answer mcp-quota did not pass on because it
// is not what it asked for: a body in a content coding it did not ask
// for (and cannot read, so cannot remove the credential from), or a part
// of a representation (206) when it asked for the whole. The attempt was
// sent and counted.
var ErrRefusedAnswer = errors.New("the upstream's answer was refused")

// ErrAnswerTooLarge reports a compressed body that decoded to more than
// the request's MaxDecoded: reads past it fail with this error.
var ErrAnswerTooLarge = errors.New("the upstream's compressed answer decodes to more than mcp-quota reads")

// rangeFields are the request fields that let a caller pick which bytes
// of a representation come back: Range and its condition, the
// Netscape-era Request-Range some servers still read, and Azure
// Storage's x-ms-range. A scrubber cannot see a credential a range edge
// cuts, so for a key with a credential they never go upstream.
var rangeFields = []string{"Range", "If-Range", "Request-Range", "X-Ms-Range"}

// ownFields are the request fields mcp-quota sets itself, whatever the
// caller sent.
var ownFields = []string{"Accept-Encoding"}

// Ranged reports whether k's requests may carry the caller's range
// fields: only for a key without a credential, which no range can cut.
func Ranged(k *keystore.Key) bool { return k.Auth.Kind == keystore.AuthNone }

// contentCodings returns the codings h's Content-Encoding lists, in the
// order they were applied, lower case, without identity.
func contentCodings(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c != "" && c != "identity" {
				out = append(out, c)
			}
		}
	}
	return out
}

// decodeAnswer checks what resp came as against what the request asked
// for, and decodes its body: it returns an error wrapping
// ErrRefusedAnswer for a coding mcp-quota did not ask for, or a partial
// answer (206) to a request that asked for the whole (ranged false).
// Otherwise resp's body reads decoded (failing with ErrAnswerTooLarge
// past limit bytes), its Content-Encoding and Content-Length are gone,
// and Uncompressed is set.
func decodeAnswer(resp *http.Response, method string, ranged bool, limit int64) error {
	if resp.StatusCode == http.StatusPartialContent && !ranged {
		return fmt.Errorf("%w: it answered %d Partial Content to a request that asked for the whole representation "+
			"(mcp-quota never asks this key's upstream for a range: a credential cut at a range's edge could not be removed)",
			ErrRefusedAnswer, resp.StatusCode)
	}
	codings := contentCodings(resp.Header)
	if len(codings) == 0 {
		return nil
	}
	for _, c := range codings {
		if c != "gzip" && c != "x-gzip" && c != "deflate" {
			return fmt.Errorf("%w: its body came in the content coding %q, which mcp-quota did not ask for and cannot read "+
				"(it asks for %s), so it cannot remove the key's credential from it", ErrRefusedAnswer, c, AcceptEncoding)
		}
	}
	if len(codings) > maxCodings {
		return fmt.Errorf("%w: its body came in %d content codings one on top of another (%s); mcp-quota decodes at most %d",
			ErrRefusedAnswer, len(codings), strings.Join(codings, ", "), maxCodings)
	}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	if method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified ||
		resp.StatusCode < 200 {
		return nil
	}
	if limit <= 0 {
		limit = DefaultMaxDecoded
	}
	resp.Body = &decodedBody{src: resp.Body, codings: codings, left: limit, limit: limit}
	return nil
}

// decodedBody reads a body through its content codings, undone in the
// reverse of the order they were applied. The decoders are made at the
// first read (a gzip reader reads its header when it is made).
type decodedBody struct {
	src     io.ReadCloser
	codings []string
	r       io.Reader
	err     error
	left    int64 // bytes that may still be read
	limit   int64
}

// Read reads the body decoded, its codings undone in the reverse of the
// order they were applied in, and fails with ErrAnswerTooLarge once it
// has more than its limit; an error, once met, is returned from then on.
func (b *decodedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.r == nil {
		r := io.Reader(b.src)
		for i := len(b.codings) - 1; i >= 0; i-- {
			d, err := decoder(b.codings[i], r)
			if err != nil {
				b.err = fmt.Errorf("the %s body could not be decoded: %w", b.codings[i], err)
				return 0, b.err
			}
			r = d
		}
		b.r = r
	}
	if b.left <= 0 {
		// One byte more tells a body of exactly the limit from a longer one.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.err = fmt.Errorf("%w (%d bytes)", ErrAnswerTooLarge, b.limit)
			return 0, b.err
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("the compressed body could not be decoded: %w", err)
		b.err = err
	}
	return n, err
}

func (b *decodedBody) Close() error { return b.src.Close() }

// decoder returns a reader of r decoded from coding: gzip, or deflate —
// the zlib format (RFC 9110 §8.4.1.2), or the raw deflate some servers
// send under that name.
func decoder(coding string, r io.Reader) (io.Reader, error) {
	switch coding {
	case "gzip", "x-gzip":
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		return z, nil
	case "deflate":
		br := bufio.NewReader(r)
		if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
			return zlib.NewReader(br)
		}
		return flate.NewReader(br), nil
	}
	return nil, fmt.Errorf("unknown content coding %q", coding)
}

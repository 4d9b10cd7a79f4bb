package rest

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/mcp-quota/mcp-quota/upstream"
)

// hangUp is a ResponseWriter whose caller went away after n bytes.
type hangUp struct {
	*httptest.ResponseRecorder
	left int
}

func (w *hangUp) Write(p []byte) (int, error) {
	if len(p) > w.left {
		return 0, syscall.EPIPE
	}
	w.left -= len(p)
	return w.ResponseRecorder.Write(p)
}

// brokenReader gives its text, then fails as a connection that broke.
type brokenReader struct{ r io.Reader }

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

// TestSendSaysWhichSideBroke: a caller that hangs up is not reported as an
// upstream whose answer broke off, and either report counts the bytes that
// went out.
func TestSendSaysWhichSideBroke(t *testing.T) {
	body := strings.Repeat("x", 100_000)
	stream := func(r io.Reader) *upstream.Response {
		return &upstream.Response{Response: &http.Response{StatusCode: 200, Body: io.NopCloser(r), ContentLength: -1}}
	}
	a := &answer{}
	err := a.send(&hangUp{ResponseRecorder: httptest.NewRecorder(), left: 40_000}, stream(strings.NewReader(body)), false)
	if !errors.Is(err, errCallerGone) || errors.Is(err, errAnswerBroken) || strings.Contains(err.Error(), "-1") {
		t.Errorf("a caller that hung up: %v; want errCallerGone with the bytes sent", err)
	}
	err = a.send(httptest.NewRecorder(), stream(&brokenReader{strings.NewReader(body)}), false)
	if !errors.Is(err, errAnswerBroken) || !strings.Contains(err.Error(), "after 100000 bytes") {
		t.Errorf("an upstream that broke off: %v; want errAnswerBroken after 100000 bytes", err)
	}
}

func TestFlushEach(t *testing.T) {
	for _, tt := range []struct {
		contentType string
		length      int64
		want        bool
	}{
		{"application/json", 300, false},
		{"text/event-stream", 300, true},
		{"Text/Event-Stream; charset=utf-8", 300, true},
		{" text/event-stream ;charset=utf-8", 0, true},
		{"text/event-streams", 300, false},
		{"", 300, false},
		{"application/json", -1, true},
	} {
		resp := &http.Response{Header: http.Header{"Content-Type": {tt.contentType}}, ContentLength: tt.length}
		if got := flushEach(resp); got != tt.want {
			t.Errorf("flushEach(%q, length %d) = %v, want %v", tt.contentType, tt.length, got, tt.want)
		}
	}
	// Asked twice of every answer the REST side passes on.
	resp := &http.Response{Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}}, ContentLength: 300}
	if n := testing.AllocsPerRun(100, func() { flushEach(resp) }); n != 0 {
		t.Errorf("flushEach allocates %v times, want none", n)
	}
}

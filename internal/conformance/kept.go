package conformance

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// kept: the last answer of each URL of a key.
var kept = []behaviour{
	{"a kept answer reads back whole, and a key keeps only its newest", keptResponses},
	{"an empty answer is kept as empty", emptyResponse},
}

func keptResponses(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	body := func(target string) []byte { return append([]byte(target), 0, 0xff, '\n') } // any bytes
	update(t, s, func(tx ledger.Tx) error {
		for i, target := range []string{"/a", "/b", "/c"} {
			r := ledger.StoredResponse{Key: "k", Target: target, ETag: `"e"`, Status: 200, ContentType: "application/json",
				Body: body(target), Digest: "d", StoredAt: t0.Add(time.Duration(i) * time.Second), Unchanged: i,
				Vary: "accept-language", Varied: "accept-language: " + target}
			if err := tx.PutResponse(r, 2); err != nil {
				return err
			}
		}
		// Another key's answers count against its own limit only.
		return tx.PutResponse(ledger.StoredResponse{Key: "other", Target: "/a", Status: 200, Body: []byte("x"), StoredAt: t0}, 2)
	})
	view(t, s, func(tx ledger.ReadTx) error {
		if _, ok, err := tx.Response("k", "/a"); ok || err != nil {
			t.Errorf("the oldest answer: kept (%v), want it gone beyond the limit of 2", err)
		}
		r, ok, err := tx.Response("k", "/c")
		want := ledger.StoredResponse{Key: "k", Target: "/c", ETag: `"e"`, Status: 200, ContentType: "application/json",
			Body: body("/c"), Digest: "d", StoredAt: t0.Add(2 * time.Second), Unchanged: 2,
			Vary: "accept-language", Varied: "accept-language: /c"}
		if diff := cmp.Diff(r, want); !ok || err != nil || diff != "" {
			t.Errorf("Response (-got +want):\n%s%v", diff, err)
		}
		if _, ok, err := tx.Response("other", "/a"); !ok || err != nil {
			t.Errorf("another key's answer: gone (%v), want it kept", err)
		}
		return nil
	})
	// The same URL again replaces its answer, and makes it the newest.
	update(t, s, func(tx ledger.Tx) error {
		return tx.PutResponse(ledger.StoredResponse{Key: "k", Target: "/b", LastModified: "Fri, 01 May 2026 12:00:00 GMT", Status: 200,
			Body: []byte("new"), Digest: "e", StoredAt: t0.Add(3 * time.Second)}, 2)
	})
	view(t, s, func(tx ledger.ReadTx) error {
		r, ok, err := tx.Response("k", "/b")
		if !ok || err != nil || !bytes.Equal(r.Body, []byte("new")) || r.ETag != "" || r.LastModified == "" {
			t.Errorf("an answer replaced: got %+v, %v, %v", r, ok, err)
		}
		if _, ok, _ := tx.Response("k", "/c"); !ok {
			t.Error("the other answer within the limit is gone")
		}
		return err
	})
}

// An answer with no body (nil or empty) is kept, and reads back empty.
func emptyResponse(t *testing.T, b Backend) {
	s, _ := b.fresh(t)
	for _, body := range [][]byte{nil, {}} {
		err := s.Update(t.Context(), func(tx ledger.Tx) error {
			return tx.PutResponse(ledger.StoredResponse{Key: "k", Target: "/empty", Status: 200, Body: body, StoredAt: t0}, 10)
		})
		if err != nil {
			t.Errorf("keeping an answer with body %#v: %v", body, err)
			continue
		}
		view(t, s, func(tx ledger.ReadTx) error {
			r, ok, err := tx.Response("k", "/empty")
			if !ok || len(r.Body) != 0 {
				t.Errorf("an answer with body %#v reads back %v, %q", body, ok, r.Body)
			}
			return err
		})
	}
}

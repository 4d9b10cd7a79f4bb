package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/leaktest"
	"github.com/mcp-quota/mcp-quota/keystore"
)

const (
	sharedSecret = "session-secret-SHARED-1b7e4c9a0f3d6e2b8a5c"
	otherSecret  = "session-secret-OTHER-6d2a9e4f1c8b3a7e0d5f"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// reencode decodes id, lets change alter its bytes and encodes them again.
func reencode(t *testing.T, id string, change func(raw []byte)) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil {
		t.Fatal(err)
	}
	change(raw)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func TestSessionIDCheck(t *testing.T) {
	ids := newSessionIDs(keystore.NewSecret(sharedSecret))
	id := ids.issue(t0, "a")
	if len(id) != 76 || strings.Trim(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
		t.Fatalf("issued %q (%d characters); want 76 of base64url", id, len(id))
	}
	if again := ids.issue(t0, "a"); again == id {
		t.Fatalf("two sessions issued at once have one ID %q", id)
	}
	// A host whose clock runs a little ahead issued this one.
	ahead := ids.issue(t0.Add(sessionClockSkew), "a")
	tests := []struct {
		name string
		ids  sessionIDs
		id   string
		now  time.Time
		want error
	}{
		{"issued here", ids, id, t0, nil},
		{"by another host with the secret", newSessionIDs(keystore.NewSecret(sharedSecret)), id, t0.Add(time.Hour), nil},
		{"a second before the end of its age", ids, id, t0.Add(SessionMaxAge - time.Second), nil},
		{"by a host whose clock is ahead", ids, ahead, t0, nil},

		{"another secret", newSessionIDs(keystore.NewSecret(otherSecret)), id, t0, errSessionTag},
		{"a random secret", newSessionIDs(keystore.Secret{}), id, t0, errSessionTag},
		{"random part changed", ids, reencode(t, id, func(b []byte) { b[20] ^= 1 }), t0, errSessionTag},
		{"issue time changed", ids, reencode(t, id, func(b []byte) { b[8] ^= 1 }), t0, errSessionTag},
		{"tag changed", ids, reencode(t, id, func(b []byte) { b[len(b)-1] ^= 0x80 }), t0, errSessionTag},
		{"tag of another ID", ids, reencode(t, id, func(b []byte) {
			other, _ := base64.RawURLEncoding.DecodeString(ids.issue(t0, "a"))
			copy(b[sessionSignedLen:], other[sessionSignedLen:])
		}), t0, errSessionTag},

		{"as old as the age allows", ids, id, t0.Add(SessionMaxAge), errSessionIssued},
		{"older", ids, id, t0.Add(30 * 24 * time.Hour), errSessionIssued},
		{"issued beyond the clock skew", ids, ids.issue(t0.Add(sessionClockSkew+time.Second), "a"), t0, errSessionIssued},

		{"empty", ids, "", t0, errSessionForm},
		{"a session ID of before", ids, "MF4KQ7ZNCXH6LJDAS2YOBWGVTU", t0, errSessionForm},
		{"cut short", ids, id[:75], t0, errSessionForm},
		{"one character more", ids, id + "A", t0, errSessionForm},
		{"padded", ids, id + "=", t0, errSessionForm},
		{"standard base64", ids, strings.NewReplacer("-", "+", "_", "/").Replace(id[:75]) + "+", t0, errSessionForm},
		{"another version", ids, reencode(t, id, func(b []byte) { b[0] = 1 }), t0, errSessionForm},
		{"in upper case", ids, strings.ToUpper(id), t0, errSessionForm}, // its version byte changes
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := tt.ids.check(tt.id, "a", tt.now)
			if !errors.Is(err, tt.want) {
				t.Fatalf("check: %v, want %v", err, tt.want)
			}
			if err == nil && !s.issued.Equal(t0) && !s.issued.Equal(t0.Add(sessionClockSkew)) {
				t.Errorf("issued %v, want %v", s.issued, t0)
			}
		})
	}
}

// TestSessionIDBoundToCaller: an ID checks out only for the caller it
// was issued to, on the host that issued it and on any other with the
// secret.
func TestSessionIDBoundToCaller(t *testing.T) {
	ids := newSessionIDs(keystore.NewSecret(sharedSecret))
	elsewhere := newSessionIDs(keystore.NewSecret(sharedSecret))
	id := ids.issue(t0, "a")
	for _, k := range []sessionIDs{ids, elsewhere} {
		if _, err := k.check(id, "a", t0); err != nil {
			t.Errorf("check by its caller: %v", err)
		}
		for _, other := range []string{"b", "ab", "", "A", "a "} {
			if _, err := k.check(id, other, t0); !errors.Is(err, errSessionTag) {
				t.Errorf("check by caller %q: %v, want %v", other, err, errSessionTag)
			}
		}
	}
	if noCaller := ids.issue(t0, ""); func() bool { _, err := ids.check(noCaller, "a", t0); return err == nil }() {
		t.Errorf("an ID issued to no caller checks out for caller a")
	}
}

// FuzzSessionID: check takes any text without panicking, and accepts only
// the IDs it issued, spelled as it spelled them.
func FuzzSessionID(f *testing.F) {
	ids := newSessionIDs(keystore.NewSecret(sharedSecret))
	// Issued as issue does, with a random part fixed so that every fuzz
	// process has the same one.
	raw := make([]byte, sessionSignedLen, sessionRawLen)
	raw[0] = sessionVersion
	binary.BigEndian.PutUint64(raw[sessionVersionLen:], uint64(t0.Unix()))
	copy(raw[sessionVersionLen+sessionIssuedLen:], "random part, 16B")
	id := sessionEncoding.EncodeToString(ids.sign(raw, "a"))
	for _, seed := range []string{id, id[:75], id + "=", strings.ToUpper(id), "", "mcp-session-0e1b5b2a-3f4c-4d6e-8a9b-1c2d3e4f5a6b",
		strings.Repeat("A", 76), strings.Repeat("_", 76), strings.Repeat("=", 76)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ids.check(s, "a", t0)
		if err != nil {
			return
		}
		if s != id || !got.issued.Equal(t0) {
			t.Errorf("check(%q) accepted it, issued %v; only %q was issued", s, got.issued, id)
		}
	})
}

// TestSessionSecretNeverPrinted formats everything that holds the
// session secret, or the key derived from it, in every way a log line or
// an error might, and finds neither.
func TestSessionSecretNeverPrinted(t *testing.T) {
	secret := keystore.NewSecret(sharedSecret)
	c := Config{SessionSecret: secret, SessionIdle: time.Minute}
	ss := newSessions(time.Minute, nil, secret)
	ss.open("a", nil)
	key := ss.ids.key.Reveal()
	var logged bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logged, nil))
	channels := map[string]string{}
	for name, v := range map[string]any{"Config": c, "*Config": &c, "sessions": ss, "sessionIDs": ss.ids} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			channels[name+" "+verb] = fmt.Sprintf(verb, v)
		}
		log.Info("formatting", "value", v)
	}
	channels["slog JSON"] = logged.String()
	leaktest.Scan(t, sharedSecret, channels)
	leaktest.Scan(t, key, channels)
}

package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// SessionMaxAge bounds how long after its initialize a session may be
// taken up by a gateway that has no record of it (see Config.SessionSecret):
// an older session lives on only where it is live, and elsewhere is
// answered 404, after which its client starts a new one.
const SessionMaxAge = 24 * time.Hour

// sessionClockSkew is how far ahead of this host's clock another host's
// may be: a session ID issued further in the future is refused.
const sessionClockSkew = time.Minute

// The sizes of a session ID's parts, in bytes.
const (
	sessionVersionLen = 1
	sessionIssuedLen  = 8
	sessionRandomLen  = 16
	sessionTagLen     = sha256.Size
	sessionSignedLen  = sessionVersionLen + sessionIssuedLen + sessionRandomLen
	sessionRawLen     = sessionSignedLen + sessionTagLen
)

// sessionIDLen is the length of every session ID: its 57 bytes are 76
// characters exactly, so there is no padding and one spelling of each.
var sessionIDLen = sessionEncoding.EncodedLen(sessionRawLen)

// sessionVersion is the first byte of every session ID of this format.
// (Version 1 signed no caller; its IDs are refused like any unknown one.)
const sessionVersion = 2

// sessionEncoding writes session IDs: base64url without padding.
var sessionEncoding = base64.RawURLEncoding

// sessionKeyLabel derives the key that signs session IDs from the shared
// secret, so that the secret itself signs nothing another use of it
// might sign too.
const sessionKeyLabel = "mcp-quota MCP session ID v2"

// sessionIDs issues and checks self-certifying session IDs:
//
//	session-id = base64url(version issued random tag)  ; RFC 4648 §5, no padding: 76 characters
//	version    = %x02
//	issued     = 8 bytes   ; when initialize opened it, Unix seconds, big-endian
//	random     = 16 bytes  ; from crypto/rand
//	tag        = 32 bytes  ; HMAC-SHA256(key, version issued random caller)
//	key        = HMAC-SHA256(secret, "mcp-quota MCP session ID v2")
//	caller     = the name of the caller whose initialize opened it (not in the ID)
//
// Any holder of the secret tells an ID issued with it from a forged one
// without a record of either, so every host that shares the secret
// accepts every session any of them opened — for the caller that opened
// it only: the tag checks out only with that caller's name, so a request
// in the session with another caller's token is refused by every host,
// as if the session were unknown, without a shared record. An ID is
// opaque to clients, safe in a URL or header, and tells nothing but when
// its session began (not whose it is). It grants nothing either: each
// request is authorized by its own caller token.
//
// The zero value is not usable; newSessionIDs returns one. It is
// immutable and safe for concurrent use.
type sessionIDs struct {
	key keystore.Secret
}

// newSessionIDs returns the IDs signed with secret; with the zero Secret,
// with a random secret of this process.
func newSessionIDs(secret keystore.Secret) sessionIDs {
	s := []byte(secret.Reveal())
	if len(s) == 0 {
		s = make([]byte, 32)
		rand.Read(s)
	}
	m := hmac.New(sha256.New, s)
	m.Write([]byte(sessionKeyLabel))
	return sessionIDs{key: keystore.NewSecret(string(m.Sum(nil)))}
}

// sessionID is what a session ID holds.
type sessionID struct {
	issued time.Time
	random [sessionRandomLen]byte
}

// expires returns when the ID stops being taken up where no record of it
// is kept.
func (s sessionID) expires() time.Time { return s.issued.Add(SessionMaxAge) }

// Why check refuses an ID. They are never shown: every refusal is the
// same 404.
var (
	errSessionForm   = errors.New("not a session ID of this format")
	errSessionTag    = errors.New("session ID not signed with this secret for this caller")
	errSessionIssued = errors.New("session ID issued too long ago or in the future")
)

// issue returns a new session ID issued at now to caller (a name).
func (k sessionIDs) issue(now time.Time, caller string) string {
	raw := make([]byte, sessionSignedLen, sessionRawLen)
	raw[0] = sessionVersion
	binary.BigEndian.PutUint64(raw[sessionVersionLen:], uint64(now.Unix()))
	rand.Read(raw[sessionVersionLen+sessionIssuedLen:])
	return sessionEncoding.EncodeToString(k.sign(raw, caller))
}

// parseSessionID returns what id holds, whether or not its tag is right.
func parseSessionID(id string) (sessionID, []byte, error) {
	if len(id) != sessionIDLen {
		return sessionID{}, nil, errSessionForm
	}
	raw, err := sessionEncoding.DecodeString(id)
	if err != nil || len(raw) != sessionRawLen || raw[0] != sessionVersion {
		return sessionID{}, nil, errSessionForm
	}
	s := sessionID{issued: time.Unix(int64(binary.BigEndian.Uint64(raw[sessionVersionLen:])), 0)}
	copy(s.random[:], raw[sessionVersionLen+sessionIssuedLen:])
	return s, raw, nil
}

// check returns what id holds when it is a session ID signed with this
// secret for caller (a name) and, at now, issued within SessionMaxAge (and
// not further ahead than another host's clock may be).
func (k sessionIDs) check(id, caller string, now time.Time) (sessionID, error) {
	s, raw, err := parseSessionID(id)
	if err != nil {
		return sessionID{}, err
	}
	if want := k.sign(raw[:sessionSignedLen:sessionSignedLen], caller); !hmac.Equal(raw, want) {
		return sessionID{}, errSessionTag
	}
	if !now.Before(s.expires()) || s.issued.After(now.Add(sessionClockSkew)) {
		return sessionID{}, errSessionIssued
	}
	return s, nil
}

// sign returns signed with its tag for caller appended. signed has a
// fixed length, so what follows it in the MAC is the caller's name alone.
func (k sessionIDs) sign(signed []byte, caller string) []byte {
	m := hmac.New(sha256.New, []byte(k.key.Reveal()))
	m.Write(signed)
	m.Write([]byte(caller))
	return m.Sum(signed)
}

package dashboard

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// CookieName is the session cookie's name. The cookie holds a random
// session ID — never the caller's token — and is HttpOnly (no script
// reads it), SameSite=Strict (no other site's page sends it), and Secure
// on a TLS listener or behind a trusted TLS proxy (Config.Secure).
const CookieName = "mcpq_session"

// Session settings.
const (
	SessionLifetime = 12 * time.Hour // a sign-in lasts this long
	// MaxSignInsPerCaller bounds one caller's sign-ins: a new one past it
	// forgets that caller's oldest, never another caller's.
	MaxSignInsPerCaller = 16
	// MaxSignIns bounds all sign-ins: a new one past it forgets the
	// oldest sign-in of the caller that holds the most (the new sign-in's
	// own caller when it is one of them), so one caller's sign-ins never
	// push out another's while that other holds fewer.
	MaxSignIns = 1024
)

// session is one browser signed in as a caller.
type session struct {
	caller  *keystore.Caller
	csrf    string // the anti-forgery token writes must carry
	expires time.Time
}

// sessions are the sign-ins this process gave out, by the hash of their
// ID (the ID itself is kept only by the browser), on clock (nil means
// real time). Safe for concurrent use.
type sessions struct {
	clock   clock.Clock
	perCall int // 0 means MaxSignInsPerCaller
	most    int // 0 means MaxSignIns
	mu      sync.Mutex
	m       map[[32]byte]*session
}

func newID() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// start signs a browser in as c and returns the session's ID.
func (s *sessions) start(c *keystore.Caller) (string, *session) {
	id := newID()
	se := &session{caller: c, csrf: newID(), expires: clock.Or(s.clock).Now().Add(SessionLifetime)}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := clock.Or(s.clock).Now()
	count := map[string]int{} // caller → live sign-ins
	for h, old := range s.m {
		if !now.Before(old.expires) {
			delete(s.m, h)
			continue
		}
		count[old.caller.Name]++
	}
	perCaller, most := cmp.Or(s.perCall, MaxSignInsPerCaller), cmp.Or(s.most, MaxSignIns)
	for count[c.Name] >= perCaller {
		s.forgetOldestLocked(c.Name, count)
	}
	for len(s.m) >= most {
		// The caller holding the most; the new sign-in's own on a tie.
		victim := c.Name
		for name, n := range count {
			if n > count[victim] {
				victim = name
			}
		}
		s.forgetOldestLocked(victim, count)
	}
	s.m[sha256.Sum256([]byte(id))] = se
	return id, se
}

// forgetOldestLocked forgets caller's oldest sign-in, and counts it out.
func (s *sessions) forgetOldestLocked(caller string, count map[string]int) {
	var oldest [32]byte
	found := false
	for h, se := range s.m {
		if se.caller.Name == caller && (!found || se.expires.Before(s.m[oldest].expires)) {
			oldest, found = h, true
		}
	}
	if !found { // nothing of caller's: forget nothing more of anyone's
		count[caller] = 0
		return
	}
	delete(s.m, oldest)
	count[caller]--
}

// find returns r's session, when its cookie names a live one.
func (s *sessions) find(r *http.Request) (*session, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return nil, false
	}
	h := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.m[h]
	if !ok {
		return nil, false
	}
	if !clock.Or(s.clock).Now().Before(se.expires) {
		delete(s.m, h)
		return nil, false
	}
	return se, true
}

// end forgets r's session.
func (s *sessions) end(r *http.Request) {
	if c, err := r.Cookie(CookieName); err == nil {
		s.mu.Lock()
		delete(s.m, sha256.Sum256([]byte(c.Value)))
		s.mu.Unlock()
	}
}

// readable are the paths a session cookie may read: the dashboard's data
// and the REST side's reports. It never spends a key (/k/), speaks MCP or
// serves /metrics: those need the caller's token itself.
func readable(path string) bool {
	return strings.HasPrefix(path, "/ui/api/") || path == "/v1/activity" || path == "/v1/quota"
}

// allows reports whether a request authenticated by se's cookie may be
// made: a read of readable data, or a write to the dashboard carrying the
// session's anti-forgery token in the X-CSRF-Token header.
func (se *session) allows(r *http.Request) bool {
	if !readable(r.URL.Path) {
		return false
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	got := r.Header.Get("X-CSRF-Token")
	return strings.HasPrefix(r.URL.Path, "/ui/api/") && got != "" &&
		subtle.ConstantTimeCompare([]byte(got), []byte(se.csrf)) == 1
}

// secureKey marks a request that reached mcp-quota over HTTPS
// (Config.Secure said so).
type secureKey struct{}

// setCookie sets the session cookie, Secure when r came over HTTPS (on a
// TLS listener, or as Config.Secure says).
func setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	secure, _ := r.Context().Value(secureKey{}).(bool)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure || r.TLS != nil})
}

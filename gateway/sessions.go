package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// DefaultSessionIdle is how long an MCP session lives without a request
// when Config.SessionIdle is zero.
const DefaultSessionIdle = time.Hour

// sessions keeps the MCP sessions that the initialize handshake of the
// revisions before 2026-07-28 opens, and ends each one idle for longer
// than idle. mcp-go keeps a session (about 12 KB) until its client sends
// DELETE, which many clients never do; without an end, a long-running
// serve only grows.
//
// It is the StreamableHTTPServer's SessionIdManager, and the handler in
// front of it (serve): a request naming a session that ended, or that was
// never opened here, is answered 404 Not Found, after which the client
// starts a new session, as the transport says. A session is idle while it
// has no request in flight (an open GET stream is one); it ends at the
// first request to the gateway after idle has passed, and its state in
// mcp-go is freed through the same DELETE a client would send. The
// 2026-07-28 revision has no sessions: its requests pass untouched.
//
// # Many hosts
//
// A session works on every host that shares the secret its ID is signed
// with (sessionIDs), with no lookup in a shared state: a host that gets a
// request naming a session it has no record of checks the ID and, when it
// is signed with this secret and was issued within SessionMaxAge, adopts
// the session — makes it live here, as if it had opened it. A forged or
// altered ID, or one signed with another secret, is refused like any
// unknown session. What a host knows of a session is its own:
//
//   - Idle expiry: each host ends the session once it has been idle there
//     for idle, and keeps its own last request. A client whose requests
//     alternate between hosts keeps the session alive on each.
//   - DELETE ends the session on the host that gets it. Another host that
//     has it live, or that never saw it, serves it until it idles out
//     there (or, unseen, until SessionMaxAge). A session grants nothing
//     — every request is authorized by its own caller token — so an
//     ended session served elsewhere costs only its memory, for idle.
//   - A session that ended here (idle or DELETE) is never adopted here
//     again: the host keeps the ID's random part until the ID expires,
//     SessionMaxAge after its issue (under 100 bytes a session, against
//     12 KB for a live one).
//
// mcp-go keeps, of a session, what initialize told it (the client's info
// and capabilities, the negotiated revision), the log level that
// logging/setLevel sets, per-session tools and resources (mcp-quota has
// none), the requests in flight that notifications/cancelled may cancel,
// and an open GET stream. On a host that adopted a session, mcp-go saw no
// initialize: it answers each POST through a session made for that
// request alone, whose Initialized is true (as every session of this
// transport's is), so tools/list, tools/call, resources/read and ping are
// answered as on the host that opened it, and a GET opens a stream as it
// does there. The revision, which it lacks, serves mcp-go only to tell
// 2026-07-28 requests from older ones, and a session's is always older.
// What holds on one host only: logging/setLevel (elsewhere the level
// stays mcp-go's default, error, so mcp-quota's warnings are not sent as
// log messages there), notifications/cancelled (it cancels a request only
// on the host that runs it), and a GET stream (it carries what its own
// host sends, which for mcp-quota is nothing: it sends no requests to
// clients, whose answers would have to reach the host that asked).
//
// # Whose a session is
//
// A session is its caller's: the caller whose initialize opened it is
// bound into its ID's tag (sessionIDs), and kept with it where it is
// live. A request naming the session with another caller's token — a
// call, a notifications/cancelled, a GET stream, a DELETE — is answered
// exactly as a request naming an unknown session is (404, the same
// sentence), on the host that opened it and on every other, which checks
// the tag with the caller of the request. So another caller who learns a
// session's ID can neither use it, nor end it, nor tell it from an ID
// never issued.
//
// # How many
//
// At most maxPerCaller sessions of one caller, and maxTotal in all, are
// live on a host at once (opened there or taken up from another host);
// an initialize past either bound is refused with a JSON-RPC error that
// says which bound and what to do, and opens nothing. Sessions beyond the
// bound are never kept, so a host holds at most maxTotal sessions (about
// 12 KB each in mcp-go, under 200 bytes here) however many initialize
// requests come. A host does not take up another's session past its
// bounds: it answers 404, and the client's new initialize is refused or
// served by the bounds as any other.
//
// Its methods are safe for concurrent use.
type sessions struct {
	idle         time.Duration
	clock        clock.Clock
	ids          sessionIDs
	maxTotal     int
	maxPerCaller int
	mcp          http.Handler // the StreamableHTTPServer, set once before use

	mu        sync.Mutex
	live      map[string]*sessionUse
	perCaller map[string]int                       // caller → sessions live, and initializes holding a place
	opening   int                                  // initializes holding a place, not yet live
	ended     map[[sessionRandomLen]byte]time.Time // sessions that ended here → when their IDs expire
	nextSweep time.Time
}

// Defaults of the sessions' bounds (Config.MaxSessions and
// Config.MaxSessionsPerCaller).
const (
	DefaultMaxSessions          = 1024
	DefaultMaxSessionsPerCaller = 64
)

// sessionUse is what is known of one live session.
type sessionUse struct {
	caller string    // the name of the caller whose session it is
	last   time.Time // when its latest request ended, or began while one is in flight
	busy   int       // its requests in flight, GET streams included
}

// newSessions returns the sessions that end after idle (0 means
// DefaultSessionIdle) on c (nil means real time), with IDs signed with
// secret (the zero Secret means a random one of this process), bounded by
// the default bounds.
func newSessions(idle time.Duration, c clock.Clock, secret keystore.Secret) *sessions {
	if idle <= 0 {
		idle = DefaultSessionIdle
	}
	return &sessions{idle: idle, clock: clock.Or(c), ids: newSessionIDs(secret),
		maxTotal: DefaultMaxSessions, maxPerCaller: DefaultMaxSessionsPerCaller,
		live: map[string]*sessionUse{}, perCaller: map[string]int{}, ended: map[[sessionRandomLen]byte]time.Time{}}
}

// callerName is the name of the caller ctx carries; "" for none.
func callerName(ctx context.Context) string {
	if c, ok := keystore.CallerFrom(ctx); ok {
		return c.Name
	}
	return ""
}

// A place is an initialize's claim on a session within the bounds, taken
// before mcp-go sees the request and given back unless a session was
// opened with it.
type place struct {
	caller string
	used   bool // guarded by sessions.mu
}

type placeKey struct{}

// errTooManySessions and errTooManyOfCaller say which bound an
// initialize is past.
var (
	errTooManySessions = errors.New("too many MCP sessions on this host")
	errTooManyOfCaller = errors.New("too many MCP sessions of this caller")
)

// reserve takes a place for a session of caller, when the bounds allow one.
func (ss *sessions) reserve(caller string) (*place, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.perCaller[caller] >= ss.maxPerCaller {
		return nil, errTooManyOfCaller
	}
	if len(ss.live)+ss.opening >= ss.maxTotal {
		return nil, errTooManySessions
	}
	ss.perCaller[caller]++
	ss.opening++
	return &place{caller: caller}, nil
}

// release gives back p unless a session was opened with it.
func (ss *sessions) release(p *place) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !p.used {
		p.used = true
		ss.opening--
		ss.dropLocked(p.caller)
	}
}

// dropLocked counts one session of caller less.
func (ss *sessions) dropLocked(caller string) {
	if ss.perCaller[caller]--; ss.perCaller[caller] <= 0 {
		delete(ss.perCaller, caller)
	}
}

// ResolveSessionIdManager returns the SessionIdManager mcp-go uses for r:
// the sessions as r's caller sees them (with no request, mcp-go's own
// clean-up, as no caller).
func (ss *sessions) ResolveSessionIdManager(r *http.Request) server.SessionIdManager {
	m := callerSessions{ss: ss}
	if r != nil {
		m.caller = callerName(r.Context())
		m.place, _ = r.Context().Value(placeKey{}).(*place)
	}
	return m
}

// callerSessions are the sessions as one request's caller sees them: the
// StreamableHTTPServer's SessionIdManager for that request.
type callerSessions struct {
	ss     *sessions
	caller string
	place  *place // the initialize's place, if it holds one
}

// Generate opens a session of the caller (mcp-go calls it for initialize).
func (m callerSessions) Generate() string {
	return m.ss.open(m.caller, m.place)
}

// errNoSession is what Validate says of a session that is not live.
var errNoSession = errors.New("no such MCP session")

// Validate reports whether id names a live session of the caller; mcp-go
// answers 404 when it does not.
func (m callerSessions) Validate(id string) (isTerminated bool, err error) {
	m.ss.mu.Lock()
	defer m.ss.mu.Unlock()
	if u, ok := m.ss.live[id]; !ok || u.caller != m.caller {
		return false, errNoSession
	}
	return false, nil
}

// Terminate ends session id here (a client's DELETE, which serve let
// through only from the session's caller, or the sweep's).
func (m callerSessions) Terminate(id string) (isNotAllowed bool, err error) {
	m.ss.mu.Lock()
	defer m.ss.mu.Unlock()
	m.ss.endLocked(id, m.ss.clock.Now())
	return false, nil
}

// open makes a new session of caller live and returns its ID, in the
// place p holds (nil: none was taken; the session counts all the same).
func (ss *sessions) open(caller string, p *place) string {
	now := ss.clock.Now()
	id := ss.ids.issue(now, caller)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if p != nil && !p.used {
		p.used = true
		ss.opening--
	} else {
		ss.perCaller[caller]++
	}
	ss.live[id] = &sessionUse{caller: caller, last: now}
	return id
}

// endLocked forgets session id and remembers that it ended here, for as
// long as its ID could be adopted.
func (ss *sessions) endLocked(id string, now time.Time) {
	if u, ok := ss.live[id]; ok {
		delete(ss.live, id)
		ss.dropLocked(u.caller)
	}
	if s, _, err := parseSessionID(id); err == nil && now.Before(s.expires()) {
		ss.ended[s.random] = s.expires()
	}
}

// count returns how many sessions are live.
func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.live)
}

// serve is the handler in front of the StreamableHTTPServer.
func (ss *sessions) serve(w http.ResponseWriter, r *http.Request) {
	ss.sweep()
	id := r.Header.Get(server.HeaderKeySessionID)
	caller := callerName(r.Context())
	if mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion)) {
		// 2026-07-28 and later: no sessions (mcp-go answers GET and DELETE 405).
		ss.mcp.ServeHTTP(w, r)
		return
	}
	switch opens, reqID := initializes(r); {
	case opens:
		// A new session, whatever the client still sends of its old one
		// (mcp-go ignores the header on initialize).
		p, err := ss.reserve(caller)
		if err != nil {
			ss.refuse(w, reqID, caller, err)
			return
		}
		defer ss.release(p)
		r = r.WithContext(context.WithValue(r.Context(), placeKey{}, p))
	case id == "" && r.Method == http.MethodGet:
		// A stream outside any session would carry nothing and never end:
		// the transport's answer for "no stream here" is 405.
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "mcp-quota offers no event stream outside a session: send initialize with POST, "+
			"then GET with its Mcp-Session-Id, or use POST alone.", http.StatusMethodNotAllowed)
		return
	case id != "":
		if !ss.enter(id, caller) && !ss.adopt(id, caller) {
			http.Error(w, fmt.Sprintf("The MCP session is not known here: it ended (after %s without a request, or with DELETE), "+
				"or another host opened it more than %s ago, or an mcp-quota that does not share this one's session secret "+
				"opened it (such as this one before it restarted, when none is shared). "+
				"Start a new one with initialize, without Mcp-Session-Id.",
				reason.Duration(ss.idle), reason.Duration(SessionMaxAge)),
				http.StatusNotFound)
			return
		}
		defer ss.leave(id)
	}
	ss.mcp.ServeHTTP(w, r)
}

// refuse answers an initialize past a bound (err says which) with a
// JSON-RPC error to that initialize, which clients show as the reason
// the connection failed.
func (ss *sessions) refuse(w http.ResponseWriter, reqID json.RawMessage, caller string, err error) {
	msg := fmt.Sprintf("This mcp-quota has %d MCP sessions open, the most it keeps at once, so it opens no new one now. "+
		"Try again once sessions end: a session ends when its client disconnects (DELETE /mcp), "+
		"or after %s without a request; whoever runs mcp-quota may raise the bound (serve --max-sessions).",
		ss.maxTotal, reason.Duration(ss.idle))
	if errors.Is(err, errTooManyOfCaller) {
		who := "This caller"
		if caller != "" {
			who = fmt.Sprintf("Caller '%s'", caller)
		}
		msg = fmt.Sprintf("%s has %d MCP sessions open, the most one caller may have at once, so no new one is opened. "+
			"End sessions you no longer use (disconnect their clients, which sends DELETE /mcp), "+
			"or wait until one has had no request for %s; whoever runs mcp-quota may raise the bound "+
			"(serve --max-sessions-per-caller).", who, ss.maxPerCaller, reason.Duration(ss.idle))
	}
	if len(reqID) == 0 {
		reqID = json.RawMessage("null")
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": reqID,
		"error": map[string]any{"code": mcp.INTERNAL_ERROR, "message": msg, "data": map[string]string{"code": "tooManySessions"}}})
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// initializes reports whether r is a POST whose body is an initialize
// request, and its ID; it leaves the body to be read again.
func initializes(r *http.Request) (bool, json.RawMessage) {
	if r.Method != http.MethodPost || r.Body == nil {
		return false, nil
	}
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), errReader{err}))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if err != nil || json.Unmarshal(b, &msg) != nil || msg.Method != string(mcp.MethodInitialize) {
		return false, nil
	}
	return true, msg.ID
}

// errReader returns err (io.EOF when nil) from every Read: what is left
// of a body whose reading failed.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err == nil {
		return 0, io.EOF
	}
	return 0, e.err
}

// enter marks a request of session id in flight, and reports whether id
// is live here as caller's session. A session idle for too long ends
// here, whether or not the sweep has come by.
func (ss *sessions) enter(id, caller string) bool {
	now := ss.clock.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.enterLocked(id, caller, now)
}

func (ss *sessions) enterLocked(id, caller string, now time.Time) bool {
	u, ok := ss.live[id]
	if !ok || u.caller != caller {
		return false
	}
	if u.busy == 0 && now.Sub(u.last) >= ss.idle {
		return false // the sweep frees it in mcp-go
	}
	u.busy++
	u.last = now
	return true
}

// adopt makes session id live here and marks a request of it in flight,
// when id is a session ID another host (or this one, before it forgot)
// issued to caller with this secret within SessionMaxAge, the session has
// not ended here, and the bounds leave room for it; it reports whether
// id is live.
func (ss *sessions) adopt(id, caller string) bool {
	now := ss.clock.Now()
	s, err := ss.ids.check(id, caller, now)
	if err != nil {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, ok := ss.live[id]; ok {
		return ss.enterLocked(id, caller, now) // adopted meanwhile, or idle for too long
	}
	if _, ok := ss.ended[s.random]; ok {
		return false
	}
	if ss.perCaller[caller] >= ss.maxPerCaller || len(ss.live)+ss.opening >= ss.maxTotal {
		return false
	}
	ss.live[id] = &sessionUse{caller: caller, last: now, busy: 1}
	ss.perCaller[caller]++
	return true
}

// leave marks a request of session id done.
func (ss *sessions) leave(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if u, ok := ss.live[id]; ok {
		u.busy--
		u.last = ss.clock.Now()
	}
}

// sweep ends the sessions idle for idle or longer, and forgets those
// that ended here once their IDs expire, at most once in a tenth of idle
// (and once a second at most).
func (ss *sessions) sweep() {
	now := ss.clock.Now()
	ss.mu.Lock()
	if now.Before(ss.nextSweep) {
		ss.mu.Unlock()
		return
	}
	ss.nextSweep = now.Add(max(ss.idle/10, time.Second))
	var ended []string
	for id, u := range ss.live {
		if u.busy == 0 && now.Sub(u.last) >= ss.idle {
			ss.endLocked(id, now)
			ended = append(ended, id)
		}
	}
	for random, expires := range ss.ended {
		if !now.Before(expires) {
			delete(ss.ended, random)
		}
	}
	ss.mu.Unlock()
	for _, id := range ended {
		ss.end(id)
	}
}

// end frees session id in mcp-go: its transport keeps a session's state
// until a DELETE names it, so one is sent to it.
func (ss *sessions) end(id string) {
	r, err := http.NewRequestWithContext(context.Background(), http.MethodDelete, "/mcp", nil)
	if err != nil {
		panic(err) // a constant request
	}
	r.Header.Set(server.HeaderKeySessionID, id)
	ss.mcp.ServeHTTP(discard{http.Header{}}, r)
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{ h http.Header }

func (d discard) Header() http.Header         { return d.h }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}

package demo

import "time"

// A key is what the API keeps for one token: its servers' windows, whose
// turn is next, and what it saw.
type key struct {
	id      int // 1, 2, … in the order the API first saw the keys
	next    int // index of the server the next request goes to
	servers []*server
	stats   Stats
}

// A server is one of the API's servers as one key sees it: a window per
// policy, each admitting the server's share of the policy's quota.
type server struct {
	windows []*window
}

// A window counts one policy's calls on one server. A fixed window starts
// with the first call after the previous one ended; a sliding window
// keeps the times of the calls it still counts.
type window struct {
	name    string        // the policy's name in RateLimit-Policy
	quota   int           // the policy's quota for the whole key (q)
	share   int           // the calls this server admits per window
	servers int           // how many servers share the quota
	length  time.Duration // w
	sliding bool

	start time.Time   // fixed: start of the current window; zero before its first call
	n     int         // fixed: calls counted in the current window
	log   []time.Time // sliding: times of counted calls, oldest first
}

// A decision is what one request's admission came to.
type decision struct {
	allowed    bool
	keyID      int
	policies   []status      // per policy, after the call (if it was admitted)
	binding    int           // index in policies of the one that refused (the longest wait)
	retryAfter time.Duration // >0 when refused: until the refusing policies admit again
}

// A status is what a policy looks like to the caller of one request.
type status struct {
	name      string
	quota     int           // q
	window    time.Duration // w
	remaining int           // r, as the answering server reports it
	reset     time.Time     // when r next grows (end of the fixed window, or oldest call's expiry)
}

// newKey returns the state of a key first seen as the id-th, with every
// window empty.
func newKey(cfg Config, id int) *key {
	type policy struct {
		name    string
		quota   int
		length  time.Duration
		sliding bool
	}
	var policies []policy
	switch cfg.Mode {
	case HiddenLong:
		policies = []policy{
			{"minute", cfg.Quota, cfg.Window, false},
			{"hour", cfg.LongQuota, cfg.LongWindow, false},
		}
	case Sliding:
		policies = []policy{{"default", cfg.Quota, cfg.Window, true}}
	default:
		policies = []policy{{"default", cfg.Quota, cfg.Window, false}}
	}
	k := &key{id: id, servers: make([]*server, cfg.Servers)}
	for i := range k.servers {
		s := &server{}
		for _, p := range policies {
			share := p.quota / cfg.Servers
			if i < p.quota%cfg.Servers {
				share++
			}
			s.windows = append(s.windows, &window{
				name: p.name, quota: p.quota, share: share, servers: cfg.Servers,
				length: p.length, sliding: p.sliding,
			})
		}
		k.servers[i] = s
	}
	return k
}

// admit sends one request of the key, at now, to the server whose turn
// it is. The call is counted in every window if all of them have room,
// and in none otherwise.
func (k *key) admit(now time.Time) decision {
	s := k.servers[k.next]
	k.next = (k.next + 1) % len(k.servers)

	d := decision{allowed: true, keyID: k.id}
	for _, w := range s.windows {
		w.expire(now)
	}
	for i, w := range s.windows {
		if w.used() < w.share {
			continue
		}
		d.allowed = false
		if wait := w.resetAt().Sub(now); wait > d.retryAfter {
			d.retryAfter, d.binding = wait, i
		}
	}
	for _, w := range s.windows {
		if d.allowed {
			w.add(now)
		}
		d.policies = append(d.policies, w.status(now))
	}
	return d
}

// expire ends the current fixed window, or drops the calls of a sliding
// one, that are over at now: a call at s is counted in [s, s+length).
func (w *window) expire(now time.Time) {
	if w.sliding {
		i := 0
		for i < len(w.log) && !now.Before(w.log[i].Add(w.length)) {
			i++
		}
		w.log = append(w.log[:0], w.log[i:]...)
		return
	}
	if !w.start.IsZero() && !now.Before(w.start.Add(w.length)) {
		w.start, w.n = time.Time{}, 0
	}
}

func (w *window) used() int {
	if w.sliding {
		return len(w.log)
	}
	return w.n
}

func (w *window) add(now time.Time) {
	if w.sliding {
		w.log = append(w.log, now)
		return
	}
	if w.start.IsZero() {
		w.start = now
	}
	w.n++
}

// resetAt returns when the window next admits more calls: the end of a
// fixed window, the expiry of a sliding window's oldest call. It is only
// meaningful when the window counts at least one call.
func (w *window) resetAt() time.Time {
	if w.sliding {
		if len(w.log) == 0 {
			return time.Time{}
		}
		return w.log[0].Add(w.length)
	}
	return w.start.Add(w.length)
}

// status returns what the window tells at now. An empty window tells
// a full quota and a whole window, as if one began now.
func (w *window) status(now time.Time) status {
	reset := now.Add(w.length)
	if w.used() > 0 {
		reset = w.resetAt()
	}
	left := (w.share - w.used()) * w.servers
	return status{
		name:      w.name,
		quota:     w.quota,
		window:    w.length,
		remaining: max(0, min(w.quota, left)),
		reset:     reset,
	}
}

// closest returns the index of the policy closest to exhaustion: the
// fewest calls left and, among those, the longest wait.
func closest(ps []status) int {
	best := 0
	for i, p := range ps[1:] {
		b := ps[best]
		if p.remaining < b.remaining || (p.remaining == b.remaining && p.reset.After(b.reset)) {
			best = i + 1
		}
	}
	return best
}

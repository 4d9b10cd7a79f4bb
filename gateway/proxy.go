package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// The fields a reverse proxy in front of mcp-quota sets, read only from a
// proxy named in Config.TrustedProxies: anyone else could write them.
const (
	headerForwardedProto = "X-Forwarded-Proto"
	headerForwardedFor   = "X-Forwarded-For"
)

type secureKey struct{}

// Secure reports whether r reached mcp-quota over TLS: on a TLS listener,
// or through a trusted proxy (Config.TrustedProxies) that says the client
// spoke HTTPS to it. The gateway marks such requests; anything else is
// judged by r.TLS alone. A dashboard's cookie is Secure when it is.
func Secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	secure, _ := r.Context().Value(secureKey{}).(bool)
	return secure
}

// ParseProxies reads a comma-separated list of addresses and CIDR
// prefixes (such as "10.0.0.5, 192.168.0.0/16, ::1") as trusted proxies.
func ParseProxies(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q is neither an IP address nor a CIDR prefix (like 10.0.0.5 or 10.0.0.0/8)", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// trustedProxy reports whether addr (an http.Request's RemoteAddr, or an
// address) is one of the trusted proxies.
func (g *gate) trustedProxy(addr string) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return false
		}
		a = ap.Addr()
	}
	a = a.Unmap()
	return slices.ContainsFunc(g.c.TrustedProxies, func(p netip.Prefix) bool { return p.Contains(a) })
}

// proxied takes, from a request a trusted proxy forwards, what the proxy
// says of its client: whether it spoke HTTPS (X-Forwarded-Proto, as the
// nearest proxy set it), and its address (the nearest address in
// X-Forwarded-For that is not itself a trusted proxy), which the bad-token
// throttle then counts by. From anyone else these fields mean nothing.
func (g *gate) proxied(next http.Handler) http.Handler {
	if len(g.c.TrustedProxies) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.trustedProxy(r.RemoteAddr) {
			next.ServeHTTP(w, r)
			return
		}
		if proto := last(r.Header.Values(headerForwardedProto)); strings.EqualFold(proto, "https") {
			r = r.WithContext(context.WithValue(r.Context(), secureKey{}, true))
		}
		hops := strings.Split(strings.Join(r.Header.Values(headerForwardedFor), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a garbled list: keep the proxy's own address
			}
			if !g.trustedProxy(a.String()) {
				r = r.Clone(r.Context())
				r.RemoteAddr = netip.AddrPortFrom(a.Unmap(), 0).String()
				break
			}
		}
		next.ServeHTTP(w, r)
	})
}

// last returns the last element of a comma-separated field's values.
func last(values []string) string {
	if len(values) == 0 {
		return ""
	}
	v := values[len(values)-1]
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.TrimSpace(v)
}

// nosniff marks every answer X-Content-Type-Options: nosniff, so no
// browser reads a JSON or problem answer (or an upstream's body) as
// anything but the type it is labelled with.
func nosniff(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		next.ServeHTTP(w, r)
	})
}

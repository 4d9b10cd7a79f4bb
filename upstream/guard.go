package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrForbiddenAddress reports a connection refused because its address is
// in a private, loopback, link-local or otherwise internal range.
var ErrForbiddenAddress = errors.New("forbidden address")

// internal are the ranges a key may not reach unless its own base URL is
// in one: private, loopback, link-local (with cloud metadata), carrier
// NAT, benchmarking, documentation, multicast and the like.
var internal = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("::/96"), // unspecified, loopback and the deprecated IPv4-compatible forms
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// metadata are cloud metadata endpoints (AWS, ECS/EKS, GCP and Azure
// share 169.254.169.254; Alibaba; Oracle), refused even to keys allowed
// internal addresses.
var metadata = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"),
	netip.MustParseAddr("169.254.170.2"),
	netip.MustParseAddr("169.254.170.23"),
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("fd00:ec2::23"),
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("192.0.0.192"),
}

// isInternal reports whether a is in an internal range. IPv4-mapped IPv6
// addresses (::ffff:127.0.0.1) are judged by the IPv4 address they carry.
func isInternal(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return true
	}
	for _, p := range internal {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// allowsInternal reports whether a key with this base URL may reach
// internal addresses: only when its base URL itself names one — an
// internal IP literal or "localhost" (a local upstream, such as the
// demo's). Any other name is a public name, whatever it resolves to.
func allowsInternal(base *url.URL) bool {
	h := strings.TrimSuffix(base.Hostname(), ".")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && isInternal(a)
}

// guardControl checks the address a connection is about to be made to —
// after DNS resolution, so a name that rebinds to an internal address is
// refused at connect time.
func guardControl(allowInternal bool) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: cannot parse %s", ErrForbiddenAddress, address)
		}
		a := ap.Addr().Unmap().WithZone("")
		for _, m := range metadata {
			if a == m {
				return fmt.Errorf("%w: %s is a cloud metadata endpoint", ErrForbiddenAddress, a)
			}
		}
		if !allowInternal && isInternal(a) {
			return fmt.Errorf("%w: %s is an internal address", ErrForbiddenAddress, a)
		}
		return nil
	}
}

// Timeouts of the upstream side.
const (
	DialTimeout           = 10 * time.Second
	TLSHandshakeTimeout   = 10 * time.Second
	ResponseHeaderTimeout = 60 * time.Second
)

// MaxResponseHeaderBytes bounds the header section of an upstream's
// answer.
const MaxResponseHeaderBytes = 1 << 20

// newTransport returns the transport one key's attempts go through. It
// never uses a proxy from the environment: the connect-time address check
// must see the upstream's own address.
func newTransport(base *url.URL) *http.Transport {
	return guardedTransport(base, nil)
}

// guardedTransport is newTransport with names resolved by resolver (nil
// means net.DefaultResolver). Whatever a name resolves to, the address
// checked is the one the connection is made to.
func guardedTransport(base *url.URL, resolver *net.Resolver) *http.Transport {
	d := &net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second, Resolver: resolver,
		Control: guardControl(allowsInternal(base))}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           256, // over every host the keys name
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    TLSHandshakeTimeout,
		ResponseHeaderTimeout:  ResponseHeaderTimeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
}

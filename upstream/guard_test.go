package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/state"
)

func TestIsInternal(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.254", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true},
		{"100.64.0.1", true},
		{"0.0.0.0", true},
		{"224.0.0.1", true},
		{"255.255.255.255", true},
		{"198.18.0.1", true},
		{"::1", true},
		{"::", true},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"fc00::1", true},
		{"fd00:ec2::254", true},
		{"ff02::1", true},
		{"::ffff:127.0.0.1", true}, // IPv4-mapped
		{"::ffff:10.0.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"::127.0.0.1", true},           // IPv4-compatible (deprecated)
		{"64:ff9b::7f00:1", true},       // NAT64 of 127.0.0.1
		{"64:ff9b:1::a00:1", true},      // local-use NAT64
		{"2001:db8::1", true},           // documentation
		{"8.8.8.8", false},              // public
		{"1.1.1.1", false},              // public
		{"172.32.0.1", false},           // just past 172.16/12
		{"::ffff:8.8.8.8", false},       // IPv4-mapped public
		{"2606:4700:4700::1111", false}, // public IPv6
	}
	for _, tt := range tests {
		if got := isInternal(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("isInternal(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

func TestAllowsInternal(t *testing.T) {
	tests := []struct {
		base string
		want bool
	}{
		{"http://127.0.0.1:8788/", true},
		{"http://localhost:8788/", true},
		{"http://LOCALHOST/", true},
		{"http://localhost./", true},
		{"http://[::1]:8788/", true},
		{"http://10.0.0.5/", true},
		{"http://[::ffff:127.0.0.1]/", true},
		{"https://api.example.com/", false},
		{"https://localhost.example.com/", false},
		{"https://api.localhost/", false}, // a name, however it resolves
		{"https://127.0.0.1.nip.io/", false},
		{"https://8.8.8.8/", false},
	}
	for _, tt := range tests {
		if got := allowsInternal(mustURL(t, tt.base)); got != tt.want {
			t.Errorf("allowsInternal(%s) = %v, want %v", tt.base, got, tt.want)
		}
	}
}

func TestGuardControl(t *testing.T) {
	tests := []struct {
		address       string
		allowInternal bool
		wantErr       bool
	}{
		{"93.184.215.14:443", false, false},
		{"[2606:4700:4700::1111]:443", false, false},
		{"127.0.0.1:80", false, true},
		{"[::1]:80", false, true},
		{"[::ffff:127.0.0.1]:80", false, true},
		{"10.0.0.1:80", false, true},
		{"[fe80::1%eth0]:80", false, true},
		{"169.254.169.254:80", false, true},
		{"0.0.0.0:80", false, true},
		{"127.0.0.1:80", true, false},
		{"10.0.0.1:80", true, false},
		{"[::1]:80", true, false},
		// Metadata endpoints are refused even to keys allowed internal
		// addresses, in every form.
		{"169.254.169.254:80", true, true},
		{"[::ffff:169.254.169.254]:80", true, true},
		{"[fd00:ec2::254]:80", true, true},
		{"[fd00:ec2::254%eth0]:80", true, true},
		{"169.254.170.2:80", true, true},
		{"100.100.100.200:80", true, true},
		{"not-an-address", true, true},
	}
	for _, tt := range tests {
		err := guardControl(tt.allowInternal)("tcp", tt.address, nil)
		if (err != nil) != tt.wantErr {
			t.Errorf("guardControl(%v)(%s) = %v, want error %v", tt.allowInternal, tt.address, err, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrForbiddenAddress) {
			t.Errorf("guardControl(%v)(%s) = %v, want an error matching ErrForbiddenAddress", tt.allowInternal, tt.address, err)
		}
	}
}

// TestGuardRefusesANameThatResolvesInside is the DNS rebinding case end
// to end: a key whose base URL names a public host, whose name resolves
// (through a real resolver, at connect time) to 127.0.0.1 where an
// upstream listens. The connection is refused and the upstream gets
// nothing; the same upstream reached through a key whose base URL is
// 127.0.0.1 answers.
func TestGuardRefusesANameThatResolvesInside(t *testing.T) {
	api := demo.New(demo.Config{Tokens: []string{guardSecret}})
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	resolver := fakeResolver(t, map[string]netip.Addr{"api.example.test.": netip.MustParseAddr("127.0.0.1")})

	// The resolver is real: it does resolve the name to the listener.
	addrs, err := resolver.LookupHost(context.Background(), "api.example.test")
	if err != nil || len(addrs) != 1 || addrs[0] != "127.0.0.1" {
		t.Fatalf("LookupHost = %v, %v; want [127.0.0.1]", addrs, err)
	}

	for _, tt := range []struct {
		base    string
		wantErr error
	}{
		{"http://api.example.test:" + port + "/", ErrForbiddenAddress},
		{"http://api.example.test.:" + port + "/", ErrForbiddenAddress},
		{srv.URL + "/", nil},
	} {
		t.Run(tt.base, func(t *testing.T) {
			api.Reset()
			k := guardKey(t, tt.base)
			c := New(pacer.New(guardDB(t)), nil)
			c.Transport = guardedTransport(k.BaseURL, resolver)
			resp, err := c.Do(context.Background(), k, Request{Caller: "test", Transport: "rest", Path: "/v1/participants?limit=1", MaxWait: time.Second})
			if resp != nil {
				resp.Body.Close()
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Do = %v, want %v", err, tt.wantErr)
			}
			want := 1
			if tt.wantErr != nil {
				want = 0
			}
			if got := api.Stats(guardSecret).Requests; got != want {
				t.Errorf("the upstream got %d requests, want %d", got, want)
			}
		})
	}
}

const guardSecret = "guard-test-secret-5e1f2a"

func guardKey(t *testing.T, base string) *keystore.Key {
	t.Helper()
	cfg := testkit.Keys(testkit.Key{Name: "k", BaseURL: base, SecretEnv: "S", MaxRate: 1000})
	s, err := keystore.Parse([]byte(cfg), keystore.Env{Getenv: func(string) string { return guardSecret }})
	if err != nil {
		t.Fatal(err)
	}
	return s.Keys()[0]
}

func guardDB(t *testing.T) *state.DB {
	t.Helper()
	db := testkit.OpenState(t, state.Open)
	return db
}

// fakeResolver returns a Go resolver that asks a DNS server on loopback
// which knows only names (fully qualified) and answers NXDOMAIN to the
// rest. Only A questions get answers.
func fakeResolver(t *testing.T, names map[string]netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := dnsAnswer(buf[:n], names); out != nil {
				pc.WriteTo(out, from)
			}
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// dnsAnswer answers one DNS query (RFC 1035 §4.1) with a single A record
// for a known name, no records for other types of a known name, and
// NXDOMAIN otherwise; nil for what is not a query.
func dnsAnswer(q []byte, names map[string]netip.Addr) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var name strings.Builder
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if i+1+l > len(q) {
			return nil
		}
		name.WriteString(strings.ToLower(string(q[i+1 : i+1+l])))
		name.WriteByte('.')
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	question := q[12 : i+5]
	addr, known := names[name.String()]
	out := make([]byte, 12, 64)
	copy(out, q[:2])        // the ID
	flags := uint16(0x8180) // a response, recursion desired and available
	if !known {
		flags |= 3 // NXDOMAIN
	}
	binary.BigEndian.PutUint16(out[2:], flags)
	binary.BigEndian.PutUint16(out[4:], 1)
	out = append(out, question...)
	if known && qtype == 1 && addr.Is4() {
		binary.BigEndian.PutUint16(out[6:], 1)
		a := addr.As4()
		out = append(out, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		out = append(out, a[:]...)
	}
	return out
}

// The guarded transport never goes through a proxy from the environment
// (the address check would see the proxy's address), and bounds what an
// upstream may send.
func TestGuardedTransportHasNoProxy(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://proxy.invalid:3128")
	t.Setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
	tr := guardedTransport(mustURL(t, "https://api.example.com/"), nil)
	if tr.Proxy != nil {
		req, _ := http.NewRequest("GET", "https://api.example.com/", nil)
		if u, _ := tr.Proxy(req); u != nil {
			t.Errorf("the transport goes through proxy %s: the address check would see the proxy", u)
		}
	}
	if tr.MaxResponseHeaderBytes != MaxResponseHeaderBytes || tr.ResponseHeaderTimeout == 0 || tr.TLSHandshakeTimeout == 0 {
		t.Errorf("transport limits not set: %+v", tr)
	}
}

package demo_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/demo"
)

// Example starts the seed's API on loopback with a stopped clock and
// spends a key's quota of three calls.
func Example() {
	stopped := clock.Source(func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) })
	api := demo.New(demo.Config{Quota: 3, Clock: stopped})
	srv := httptest.NewServer(api)
	defer srv.Close()

	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/participants?limit=500", nil)
		req.Header.Set("Authorization", "Bearer demo-key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.Status, res.Header.Get("RateLimit"))
		if res.StatusCode != http.StatusOK {
			fmt.Println("Retry-After:", res.Header.Get("Retry-After"))
			fmt.Println(string(body))
		}
	}
	fmt.Println("accepted:", len(api.Stats("demo-key").Accepted))
	// Output:
	// 200 OK "default";r=2;t=60
	// 200 OK "default";r=1;t=60
	// 200 OK "default";r=0;t=60
	// 429 Too Many Requests "default";r=0;t=60
	// Retry-After: 60
	// {"status":429,"code":"rateLimited","detail":"This key made more than 3 calls in a minute. Try again in 60 seconds; the RateLimit header says what is left."}
	// accepted: 3
}

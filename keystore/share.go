package keystore

import (
	"fmt"
	"math"
	"strings"
)

// A Share caps what one principal may spend of a key: at most Share of
// the quota of each of the key's windowed policies per window, counted
// over every host sharing the state. A key with shares also serves the
// principals waiting for it in turn, weighted by their shares, rather
// than whoever asks first.
//
// Principal "*" is every principal the key has no entry of its own for.
type Share struct {
	Principal string
	Share     float64 // in (0, 1]; 1 caps nothing, but still weighs the turns
}

// AnyPrincipal is the Share.Principal that stands for every principal
// without an entry of its own.
const AnyPrincipal = "*"

type shareConfig struct {
	Principal string  `toml:"principal"`
	Share     float64 `toml:"share"`
}

// Fair reports whether k's principals take turns and have caps: whether
// it has shares.
func (k *Key) Fair() bool { return len(k.Shares) > 0 }

// ShareOf returns principal's share of k: its own entry, else the entry
// for every principal ("*"), else 1 (no cap, the weight of a whole).
// capped says whether an entry below 1 applies.
func (k *Key) ShareOf(principal string) (share float64, capped bool) {
	share = 1
	for _, s := range k.Shares {
		if s.Principal == principal {
			return s.Share, s.Share < 1
		}
		if s.Principal == AnyPrincipal {
			share = s.Share
		}
	}
	return share, share < 1
}

// PrincipalOf is the principal a caller name speaks for: the name before
// " via " (a person's token names the client it came through, and the
// person's share is the same through every client), or the whole name.
func PrincipalOf(caller string) string {
	p, _, _ := strings.Cut(caller, " via ")
	return p
}

// parseShares checks a key's [[keys.share]] entries.
func parseShares(scs []shareConfig, bad func(field, msg string)) []Share {
	var out []Share
	seen := map[string]bool{}
	for j, sc := range scs {
		f := fmt.Sprintf("share[%d]", j)
		switch {
		case strings.TrimSpace(sc.Principal) == "":
			bad(f, `name the principal the share is for, as the activity shows it (e.g. principal = "nightly-sync"), or "*" for every principal`)
			continue
		case strings.Contains(sc.Principal, " via "):
			bad(f, fmt.Sprintf("%q names a client too: a share is the principal's, whatever client it calls through; write %q", sc.Principal, PrincipalOf(sc.Principal)))
			continue
		case !(sc.Share > 0 && sc.Share <= 1) || math.IsNaN(sc.Share):
			bad(f, "a share is a part of the key's budget between 0 and 1, e.g. share = 0.4 (at most 40% of each policy per window)")
			continue
		case seen[sc.Principal]:
			bad(f, fmt.Sprintf("principal %q has two shares of this key", sc.Principal))
			continue
		}
		seen[sc.Principal] = true
		out = append(out, Share(sc))
	}
	return out
}

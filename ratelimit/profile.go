package ratelimit

// A profileReader is one row of the profile table: what a profile reads
// beyond the fields every profile reads (Retry-After, the draft fields,
// problem details, a google.rpc.Status body, prose hints). A nil function
// reads nothing of its kind.
type profileReader struct {
	// vendor reads the profile's own fields into observations.
	vendor func(*reader)
	// waits reads the profile's variants of Retry-After (retry-after-ms,
	// a body's retry_after) and explicit retry verdicts.
	waits func(*reader)
	// body reads the throttling the profile's bodies report (GraphQL
	// errors and costs, Slack's "ok": false).
	body func(*reader)
	// ownsDraft03 says the profile's fields reuse the names of the draft's
	// -00 to -06 fields with another meaning (GitLab): those are then
	// read by vendor alone.
	ownsDraft03 bool
	// beta says the profile sends the draft-11 fields twice, the second
	// pair with a Beta- prefix (Jira).
	beta bool
	// successBody says 2xx bodies carry signals (see ReadsSuccessBody).
	successBody bool
	// partitionsByRoute says each partition the profile reads belongs to
	// the routes that reported it (see PartitionsByRoute).
	partitionsByRoute bool
}

// profileTable holds what each profile reads. Read consults it in one
// place per kind of signal; adding a profile is adding a row.
var profileTable = map[Profile]profileReader{
	Generic: {
		vendor: func(rd *reader) { rd.readXRateLimit(Generic, rd.guessedReset) },
		waits:  func(rd *reader) { rd.readShouldRetry("Stripe-Should-Retry") },
	},
	IETF: {
		vendor: func(rd *reader) { rd.readXRateLimit(IETF, rd.deltaReset) },
	},
	GitHub: {
		vendor: (*reader).readGitHub,
		body: func(rd *reader) {
			rd.readGraphQLThrottle(func(e graphQLError) bool { return e.Type == "RATE_LIMITED" })
		},
		successBody: true,
	},
	OpenAI: {
		vendor: (*reader).readOpenAI,
		waits:  (*reader).readMillisWaits,
	},
	Anthropic: {
		vendor: (*reader).readAnthropic,
		waits:  (*reader).readMillisWaits,
	},
	Discord: {
		vendor:            (*reader).readDiscord,
		waits:             (*reader).readDiscordWait,
		partitionsByRoute: true,
	},
	Shopify: {
		vendor: (*reader).readShopify,
		body: func(rd *reader) {
			rd.readGraphQLThrottle(func(e graphQLError) bool { return e.Extensions.Code == "THROTTLED" })
			rd.readShopifyCost()
		},
		successBody: true,
	},
	GitLab: {
		vendor:      (*reader).readGitLab,
		ownsDraft03: true,
	},
	Reddit: {
		vendor: (*reader).readReddit,
	},
	Jira: {
		vendor: (*reader).readJira,
		beta:   true,
	},
	Google: {},
	X: {
		vendor: (*reader).readX,
	},
	Kong: {
		vendor: (*reader).readKong,
	},
	Slack: {
		body:        (*reader).readSlack,
		successBody: true,
	},
	Stripe: {
		vendor: (*reader).readStripe,
		waits:  func(rd *reader) { rd.readShouldRetry("Stripe-Should-Retry") },
	},
}

// row is the profile table's row for rd's profile.
func (rd *reader) row() profileReader {
	return profileTable[rd.p]
}

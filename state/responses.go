package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

var qResponse = newQuery("Response")

// Response returns the stored answer for key and target, if any.
func (tx *Tx) Response(key, target string) (ledger.StoredResponse, bool, error) {
	r := ledger.StoredResponse{Key: key, Target: target}
	var at int64
	err := tx.queryRow(qResponse, key, target).
		Scan(&r.ETag, &r.LastModified, &r.Status, &r.ContentType, &r.Body, &r.Digest, &at, &r.Unchanged, &r.Vary, &r.Varied)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("state: stored response: %w", err)
	}
	r.StoredAt = fromMicros(at)
	return r, true, nil
}

var (
	qPutResponse  = newQuery("PutResponse")
	qDropResponse = newQuery("DropResponse")
)

// PutResponse stores r, keeping at most keep answers per key (the oldest
// go first).
func (tx *Tx) PutResponse(r ledger.StoredResponse, keep int) error {
	_, err := tx.KeepResponse(r, keep)
	return err
}

// KeepResponse is PutResponse that also returns the targets of r's key
// with a stored answer after it, newest first, as StoredTargets would: the
// put, one read of the key's targets by age, and a delete by primary key
// for each past keep (one, for a key at its limit). Counting the key's
// answers, then trimming them with a statement that sorts them, cost
// twice as much. An answer of r.Target kept before, and newer than r (a
// journal replayed after a crash may bring an older one), stays.
func (tx *Tx) KeepResponse(r ledger.StoredResponse, keep int) ([]string, error) {
	if err := tx.putResponse(r); err != nil {
		return nil, err
	}
	targets, err := tx.StoredTargets(r.Key)
	if err != nil {
		return nil, err
	}
	keep = max(keep, 0)
	if len(targets) <= keep {
		return targets, nil
	}
	for _, t := range targets[keep:] {
		if _, err := tx.exec(qDropResponse, r.Key, t); err != nil {
			return nil, fmt.Errorf("state: store response: %w", err)
		}
	}
	return targets[:keep:keep], nil
}

// putResponse stores r, unless an answer of its target newer than r is
// stored, and leaves the key's other answers as they are.
func (tx *Tx) putResponse(r ledger.StoredResponse) error {
	body := r.Body
	if body == nil {
		body = []byte{} // no body is an empty one: a nil slice would be NULL, which the column refuses
	}
	_, err := tx.exec(qPutResponse,
		r.Key, r.Target, r.ETag, r.LastModified, r.Status, r.ContentType, body, r.Digest, micros(r.StoredAt), r.Unchanged, r.Vary, r.Varied)
	if err != nil {
		return fmt.Errorf("state: store response: %w", err)
	}
	return nil
}

var qStoredTargets = newQuery("StoredTargets")

// StoredTargets returns the targets of key that have a stored answer,
// newest first (at most the keep of the last PutResponse for key, and the
// answers kept beside them since): the primary key's range for key,
// sorted by age.
func (tx *Tx) StoredTargets(key string) ([]string, error) {
	rows, err := tx.query(qStoredTargets, key)
	if err != nil {
		return nil, fmt.Errorf("state: kept targets: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("state: kept targets: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("state: kept targets: %w", err)
	}
	return out, nil
}

var qKeys = newQuery("Keys")

// Keys returns every key the file has state for.
func (tx *Tx) Keys() ([]string, error) {
	if tx.pg != nil {
		if err := tx.pg.flush(tx); err != nil { // the key states it put, not yet written
			return nil, err
		}
	}
	rows, err := tx.query(qKeys)
	if err != nil {
		return nil, fmt.Errorf("state: keys: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

var qClaimed = newQuery("Claimed")

// Claimed returns the callers with a claim on key open at now: they are
// waiting for admission, so their reservations are not lent.
func (tx *Tx) Claimed(key string, now time.Time) (map[string]bool, error) {
	rows, err := tx.query(qClaimed, key, micros(now))
	if err != nil {
		return nil, fmt.Errorf("state: claims: %w", err)
	}
	defer rows.Close()
	var out map[string]bool
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[c] = true
	}
	return out, rows.Err()
}

var qClaim = newQuery("Claim")

// Claim opens (or extends) caller's claim on key until until.
func (tx *Tx) Claim(key, caller string, until time.Time) error {
	if _, err := tx.exec(qClaim, key, caller, micros(until)); err != nil {
		return fmt.Errorf("state: claim: %w", err)
	}
	return nil
}

// KeepLater is DB.KeepLater on PostgreSQL: through the process's journal
// on this host, with the outcomes it records; without a JournalDir, at
// once.
func (pg *Postgres) KeepLater(ctx context.Context, r ledger.StoredResponse, keep int, listed func(targets []string)) error {
	return pg.out.keepLater(ctx, r, keep, listed)
}

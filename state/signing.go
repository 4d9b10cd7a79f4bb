package state

import (
	"context"
	"crypto/rand"
)

var (
	qAddSigningKey = newQuery("AddSigningKey")
	qSigningKey    = newQuery("SigningKey")
)

// signingKey returns the key called name, made (130 random bits) by the
// first process to ask, in the transactions of update: what one process
// or host signs, every other sharing the state can check (MCP session
// IDs). It is no credential: every request still carries its caller's
// token, which the state never holds.
func signingKey(ctx context.Context, update func(context.Context, func(*Tx) error) error, name string) ([]byte, error) {
	var key []byte
	err := update(ctx, func(tx *Tx) error {
		if _, err := tx.exec(qAddSigningKey, name, []byte(rand.Text())); err != nil {
			return err
		}
		return tx.queryRow(qSigningKey, name).Scan(&key)
	})
	return key, err
}

// SigningKey returns the key called name that every process sharing the
// file signs with (see signingKey).
func (db *DB) SigningKey(ctx context.Context, name string) ([]byte, error) {
	return signingKey(ctx, db.update, name)
}

// SigningKey returns the key called name that every host sharing the
// database signs with (see signingKey).
func (pg *Postgres) SigningKey(ctx context.Context, name string) ([]byte, error) {
	return signingKey(ctx, func(ctx context.Context, fn func(*Tx) error) error { return pg.update(ctx, fn) }, name)
}

-- A kept answer now says what it varies on (its Vary field's names, and
-- the values the request that produced it sent for them), so that it is
-- reused only for a request that sends the same. Answers kept before may
-- be one caller's variant, or a compressed body the credential was not
-- removed from: they go.
DELETE FROM responses;
ALTER TABLE responses ADD COLUMN vary TEXT NOT NULL DEFAULT '';
ALTER TABLE responses ADD COLUMN varied TEXT NOT NULL DEFAULT '';
